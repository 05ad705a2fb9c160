"""Work handed to the Celery worker after the transaction commits.

Tasks are sent by name, so services never import the task module (which imports them).
"""

from __future__ import annotations

from celery import current_app
from django.db import transaction

CHECK_SNAPSHOT_LOG = "inspections.tasks.check_snapshot_log"
VERIFY_CLAIM = "inspections.tasks.verify_claim"


def _enqueue(name: str, *args, countdown: float | None = None) -> None:
    later = {} if countdown is None else {"countdown": countdown}
    transaction.on_commit(lambda: current_app.send_task(name, args=args, **later))


def enqueue_log_check(log_id: int) -> None:
    _enqueue(CHECK_SNAPSHOT_LOG, log_id)


def enqueue_claim_verification(claim_id: int, countdown: float | None = None) -> None:
    """Verify a claim now, or (a retry after the verifier failed) ``countdown`` seconds from now."""
    _enqueue(VERIFY_CLAIM, claim_id, countdown=countdown)
