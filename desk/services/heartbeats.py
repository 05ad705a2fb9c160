"""Heartbeats of the periodic tasks: beat sends them, a worker runs them; each run to its end is recorded.

A task that has not run for two of its intervals (plus ``HEALTH_HEARTBEAT_GRACE`` seconds) means beat
stopped sending or no worker is taking work (a wedged pool, a dead broker): ``/healthz`` answers 503 naming
it. Before the first heartbeat of any task (a fresh deployment, the tests) nothing is stale; after it, a
task that never ran is counted from that first sign of life.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone

from ..models import Heartbeat


def periodic_intervals() -> dict[str, float]:
    """Task name -> seconds between runs, from beat's schedule."""
    out = {}
    for entry in settings.CELERY_BEAT_SCHEDULE.values():
        schedule = entry["schedule"]
        seconds = schedule.total_seconds() if isinstance(schedule, timedelta) else float(schedule)
        out[entry["task"]] = seconds
    return out


def heartbeat_record(task: str, state: str) -> None:
    """Called by the worker after each run of a periodic task (desk.apps connects it to task_postrun)."""
    if task not in periodic_intervals():
        return
    try:
        Heartbeat.objects.update_or_create(
            task=task, defaults={"last_run_at": timezone.now(), "last_state": str(state)[:16]}
        )
    except DatabaseError:  # the database is down: /healthz says so on its own
        return


def stale_tasks(now: datetime | None = None) -> list[str]:
    """'<task>: last ran N s ago, every M s' for each periodic task two intervals overdue."""
    now = now or timezone.now()
    beats = dict(Heartbeat.objects.values_list("task", "last_run_at"))
    if not beats:
        return []
    first_sign_of_life = min(beats.values())
    stale = []
    for task, interval in sorted(periodic_intervals().items()):
        last = beats.get(task, first_sign_of_life)
        age = (now - last).total_seconds()
        if age > 2 * interval + settings.HEALTH_HEARTBEAT_GRACE:
            ran = "never ran" if task not in beats else f"last ran {age:.0f} s ago"
            stale.append(f"{task}: {ran}, every {interval:.0f} s")
    return stale
