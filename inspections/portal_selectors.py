"""What the inspector's portal reads: a body's tasks by view (open, due, done), a task's open challenge and
its identity results. (Kept apart from ``selectors`` so the portal's reads are in one place.)"""

from __future__ import annotations

from datetime import date, timedelta

from django.db.models import QuerySet
from django.utils import timezone

from registry.models import Organisation

from . import selectors
from .models import IdentityChallenge, IdentityCheck, InspectionTask

DUE_WITHIN_DAYS = 7
IDENTITY_ROWS = 50
OPEN = (InspectionTask.Status.ASSIGNED, InspectionTask.Status.ACCEPTED, InspectionTask.Status.OVERDUE)
VIEWS = {
    "open": "open (not done)",
    "due": f"due within {DUE_WITHIN_DAYS} days or overdue",
    "done": "done",
    "all": "all",
}


def tasks_in_view(body: Organisation, view: str, today: date | None = None) -> QuerySet[InspectionTask]:
    """The body's tasks in one view; the earliest due first (done tasks: the latest first)."""
    today = today or timezone.localdate()
    tasks = selectors.tasks_of(body)
    if view == "open":
        return tasks.filter(status__in=OPEN)
    if view == "due":
        return tasks.filter(status__in=OPEN, due_on__lte=today + timedelta(days=DUE_WITHIN_DAYS))
    if view == "done":
        return tasks.filter(status=InspectionTask.Status.DONE).order_by("-due_on", "-id")
    return tasks


def task_counts(body: Organisation, today: date | None = None) -> dict[str, int]:
    return {view: tasks_in_view(body, view, today).count() for view in VIEWS}


def open_challenge(task: InspectionTask) -> IdentityChallenge | None:
    """The task's latest challenge still waiting for the chip's answer: it survives leaving the page."""
    return (
        IdentityChallenge.objects.filter(task=task, answered=False, expires_at__gt=timezone.now())
        .order_by("-issued_at", "-id")
        .first()
    )


def identity_results(task: InspectionTask) -> list[dict]:
    """The task's identity checks as the ledger records them: seq, time, passed, reason (from their projection,
    by task: no scan of the ledger for the kind)."""
    checks = IdentityCheck.objects.filter(task=task).order_by("seq")[:IDENTITY_ROWS]
    return [{"seq": c.seq, "time": c.checked_at, "passed": c.passed, "reason": c.reason} for c in checks]
