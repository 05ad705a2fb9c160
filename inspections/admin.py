"""Regulators run campaigns, register inspection bodies and watch alerts in the admin. Rows are
read-only; 'Add campaign' and saving an inspection body go through the services, so they land on the ledger."""

from django import forms
from django.contrib import admin
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Exists, OuterRef, Q
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from ledger.admin import ReadOnlyAdmin
from registry.models import Organisation, Role
from rules.inspection_planning import DEFAULT_MODEL, MODELS
from rules.sampling_plans import DAYS_PER_YEAR
from rules.units import flops

from . import selectors
from .models import Alert, Campaign, Claim, Draw, InspectionBody, InspectionTask
from .services import bodies, campaigns
from .severity import SEVERITIES, SEVERITY, kinds_of_severity


class CampaignAddForm(forms.Form):
    slug = forms.SlugField(max_length=64)
    provers = forms.ModelMultipleChoiceField(
        Organisation.objects.none(),
        required=False,
        to_field_name="slug",
        help_text="owners/operators holding chips; or leave empty and name a country",
    )
    country = forms.CharField(max_length=2, required=False, help_text="target every holder of chips in this country")
    rule_flops = forms.FloatField(help_text="H: training compute the rule forbids, e.g. 1e25")
    detection_probability = forms.FloatField(initial=0.9)
    snapshot_rate = forms.FloatField(initial=0.1, help_text="snapshots per chip per day")
    period_days = forms.IntegerField(initial=30)
    run_days = forms.IntegerField(initial=365)
    starts_on = forms.DateField(help_text="YYYY-MM-DD")
    ends_on = forms.DateField(required=False)
    model = forms.TypedChoiceField(
        choices=[(m, m) for m in MODELS],
        initial=DEFAULT_MODEL,
        required=False,
        empty_value=DEFAULT_MODEL,
        help_text="paper: with replacement (Shavit 2023); exact: without replacement",
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["provers"].queryset = selectors.prover_candidates()

    def clean(self):
        data = super().clean()
        if self.errors:
            return data
        fields = {**data, "provers": [org.slug for org in data["provers"]]}
        try:  # the service's own checks: a refusal shows on the form, and the preview shows only what would pass
            self.params = campaigns.campaign_clean(**fields)
        except ValidationError as error:
            for field, reasons in error.message_dict.items():
                self.add_error(field if field in self.fields else None, reasons)
        return data


@admin.register(Campaign)
class CampaignAdmin(ReadOnlyAdmin):
    list_display = (
        "campaign_page",
        "country",
        "rule",
        "detection_probability",
        "period_days",
        "model",
        "plan",
        "starts_on",
        "ends_on",
    )
    list_display_links = None
    readonly_fields = ("plan",)
    filter_horizontal = ()

    @admin.display(description="campaign", ordering="slug")
    def campaign_page(self, campaign):
        return format_html('<a href="{}">{}</a>', reverse("desk:campaign", args=[campaign.slug]), campaign.slug)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        campaign = Campaign.objects.filter(pk=object_id).first() if object_id.isdigit() else None
        if campaign is not None:
            return redirect("desk:campaign", campaign.slug)
        return super().change_view(request, object_id)

    @admin.display(description="rule (H)", ordering="rule_flops")
    def rule(self, campaign):
        return flops(campaign.rule_flops)

    @admin.display(description="plan per period: paper / exact samples (detection)")
    def plan(self, campaign):
        return (
            format_html_join(
                "",
                "<div>{}</div>",
                ((_plan_line(slug, row),) for slug, row in self.plans_of(campaign).items()),
            )
            or "-"
        )

    def plans_of(self, campaign) -> dict[str, dict]:
        """Prover slug -> plan, counted now (one grouped scan of the eligible chips per campaign). The desk
        registers a subclass that reads the plans its beat task stored instead (desk/admin.py)."""
        return selectors.campaign_plan(campaign)

    def has_add_permission(self, request):
        return request.user.has_perm("inspections.add_campaign")

    def add_view(self, request, form_url="", extra_context=None):
        """Two steps: "Preview" shows the plan and its cost and writes nothing; "Create" puts it on the ledger."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        form = CampaignAddForm(request.POST or None)
        preview, step = None, request.POST.get("step", "preview")
        if request.method == "POST" and step != "edit" and form.is_valid():
            if step == "create":
                data = {**form.cleaned_data, "provers": [org.slug for org in form.cleaned_data["provers"]]}
                try:
                    campaign = campaigns.campaign_create(**data, actor="regulator")
                except ValidationError as error:
                    for field, reasons in error.message_dict.items():
                        form.add_error(field if field in form.fields else None, reasons)
                else:
                    message = f"Campaign {campaign.slug} created at ledger seq {campaign.created_seq}."
                    self.message_user(request, message)
                    return redirect("desk:campaign", campaign.slug)
            else:
                preview = _preview(form.params)
        context = {
            **self.admin_site.each_context(request),
            "title": "Start a campaign: preview" if preview else "Start a campaign",
            "form": form,
            "preview": preview,
            "opts": self.model._meta,
        }
        return render(request, "admin/inspections/campaign_add.html", context)


def _preview(params: dict) -> dict:
    """The plan a campaign would start with, and what it costs in inspections per period and per year."""
    plans = selectors.campaign_preview(params)
    periods_per_year = DAYS_PER_YEAR / params["period_days"]
    cost = {}
    for model in MODELS:
        per_period = sum(
            min(row[model]["samples_per_period"], row["chips"])
            for row in plans.values()
            if row.get("impossible") is False and "samples_per_period" in row.get(model, {})
        )
        cost[model] = {"per_period": per_period, "per_year": round(per_period * periods_per_year)}
    shown = {**params, "rule_flops": flops(params["rule_flops"]), "provers": ", ".join(params["provers"]) or "-"}
    return {"plans": plans, "cost": cost, "model": params["model"], "params": params, "shown": shown}


@admin.register(Draw)
class DrawAdmin(ReadOnlyAdmin):
    list_display = ("draw_page", "period", "checkpoint_size", "drawn_seq", "drawn_at")
    list_display_links = None
    list_select_related = ("campaign",)
    exclude = ("checkpoint_root",)

    @admin.display(description="draw")
    def draw_page(self, draw):
        return format_html('<a href="{}">{}</a>', reverse("desk:draw", args=[draw.pk]), draw)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        return redirect("desk:draw", object_id) if object_id.isdigit() else super().change_view(request, object_id)


class OverdueFilter(admin.SimpleListFilter):
    """Overdue as the dashboard counts it: marked overdue, or assigned/accepted and past its due date."""

    title = "overdue"
    parameter_name = "overdue"

    def lookups(self, request, model_admin):
        return [("yes", "overdue (past due, not done)")]

    def queryset(self, request, queryset):
        if self.value() != "yes":
            return queryset
        today = timezone.now().date()
        late = Q(status=InspectionTask.Status.OVERDUE) | Q(status__in=["assigned", "accepted"], due_on__lt=today)
        return queryset.filter(late)


class ProverFilter(admin.SimpleListFilter):
    """By the prover's slug (the dashboard's campaign rows know provers by slug); choices from organisations."""

    title = "prover"
    parameter_name = "prover"

    def lookups(self, request, model_admin):
        inspected = Exists(InspectionTask.objects.filter(prover=OuterRef("pk")))  # an EXISTS per organisation
        return list(Organisation.objects.filter(inspected).order_by("slug").values_list("slug", "slug"))

    def queryset(self, request, queryset):
        return queryset.filter(prover__slug=self.value()) if self.value() else queryset


@admin.register(InspectionTask)
class InspectionTaskAdmin(ReadOnlyAdmin):
    list_display = ("task_page", "chip", "prover", "inspection_body", "due_on", "status_shown")
    list_display_links = None
    list_filter = ("status", OverdueFilter, "inspection_body", ProverFilter, "draw__campaign")
    search_fields = ("=chip__serial",)
    list_select_related = ("chip", "prover", "inspection_body")

    @admin.display(description="status", ordering="status")
    def status_shown(self, task):
        """Overdue (as the dashboard counts it) in the error colour, so a late task stands out in any list."""
        late = task.status == InspectionTask.Status.OVERDUE or (
            task.status in ("assigned", "accepted") and task.due_on < timezone.now().date()
        )
        if late:
            return format_html('<strong class="errornote" style="padding:0 4px">{} — overdue</strong>', task.status)
        return task.status

    @admin.display(description="task", ordering="pk")
    def task_page(self, task):
        return format_html('<a href="{}">task #{}</a>', reverse("desk:task", args=[task.pk]), task.pk)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        return redirect("desk:task", object_id) if object_id.isdigit() else super().change_view(request, object_id)


class SeverityFilter(admin.SimpleListFilter):
    title = "severity"
    parameter_name = "severity"

    def lookups(self, request, model_admin):
        return [(level, level) for level in SEVERITIES]

    def queryset(self, request, queryset):
        if self.value() in SEVERITIES:
            return queryset.filter(kind__in=kinds_of_severity(self.value()))
        return queryset


@admin.register(Alert)
class AlertAdmin(ReadOnlyAdmin):
    """The alerts inbox: filter by state, severity and prover; each alert opens on the desk's triage page."""

    list_display = ("alert_page", "raised_at", "state", "severity", "prover_page", "chip_page", "detail")
    list_display_links = None
    list_filter = ("state", SeverityFilter, "kind", "prover")
    list_select_related = ("prover", "chip")
    search_fields = ("=chip__serial",)

    @admin.display(description="alert")
    def alert_page(self, alert):
        return format_html('<a href="{}">{} #{}</a>', reverse("desk:alert", args=[alert.pk]), alert.kind, alert.pk)

    @admin.display(description="prover", ordering="prover__slug")
    def prover_page(self, alert):
        return format_html('<a href="{}">{}</a>', reverse("desk:organisation", args=[alert.prover.slug]), alert.prover)

    @admin.display(description="chip")
    def chip_page(self, alert):
        if alert.chip is None:
            return "-"
        return format_html('<a href="{}">{}</a>', reverse("desk:chip", args=[alert.chip.serial]), alert.chip.serial)

    @admin.display(description="severity")
    def severity(self, alert):
        return SEVERITY.get(alert.kind, "low")

    def change_view(self, request, object_id, form_url="", extra_context=None):
        return redirect("desk:alert", object_id) if object_id.isdigit() else super().change_view(request, object_id)


