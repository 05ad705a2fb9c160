"""How much each kind of alert threatens the rule: the inbox's and the dashboard's severity, and the hours the
regulator gives itself to close an alert of each severity (``ALERT_SLA_HOURS``)."""

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q

from inspections.case_states import OPEN
from inspections.models import Alert

SEVERITY = {
    Alert.Kind.IDENTITY_FAILED: "high",
    Alert.Kind.LOG_PROBLEMS: "high",
    Alert.Kind.CLAIM_FAILED: "high",
    Alert.Kind.NOT_FOUND: "high",
    Alert.Kind.REFUSED: "high",
    Alert.Kind.LOST: "high",
    Alert.Kind.OVERDUE: "medium",
    Alert.Kind.UNANSWERED: "medium",
    Alert.Kind.UNASSIGNED: "low",
    Alert.Kind.CLOCK_AHEAD: "low",  # an honest chip's wrong clock looks the same: the regulator asks, not accuses
    Alert.Kind.DRAW_FAILED: "high",  # no draw, no inspection: the rule goes unenforced for that campaign
}
SEVERITIES = ("high", "medium", "low")
DEFAULT = "low"  # a kind not listed above


def severity_of(kind: str) -> str:
    return SEVERITY.get(kind, DEFAULT)


def kinds_of_severity(severity: str) -> list[str]:
    return [kind for kind, level in SEVERITY.items() if level == severity]


def severity_q(severity: str) -> Q:
    """Alerts of ``severity`` (the default level takes every kind not listed too)."""
    found = Q(kind__in=kinds_of_severity(severity))
    return found | ~Q(kind__in=list(SEVERITY)) if severity == DEFAULT else found


def sla_hours(severity: str) -> float:
    return float(settings.ALERT_SLA_HOURS[severity])


def sla_deadline(kind: str, raised_at: datetime) -> datetime:
    """When an alert of ``kind`` raised at ``raised_at`` should be closed (resolved or dismissed)."""
    return raised_at + timedelta(hours=sla_hours(severity_of(kind)))


def past_sla_q(now: datetime) -> Q:
    """Open alerts (open, acknowledged, under investigation) raised longer ago than their severity's SLA."""
    late = Q()
    for level in SEVERITIES:
        late |= severity_q(level) & Q(raised_at__lt=now - timedelta(hours=sla_hours(level)))
    return Q(state__in=list(OPEN)) & late
