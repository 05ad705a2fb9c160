import pytest
from django.contrib.auth import get_user_model

from inspections.demo_campaign import seed_inspections
from inspections.models import Alert, InspectionTask
from inspections.services.alerts import alert_raise
from registry.demo_registry import seed_demo
from tests.shared_world import seeded_once_per_module


def desk_world() -> dict:
    """The demo world (60 chips, a campaign drawn) with one alert about a drawn chip: their primary keys."""
    seed_demo("demo-pass-123", chips=60)
    seed_inspections()
    task = InspectionTask.objects.select_related("chip", "prover").order_by("pk").first()
    alert = alert_raise("overdue", task.prover, "inspection overdue", chip=task.chip, task=task)
    return {"task": task.pk, "alert": alert.pk}


desk_world_fixture = seeded_once_per_module(desk_world)


@pytest.fixture
def world(desk_world):
    """The desk world (seeded once per module), its task and alert read afresh for each test."""
    task = InspectionTask.objects.select_related("chip", "prover").get(pk=desk_world["task"])
    return {"task": task, "alert": Alert.objects.get(pk=desk_world["alert"]), "users": get_user_model().objects}


@pytest.fixture
def regulator(client, world):
    client.force_login(world["users"].get(username="regulator"))
    return client


@pytest.fixture
def auditor(client, world):
    client.force_login(world["users"].get(username="auditor"))
    return client
