"""Regulators read the ledger in the admin; nothing here edits an entry."""

from django import forms
from django.contrib import admin

from tlog import note

from . import services
from .admin_tools import EstimatedCountPaginator
from .models import Checkpoint, Cosignature, Entry, Witness


class ReadOnlyAdmin(admin.ModelAdmin):
    paginator = EstimatedCountPaginator  # no COUNT(*) over millions of rows on PostgreSQL
    show_full_result_count = False

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Entry)
class EntryAdmin(ReadOnlyAdmin):
    list_display = ("seq", "time", "kind", "actor")
    # No list_filter on kind: its choices would be a DISTINCT over every entry. Search is exact
    # (=kind, =actor) and walks the primary key newest first, stopping at a page of matches.
    search_fields = ("=seq", "=kind", "=actor")
    ordering = ("-seq",)
    readonly_fields = ("seq", "time", "kind", "actor", "payload", "leaf_text", "hash_hex")
    exclude = ("leaf", "hash")

    @admin.display(description="leaf (exact bytes)")
    def leaf_text(self, obj):
        return bytes(obj.leaf).decode("utf-8", errors="replace")

    @admin.display(description="leaf hash")
    def hash_hex(self, obj):
        return bytes(obj.hash).hex()


@admin.register(Checkpoint)
class CheckpointAdmin(ReadOnlyAdmin):
    list_display = ("size", "created_at")
    readonly_fields = ("size", "note", "created_at")
    exclude = ("root",)


class WitnessAddForm(forms.ModelForm):
    class Meta:
        model = Witness
        fields = ("verifier_key",)

    def clean_verifier_key(self):
        """A malformed key is a form error naming the problem, never a 500."""
        vkey = self.cleaned_data["verifier_key"].strip()
        try:
            verifier = note.parse_verifier_key(vkey)
        except (note.NoteError, ValueError) as error:
            raise forms.ValidationError(f"not a verifier key: {error}") from error
        if verifier.sig_type != note.COSIGNATURE_V1:
            raise forms.ValidationError("must be a cosignature/v1 key (type 0x04)")
        return vkey


@admin.register(Witness)
class WitnessAdmin(admin.ModelAdmin):
    """Adding a witness goes through the service, so the registration is a ledger entry."""

    list_display = ("name", "registered_seq", "revoked_seq")
    readonly_fields = ("name", "verifier_key", "registered_seq", "revoked_seq")
    exclude = ("key_id", "public_key")
    form = WitnessAddForm

    def get_readonly_fields(self, request, obj=None):
        return self.readonly_fields if obj else ()

    def get_exclude(self, request, obj=None):
        return self.exclude if obj else ("key_id", "public_key", "name", "registered_seq", "revoked_seq")

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        if change:
            return
        witness = services.witness_register(form.cleaned_data["verifier_key"], actor="regulator")
        obj.pk = witness.pk


@admin.register(Cosignature)
class CosignatureAdmin(ReadOnlyAdmin):
    list_display = ("checkpoint", "witness", "timestamp")
