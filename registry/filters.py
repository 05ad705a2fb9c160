import django_filters

from .lifecycle import Status
from .models import Chip


class ChipFilter(django_filters.FilterSet):
    owner = django_filters.CharFilter(field_name="owner__slug")
    possessor = django_filters.CharFilter(field_name="possessor__slug")
    model = django_filters.CharFilter(field_name="model__slug")
    facility = django_filters.CharFilter(field_name="facility__slug")
    status = django_filters.ChoiceFilter(choices=[(s.value, s.value) for s in Status])
    country = django_filters.CharFilter(field_name="country")

    class Meta:
        model = Chip
        fields = ["owner", "possessor", "model", "facility", "status", "country"]
