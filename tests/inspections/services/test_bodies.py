"""Inspection bodies are registered on the ledger, with their countries and capacity, and re-registered the same way."""

import pytest
from django.core.exceptions import ValidationError

from inspections.models import InspectionBody
from inspections.services.bodies import MAX_CAPACITY, inspection_body_register
from ledger.models import Entry
from tests.registry.factories import organisation

pytestmark = pytest.mark.django_db


@pytest.fixture
def inspectorate():
    return organisation("inspect-eu", ["inspection_body"], "NL")[0]


def test_a_registration_is_an_entry_and_its_projection(inspectorate):
    body = inspection_body_register(organisation="inspect-eu", countries=["nl", " DE "], capacity_per_period=50)
    entry = Entry.objects.get(kind="inspection_body.registered")
    assert entry.payload == {"organisation": "inspect-eu", "countries": ["DE", "NL"], "capacity_per_period": 50}
    assert entry.actor == "regulator" and body.registered_seq == entry.seq
    assert (body.organisation, body.countries, body.capacity_per_period) == (inspectorate, ["DE", "NL"], 50)


def test_registering_again_replaces_coverage_and_capacity(inspectorate):
    inspection_body_register(organisation="inspect-eu", countries=["NL"], capacity_per_period=50)
    again = inspection_body_register(organisation="inspect-eu", countries=["FR"], capacity_per_period=7)
    assert InspectionBody.objects.get() == again and (again.countries, again.capacity_per_period) == (["FR"], 7)
    entries = Entry.objects.filter(kind="inspection_body.registered").order_by("seq")
    assert [e.payload["countries"] for e in entries] == [["NL"], ["FR"]] and again.registered_seq == entries[1].seq


def test_a_country_must_be_an_assigned_iso_3166_code(inspectorate):
    with pytest.raises(ValidationError) as error:
        inspection_body_register(organisation="inspect-eu", countries=["NL", "xx"], capacity_per_period=5)
    assert error.value.message_dict == {"countries": ["'XX' is not an ISO 3166-1 country code"]}
    assert not Entry.objects.filter(kind="inspection_body.registered").exists()


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"organisation": "nobody"}, "organisation"),
        ({"organisation": "owner-a"}, "organisation"),  # not an inspection body
        ({"countries": ["NLD"]}, "countries"),
        ({"countries": ["N1"]}, "countries"),
        ({"countries": ["NL", "xx"]}, "countries"),  # two letters, but no country's code
        ({"countries": ["UK"]}, "countries"),  # the United Kingdom is GB in ISO 3166-1
        ({"countries": "NL"}, "countries"),
        ({"countries": ["NL", "nl"]}, "countries"),
        ({"capacity_per_period": 0}, "capacity_per_period"),
        ({"capacity_per_period": MAX_CAPACITY + 1}, "capacity_per_period"),
        ({"capacity_per_period": True}, "capacity_per_period"),
        ({"capacity_per_period": 5.0}, "capacity_per_period"),
    ],
)
def test_bad_registrations_are_refused_and_write_nothing(inspectorate, overrides, field):
    organisation("owner-a", ["owner"], "US")
    size = Entry.objects.count()
    with pytest.raises(ValidationError) as error:
        inspection_body_register(
            **{"organisation": "inspect-eu", "countries": ["NL"], "capacity_per_period": 5, **overrides}
        )
    assert field in error.value.message_dict
    assert Entry.objects.count() == size and not InspectionBody.objects.exists()
