"""The inspections part of the demo world: an inspection body and a campaign with its first draw."""

from django.db import transaction
from django.utils import timezone

from .models import Campaign
from .services import bodies, campaigns

DEMO_CAMPAIGN = "frontier-runs-2026"
RULE_FLOPS = 1e24  # the demo rule: no undeclared training run of 10^24 FLOPs or more


@transaction.atomic
def seed_inspections() -> None:
    if Campaign.objects.filter(slug=DEMO_CAMPAIGN).exists():
        return
    bodies.inspection_body_register(
        organisation="inspect-eu", countries=["NL", "DE", "US", "AE", "TW"], capacity_per_period=200
    )
    campaign = campaigns.campaign_create(
        slug=DEMO_CAMPAIGN,
        provers=["owner-a", "owner-b", "owner-c"],
        rule_flops=RULE_FLOPS,
        starts_on=timezone.now().date(),
    )
    campaigns.campaign_draw(campaign, 0)
