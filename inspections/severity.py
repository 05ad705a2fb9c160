"""How much each kind of alert threatens the rule: the inbox's and the dashboard's severity."""

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
    Alert.Kind.DRAW_FAILED: "high",  # no draw, no inspection: the rule goes unenforced for that campaign
}
SEVERITIES = ("high", "medium", "low")


def kinds_of_severity(severity: str) -> list[str]:
    return [kind for kind, level in SEVERITY.items() if level == severity]
