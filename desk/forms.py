"""The desk's forms for a campaign's lifecycle: amend or stop it (each a superseding ledger entry)."""

from django import forms
from django.utils import timezone

from inspections.selectors import prover_candidates
from registry.models import Organisation
from rules.inspection_planning import MODELS


class DatePicker(forms.DateInput):
    input_type = "date"

    def __init__(self, **attrs):
        super().__init__(attrs=attrs, format="%Y-%m-%d")


class CampaignAmendForm(forms.Form):
    """The amendable parameters, filled with those in force; only what differs is recorded as changed."""

    provers = forms.ModelMultipleChoiceField(
        Organisation.objects.none(), required=False, to_field_name="slug", help_text="owners/operators holding chips"
    )
    rule_flops = forms.FloatField(label="Rule (H)", help_text="training compute the rule forbids, in FLOPs")
    detection_probability = forms.FloatField(label="Detection target")
    snapshot_rate = forms.FloatField(label="Snapshots per chip per day")
    model = forms.ChoiceField(
        choices=[(m, {"paper": "paper (with replacement)", "exact": "exact (without replacement)"}[m]) for m in MODELS],
        label="Sampling model",
    )
    ends_on = forms.DateField(required=False, label="Ends on", help_text="empty: runs until stopped")

    def __init__(self, *args, campaign, **kwargs):
        initial = {
            "provers": list(campaign.provers.values_list("slug", flat=True)),
            "rule_flops": campaign.rule_flops,
            "detection_probability": campaign.detection_probability,
            "snapshot_rate": campaign.snapshot_rate,
            "model": campaign.model,
            "ends_on": campaign.ends_on,
        }
        super().__init__(*args, initial=initial, prefix="amend", **kwargs)
        self.fields["provers"].queryset = prover_candidates()
        self.fields["ends_on"].widget = DatePicker(min=timezone.now().date().isoformat())
        if campaign.country:
            del self.fields["provers"]  # a country campaign targets every owner/operator there

    def changes(self) -> dict:
        data = dict(self.cleaned_data)
        if "provers" in data:
            data["provers"] = [org.slug for org in data["provers"]]
        return data


class CampaignStopForm(forms.Form):
    on = forms.DateField(label="No draw from", help_text="today or later; tasks already drawn stay open")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, prefix="stop", **kwargs)
        today = timezone.now().date()
        self.fields["on"].initial = today
        self.fields["on"].widget = DatePicker(min=today.isoformat())
