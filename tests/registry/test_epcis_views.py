"""EPCIS 2.0 query of a chip's history (registry.selectors.chip_object_events) and the endpoints' schema."""

import base64

import pytest

from ledger.models import Entry
from registry.models import ChipEvent
from tests.registry.epcis_helpers import EVENTS, at_vendor_a, chip, epcis_world, link, sgtin

pytestmark = pytest.mark.django_db


@pytest.fixture
def world():
    return epcis_world()


def test_query_returns_the_history_as_epcis_object_events(world):
    serials = at_vendor_a(world, 1)
    response = world["vendor_a"].get(EVENTS, epc=sgtin(serials[0]))
    assert response.status_code == 200, response.content
    doc = response.json()
    assert (doc["type"], doc["schemaVersion"]) == ("EPCISQueryDocument", "2.0")
    events = doc["epcisBody"]["queryResults"]["resultsBody"]["eventList"]
    history = list(ChipEvent.objects.filter(chip__serial=serials[0]).order_by("seq"))
    assert [e["chipledger:seq"] for e in events] == [h.seq for h in history]
    assert [(e["bizStep"], e["action"]) for e in events] == [
        ("commissioning", "ADD"),
        ("shipping", "OBSERVE"),
        ("receiving", "OBSERVE"),
    ]
    assert all(e["epcList"] == [sgtin(serials[0])] and e["type"] == "ObjectEvent" for e in events)
    entries = {e.seq: e for e in Entry.objects.filter(seq__in=[h.seq for h in history])}
    for item in events:
        entry = entries[item["chipledger:seq"]]
        assert item["eventTime"] == entry.time.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        assert item["eventID"] == entry.payload["epcis"]["event_id"]
    commission, export, receipt = events
    assert commission["ilmd"]["chipledger:model"] == "h100-sxm"
    assert (
        commission["ilmd"]["chipledger:publicKeys"][sgtin(serials[0])]
        == base64.b64encode(bytes(chip(serials[0]).public_key)).decode()
    )
    assert export["destinationList"] == [
        {"type": "possessing_party", "destination": "https://chipledger.example/org/vendor-a"}
    ]
    assert export["sourceList"][0]["source"] == "https://chipledger.example/org/fab-tw"
    assert export["bizTransactionList"] == [{"bizTransaction": "urn:epcglobal:cbv:bt:0614141000005:PO-42"}]
    assert (export["chipledger:exportLicence"], export["chipledger:kind"]) == ("TW-EL-1", "chip.exported")
    assert receipt["bizLocation"] == {"id": "https://chipledger.example/facility/wh-vendor-a"}


def test_query_by_digital_link_or_serial_and_visibility(world):
    serials = at_vendor_a(world, 1)

    def seqs(response):
        return [e["chipledger:seq"] for e in response.json()["epcisBody"]["queryResults"]["resultsBody"]["eventList"]]

    by_sgtin = world["vendor_a"].get(EVENTS, epc=sgtin(serials[0]))
    by_link = world["regulator"].get(EVENTS, epc=link(serials[0]))
    by_serial = world["fab"].get(EVENTS, epc=serials[0])
    assert seqs(by_sgtin) == seqs(by_link) == seqs(by_serial) and len(seqs(by_sgtin)) == 3
    assert by_serial.json()["epcisBody"]["queryResults"]["resultsBody"]["eventList"][0]["epcList"] == [
        f"https://chipledger.example/chip/{serials[0]}"
    ]
    assert world["vendor_b"].get(EVENTS, epc=sgtin(serials[0])).status_code == 404
    assert world["vendor_b"].get(EVENTS, epc=sgtin("NO-SUCH-CHIP")).status_code == 404
    assert "epc" in world["vendor_a"].get(EVENTS, epc="urn:epc:id:sscc:0614141.1234567890").json()
    assert world["vendor_a"].get(EVENTS).status_code == 400


def test_schema_documents_both_endpoints_with_their_errors(world):
    schema = world["regulator"].get("/api/schema/", format="json").json()
    capture_op = schema["paths"]["/api/epcis/capture"]["post"]
    query_op = schema["paths"]["/api/epcis/events"]["get"]
    assert {"201", "400", "403", "409", "429"} <= set(capture_op["responses"])
    assert {"200", "400", "404"} <= set(query_op["responses"])
    example = capture_op["requestBody"]["content"]["application/json"]["examples"]
    assert next(iter(example.values()))["value"]["type"] == "EPCISDocument"
