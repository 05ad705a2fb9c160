"""The regulator's desk pages inside the admin. Thin: read through selectors, act through services."""

from __future__ import annotations

import csv
import json

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.utils import label_for_field, lookup_field
from django.contrib.auth import login as auth_login
from django.contrib.auth.forms import AuthenticationForm
from django.core.cache import cache
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpResponse, HttpResponseBadRequest, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from inspections.services import campaigns

from . import reports, search_selectors, selectors
from .exports import attachment, csv_cell, export_filename
from .forms import CampaignAmendForm, CampaignStopForm
from .models import Job
from .services import jobs, triage
from .services.charts import charts_draw

CHART_SECONDS = 60


def _context(request, title: str, **extra) -> dict:
    return {**admin.site.each_context(request), "title": title, **extra}


def _found(page_object):
    """The page's object, or a 404: a missing object is not an error of the page."""
    if page_object is None:
        raise Http404("no such object")
    return page_object


# --- where each kind of user belongs ------------------------------------------------------------------


def home_of(user) -> str:
    """Staff use the admin; inspectors their portal; vendors and owners the API (its docs)."""
    if user.is_staff:
        return reverse("admin:index")
    if selectors.is_inspector(user):
        return reverse("portal:tasks")
    return reverse("docs")


def login(request):
    """The admin's login, except that someone who is not staff is signed in and sent where they belong."""
    if request.user.is_authenticated and not request.user.is_staff:
        return redirect(home_of(request.user))
    if request.method == "POST":
        form = AuthenticationForm(request, data=request.POST)
        if form.is_valid() and not form.get_user().is_staff:
            auth_login(request, form.get_user())
            return redirect(home_of(form.get_user()))
    return admin.site.login(request)


# --- dashboard --------------------------------------------------------------------------------------


def dashboard(request):
    stored = selectors.figures()
    campaigns = stored["open_campaigns"].data if "open_campaigns" in stored else []
    chosen = _chosen_campaign(request, campaigns)
    oldest = min(figure.computed_at for figure in stored.values())
    # The beat task draws the default dashboard's plots; another campaign's (or before the task ran) are
    # drawn here and kept for CHART_SECONDS: matplotlib takes 0.1-0.5 s a chart.
    charts = selectors.charts_stored(stored, chosen)
    key = f"desk:charts:{oldest.isoformat()}:{chosen['slug'] if chosen else ''}"
    if charts is None and (charts := cache.get(key)) is None:
        charts = charts_draw(stored, chosen)
        cache.set(key, charts, CHART_SECONDS)
    context = _context(
        request,
        "Regulator's desk",
        charts=charts,
        campaigns=campaigns,
        chosen=chosen,
        figures_at=oldest,
        inspections=selectors.inspections_state(),
        drawn_statuses=selectors.DRAWN_STATUSES,
        chip_statuses=stored["chips_by_status"].data if "chips_by_status" in stored else [],
        ledger=selectors.ledger_state(),
        can_act=request.user.has_perm("desk.add_job"),
    )
    return render(request, "admin/desk/dashboard.html", context)


def _chosen_campaign(request, campaigns: list[dict]) -> dict | None:
    wanted = request.GET.get("campaign")
    return next((c for c in campaigns if c["slug"] == wanted), campaigns[0] if campaigns else None)


@require_POST
def sweep_start(request):
    if not request.user.has_perm("desk.add_job"):
        raise PermissionDenied
    job = jobs.job_start(Job.Kind.INTEGRITY_SWEEP, {}, request.user.get_username())
    messages.info(request, f"Integrity sweep started (job {job.pk}).")
    return redirect(reverse("desk:job", args=[job.pk]))


# --- chip page --------------------------------------------------------------------------------------


def chip_page(request, serial: str):
    chip = _found(selectors.chip_of_page(serial))
    context = _context(request, f"Chip {chip.serial}", chip=chip, timeline=selectors.chip_timeline(chip))
    return render(request, "admin/desk/chip.html", context)


