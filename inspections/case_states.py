"""An alert's case as a state machine: which triage action may follow which state, refused in plain words.

    open ──acknowledge──▶ acknowledged ──investigate──▶ investigating
      └──────────────────investigate───────────────────▶┘
    open / acknowledged / investigating ──resolve──▶ resolved
                                        ──dismiss──▶ dismissed (also: false positive, superseded)
    resolved / dismissed / false positive / superseded ──reopen──▶ open

``assign`` and ``comment`` keep the state: assign while the case is open, comment at any time. The live write
(``services.alerts.alert_act``) and the rebuild from the ledger share this table. Entries written before the
machine (they carry no ``from``) replay by the older, looser rule of ``legacy_next_state``.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError

from .models import Alert

S = Alert.State
OPEN = frozenset({S.OPEN, S.ACKNOWLEDGED, S.INVESTIGATING})
CLOSED = frozenset({S.RESOLVED, S.DISMISSED, S.FALSE_POSITIVE, S.SUPERSEDED})
ANY = OPEN | CLOSED

# action -> (the states it may follow, the state it leads to; None keeps the state)
TRANSITIONS: dict[str, tuple[frozenset, str | None]] = {
    "acknowledge": (frozenset({S.OPEN}), S.ACKNOWLEDGED),
    "investigate": (frozenset({S.OPEN, S.ACKNOWLEDGED}), S.INVESTIGATING),
    "assign": (OPEN, None),
    "comment": (ANY, None),
    "resolve": (OPEN, S.RESOLVED),
    "dismiss": (OPEN, S.DISMISSED),
    "false_positive": (OPEN, S.FALSE_POSITIVE),
    "supersede": (OPEN, S.SUPERSEDED),
    "reopen": (CLOSED, S.OPEN),
}
ACTIONS = tuple(TRANSITIONS)
NEEDS_REASON = frozenset({"comment", "resolve", "dismiss", "false_positive", "supersede", "reopen"})
BULK_ACTIONS = ("acknowledge", "investigate", "assign", "resolve", "dismiss")


def case_transition(current: str, action: str) -> str:
    """The state ``action`` leads to from ``current``; a ValidationError on ``action`` says why not, in words."""
    if action not in TRANSITIONS:
        raise ValidationError({"action": f"must be one of {', '.join(ACTIONS)}"})
    allowed, target = TRANSITIONS[action]
    if current not in allowed:
        raise ValidationError({"action": refusal(current, action)})
    return target or current


def refusal(current: str, action: str) -> str:
    """Why ``action`` cannot follow ``current``, as a regulator would say it."""
    shown = S(current).label.lower()
    if action == "acknowledge" and current == S.ACKNOWLEDGED:
        return "this alert is already acknowledged; nothing was changed"
    if action in ("acknowledge", "investigate") and current == S.INVESTIGATING:
        return "this alert is already under investigation; nothing was changed"
    if action == "reopen":
        return f"this alert is still open ({shown}); only a closed alert can be reopened"
    if current in CLOSED:
        return f"this alert is closed ({shown}); reopen it first, with a reason, to {action.replace('_', ' ')} it"
    return f"{action.replace('_', ' ')} does not apply to an alert that is {shown}"


LEGACY_TARGETS = {
    "acknowledge": S.ACKNOWLEDGED,
    "assign": None,
    "comment": None,
    "resolve": S.RESOLVED,
    "false_positive": S.FALSE_POSITIVE,
    "supersede": S.SUPERSEDED,
}


def legacy_next_state(current: str, action: str) -> str:
    """The rule of entries written before the state machine: any action on an open alert, comments on a closed one."""
    if action not in LEGACY_TARGETS:
        raise ValidationError({"action": f"{action!r} is not an action of an entry without 'from'"})
    target = LEGACY_TARGETS[action]
    if target is not None and current in CLOSED:
        raise ValidationError({"action": f"the alert is already {current}; only comments can be added"})
    return target or current
