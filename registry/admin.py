"""Regulators browse the registry in the admin. Projections are read-only here: every change
goes through the services (and so onto the ledger), via the API or management commands."""

import base64

from django import forms
from django.contrib import admin
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.html import format_html

from ledger.admin import ReadOnlyAdmin
from rules.units import flop_rate, size_bytes

from . import services
from .models import ApiToken, Chip, ChipEvent, ChipModel, Facility, Member, Organisation, OrganisationKey, Role
from .services.tokens import api_token_revoke


class KeyInline(admin.TabularInline):
    model = OrganisationKey
    fields = ("key_id", "registered_seq", "revoked_seq")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


class OrganisationAddForm(forms.Form):
    """What a regulator fills in to register an organisation (and optionally its first key)."""

    slug = forms.SlugField(max_length=64, help_text="its name on the ledger")
    legal_name = forms.CharField(max_length=255)
    country = forms.CharField(max_length=2, help_text="ISO 3166-1 alpha-2, e.g. NL")
    roles = forms.MultipleChoiceField(choices=Role.choices, widget=forms.CheckboxSelectMultiple)
    parent = forms.ModelChoiceField(Organisation.objects.all(), required=False, to_field_name="slug")
    public_key = forms.CharField(required=False, help_text="base64 Ed25519 public key to register as its first key")


@admin.register(Organisation)
class OrganisationAdmin(ReadOnlyAdmin):
    """Read-only rows; 'Add' registers an organisation through the service, on the ledger."""

    list_display = ("organisation_page", "legal_name", "country", "role_names", "parent")
    list_display_links = None
    list_filter = ("country",)
    search_fields = ("slug", "legal_name")
    inlines = [KeyInline]

    @admin.display(description="organisation", ordering="slug")
    def organisation_page(self, organisation):
        return format_html('<a href="{}">{}</a>', reverse("desk:organisation", args=[organisation.slug]), organisation)

    @admin.display(description="roles")
    def role_names(self, organisation):
        return ", ".join(str(role).replace("_", " ") for role in organisation.roles or [])

    def change_view(self, request, object_id, form_url="", extra_context=None):
        organisation = self.get_object(request, object_id)
        if organisation is not None:  # the desk's organisation page tells its story
            return redirect("desk:organisation", organisation.slug)
        return super().change_view(request, object_id, form_url, extra_context)

    def has_add_permission(self, request):
        return request.user.has_perm("registry.add_organisation")

    def add_view(self, request, form_url="", extra_context=None):
        if not self.has_add_permission(request):
            raise PermissionDenied
        form = OrganisationAddForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            try:
                organisation = _register(form.cleaned_data)
            except ValidationError as error:
                for field, messages_ in error.message_dict.items():
                    form.add_error(field if field in form.fields else None, messages_)
            else:
                self.message_user(
                    request, f"Registered {organisation.slug} at ledger seq {organisation.registered_seq}."
                )
                return redirect("admin:registry_organisation_change", organisation.pk)
        context = {
            **self.admin_site.each_context(request),
            "title": "Register an organisation",
            "form": form,
            "opts": self.model._meta,
        }
        return render(request, "admin/registry/organisation_add.html", context)


def _register(data: dict) -> Organisation:
    with transaction.atomic():
        organisation = services.organisation_register(
            slug=data["slug"],
            legal_name=data["legal_name"],
            country=data["country"].upper(),
            roles=data["roles"],
            parent=data["parent"].slug if data["parent"] else None,
            actor="regulator",
        )
        if data["public_key"]:
            try:
                key = base64.b64decode(data["public_key"], validate=True)
            except ValueError:  # binascii.Error, or a non-ASCII string
                raise ValidationError({"public_key": "not base64"}) from None
            services.organisation_key_register(organisation=organisation, public_key=key, actor="regulator")
    return organisation


@admin.register(Facility)
class FacilityAdmin(ReadOnlyAdmin):
    list_display = ("slug", "owner_page", "kind", "country", "location", "chips_here")
    list_filter = ("kind", "country")
    search_fields = ("slug", "owner__slug", "location")
    list_select_related = ("owner",)

    @admin.display(description="owner", ordering="owner__slug")
    def owner_page(self, facility):
        return format_html(
            '<a href="{}">{}</a>', reverse("desk:organisation", args=[facility.owner.slug]), facility.owner
        )

    @admin.display(description="chips")
    def chips_here(self, facility):
        """A link to the chips at the facility (no count: a COUNT per row would scan the chips on every page)."""
        url = reverse("admin:registry_chip_changelist") + f"?facility={facility.slug}"
        return format_html('<a href="{}">chips here</a>', url)


@admin.register(ChipModel)
class ChipModelAdmin(ReadOnlyAdmin):
    list_display = ("name", "vendor", "export_class", "peak", "memory")
    list_select_related = ("vendor",)

    @admin.display(description="peak dense 16-bit", ordering="peak_flops_16bit")
    def peak(self, chip_model):
        return flop_rate(chip_model.peak_flops_16bit)

    @admin.display(description="memory", ordering="memory_bytes")
    def memory(self, chip_model):
        return size_bytes(chip_model.memory_bytes)


class EventInline(admin.TabularInline):
    model = ChipEvent
    fields = ("seq", "kind", "actor")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


class _SmallTableFilter(admin.SimpleListFilter):
    """A chip filter whose choices come from a small table (organisations, facilities, models), never from a
    DISTINCT over the chips; the choice filters the chips on an indexed (or cheap) column."""

    field = ""

    def queryset(self, request, queryset):
        return queryset.filter(**{self.field: self.value()}) if self.value() else queryset