# --- organisation page ------------------------------------------------------------------------------


def organisation_page(request, slug: str):
    organisation = _found(selectors.organisation_of_page(slug))
    context = _context(
        request,
        f"{organisation.legal_name} ({organisation.slug})",
        organisation=organisation,
        roles=", ".join(str(role).replace("_", " ") for role in organisation.roles or []),
        story=selectors.organisation_story(organisation),
    )
    return render(request, "admin/desk/organisation.html", context)


# --- search -----------------------------------------------------------------------------------------


def search(request):
    """Search across everything; a query that is exactly one chip's serial opens that chip."""
    query = request.GET.get("q", "")[:100]
    page = request.GET.get("page", "1")
    results = search_selectors.search(query, int(page) if page.isascii() and page.isdigit() and len(page) < 7 else 1)
    chips = results["chips"]["rows"] if results["chips"] else []
    if len(chips) == 1 and chips[0].serial == query.strip():
        return redirect(reverse("desk:chip", args=[query.strip()]))
    context = _context(request, f"Search: {query}", q=query, **results)
    return render(request, "admin/desk/search.html", context)


# --- alerts -----------------------------------------------------------------------------------------


class TriageForm(forms.Form):
    action = forms.ChoiceField(choices=[(a, a.replace("_", " ")) for a in triage.TRIAGE_ACTIONS])
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), required=False, max_length=2000)
    assignee = forms.ChoiceField(required=False, choices=[], help_text="a staff user who may triage, to assign")

    def __init__(self, *args, next_actions=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["assignee"].choices = [("", "-")] + [(name, name) for name in triage.triage_assignees()]
        if next_actions:  # offer the steps that apply now; a stale page's other choice is refused by the service
            self.fields["action"].choices = [c for c in self.fields["action"].choices if c[0] in next_actions]


def alert_page(request, pk: int):
    alert = _found(selectors.alert_of_page(pk))
    can_act = request.user.has_perm("inspections.change_alert")
    detail = selectors.alert_detail(alert, request.user)
    form = TriageForm(request.POST or None)
    if request.method == "GET":
        form = TriageForm(next_actions=detail["next_actions"])
    if request.method == "POST":
        if not can_act:
            raise PermissionDenied
        if form.is_valid():
            try:
                triage.alert_triage(alert, by=request.user.get_username(), **form.cleaned_data)
            except ValidationError as error:
                for field, reasons in error.message_dict.items():
                    form.add_error(field if field in form.fields else None, reasons)
            else:
                messages.success(request, f"{form.cleaned_data['action'].replace('_', ' ')}: recorded on the ledger.")
                return redirect(reverse("desk:alert", args=[alert.pk]))
    context = _context(
        request,
        f"Alert: {alert.get_kind_display()} — {alert.prover.slug}",
        alert=alert,
        **detail,
        form=form,
        can_act=can_act,
    )
    return render(request, "admin/desk/alert.html", context)


# --- draws and jobs ---------------------------------------------------------------------------------


def draw_page(request, pk: int):
    draw = _found(selectors.draw_of_page(pk))
    if request.method == "POST":
        if not request.user.has_perm("desk.add_job"):
            raise PermissionDenied
        job = jobs.job_start(Job.Kind.DRAW_AUDIT, {"draw": draw.pk}, request.user.get_username())
        return redirect(reverse("desk:draw", args=[draw.pk]) + f"?job={job.pk}")
    context = _context(
        request,
        f"Draw: {draw.campaign.slug}, period {draw.period}",
        draw=draw,
        detail=selectors.draw_detail(draw),
        tasks=selectors.draw_tasks(draw),
        can_act=request.user.has_perm("desk.add_job"),
        watch=request.GET.get("job", ""),
    )
    return render(request, "admin/desk/draw.html", context)


def campaign_page(request, slug: str):
    campaign = _found(selectors.campaign_of_page(slug))
    can_act = request.user.has_perm("inspections.change_campaign") and campaign.stopped_seq is None
    action = request.POST.get("action") if request.method == "POST" else None
    amend = CampaignAmendForm(request.POST if action == "amend" else None, campaign=campaign)
    stop = CampaignStopForm(request.POST if action == "stop" else None)
    if action:
        if not request.user.has_perm("inspections.change_campaign"):
            raise PermissionDenied
        done = _campaign_act(campaign, action, amend if action == "amend" else stop, request.user.get_username())
        if done:
            messages.success(request, done)
            return redirect(reverse("desk:campaign", args=[campaign.slug]))
    detail = selectors.campaign_detail(campaign)
    achieved = [value for value in detail["achieved"].values() if value is not None]
    context = _context(
        request,
        f"Campaign {campaign.slug}",
        campaign=campaign,
        detail=detail,
        weakest=min(achieved) if achieved else None,
        provers=", ".join(selectors.campaign_provers(campaign)) or f"every owner/operator in {campaign.country}",
        next_draw=selectors.campaign_next_draw(campaign),
        versions=selectors.campaign_versions(campaign),
        amend=amend,
        stop=stop,
        can_act=can_act,
        open_form=action or "",
    )
    return render(request, "admin/desk/campaign.html", context)


def _campaign_act(campaign, action: str, form, by: str) -> str | None:
    """Amend or stop through the service (a superseding ledger entry); a refusal lands on the form."""
    if not form.is_valid():
        return None
    try:
        if action == "amend":
            campaign = campaigns.campaign_amend(campaign, actor="regulator", **form.changes())
            return f"Campaign {campaign.slug} amended at ledger seq {campaign.amended_seq} (by {by})."
        campaign = campaigns.campaign_stop(campaign, on=form.cleaned_data["on"], actor="regulator")
        return (
            f"Campaign {campaign.slug} stopped at ledger seq {campaign.stopped_seq}: no draw after {campaign.ends_on}."
        )
    except ValidationError as error:
        for field, reasons in error.message_dict.items():
            form.add_error(field if field in form.fields else None, reasons)
        return None


def task_page(request, pk: int):
    task = _found(selectors.task_of_page(pk))
    detail = selectors.task_detail(task)
    notes = [detail["finding"].notes] if detail["finding"] else []
    private = selectors.case_texts(request.user, notes)
    context = _context(request, f"Task #{task.pk}: {task}", task=task, detail=detail, private=private)
    return render(request, "admin/desk/task.html", context)


def claim_page(request, pk: int):
    claim = _found(selectors.claim_of_page(pk))
    can_act = request.user.has_perm("desk.add_job")
    if request.method == "POST":
        if not can_act:
            raise PermissionDenied
        job = jobs.job_start(Job.Kind.CLAIM_REVERIFY, {"claim": claim.pk}, request.user.get_username())
        messages.info(request, f"Re-verification started (job {job.pk}).")
        return redirect(reverse("desk:claim", args=[claim.pk]))
    context = _context(
        request, f"Claim #{claim.pk}: {claim}", claim=claim, detail=selectors.claim_detail(claim), can_act=can_act
    )
    return render(request, "admin/desk/claim.html", context)


def job_page(request, pk: int):
    job = _found(selectors.job_of_page(pk))
    if request.GET.get("format") == "json":
        return JsonResponse(
            {"state": job.state, "progress": job.progress, "message": job.message, "result": job.result}
        )
    context = _context(request, job.title, job=job, about=selectors.job_about(job), result=selectors.job_result(job))
    return render(request, "admin/desk/job.html", context)


# --- exports ----------------------------------------------------------------------------------------


def changelist_csv(request, app_label: str, model_name: str):
    """The change list as the regulator filtered it, as CSV (its list columns, every page, streamed)."""
    model_admin = next(
        (
            ma
            for m, ma in admin.site._registry.items()
            if (m._meta.app_label, m._meta.model_name) == (app_label, model_name)
        ),
        None,
    )
    if model_admin is None or not model_admin.has_view_permission(request):
        raise PermissionDenied
    params = request.GET.copy()
    request.GET = params
    try:
        changelist = model_admin.get_changelist_instance(request)
    except IncorrectLookupParameters as error:  # the change list redirects with ?e=1; a file cannot: say why
        reason = " ".join(str(m) for m in getattr(error.args[0], "messages", error.args)) if error.args else ""
        return HttpResponseBadRequest(
            f"filters: the query string does not filter this list ({reason or 'an unknown or malformed filter'})",
            content_type="text/plain; charset=utf-8",
        )
    columns = [c for c in changelist.list_display if c != "action_checkbox"]
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    filters = [(name, value) for name, values in request.GET.lists() for value in values]
    name = export_filename(str(model_admin.model._meta.verbose_name_plural), "csv", filters)
    response["Content-Disposition"] = attachment(name)
    writer = csv.writer(response)
    writer.writerow([csv_cell(label_for_field(c, model_admin.model, model_admin)) for c in columns])
    for obj in changelist.queryset.iterator(chunk_size=2000):
        row = []
        for name in columns:
            try:
                _, _, value = lookup_field(name, obj, model_admin)
            except Exception:  # a column that cannot be read for this row stays empty
                value = ""
            row.append(csv_cell(value))
        writer.writerow(row)
    return response


def crosstab_csv(request):
    """Chips by prover (owner) and country, as CSV."""
    if not request.user.has_perm("registry.view_chip"):
        raise PermissionDenied
    table = selectors.figures()["prover_country"].data
    countries = sorted({country for row in table.values() for country in row})
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = attachment(export_filename("prover-by-country", "csv"))
    writer = csv.writer(response)
    writer.writerow(["prover", *countries, "total"])
    for prover in sorted(table):
        row = table[prover]
        writer.writerow([prover, *(row.get(c, 0) for c in countries), sum(row.values())])
    return response


# --- reports and ledger extracts ---------------------------------------------------------------------

REPORT_TYPES = {"csv": "text/csv; charset=utf-8", "pdf": "application/pdf"}


def _report_response(report, extension: str) -> HttpResponse:
    if extension not in REPORT_TYPES:
        raise Http404("a report is csv or pdf")
    body = reports.report_csv(report) if extension == "csv" else reports.report_pdf(report)
    response = HttpResponse(body, content_type=REPORT_TYPES[extension])
    response["Content-Disposition"] = attachment(report.filename(extension))
    return response


def organisation_report(request, slug: str, extension: str):
    """A prover's compliance report (its chips, inspections, campaigns and what they achieved, alerts, claims)."""
    if not request.user.has_perm("registry.view_organisation"):
        raise PermissionDenied
    return _report_response(reports.prover_report(_found(selectors.organisation_of_page(slug))), extension)


def campaign_report(request, slug: str, extension: str):
    if not request.user.has_perm("inspections.view_campaign"):
        raise PermissionDenied
    return _report_response(reports.campaign_report(_found(selectors.campaign_of_page(slug))), extension)


def _extract_response(document: dict, what: str) -> HttpResponse:
    body = json.dumps(document, indent=1, ensure_ascii=False) + "\n"
    response = HttpResponse(body, content_type="application/json; charset=utf-8")
    response["Content-Disposition"] = attachment(export_filename(what, "json"))
    return response


def organisation_extract(request, slug: str):
    """The ledger entries about an organisation with their inclusion proofs: ``python -m ledger.verify --extract``."""
    if not request.user.has_perm("ledger.view_entry"):
        raise PermissionDenied
    organisation = _found(selectors.organisation_of_page(slug))
    return _extract_response(selectors.organisation_extract(organisation), f"ledger-extract-organisation-{slug}")


def campaign_extract(request, slug: str):
    if not request.user.has_perm("ledger.view_entry"):
        raise PermissionDenied
    campaign = _found(selectors.campaign_of_page(slug))
    return _extract_response(selectors.campaign_extract(campaign), f"ledger-extract-campaign-{slug}")
