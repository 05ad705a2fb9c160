"""A drawn campaign over the inspections world of tests/inspections/factories.py; a small real transcript."""

import subprocess
import sys

import pytest
from django.conf import settings
from django.utils import timezone

from inspections.models import Draw
from inspections.services import campaigns
from tests.inspections.factories import H100, YEAR, make_provers
from tests.shared_world import seeded_once_per_module


def inspections_draw() -> int:
    """The inspections world with campaign c1 over both provers drawn for its first period: the draw's key."""
    make_provers()
    campaign = campaigns.campaign_create(
        slug="c1", provers=["owner-a", "owner-b"], rule_flops=20 * H100 * YEAR, starts_on=timezone.now().date()
    )
    return campaigns.campaign_draw(campaign, 0).pk


inspections_draw_fixture = seeded_once_per_module(inspections_draw)


def inspections_provers() -> None:
    """The inspections world of tests/inspections/factories.py, nothing drawn."""
    make_provers()


inspections_provers_fixture = seeded_once_per_module(inspections_provers)


@pytest.fixture
def draw(inspections_draw):
    """The drawn world (seeded once per module), its draw read afresh for each test."""
    return Draw.objects.get(pk=inspections_draw)


@pytest.fixture(scope="module")
def transcript(tmp_path_factory):
    """One small real transcript (MLP, 20 steps, 2 chips), recorded once for the module."""
    out = tmp_path_factory.mktemp("run") / "mlp-run"
    subprocess.run(
        [sys.executable, "-m", "replay", "record", "--arch", "mlp", "--steps", "20", "--chips", "2", "--out", str(out)],
        check=True,
        cwd=settings.BASE_DIR,
        capture_output=True,
    )
    return out
