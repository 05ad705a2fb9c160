"""Alert triage from the desk's alert page: the inspections service that moves the alert's case through its
states (``inspections.case_states``) and records each step on the ledger. (The inbox's bulk actions call
``inspections.services.alerts.alerts_act`` from the inspections admin.)"""

from __future__ import annotations

from inspections.models import Alert
from inspections.services.alerts import ACTIONS, alert_act, triage_staff

TRIAGE_ACTIONS = tuple(ACTIONS)


def alert_triage(alert: Alert, *, by: str, action: str, reason: str = "", assignee: str = "") -> Alert:
    """One ``alert.updated`` entry by the regulator, ``by`` (a username) acting; a ValidationError names the field."""
    return alert_act(alert, by=by, action=action, reason=reason, assignee=assignee)


def triage_assignees() -> list[str]:
    """Who an alert may be assigned to: the staff users who may triage."""
    return triage_staff()