@admin.register(Claim)
class ClaimAdmin(ReadOnlyAdmin):
    list_display = (
        "claim_page",
        "snapshot",
        "prover",
        "run",
        "step",
        "result",
        "mismatch_step",
        "failures",
        "run_coverage",
    )
    list_display_links = None
    list_filter = ("result", "prover")
    list_select_related = ("prover", "snapshot__chip")
    readonly_fields = ("run_coverage",)

    @admin.display(description="claim", ordering="pk")
    def claim_page(self, claim):
        return format_html('<a href="{}">claim #{}</a>', reverse("desk:claim", args=[claim.pk]), claim.pk)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        return redirect("desk:claim", object_id) if object_id.isdigit() else super().change_view(request, object_id)

    @admin.display(description="run coverage (one fabricated segment caught)")
    def run_coverage(self, claim):
        return _coverage_line(selectors.run_coverage(claim.prover, claim.manifest))

    def get_urls(self):
        runs = path("runs/", self.admin_site.admin_view(self.runs_view), name="inspections_claim_runs")
        return [runs, *super().get_urls()]

    def runs_view(self, request):
        """Every run (prover, manifest hash) with the segments its claims replayed and its coverage."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            "title": "Runs: replay coverage",
            "runs": selectors.runs(),
            "opts": self.model._meta,
        }
        return render(request, "admin/inspections/claim_runs.html", context)


def _coverage_line(run: dict) -> str:
    if not run["segments_total"]:
        return "no segment replayed yet"
    met = "target met" if run["target_met"] else f"below target {run['target']:.2f}"
    return f"{len(run['segments_replayed'])}/{run['segments_total']} segments, {run['coverage']:.3f} ({met})"


def _plan_line(prover: str, row: dict) -> str:
    if row.get("impossible", True):
        return f"{prover}: {row['chips']} chips, the run is impossible here"

    def one(model: str) -> str:
        plan = row.get(model, {})
        if "error" in plan:
            return f"{model} n/a ({plan['error']})"
        return f"{model} {plan['samples_per_period']} ({plan['detection_probability']:.3f})"

    drawn = f"; draws {row['drawn']} (detection {row['drawn_detection']:.3f})" if "drawn" in row else ""
    return f"{prover}: {row['chips']} chips, {one('paper')} / {one('exact')}{drawn}"


class InspectionBodyForm(forms.ModelForm):
    organisation = forms.ModelChoiceField(Organisation.objects.order_by("slug"), to_field_name="slug")
    countries = forms.CharField(help_text="ISO 3166-1 alpha-2 codes it covers, separated by commas or spaces")

    class Meta:
        model = InspectionBody
        fields = ["organisation", "countries", "capacity_per_period"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        eligible = [org.pk for org in Organisation.objects.all() if org.has_role(Role.INSPECTION_BODY)]
        self.fields["organisation"].queryset = Organisation.objects.filter(pk__in=eligible).order_by("slug")
        if self.instance.pk:
            self.initial["countries"] = ", ".join(self.instance.countries)
            self.initial["organisation"] = self.instance.organisation.slug
            self.fields["organisation"].disabled = True

    def clean(self):
        data = super().clean()
        if self.errors:
            return data
        try:  # the service's own checks, so a refusal shows on the form and nothing is written
            self.registration = bodies.inspection_body_clean(
                organisation=data["organisation"].slug,
                countries=data["countries"].replace(",", " ").split(),
                capacity_per_period=data["capacity_per_period"],
            )
        except ValidationError as error:
            for field, reasons in error.message_dict.items():
                self.add_error(field if field in self.fields else None, reasons)
        return data

    def _post_clean(self):
        pass  # the row is written by the service, not from the form


@admin.register(InspectionBody)
class InspectionBodyAdmin(admin.ModelAdmin):
    """Coverage and capacity of inspection bodies: registered on the ledger (``inspection_body.registered``)."""

    form = InspectionBodyForm
    list_display = ("organisation", "countries", "capacity_per_period", "registered_seq")

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        body = bodies.inspection_body_register(**form.registration, actor="regulator")
        for field in ("pk", "organisation", "countries", "capacity_per_period", "registered_seq"):
            setattr(obj, field, getattr(body, field))
