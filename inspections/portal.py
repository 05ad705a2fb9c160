"""The inspector's web portal: the same services as the API, as pages (server-rendered, session login)."""

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import redirect, render

from registry.models import Role
from registry.selectors import organisation_of

from . import portal_selectors, selectors
from .services import inspectors

TASKS_PER_PAGE = 25
YES_NO = [("true", "yes"), ("false", "no")]
NOT_CHECKED = [("", "not checked"), *YES_NO]


def _tri_state(label: str) -> forms.TypedChoiceField:
    """yes / no / not checked: a box the inspector did not look at is not recorded as an answer."""
    return forms.TypedChoiceField(
        choices=NOT_CHECKED,
        coerce=lambda v: v == "true",
        empty_value=None,
        required=False,
        initial="",
        widget=forms.RadioSelect,
        label=label,
    )


class FindingForm(forms.Form):
    chip_found = forms.TypedChoiceField(
        choices=YES_NO,
        coerce=lambda v: v == "true",
        widget=forms.RadioSelect,
        label="Chip found where the registry says",
    )
    owner_refused = forms.TypedChoiceField(
        choices=YES_NO,
        coerce=lambda v: v == "true",
        empty_value=None,
        required=False,
        initial="false",
        widget=forms.RadioSelect,
        label="Owner refused access",
    )
    seal_intact = _tri_state("Seal intact")
    tamper_evidence = _tri_state("Evidence of tampering")
    location_matches = _tri_state("Location matches the registry")
    photo_hashes = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2, "id": "id_photo_hashes"}),
        help_text="SHA-256 of each photograph, one per line (choose the photos below to have this browser compute them)",
    )
    notes = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}))

    def finding(self) -> dict:
        """The answers given: a question left "not checked" is left out (the ledger records no answer to it)."""
        data = {k: v for k, v in self.cleaned_data.items() if v is not None}
        data["photo_hashes"] = data.get("photo_hashes", "").split()
        return data


class LogForm(forms.Form):
    log = forms.FileField(help_text="the chip's firmware log (JSON lines)")


class IdentityForm(forms.Form):
    nonce = forms.CharField(widget=forms.HiddenInput)
    signature = forms.CharField(help_text="the chip's base64 signature of the message above")


def _log_text(upload) -> str:
    """The uploaded log as text: its size checked before it is read, and it must be UTF-8 (a log is JSON lines)."""
    if upload.size > inspectors.MAX_LOG_BYTES:
        raise ValidationError({"log": f"at most {inspectors.MAX_LOG_BYTES} bytes"})
    try:
        return upload.read().decode("utf-8")
    except UnicodeDecodeError:
        raise ValidationError({"log": "is not UTF-8 text (a firmware log is JSON lines)"}) from None


def _body(request):
    if request.user.is_staff or request.user.is_superuser:  # staff act for the regulator, never as a body
        raise PermissionDenied("Regulator staff do not use the inspectors' portal.")
    organisation = organisation_of(request.user)
    if organisation is None or not organisation.has_role(Role.INSPECTION_BODY):
        raise PermissionDenied("Only members of an inspection body use the portal.")
    return organisation


@login_required
def task_list(request):
    body = _body(request)
    view = request.GET.get("show", "open")
    if view not in portal_selectors.VIEWS:
        view = "open"
    page = Paginator(portal_selectors.tasks_in_view(body, view), TASKS_PER_PAGE).get_page(request.GET.get("page"))
    context = {
        "body": body,
        "tasks": page,
        "page": page,
        "view": view,
        "views": [
            (name, label, count)
            for (name, label), count in zip(portal_selectors.VIEWS.items(), portal_selectors.task_counts(body).values())
        ],
    }
    return render(request, "inspections/tasks.html", context)


@login_required
def task_detail(request, task_id: int):
    body = _body(request)
    task = selectors.task_of(body, task_id)
    if task is None:
        raise Http404("no such task")
    context = {"body": body, "task": task, "finding_form": FindingForm(), "log_form": LogForm()}
    if request.method == "POST":
        try:
            response = _act(request, body, task, context)
        except ValidationError as error:
            for field, reasons in error.message_dict.items():
                messages.error(request, f"{field}: {' '.join(reasons)}")
            response = None
        if response is not None:
            return response
    context["logs"] = task.snapshot_logs.order_by("-uploaded_at")
    context.update(_identity_context(task))
    context["finding"] = getattr(task, "finding", None) if task.status == task.Status.DONE else None
    return render(request, "inspections/task.html", context)


def _identity_context(task) -> dict:
    """The identity section: verified (nothing more to do), or the open challenge kept server-side until it is
    answered or expires (leaving the page and coming back shows it again), or a button for a fresh one."""
    results = portal_selectors.identity_results(task)
    passed = next((r for r in results if r["passed"]), None)
    challenge = None if passed or task.status == task.Status.DONE else portal_selectors.open_challenge(task)
    shown = None
    if challenge is not None:
        shown = {
            "message": inspectors.identity_message(task.chip.serial, challenge.nonce).decode(),
            "expires_at": challenge.expires_at,
        }
    return {
        "identity_results": results,
        "identity_passed": passed,
        "challenge": shown,
        "identity_form": IdentityForm(initial={"nonce": challenge.nonce}) if challenge else None,
    }


def _act(request, body, task, context):
    action = request.POST.get("action")
    if task.status == task.Status.DONE:  # its findings are on the ledger: nothing more to do (a stale page)
        raise ValidationError({"task": "is done: its findings are recorded, nothing more is taken"})
    if action == "accept":
        inspectors.task_accept(task, body)
        messages.success(request, "Task accepted.")
    elif action == "challenge":
        inspectors.identity_challenge_issue(task, body)  # kept server-side: the page shows it until answered
        messages.success(request, "Challenge issued: have the chip sign the message below.")
    elif action == "identity":
        form = IdentityForm(request.POST)
        if form.is_valid():
            outcome = inspectors.identity_answer_check(task, body, **form.cleaned_data)
            (messages.success if outcome["passed"] else messages.error)(
                request, "Identity verified." if outcome["passed"] else f"Identity check failed: {outcome['reason']}"
            )
    elif action == "log":
        form = LogForm(request.POST, request.FILES)
        if form.is_valid():
            inspectors.snapshot_log_upload(task, body, _log_text(form.cleaned_data["log"]))
            messages.success(request, "Log uploaded; it is being checked.")
        else:
            raise ValidationError(form.errors)
    elif action == "finding":
        form = FindingForm(request.POST)
        if not form.is_valid():
            context["finding_form"] = form
            return None
        inspectors.finding_submit(task, body, form.finding())
        messages.success(request, "Finding recorded on the ledger.")
    return redirect("portal:task", task.pk)
