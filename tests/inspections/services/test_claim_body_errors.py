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


@pytest.mark.parametrize(
    "location, reason",
    [
        ("https://user:secretpass@example.org/t/", "must not carry credentials"),
        ("https://example.org/t/?X-Amz-Signature=abc", "must not carry a query or fragment"),
        ("https://example.org/t/#token=abc", "must not carry a query or fragment"),
        ("file:///etc/passwd", "not file:"),
        ("s3://bucket/t", "not s3:"),
        ("runs/t", "not a relative path"),
        ("/runs/t\n", "must not contain control characters"),
        ("https:///t", "with a host"),
    ],
)
def test_a_location_is_published_so_it_carries_no_secret_and_is_a_path_or_an_http_url(location, reason):
    """The location goes onto the public ledger: user:pass@ or a presigned token in it would be published."""
    (problem,) = refusal([dict(GOOD, location=location)])["claims[0]"]
    assert problem.startswith("location ") and reason in problem


def test_a_run_name_takes_no_control_characters():
    (problem,) = refusal([dict(GOOD, run="run-1\n")])["claims[0]"]
    assert problem.startswith("run must not contain control characters")


@pytest.mark.parametrize("location", ["/srv/transcripts/run 6", "https://transcripts.example.org:8443/run-6/"])
def test_a_path_or_a_plain_url_passes_the_location_check(location):
    """Reaches the snapshot lookup (no snapshot here): the location itself was taken."""
    (problem,) = refusal([dict(GOOD, location=location)])["claims[0]"]
    assert problem.startswith("no logged snapshot of your chip with this serial and counter")
