"""Celery tasks of the inspections app: thin wrappers over services."""
from celery import shared_task
from django.utils import timezone

from . import services
from .models import Campaign, CampaignSeed, Draw, SnapshotLog


@shared_task(name="inspections.tasks.draw_due_campaigns")
def draw_due_campaigns() -> list[str]:
    """Beat: draw every active campaign whose current period has not been drawn yet.

    A period whose seed was never committed (the service was down through a whole
    period) gets its commitment now and is drawn on the next run, never in the same one.
    """
    today = timezone.now().date()
    done = []
    for campaign in Campaign.objects.order_by("slug"):
        period = services.campaign_period(campaign, today)
        if period is None or Draw.objects.filter(campaign=campaign, period=period).exists():
            continue
        if not CampaignSeed.objects.filter(campaign=campaign, period=period).exists():
            services.campaign_seed_commit(campaign, period)
            continue
        services.campaign_draw(campaign, period)
        done.append(f"{campaign.slug}:{period}")
    return done


@shared_task(name="inspections.tasks.check_snapshot_log", acks_late=True)
def check_snapshot_log(log_id: int) -> str:
    """Check an uploaded firmware log with replay's pure checker; the verdict lands on the ledger."""
    from replay.firmware import parse_record, verify_log  # replay only in tasks (DESIGN §2)

    log = SnapshotLog.objects.select_related("task__chip").get(pk=log_id)
    chip = log.task.chip
    lines = [line for line in log.text.splitlines() if line.strip()]
    problems = verify_log(lines, bytes(chip.public_key), serial=chip.serial)
    flagged = {p["line"] for p in problems if p["kind"] in ("malformed", "forged")}
    records = [parse_record(line) for n, line in enumerate(lines) if n not in flagged]
    return services.snapshot_log_record(log, problems, records).status


@shared_task(name="inspections.tasks.sweep")
def sweep() -> dict:
    """Beat: overdue inspections and lost chips become alerts."""
    return {"overdue": services.overdue_sweep(timezone.now().date()), "lost": services.lost_chip_sweep()}
