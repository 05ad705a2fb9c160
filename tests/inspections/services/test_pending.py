"""The pending sweep: claims and logs with no result past the deadline are re-sent, or failed with an alert."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from inspections.models import Alert, Claim, SnapshotLog
from inspections.services import claims, inspectors, pending
from inspections.tasks import check_snapshot_log
from ledger.models import Entry
from tests.inspections.factories import accepted
from tests.inspections.services.test_inspectors import a_task, firmware_log, with_chip_key

pytestmark = pytest.mark.django_db


@pytest.fixture
def stuck(draw, django_capture_on_commit_callbacks):
    """One pending log and one pending claim, both sent to the worker long before the deadline."""
    task = accepted(a_task("inspect-eu"))
    key = with_chip_key(task)
    with django_capture_on_commit_callbacks(execute=False):
        intact = inspectors.snapshot_log_upload(
            task, task.inspection_body, "\n".join(firmware_log(key, task.chip.serial, 2))
        )
    assert check_snapshot_log(intact.pk) == "intact"
    with django_capture_on_commit_callbacks(execute=False):
        log = inspectors.snapshot_log_upload(
            task, task.inspection_body, "\n".join(firmware_log(key, task.chip.serial, 3))
        )
        item = {"serial": task.chip.serial, "counter": 0, "run": "r", "step": 1, "manifest": "0" * 64, "location": "/x"}
        [claim] = claims.claims_submit(prover=task.prover, claims=[item])
    long_ago = timezone.now() - timedelta(seconds=settings.INSPECTIONS_PENDING_DEADLINE + 1)
    SnapshotLog.objects.filter(pk=log.pk).update(queued_at=long_ago)
    Claim.objects.filter(pk=claim.pk).update(queued_at=long_ago)
    return log, claim


def sweep(capture) -> tuple[dict, list]:
    with capture(execute=False) as sent:
        counts = pending.pending_sweep(timezone.now())
    return counts, sent


def test_work_pending_past_the_deadline_is_sent_again_once_per_deadline(stuck, django_capture_on_commit_callbacks):
    log, claim = stuck
    counts, sent = sweep(django_capture_on_commit_callbacks)
    assert counts == {"requeued": 2, "failed": 0} and len(sent) == 2
    assert sweep(django_capture_on_commit_callbacks)[0] == {"requeued": 0, "failed": 0}  # queued_at moved on
    log.refresh_from_db()
    claim.refresh_from_db()
    assert log.status == "pending" and claim.result == "pending"


def test_work_a_worker_started_too_often_is_failed_with_an_alert(stuck, settings, django_capture_on_commit_callbacks):
    log, claim = stuck
    for _ in range(settings.INSPECTIONS_PENDING_MAX_ATTEMPTS):
        pending.attempt_started(SnapshotLog, log.pk)
        pending.attempt_started(Claim, claim.pk)
    counts, _ = sweep(django_capture_on_commit_callbacks)
    assert counts == {"requeued": 0, "failed": 2}
    log.refresh_from_db()
    claim.refresh_from_db()
    assert log.status == "problems" and log.problems[0]["kind"] == "unchecked"
    assert Alert.objects.filter(kind="log_problems", task=log.task).exists()
    # A claim no worker could finish is the verifier's failure, never the prover's (docs/claims.md): an `error`
    # on the ledger, retried with backoff, with no alert against the prover.
    assert claim.result == "error" and claim.failures == 1 and claim.retry_at is not None
    assert Entry.objects.filter(kind="claim.verification_failed").count() == 1
    assert not Alert.objects.filter(kind="claim_failed", chip=claim.snapshot.chip).exists()
    assert sweep(django_capture_on_commit_callbacks)[0] == {"requeued": 0, "failed": 0}


def test_work_within_its_deadline_is_left_alone(stuck, django_capture_on_commit_callbacks):
    log, claim = stuck
    SnapshotLog.objects.filter(pk=log.pk).update(queued_at=timezone.now())
    Claim.objects.filter(pk=claim.pk).update(queued_at=timezone.now())
    assert sweep(django_capture_on_commit_callbacks)[0] == {"requeued": 0, "failed": 0}


def test_beat_runs_the_pending_sweep():
    entry = settings.CELERY_BEAT_SCHEDULE["inspections-pending"]
    assert entry["task"] == "inspections.tasks.sweep_pending" and entry["schedule"].total_seconds() > 0
    assert settings.CELERY_TASK_ACKS_LATE and settings.CELERY_TASK_REJECT_ON_WORKER_LOST
    assert settings.CELERY_WORKER_PREFETCH_MULTIPLIER == 1


def test_a_snapshot_answered_twice_in_one_request_is_a_400_naming_the_item(stuck):
    from django.core.exceptions import ValidationError

    _, claim = stuck
    snapshot = claim.snapshot.chip.snapshots.exclude(pk=claim.snapshot_id).first()
    item = {"serial": snapshot.chip.serial, "counter": snapshot.counter, "run": "r", "step": 1}
    item |= {"manifest": "0" * 64, "location": "/x"}
    with pytest.raises(ValidationError) as refused:
        claims.claims_submit(prover=claim.prover, claims=[item, dict(item)])
    assert list(refused.value.message_dict) == ["claims[1]"]
