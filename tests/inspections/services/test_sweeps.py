"""Sweeps: overdue inspections and lost chips become alerts, once each."""

from datetime import timedelta

import pytest
from django.utils import timezone

from inspections.models import Alert, InspectionTask
from inspections.services import sweeps
from registry.models import Chip
from tests.registry.factories import event

pytestmark = pytest.mark.django_db


def test_overdue_tasks_and_lost_chips_raise_alerts_once(draw):
    later = timezone.now().date() + timedelta(days=30)
    overdue = sweeps.overdue_sweep(later)
    assert overdue == InspectionTask.objects.filter(status="overdue").count() > 0
    assert sweeps.overdue_sweep(later) == 0
    chip = Chip.objects.filter(owner__slug="owner-a").select_related("owner").first()
    event(chip.owner, "reported_stolen", [chip.serial])
    # The report raises its alert at once (registry's chip_notice); the sweep is the safety net and adds none.
    assert Alert.objects.get(kind="lost").chip == chip
    assert sweeps.lost_chip_sweep() == 0


def test_each_chip_reported_lost_gets_its_alert_at_once(draw):
    chips = list(Chip.objects.filter(owner__slug="owner-a").select_related("owner")[:3])
    event(chips[0].owner, "reported_lost", [chip.serial for chip in chips])
    alerted = set(Alert.objects.filter(kind="lost").values_list("chip__serial", flat=True))
    assert alerted == {chip.serial for chip in chips}
    assert sweeps.lost_chip_sweep() == 0
