"""A chip crosses a border only by an export (or a receipt, alerted): install and package refuse a facility abroad; a
facility's or organisation's country is an assigned ISO 3166-1 code, so no made-up country hides a border."""

import pytest

from ledger.models import Entry
from registry.models import Chip
from tests.registry.factories import SignedClient, chip_model, event, fabricate, facility, organisation

pytestmark = pytest.mark.django_db
EVENTS = "/api/registry/chips/events/"


@pytest.fixture
def world():
    fab, fab_key = organisation("fab-us", ["fab"], "US")
    facility(fab, "fab-us-1", kind="fab")
    facility(fab, "pk-cn", kind="packaging", country="CN")
    owner, owner_key = organisation("owner-a", ["owner"], "US")
    facility(owner, "dc-a")
    facility(owner, "dc-cn", country="CN")
    return {"fab": SignedClient(fab, fab_key), "owner": SignedClient(owner, owner_key), "model": chip_model(fab)}


def test_installing_in_a_data_centre_abroad_is_refused_and_changes_nothing(world):
    serials = fabricate(world["fab"].org, world["model"], 1, "fab-us-1")
    event(world["fab"].org, "shipped", serials, consignee="owner-a", reference="PO-1")
    event(world["owner"].org, "received", serials, facility="dc-a")
    before = Entry.objects.count()
    answer = world["owner"].post(EVENTS + "install", {"chips": serials, "facility": "dc-cn"})
    assert answer.status_code == 400
    assert "US to CN (facility 'dc-cn') crosses a border: record an export" in str(answer.json())
    chip = Chip.objects.get(serial=serials[0])
    assert (chip.country, chip.facility.slug, chip.status) == ("US", "dc-a", "in_stock")
    assert Entry.objects.count() == before
    assert world["owner"].post(EVENTS + "install", {"chips": serials, "facility": "dc-a"}).status_code == 201


def test_packaging_at_a_packager_abroad_is_refused(world):
    serials = fabricate(world["fab"].org, world["model"], 1, "fab-us-1")
    answer = world["fab"].post(EVENTS + "package", {"chips": serials, "facility": "pk-cn"})
    assert answer.status_code == 400 and "crosses a border" in str(answer.json())
    assert Chip.objects.get(serial=serials[0]).country == "US"


@pytest.mark.parametrize("country", ["ZZ", "XX", "UK", "us"])
def test_a_facility_country_must_be_an_assigned_iso_code(world, country):
    answer = world["owner"].post("/api/registry/facilities", {"slug": "dc-x", "kind": "datacentre", "country": country})
    assert answer.status_code == 400 and list(answer.json()) == ["country"]
