import django_filters

from .models import CHIP_STATUS_CHOICES, Chip


class ChipFilter(django_filters.FilterSet):
    owner = django_filters.CharFilter(field_name="owner__slug")
    possessor = django_filters.CharFilter(field_name="possessor__slug")
    model = django_filters.CharFilter(field_name="model__slug")
    facility = django_filters.CharFilter(field_name="facility__slug")
    status = django_filters.ChoiceFilter(choices=CHIP_STATUS_CHOICES)
    country = django_filters.CharFilter(field_name="country")

    class Meta:
        model = Chip
        fields = ["owner", "possessor", "model", "facility", "status", "country"]
