"""Celery tasks of the inspections app: thin wrappers over services."""
from celery import shared_task
from django.utils import timezone

from . import services
from .models import Campaign, CampaignSeed, Draw


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
