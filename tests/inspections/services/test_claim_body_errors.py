"""A claims body with the wrong keys is refused once per problem, naming each unknown and missing key."""

import pytest
from django.core.exceptions import ValidationError

from inspections.models import Claim
from inspections.services import claims
from ledger.models import Entry
from tests.registry.factories import organisation

pytestmark = pytest.mark.django_db

RECORDED = {"serial": "H000001", "counter": 0, "shard": 0, "hash": "ab" * 32, "step": 3, "time": "2026-01-01T00:00:00Z"}
GOOD = {"serial": "H000001", "counter": 0, "run": "run-6", "step": 3, "manifest": "ab" * 32, "location": "/t"}


def refusal(items) -> dict:
    prover, _ = organisation("lab-x", ["owner"], "US")
    entries = Entry.objects.count()
    with pytest.raises(ValidationError) as caught:
        claims.claims_submit(prover=prover, claims=items)
    assert Entry.objects.count() == entries and not Claim.objects.exists()
    return caught.value.message_dict


def test_the_recorders_file_posted_as_is_is_one_error_naming_the_keys_and_the_command():
    errors = refusal([dict(RECORDED, counter=n) for n in range(25)])
    assert list(errors) == ["claims[0-24]"]
    problem, hint = errors["claims[0-24]"]
    assert problem == "unknown keys shard, hash, time; missing run, manifest, location"
    assert "python -m replay claim" in hint


def test_items_with_different_problems_are_named_each_with_its_own_keys():
    errors = refusal([GOOD, {k: v for k, v in GOOD.items() if k != "run"}, dict(GOOD, colour="red"), "x"])
    assert errors == {
        "claims[1]": ["missing run"],
        "claims[2]": ["unknown key colour"],
        "claims[3]": ["must be an object with the keys serial, counter, run, step, manifest, location"],
    }


def test_scattered_items_with_one_problem_are_listed_once():
    items = [GOOD, dict(GOOD, x=1), GOOD, dict(GOOD, x=1)]
    assert refusal(items) == {"claims[1,3]": ["unknown key x"]}


@pytest.mark.parametrize("field, value", [("counter", -1), ("step", True), ("counter", "3"), ("step", 1.5)])
def test_a_bad_number_names_its_field_and_value(field, value):
    errors = refusal([dict(GOOD, **{field: value})])
    assert errors["claims[0]"][0].startswith(f"{field} must be a non-negative integer")


@pytest.mark.parametrize("serial", [["a"], {"a": 1}, 5, None, True, 1.5, "", "x" * 65])
def test_a_serial_that_is_no_chip_serial_is_named_as_such(serial):
    errors = refusal([dict(GOOD, serial=serial)])
    assert list(errors) == ["claims[0]"] and errors["claims[0]"][0].startswith("serial is the chip's serial")
