"""rebuild_projections --check: the registry equals its rebuild from the ledger after the demo seed,
and a projection changed behind the ledger's back is reported."""

import io

import pytest
from django.core.management import call_command

from registry.demo_registry import seed_demo
from registry.models import Chip, ChipEvent, Facility

pytestmark = pytest.mark.django_db


@pytest.fixture
def demo():
    seed_demo("demo-pass-123", chips=120)


def check() -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("rebuild_projections", "--check", stdout=out, stderr=err)
    except SystemExit as exit_:
        return exit_.code, out.getvalue() + err.getvalue()
    return 0, out.getvalue()


def test_demo_seed_equals_its_rebuild(demo):
    code, output = check()
    assert code == 0, output
    assert "120 chips" in output


@pytest.mark.parametrize(
    "tamper, expected",
    [
        (lambda: Chip.objects.filter(serial="A000003").update(status="destroyed"), "chip A000003"),
        (
            lambda: Chip.objects.filter(serial="B000001").update(owner=Chip.objects.get(serial="A000001").owner),
            "chip B000001",
        ),
        (
            lambda: ChipEvent.objects.filter(chip__serial="A000005").order_by("-seq").first().delete(),
            "chip history A000005",
        ),
        (lambda: Facility.objects.filter(slug="dc-owner-a-or").update(country="CA"), "facility dc-owner-a-or"),
        (lambda: Chip.objects.filter(serial="A000007").update(packaged=False), "chip A000007"),
    ],
)
def test_a_projection_changed_behind_the_ledger_is_reported(demo, tamper, expected):
    tamper()
    code, output = check()
    assert code == 1 and expected in output, output