class OwnerFilter(_SmallTableFilter):
    title, parameter_name, field = "owner", "owner", "owner__slug"

    def lookups(self, request, model_admin):
        return list(Organisation.objects.order_by("slug").values_list("slug", "slug"))


class CountryFilter(_SmallTableFilter):
    title, parameter_name, field = "country", "country", "country"

    def lookups(self, request, model_admin):
        countries = set(Facility.objects.values_list("country", flat=True))
        countries |= set(Organisation.objects.values_list("country", flat=True))
        return [(c, c) for c in sorted(c for c in countries if c)]


class FacilityFilter(_SmallTableFilter):
    title, parameter_name, field = "facility", "facility", "facility__slug"

    def lookups(self, request, model_admin):
        return list(Facility.objects.order_by("slug").values_list("slug", "slug"))


class ModelFilter(_SmallTableFilter):
    title, parameter_name, field = "model", "model", "model__name"

    def lookups(self, request, model_admin):
        return [(n, n) for n in ChipModel.objects.order_by("name").values_list("name", flat=True).distinct()]


@admin.register(Chip)
class ChipAdmin(ReadOnlyAdmin):
    list_display = ("chip_page", "model", "status", "owner", "possessor", "facility", "country")
    list_display_links = None
    # Filters list their choices from the small tables (never a DISTINCT over every chip); the dashboard's
    # bars open these lists. Search is by serial prefix (the unique index) or exact owner.
    list_filter = ("status", OwnerFilter, CountryFilter, FacilityFilter, ModelFilter)
    search_fields = ("^serial", "=owner__slug", "=possessor__slug")
    list_select_related = ("model", "owner", "possessor", "facility")
    raw_id_fields = ("model", "fab", "owner", "possessor", "consignee", "pending_owner", "facility")
    exclude = ("public_key",)
    readonly_fields = ("public_key_b64",)
    inlines = [EventInline]

    @admin.display(description="serial", ordering="serial")
    def chip_page(self, chip):
        return format_html('<a href="{}">{}</a>', reverse("desk:chip", args=[chip.serial]), chip.serial)

    def get_search_results(self, request, queryset, search_term):
        """An organisation's slug finds its chips; anything else is a serial prefix (case-sensitive, indexed)."""
        term = search_term.strip()
        if not term:
            return queryset, False
        if Organisation.objects.filter(slug=term).exists():
            return queryset.filter(owner__slug=term) | queryset.filter(possessor__slug=term), True
        # ">= term" starts the serial index's walk at the prefix: PostgreSQL's estimate of a LIKE prefix is
        # coarse (1% of 10^6 chips for 100), and its plan walked 500,000 rows by id to find 50 (0.4 s).
        return queryset.filter(serial__startswith=term, serial__gte=term), False

    def get_ordering(self, request):
        """A serial search lists by serial (the unique index, from the prefix on); any other list newest first."""
        term = request.GET.get("q", "").strip()
        if term and not Organisation.objects.filter(slug=term).exists():
            return ("serial",)
        return super().get_ordering(request)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        chip = self.get_object(request, object_id)
        if chip is not None:  # the desk's chip page has the timeline and the proof check
            return redirect("desk:chip", chip.serial)
        return super().change_view(request, object_id, form_url, extra_context)

    @admin.display(description="chip public key")
    def public_key_b64(self, chip):
        return base64.b64encode(bytes(chip.public_key)).decode()


class MemberForm(forms.ModelForm):
    """The service's own checks (staff join the regulator only; no move with live tokens) as form errors."""

    class Meta:
        model = Member
        fields = ("user", "organisation")

    def clean(self):
        data = super().clean()
        user = data.get("user") or (self.instance.user if self.instance.pk else None)  # read-only on change
        organisation = data.get("organisation")
        staff = user is not None and (user.is_staff or user.is_superuser)
        if staff and organisation is not None and not organisation.has_role(Role.REGULATOR):
            self.add_error("organisation", "staff users act for the regulator only")
        return data


@admin.register(Member)
class MemberAdmin(admin.ModelAdmin):
    """Who acts for which organisation: each change an ``org.member_added``/``org.member_removed`` entry."""

    form = MemberForm
    list_display = ("user", "organisation")
    autocomplete_fields = ("user",)

    def get_readonly_fields(self, request, obj=None):
        return ("user",) if obj is not None else ()  # a membership moves its user; it never changes hands

    def save_model(self, request, obj, form, change):
        try:
            saved = services.member_add(obj.user, obj.organisation, actor="regulator")
        except ValidationError as error:
            raise PermissionDenied("; ".join(error.messages)) from error
        obj.pk = saved.pk

    def delete_model(self, request, obj):
        services.member_remove(obj, actor="regulator")

    def delete_queryset(self, request, queryset):
        for member in queryset:
            services.member_remove(member, actor="regulator")


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Who holds which token, by prefix; the token itself is stored nowhere (``manage.py api_token issue``)."""

    list_display = ("prefix", "user", "label", "created_at", "revoked_at")
    list_filter = ("revoked_at",)
    fields = ("prefix", "user", "label", "created_at", "revoked_at")
    readonly_fields = fields
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.action(description="Revoke the selected tokens", permissions=["change"])
    def revoke(self, request, queryset):
        for token in queryset:
            api_token_revoke(token)
        self.message_user(request, f"Revoked {queryset.count()} token(s).")
