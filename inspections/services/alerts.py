"""Alerts: something the regulator must look at, raised on the ledger (``alert.raised``)."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q

from ledger import services as ledger
from registry.models import Chip, Organisation

from ..case_states import ACTIONS, CLOSED, NEEDS_REASON, case_transition
from ..models import Alert, AlertAction, CaseText, InspectionTask
from .casefiles import case_text_commit
from .notifications import alert_notices_queue
from .validation import fail

__all__ = ["ACTIONS", "CLOSED", "alert_act", "alert_raise", "alerts_act", "triage_staff"]


def alert_raise(
    kind: str,
    prover: Organisation,
    detail: str,
    chip: Chip | None = None,
    task: InspectionTask | None = None,
    actor: str = "system",
) -> Alert:
    payload = {
        "kind": kind,
        "prover": prover.slug,
        "chip": chip.serial if chip else None,
        "task": task.pk if task else None,
        "detail": detail,
    }
    entry = ledger.append_entry("alert.raised", payload, actor)
    alert = Alert.objects.create(
        kind=kind, prover=prover, chip=chip, task=task, detail=detail, raised_seq=entry.seq, raised_at=entry.time
    )
    alert_notices_queue(alert)  # high alerts: email and webhook, sent by the worker after commit
    return alert


MAX_REASON = 2000


@transaction.atomic
def alert_act(
    alert: Alert, *, action: str, by: str, reason: str = "", assignee: str = "", actor: str = "regulator"
) -> Alert:
    """One step of the alert's case (``case_states``): one ``alert.updated`` entry, or a ValidationError naming
    the field and why, with nothing written.

    ``by`` is the person (username) acting for ``actor`` (the organisation on the ledger). Closing, dismissing,
    reopening and commenting need a reason; assign needs an assignee, an active staff user who may triage. The
    reason and the assignee are private case text: the entry carries their salted commitments, and the state it
    moved the case ``from`` (the alert row is locked, so two people acting at once are served one after the other:
    the second sees the first one's state and is refused if the step no longer applies).
    """
    alert = Alert.objects.select_for_update(no_key=True).get(pk=alert.pk)
    before = alert.state
    state = case_transition(before, action)
    reason, assignee, by = (
        _text(value, name) for value, name in ((reason, "reason"), (assignee, "assignee"), (by, "by"))
    )
    if not by:
        fail("by", "name who acts")
    if action in NEEDS_REASON and not reason:
        fail("reason", f"say why ({action.replace('_', ' ')})")
    _assignee_check(alert, action, assignee)
    reason, assignee = case_text_commit(reason), case_text_commit(assignee)
    payload = {
        "alert": alert.raised_seq,
        "action": action,
        "by": by,
        "reason": reason,
        "assignee": assignee,
        "from": before,
        "state": state,
    }
    entry = ledger.append_entry("alert.updated", payload, actor)
    AlertAction.objects.create(
        alert=alert, action=action, by=by, reason=reason, assignee=assignee, state=state, seq=entry.seq, at=entry.time
    )
    alert.state, alert.updated_seq = state, entry.seq
    alert.assignee = assignee or alert.assignee
    alert.save(update_fields=["state", "assignee", "updated_seq"])
    return alert


def _assignee_check(alert: Alert, action: str, assignee: str) -> None:
    if action != "assign":
        if assignee:
            fail("assignee", f"only the assign action names an assignee, not {action.replace('_', ' ')}")
        return
    if not assignee:
        fail("assignee", "choose whom to assign the alert to")
    if assignee not in triage_staff():
        fail("assignee", f"{assignee!r} is not an active staff user who may triage alerts")
    current = CaseText.objects.filter(commitment=alert.assignee).values_list("text", flat=True).first()
    if current == assignee:
        fail("assignee", f"this alert is already assigned to {assignee}; nothing was changed")


def alerts_act(alerts, *, action: str, by: str, reason: str = "", assignee: str = "") -> dict[str, list]:
    """The same step on many alerts (the desk's bulk triage), each alert validated and written on its own: one
    refusal stops nothing else. ``{"done": [alert, ...], "refused": [(alert, why), ...]}``."""
    done, refused = [], []
    for alert in alerts:
        try:
            done.append(alert_act(alert, action=action, by=by, reason=reason, assignee=assignee))
        except ValidationError as error:
            refused.append((alert, "; ".join(error.messages)))
    return {"done": done, "refused": refused}


def triage_staff() -> list[str]:
    """Usernames an alert may be assigned to: active staff users who may triage (or superusers)."""
    perm = Q(user_permissions__codename="change_alert") | Q(groups__permissions__codename="change_alert")
    users = get_user_model().objects.filter(is_active=True, is_staff=True).filter(perm | Q(is_superuser=True))
    return sorted(set(users.values_list("username", flat=True)))


def _text(value, name: str) -> str:
    if not isinstance(value, str):
        fail(name, "must be text")
    value = value.strip()
    if "\x00" in value:
        fail(name, "must not contain NUL characters")
    if len(value) > (MAX_REASON if name == "reason" else 150):
        fail(name, "too long")
    return value


def alert_from_chip_notice(sender, *, kind: str, prover: str, serials: list[str], detail: str, **_signal) -> Alert:
    """The registry's ``chip_notice`` (received abroad, taken out of use) as an alert, in the registry's transaction."""
    chip = Chip.objects.filter(serial=serials[0]).first() if len(serials) == 1 else None
    return alert_raise(kind, Organisation.objects.get(slug=prover), detail, chip)
