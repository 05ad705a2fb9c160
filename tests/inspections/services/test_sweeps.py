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
    assert sweeps.lost_chip_sweep() == 1 and sweeps.lost_chip_sweep() == 0
    assert Alert.objects.get(kind="lost").chip == chip
