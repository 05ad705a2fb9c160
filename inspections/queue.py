"""Work handed to the Celery worker after the transaction commits: the one queueing helper of the project.

Tasks are sent by name, so services never import the task module (which imports them). The inspections
services queue log checks and claim verifications here; the desk queues its jobs through ``enqueue_after_commit``.
"""

from __future__ import annotations

from celery import current_app
from django.conf import settings
from django.db import transaction

CHECK_SNAPSHOT_LOG = "inspections.tasks.check_snapshot_log"
VERIFY_CLAIM = "inspections.tasks.verify_claim"
REVERIFY_COVERAGE_CLAIM = "inspections.tasks.reverify_coverage_claim"
DELIVER_ALERT_NOTICE = "inspections.tasks.deliver_alert_notice"


def enqueue_after_commit(
    name: str, *args, countdown: float | None = None, queue: str | None = None, on_failure=None
) -> None:
    """Send the task ``name`` once the current transaction commits (never for a rolled-back one); ``countdown``
    seconds later, on ``queue`` (else the default queue). ``on_failure(error)``, if given, answers a broker that
    refuses the message (the work is committed: it must be marked, not lost behind a 500)."""
    options = {key: value for key, value in (("countdown", countdown), ("queue", queue)) if value is not None}

    def send() -> None:
        try:
            current_app.send_task(name, args=args, **options)
        except Exception as error:
            if on_failure is None:
                raise
            on_failure(error)

    transaction.on_commit(send)


def enqueue_log_check(log_id: int) -> None:
    enqueue_after_commit(CHECK_SNAPSHOT_LOG, log_id)


def enqueue_claim_verification(claim_id: int, countdown: float | None = None, larger_worker: bool = False) -> None:
    """Verify a claim now, or (a retry after the verifier failed) ``countdown`` seconds from now; on
    REPLAY_LARGE_QUEUE, where one is set, when only a worker with larger budgets could (``larger_worker``)."""
    large = settings.REPLAY_LARGE_QUEUE if larger_worker else ""
    enqueue_after_commit(VERIFY_CLAIM, claim_id, countdown=countdown, queue=large or None)


def enqueue_coverage_reverification(claim_id: int) -> None:
    """Replay more of a verified claim's run (its coverage is below target)."""
    enqueue_after_commit(REVERIFY_COVERAGE_CLAIM, claim_id)
