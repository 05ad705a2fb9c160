"""Work left pending: each worker start is counted, and a beat sweep re-sends or fails what has no result.

A claim or log stays "pending" only while a worker owes it a verdict. If the message was lost (the broker
restarted before it was sent, a worker died holding it) the sweep re-sends it after ``PENDING_DEADLINE``;
one a worker started ``PENDING_MAX_ATTEMPTS`` times without a verdict (it kills its worker) is failed with
an alert instead. Re-sending is safe: recording is idempotent (one result per claim, one verdict per log).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F

from .. import queue
from ..models import Claim, SnapshotLog
from .claims import claim_result_record
from .inspectors import snapshot_log_record, unchecked_problem


def attempt_started(model: type[Claim] | type[SnapshotLog], pk: int) -> None:
    """A worker starts on a claim or log: count it (in its own commit, so a killed worker still counts)."""
    model.objects.filter(pk=pk).update(attempts=F("attempts") + 1)


def pending_sweep(now: datetime) -> dict:
    """Re-send or fail every claim and log pending since before the deadline; returns the counts."""
    cutoff = now - timedelta(seconds=settings.INSPECTIONS_PENDING_DEADLINE)
    counts = {"requeued": 0, "failed": 0}
    logs = SnapshotLog.objects.filter(status=SnapshotLog.Status.PENDING, queued_at__lt=cutoff)
    for log_id in logs.values_list("pk", flat=True):
        counts[_log_overdue(log_id, now)] += 1
    claims = Claim.objects.filter(result=Claim.Result.PENDING, queued_at__lt=cutoff)
    for claim_id in claims.values_list("pk", flat=True):
        counts[_claim_overdue(claim_id, now)] += 1
    return counts


@transaction.atomic
def _log_overdue(log_id: int, now: datetime) -> str:
    log = SnapshotLog.objects.select_for_update(no_key=True).get(pk=log_id)
    if log.attempts >= settings.INSPECTIONS_PENDING_MAX_ATTEMPTS:
        detail = f"no verdict after {log.attempts} attempts (the check kills its worker?)"
        snapshot_log_record(log, [unchecked_problem(detail)], [])
        return "failed"
    SnapshotLog.objects.filter(pk=log_id).update(queued_at=now)
    queue.enqueue_log_check(log_id)
    return "requeued"


@transaction.atomic
def _claim_overdue(claim_id: int, now: datetime) -> str:
    claim = Claim.objects.select_for_update(no_key=True).get(pk=claim_id)
    if claim.attempts >= settings.INSPECTIONS_PENDING_MAX_ATTEMPTS:
        claim_result_record(claim_id, None, "timeout")  # no result in time: the verifier never finished
        return "failed"
    Claim.objects.filter(pk=claim_id).update(queued_at=now)
    queue.enqueue_claim_verification(claim_id)
    return "requeued"
