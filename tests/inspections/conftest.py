"""A drawn campaign over the inspections world of tests/inspections/factories.py."""

import pytest
from django.utils import timezone

from inspections.services import campaigns
from tests.inspections.factories import H100, YEAR, make_provers


@pytest.fixture
def draw():
    make_provers()
    campaign = campaigns.campaign_create(
        slug="c1", provers=["owner-a", "owner-b"], rule_flops=20 * H100 * YEAR, starts_on=timezone.now().date()
    )
    return campaigns.campaign_draw(campaign, 0)
