"""Celery tasks of the inspections app: thin wrappers over services (docs/ARCHITECTURE.md, Writes and reads)."""

from celery import shared_task
from django.utils import timezone

from .models import AlertNotification, Claim, SnapshotLog
from .services import campaigns, claims, inspectors, notifications, pending, sweeps


@shared_task(name="inspections.tasks.draw_due_campaigns")
def draw_due_campaigns() -> list[str]:
    """Beat: draw every active campaign whose current period has not been drawn yet."""
    return campaigns.campaigns_draw_due(timezone.now().date())


@shared_task(name="inspections.tasks.check_snapshot_log", acks_late=True, reject_on_worker_lost=True)
def check_snapshot_log(log_id: int) -> str:
    """Check an uploaded firmware log; the verdict lands on the ledger."""
    pending.attempt_started(SnapshotLog, log_id)
    return inspectors.snapshot_log_check(log_id)


@shared_task(name="inspections.tasks.sweep")
def sweep() -> dict:
    """Beat: overdue inspections, lost chips and unanswered snapshots become alerts; overdue claim retries are re-sent."""
    today = timezone.now().date()
    return {
        "claim_retries": claims.claim_retries_enqueue(timezone.now()),
        "overdue": sweeps.overdue_sweep(today),
        "lost": sweeps.lost_chip_sweep(),
        "unanswered": sweeps.unanswered_sweep(today),
    }


@shared_task(name="inspections.tasks.verify_claim", acks_late=True, reject_on_worker_lost=True)
def verify_claim(claim_id: int) -> str:
    """Replay the prover's transcript for one claim in a bounded subprocess; the result lands on the ledger."""
    pending.attempt_started(Claim, claim_id)
    return claims.claim_verify(claim_id)


@shared_task(name="inspections.tasks.sweep_pending")
def sweep_pending() -> dict:
    """Beat: claims and logs pending past the deadline are re-sent, or failed with an alert."""
    return pending.pending_sweep(timezone.now())


@shared_task(name="inspections.tasks.reverify_coverage")
def reverify_coverage() -> int:
    """Beat: each run below its coverage target gets one claim re-verified (bounded work per run per interval)."""
    return claims.coverage_reverifications_enqueue()


@shared_task(name="inspections.tasks.reverify_coverage_claim", acks_late=True, reject_on_worker_lost=True)
def reverify_coverage_claim(claim_id: int) -> str:
    """Replay more of one verified claim's run; the result lands on the ledger (claim.reverified)."""
    return claims.claim_coverage_reverify(claim_id)


@shared_task(bind=True, name="inspections.tasks.deliver_alert_notice", acks_late=True, max_retries=None)
def deliver_alert_notice(self, notice_id: int) -> bool:
    """Email or post (signed) one notice of a high alert; a failure is recorded and retried with backoff (the tries
    are counted on the notice, which bounds them). True: the notice is delivered."""
    notice = notifications.notice_deliver(notice_id)
    if notice.state == AlertNotification.State.RETRYING:
        raise self.retry(countdown=max(0.0, (notice.next_try_at - timezone.now()).total_seconds()))
    return notice.state == AlertNotification.State.SENT


@shared_task(name="inspections.tasks.resend_alert_notices")
def resend_alert_notices() -> dict:
    """Beat: notices whose message was lost are re-sent; those out of tries are given up."""
    return notifications.notices_resend(timezone.now())
