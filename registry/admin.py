"""Regulators browse the registry in the admin. Projections are read-only here: every change
goes through the services (and so onto the ledger), via the API or management commands."""
import base64

from django.contrib import admin

from ledger.admin import ReadOnlyAdmin

from .models import Chip, ChipEvent, ChipModel, Facility, Member, Organisation, OrganisationKey


class KeyInline(admin.TabularInline):
    model = OrganisationKey
    fields = ("key_id", "registered_seq", "revoked_seq")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Organisation)
class OrganisationAdmin(ReadOnlyAdmin):
    list_display = ("slug", "legal_name", "country", "roles", "parent")
    list_filter = ("country",)
    search_fields = ("slug", "legal_name")
    inlines = [KeyInline]


@admin.register(Facility)
class FacilityAdmin(ReadOnlyAdmin):
    list_display = ("slug", "owner", "kind", "country", "location")
    list_filter = ("kind", "country")
    search_fields = ("slug", "owner__slug", "location")


@admin.register(ChipModel)
class ChipModelAdmin(ReadOnlyAdmin):
    list_display = ("name", "vendor", "export_class", "peak_flops_16bit", "memory_bytes")


class EventInline(admin.TabularInline):
    model = ChipEvent
    fields = ("seq", "kind", "actor")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Chip)
class ChipAdmin(ReadOnlyAdmin):
    list_display = ("serial", "model", "status", "owner", "possessor", "facility", "country")
    list_filter = ("status", "model", "country", "owner")
    search_fields = ("=serial", "owner__slug", "possessor__slug")
    list_select_related = ("model", "owner", "possessor", "facility")
    exclude = ("public_key",)
    readonly_fields = ("public_key_b64",)
    inlines = [EventInline]
    show_full_result_count = False

    @admin.display(description="chip public key")
    def public_key_b64(self, chip):
        return base64.b64encode(bytes(chip.public_key)).decode()


@admin.register(Member)
class MemberAdmin(admin.ModelAdmin):
    """Who acts for which organisation: access control, not world state, so editable."""

    list_display = ("user", "organisation")
    autocomplete_fields = ("user",)
