"""Alerts: something the regulator must look at, raised on the ledger (``alert.raised``)."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Q

from ledger import services as ledger
from registry.models import Chip, Organisation

from ..models import Alert, AlertAction, InspectionTask
from .casefiles import case_text_commit
from .validation import fail


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
    return Alert.objects.create(
        kind=kind, prover=prover, chip=chip, task=task, detail=detail, raised_seq=entry.seq, raised_at=entry.time
    )


# Triage: what each action does to the alert's state. Closed alerts take comments only.
ACTIONS = {
    "acknowledge": Alert.State.ACKNOWLEDGED,
    "assign": None,  # keeps the state, sets the assignee
    "comment": None,
    "resolve": Alert.State.RESOLVED,
    "false_positive": Alert.State.FALSE_POSITIVE,
    "supersede": Alert.State.SUPERSEDED,
}
CLOSED = {Alert.State.RESOLVED, Alert.State.FALSE_POSITIVE, Alert.State.SUPERSEDED}
MAX_REASON = 2000


def alert_next_state(current: str, action: str) -> str:
    """The state after ``action`` (pure: the live write and the rebuild share it). Raises ValidationError."""
    if action not in ACTIONS:
        fail("action", f"must be one of {sorted(ACTIONS)}")
    target = ACTIONS[action]
    if target is not None and current in CLOSED:
        fail("action", f"the alert is already {current}; only comments can be added")
    return target or current


@transaction.atomic
def alert_act(
    alert: Alert, *, action: str, by: str, reason: str = "", assignee: str = "", actor: str = "regulator"
) -> Alert:
    """Acknowledge, assign, comment, resolve, mark false positive or superseded: one ``alert.updated`` entry each.

    ``by`` is the person (username) acting for ``actor`` (the organisation on the ledger). Every action but
    acknowledge and assign needs a reason; assign needs an assignee, an active staff user who may triage.
    The reason and the assignee are private case text: the entry carries their salted commitments.
    """
    alert = Alert.objects.select_for_update().get(pk=alert.pk)
    state = alert_next_state(alert.state, action)
    reason, assignee, by = (
        _text(value, name) for value, name in ((reason, "reason"), (assignee, "assignee"), (by, "by"))
    )
    if not by:
        fail("by", "name who acts")
    if action not in ("acknowledge", "assign") and not reason:
        fail("reason", f"say why ({action})")
    if (action == "assign") != bool(assignee):
        fail("assignee", "required to assign, and only then")
    if assignee and assignee not in triage_staff():
        fail("assignee", "must be the username of an active staff user who may triage alerts")
    reason, assignee = case_text_commit(reason), case_text_commit(assignee)
    payload = {
        "alert": alert.raised_seq,
        "action": action,
        "by": by,
        "reason": reason,
        "assignee": assignee,
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
