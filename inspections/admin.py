"""Regulators run campaigns, register inspection bodies and watch alerts in the admin. Rows are
read-only; 'Add campaign' and saving an inspection body go through the services, so they land on the ledger."""

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Exists, OuterRef, Q
from django.forms.utils import pretty_name
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from ledger.admin import ReadOnlyAdmin
from registry.models import Organisation, Role
from rules.countries import COUNTRIES, country_name
from rules.inspection_planning import DEFAULT_MODEL, MODELS
from rules.sampling_plans import DAYS_PER_YEAR
from rules.units import flops

from . import case_states, selectors
from .models import Alert, AlertNotification, Campaign, Claim, Draw, InspectionBody, InspectionTask
from .services import alerts, bodies, campaigns
from .severity import SEVERITIES, past_sla_q, severity_of, severity_q, sla_deadline

COUNTRY_CHOICES = [("", "— none: name the provers above —")] + [
    (code, f"{code} — {name}") for code, name in sorted(COUNTRIES.items())
]


def _a_pk(object_id: str) -> bool:
    """A primary key in a URL: ASCII digits (str.isdigit() also admits '²', which int() refuses: a 500)."""
    return object_id.isascii() and object_id.isdigit()


class CountryField(forms.ChoiceField):
    """A country from the ISO 3166-1 list; a typed code is taken in either case ("nl" is NL)."""

    def to_python(self, value):
        return super().to_python(value).strip().upper()


class DateInput(forms.DateInput):
    """The browser's date picker (ISO dates in and out)."""

    input_type = "date"

    def __init__(self, **attrs):
        super().__init__(attrs=attrs, format="%Y-%m-%d")


