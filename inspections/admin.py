"""Regulators run campaigns and watch alerts in the admin. Rows are read-only; 'Add campaign'
goes through the service, so the campaign and its first seed commitment land on the ledger."""
from django import forms
from django.contrib import admin
from django.core.exceptions import PermissionDenied, ValidationError
from django.shortcuts import redirect, render

from ledger.admin import ReadOnlyAdmin
from registry.models import Organisation

from . import services
from .models import Alert, Campaign, Claim, Draw, InspectionBody, InspectionTask


class CampaignAddForm(forms.Form):
    slug = forms.SlugField(max_length=64)
    provers = forms.ModelMultipleChoiceField(Organisation.objects.order_by("slug"), required=False,
                                             to_field_name="slug", help_text="or leave empty and name a country")
    country = forms.CharField(max_length=2, required=False, help_text="target every holder of chips in this country")
    rule_flops = forms.FloatField(help_text="H: training compute the rule forbids, e.g. 1e25")
    detection_probability = forms.FloatField(initial=0.9)
    snapshot_rate = forms.FloatField(initial=0.1, help_text="snapshots per chip per day")
    period_days = forms.IntegerField(initial=30)
    run_days = forms.IntegerField(initial=365)
    starts_on = forms.DateField(help_text="YYYY-MM-DD")
    ends_on = forms.DateField(required=False)


@admin.register(Campaign)
class CampaignAdmin(ReadOnlyAdmin):
    list_display = ("slug", "country", "rule_flops", "detection_probability", "period_days", "starts_on", "ends_on")
    filter_horizontal = ()

    def has_add_permission(self, request):
        return request.user.has_perm("inspections.add_campaign")

    def add_view(self, request, form_url="", extra_context=None):
        if not self.has_add_permission(request):
            raise PermissionDenied
        form = CampaignAddForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            data = dict(form.cleaned_data)
            data["provers"] = [org.slug for org in data["provers"]]
            data["country"] = data["country"].upper()
            try:
                campaign = services.campaign_create(**data, actor="regulator")
            except ValidationError as error:
                for field, reasons in error.message_dict.items():
                    form.add_error(field if field in form.fields else None, reasons)
            else:
                self.message_user(request, f"Campaign {campaign.slug} created at ledger seq {campaign.created_seq}.")
                return redirect("admin:inspections_campaign_changelist")
        context = {**self.admin_site.each_context(request), "title": "Start a campaign", "form": form,
                   "opts": self.model._meta}
        return render(request, "admin/inspections/campaign_add.html", context)


@admin.register(Draw)
class DrawAdmin(ReadOnlyAdmin):
    list_display = ("campaign", "period", "checkpoint_size", "drawn_seq", "drawn_at")
    exclude = ("checkpoint_root",)


@admin.register(InspectionTask)
class InspectionTaskAdmin(ReadOnlyAdmin):
    list_display = ("chip", "prover", "inspection_body", "due_on", "status")
    list_filter = ("status", "inspection_body", "prover")
    search_fields = ("=chip__serial",)
    list_select_related = ("chip", "prover", "inspection_body")


@admin.register(Alert)
class AlertAdmin(ReadOnlyAdmin):
    list_display = ("raised_at", "kind", "prover", "chip", "detail")
    list_filter = ("kind", "prover")
    list_select_related = ("prover", "chip")


@admin.register(Claim)
class ClaimAdmin(ReadOnlyAdmin):
    list_display = ("snapshot", "prover", "run", "step", "result", "mismatch_step")
    list_filter = ("result", "prover")


@admin.register(InspectionBody)
class InspectionBodyAdmin(admin.ModelAdmin):
    """Coverage and capacity of inspection bodies: regulator's configuration, not world state."""

    list_display = ("organisation", "countries", "capacity_per_period")