class CampaignAddForm(forms.Form):
    slug = forms.SlugField(max_length=64, label="Campaign name", help_text="its name on the ledger, e.g. frontier-2027")
    provers = forms.ModelMultipleChoiceField(
        Organisation.objects.none(),
        required=False,
        to_field_name="slug",
        help_text="owners/operators holding chips a draw counts; or leave empty and choose a country",
    )
    country = CountryField(
        choices=COUNTRY_CHOICES,
        required=False,
        help_text="target every owner/operator holding chips in this country (a vendor's stock is not a prover's)",
        error_messages={"invalid_choice": "%(value)s is not an ISO 3166-1 country code: choose one from the list"},
    )
    rule_flops = forms.FloatField(
        label="Rule (H)", help_text="the training compute the rule forbids, in FLOPs, e.g. 1e25"
    )
    detection_probability = forms.FloatField(
        initial=0.9, label="Detection target", help_text="probability of catching a violating run over the run"
    )
    snapshot_rate = forms.FloatField(initial=0.1, label="Snapshots per chip per day", help_text="f")
    period_days = forms.IntegerField(initial=30, label="Period (days)", help_text="one draw per period")
    run_days = forms.IntegerField(initial=365, label="Run length (days)", help_text="T: how long a violating run lasts")
    starts_on = forms.DateField(label="Starts on", help_text="today or later: a campaign is never backdated")
    ends_on = forms.DateField(required=False, label="Ends on", help_text="empty: runs until stopped")
    model = forms.TypedChoiceField(
        choices=[(m, label) for m, label in Campaign._meta.get_field("model").choices],
        initial=DEFAULT_MODEL,
        required=False,
        empty_value=DEFAULT_MODEL,
        label="Sampling model",
        help_text="paper: with replacement (Shavit 2023); exact: without replacement",
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["provers"].queryset = selectors.prover_candidates()
        today = timezone.now().date().isoformat()
        self.fields["starts_on"].widget = DateInput(min=today)
        self.fields["ends_on"].widget = DateInput(min=today)

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

    def shown(self, params: dict) -> list[tuple[str, str]]:
        """The checked parameters as the regulator reads them: labels, units and names, no field names."""
        values = {
            **params,
            "rule_flops": flops(params["rule_flops"]),
            "provers": ", ".join(params["provers"]) or "-",
            "country": f"{params['country']} — {country_name(params['country'])}" if params["country"] else "-",
            "model": dict(Campaign._meta.get_field("model").choices).get(params["model"], params["model"]),
        }
        return [(self.fields[name].label or pretty_name(name), values[name]) for name in self.fields if name in values]


@admin.register(Campaign)
class CampaignAdmin(ReadOnlyAdmin):
    list_display = (
        "campaign_page",
        "country",
        "rule",
        "target",
        "period_days",
        "model",
        "plan",
        "starts_on",
        "ends_on",
        "state",
    )
    list_display_links = None
    readonly_fields = ("plan",)
    filter_horizontal = ()

    @admin.display(description="campaign", ordering="slug")
    def campaign_page(self, campaign):
        return format_html('<a href="{}">{}</a>', reverse("desk:campaign", args=[campaign.slug]), campaign.slug)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        campaign = Campaign.objects.filter(pk=object_id).first() if _a_pk(object_id) else None
        if campaign is not None:
            return redirect("desk:campaign", campaign.slug)
        return super().change_view(request, object_id)

    @admin.display(description="detection target", ordering="detection_probability")
    def target(self, campaign):
        return campaign.detection_probability

    @admin.display(description="state")
    def state(self, campaign):
        """Stopped, amended (with the entry in force) or as created: a campaign is never edited in place."""
        if campaign.stopped_seq is not None:
            return f"stopped (#{campaign.stopped_seq})"
        return f"amended (#{campaign.amended_seq})" if campaign.amended_seq is not None else "as created"

    @admin.display(description="rule (H)", ordering="rule_flops")
    def rule(self, campaign):
        return flops(campaign.rule_flops)

    @admin.display(description="plan per period (the campaign's model)")
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
                preview = {**_preview(form.params), "shown": form.shown(form.params)}
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
    return {"plans": plans, "cost": cost, "model": params["model"], "params": params}


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
        return redirect("desk:draw", object_id) if _a_pk(object_id) else super().change_view(request, object_id)


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
        return redirect("desk:task", object_id) if _a_pk(object_id) else super().change_view(request, object_id)


class SeverityFilter(admin.SimpleListFilter):
    title = "severity"
    parameter_name = "severity"

    def lookups(self, request, model_admin):
        return [(level, level) for level in SEVERITIES]

    def queryset(self, request, queryset):
        return queryset.filter(severity_q(self.value())) if self.value() in SEVERITIES else queryset


class SlaFilter(admin.SimpleListFilter):
    """Open alerts past the hours their severity allows (``ALERT_SLA_HOURS``), or still within them."""

    title = "SLA"
    parameter_name = "sla"

    def lookups(self, request, model_admin):
        return [("overdue", "overdue (open past its SLA)"), ("within", "open, within its SLA")]

    def queryset(self, request, queryset):
        late = past_sla_q(timezone.now())
        if self.value() == "overdue":
            return queryset.filter(late)
        if self.value() == "within":
            return queryset.filter(state__in=list(case_states.OPEN)).exclude(late)
        return queryset


class BulkTriageForm(forms.Form):
    """What a bulk step needs beyond the alerts: a reason (closing, dismissing) or an assignee."""

    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), max_length=2000, help_text="why, for the record")
    assignee = forms.ChoiceField(choices=[], help_text="a staff user who may triage")

    def __init__(self, *args, action: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["assignee"].choices = [("", "-")] + [(name, name) for name in alerts.triage_staff()]
        if action != "assign":
            del self.fields["assignee"]
        if action not in case_states.NEEDS_REASON:
            del self.fields["reason"]


def _bulk_action(action: str):
    """An inbox action that takes ``action`` on every selected alert, each validated on its own."""

    def run(model_admin, request, queryset):
        return model_admin.bulk_triage(request, queryset, action)

    run.__name__ = f"triage_{action}"
    label = action.replace("_", " ")
    return admin.action(description=f"{label.capitalize()} selected alerts", permissions=["triage"])(run)


@admin.register(Alert)
class AlertAdmin(ReadOnlyAdmin):
    """The alerts inbox: filter by state, severity, SLA and prover; act on many at once; each alert opens on the
    desk's triage page."""

    list_display = ("alert_page", "raised_at", "age", "state", "severity", "prover_page", "chip_page", "detail")
    list_display_links = None
    list_filter = ("state", SeverityFilter, SlaFilter, "kind", "prover")
    list_select_related = ("prover", "chip")
    search_fields = ("=chip__serial",)
    actions = [_bulk_action(action) for action in case_states.BULK_ACTIONS]

    def has_triage_permission(self, request):
        return request.user.has_perm("inspections.change_alert")

    def bulk_triage(self, request, queryset, action: str):
        """Acknowledge, investigate, assign, resolve or dismiss the selected alerts; a step that needs a reason or
        an assignee asks for it first. Then one message says what was done and one what was refused, and why."""
        form = BulkTriageForm(request.POST if "apply" in request.POST else None, action=action)
        if form.fields and not form.is_valid():
            context = {
                **self.admin_site.each_context(request),
                "title": f"{action.replace('_', ' ').capitalize()} {queryset.count()} alerts",
                "alerts": queryset,
                "action": request.POST.get("action", ""),
                "form": form,
                "opts": self.model._meta,
            }
            return render(request, "admin/inspections/alert_bulk.html", context)
        given = form.cleaned_data if form.fields else {}
        found = alerts.alerts_act(queryset.order_by("pk"), by=request.user.get_username(), action=action, **given)
        _bulk_summary(self, request, action, found)
        return None

    @admin.display(description="alert")
    def alert_page(self, alert):
        return format_html('<a href="{}">{} #{}</a>', reverse("desk:alert", args=[alert.pk]), alert.kind, alert.pk)

    @admin.display(description="age", ordering="raised_at")
    def age(self, alert):
        """How long ago it was raised; an open alert past its severity's SLA in the error colour."""
        shown = age_text(timezone.now() - alert.raised_at)
        if alert.state in case_states.OPEN and timezone.now() > sla_deadline(alert.kind, alert.raised_at):
            return format_html(
                '<strong class="errornote desk-overdue" style="padding:0 4px">{} — overdue</strong>', shown
            )
        return shown

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
        return severity_of(alert.kind)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        return redirect("desk:alert", object_id) if _a_pk(object_id) else super().change_view(request, object_id)


def _bulk_summary(model_admin, request, action: str, found: dict) -> None:
    label = action.replace("_", " ").capitalize()
    if found["done"]:
        shown = ", ".join(f"#{alert.pk}" for alert in found["done"])
        model_admin.message_user(
            request, f"{label}: {len(found['done'])} done ({shown}), each on the ledger.", messages.SUCCESS
        )
    if found["refused"]:
        shown = "; ".join(f"#{alert.pk}: {why}" for alert, why in found["refused"])
        model_admin.message_user(request, f"{label}: {len(found['refused'])} refused ({shown})", messages.WARNING)


def age_text(age) -> str:
    """An age as a person reads it: "3 d 4 h", "5 h 12 min", "40 min"."""
    minutes = max(int(age.total_seconds() // 60), 0)
    days, hours, minutes = minutes // 1440, minutes // 60 % 24, minutes % 60
    if days:
        return f"{days} d {hours} h"
    return f"{hours} h {minutes} min" if hours else f"{minutes} min"


@admin.register(AlertNotification)
class AlertNotificationAdmin(ReadOnlyAdmin):
    """Email and webhook notices of high alerts, and emails of the tasks a draw assigned a body: whether each was
    delivered, and the last error if not."""

    list_display = (
        "alert",
        "draw",
        "inspection_body",
        "channel",
        "target",
        "state",
        "attempts",
        "next_try_at",
        "last_error",
        "created_at",
        "sent_at",
    )
    list_filter = ("state", "channel")
    list_select_related = ("alert__prover", "draw__campaign", "inspection_body")


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
        return redirect("desk:claim", object_id) if _a_pk(object_id) else super().change_view(request, object_id)

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
    if run["segments_pending"]:
        met += f", {len(run['segments_pending'])} cut draw(s) pending"
    replayed, drawn = len(run["segments_replayed"]), len(run["segments_drawn"])
    return f"{replayed}/{run['segments_total']} segments ({drawn} drawn), {run['coverage']:.3f} ({met})"


def _plan_line(prover: str, row: dict) -> str:
    """The plan the campaign's draws follow, in words (the other model is on the campaign's page)."""
    if row.get("impossible", True):
        return f"{prover}: {row['chips']:,} chips, the run is impossible here"
    chosen = row.get(row.get("model") or DEFAULT_MODEL, {})
    return f"{prover}: {chosen.get('error') or chosen.get('words') or '-'}"


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
