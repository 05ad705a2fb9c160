"""EPCIS 2.0 capture onto the chip lifecycle (registry/services/epcis.py), through the API and its signatures."""

import base64
import io
import json

import pytest
from django.core.management import call_command

from ledger import selectors as ledger_selectors
from ledger.models import Entry
from registry import selectors, signing
from registry.models import Chip, ChipEvent
from rules import epcis_format
from tests.registry.epcis_helpers import (
    CAPTURE,
    GTIN,
    at_vendor_a,
    capture,
    chip,
    commissioned,
    commissioning,
    document,
    epcis_world,
    link,
    object_event,
    receiving,
    sgtin,
    shipping,
)
from tests.registry.factories import event, facility, new_serials

pytestmark = pytest.mark.django_db


@pytest.fixture
def world():
    return epcis_world()


# --- capture -------------------------------------------------------------------------


def test_commissioning_lands_on_the_ledger_with_the_signed_document(world):
    serials = new_serials(2)
    epcs = [sgtin(s) for s in serials]
    commission = commissioning(epcs)
    body = world["fab"].body(document(commission))
    response = world["fab"].api.post(
        CAPTURE,
        body,
        content_type="application/ld+json",
        HTTP_X_CHIPLEDGER_SIGNATURE=signing.sign(world["fab"].key, body),
    )
    assert response.status_code == 201, response.content
    answer = response.json()
    assert answer["captured"] == 1 and answer["eventList"][0]["kind"] == "chip.fabricated"
    entry = Entry.objects.get(seq=answer["eventList"][0]["seq"])
    assert base64.b64decode(json.loads(bytes(entry.leaf))["submission"]["body"]) == body
    assert entry.payload["epcis"]["event_id"] == epcis_format.event_hash_id(commission)
    for serial, epc in zip(serials, epcs, strict=True):
        row = chip(serial)
        assert (row.status, row.owner.slug, row.facility.slug, row.model.slug) == (
            "fabricated",
            "fab-tw",
            "fab-tw-1",
            "h100-sxm",
        )
        assert base64.b64encode(bytes(row.public_key)).decode() == commission["ilmd"]["chipledger:publicKeys"][epc]


def test_commissioning_through_decommissioning_with_sgtin_and_digital_link(world):
    serials = at_vendor_a(world)
    assert (chip(serials[0]).possessor.slug, chip(serials[0]).facility.slug) == ("vendor-a", "wh-vendor-a")
    domestic = shipping(
        [link(s) for s in serials],
        "owner-a",
        reference="INV-7",
        sourceList=[{"type": "urn:epcglobal:cbv:sdt:possessing_party", "source": "vendor-a"}],
    )
    assert capture(world["vendor_a"], domestic).json()["eventList"][0]["kind"] == "chip.shipped"
    assert chip(serials[0]).consignee.slug == "owner-a"
    received = receiving([sgtin(s) for s in serials], "https://chipledger.example/facility/dc-owner-a")
    assert capture(world["owner_a"], received).status_code == 201
    event(world["fab"].org, "transfer_offered", serials, to_owner="owner-a")
    event(world["owner_a"].org, "transfer_accepted", serials)
    retire = object_event([sgtin(s) for s in serials], "decommissioning", "DELETE")
    assert capture(world["owner_a"], retire).status_code == 201
    row = chip(serials[1])
    assert (row.status, row.owner.slug, row.possessor.slug, row.facility.slug) == (
        "decommissioned",
        "owner-a",
        "owner-a",
        "dc-owner-a",
    )
    kinds = list(ChipEvent.objects.filter(chip=row).values_list("kind", flat=True))
    assert kinds == [
        "chip.fabricated",
        "chip.exported",
        "chip.received",
        "chip.shipped",
        "chip.received",
        "chip.transfer_offered",
        "chip.transfer_accepted",
        "chip.decommissioned",
    ]
    shipped = Entry.objects.get(seq=ChipEvent.objects.get(chip=row, kind="chip.shipped").seq)
    payload = shipped.payload
    assert (payload["consignee"], payload["reference"], payload["destination_country"]) == ("owner-a", "INV-7", "US")


def test_destroying_is_captured_by_the_owner(world):
    serials = commissioned(world, 1)
    response = capture(world["fab"], object_event([sgtin(serials[0])], "destroying", "DELETE"))
    assert response.status_code == 201 and chip(serials[0]).status == "destroyed"


def test_crossing_a_border_is_an_export_and_needs_a_licence(world):
    serials = commissioned(world)
    epcs = [sgtin(s) for s in serials]
    size = ledger_selectors.ledger_size()
    response = capture(world["fab"], shipping(epcs, "vendor-a"))
    assert response.status_code == 400
    assert "TW to US" in response.json()["epcisBody.eventList[0].chipledger:exportLicence"][0]
    assert ledger_selectors.ledger_size() == size
    response = capture(world["fab"], shipping(epcs, "vendor-a", **{"chipledger:exportLicence": "TW-EL-9"}))
    assert response.status_code == 201 and response.json()["eventList"][0]["kind"] == "chip.exported"
    entry = Entry.objects.get(seq=response.json()["eventList"][0]["seq"])
    assert (entry.payload["export_licence"], entry.payload["destination_country"]) == ("TW-EL-9", "US")
    assert (chip(serials[0]).status, chip(serials[0]).country) == ("in_transit", "US")


def test_destination_location_sets_the_country_and_a_domestic_licence_is_refused(world):
    serials = at_vendor_a(world, 1)
    abroad = facility(world["owner_a"].org, "dc-owner-a-de", country="DE")
    ship = shipping([sgtin(serials[0])], "owner-a")
    ship["destinationList"].append({"type": "location", "destination": abroad.slug})
    response = capture(world["vendor_a"], ship)
    assert response.status_code == 400
    assert "US to DE" in response.json()["epcisBody.eventList[0].chipledger:exportLicence"][0]
    licensed = shipping([sgtin(serials[0])], "owner-a", **{"chipledger:exportLicence": "US-EL-1"})
    response = capture(world["vendor_a"], licensed)
    assert response.status_code == 400
    assert "record a shipment" in response.json()["epcisBody.eventList[0].epcList[0]"][0]


def test_a_resent_event_is_skipped_as_duplicate(world):
    serials = new_serials(1)
    commission = commissioning([sgtin(serials[0])], eventID="ni:///sha-256;" + "ab" * 32 + "?ver=CBV2.0")
    assert capture(world["fab"], commission).json()["captured"] == 1
    ship = shipping([sgtin(serials[0])], "vendor-a", **{"chipledger:exportLicence": "TW-EL-1"})
    size = ledger_selectors.ledger_size()
    answer = capture(world["fab"], commission, ship).json()  # a new document (nonce), the same first event
    assert [e["status"] for e in answer["eventList"]] == ["duplicate", "captured"]
    assert ledger_selectors.ledger_size() == size + 1
    reordered = dict(reversed(list(ship.items())))  # no eventID: the canonical-JSON hash ignores member order
    answer = capture(world["fab"], reordered, reordered).json()
    assert answer == {
        "captured": 0,
        "duplicates": 2,
        "eventList": [{"eventID": epcis_format.event_hash_id(ship), "status": "duplicate"}] * 2,
    }
    assert ledger_selectors.ledger_size() == size + 1
    assert ChipEvent.objects.filter(chip__serial=serials[0], kind="chip.fabricated").count() == 1


def test_captured_chips_equal_their_rebuild_from_the_ledger(world):
    serials = at_vendor_a(world)
    capture(world["vendor_a"], shipping([sgtin(s) for s in serials], "owner-a"))
    out = io.StringIO()
    call_command("rebuild_projections", "--check", stdout=out)  # exits 1 on any difference
    assert f"{len(serials)} chips" in out.getvalue()
    assert selectors.captured_event_ids(world["vendor_a"].org, serials) == {
        e.payload["epcis"]["event_id"] for e in Entry.objects.filter(kind__startswith="chip.")
    }


def _broken(case, serials):
    """A commissioning and a shipment, valid but for what ``case`` breaks (the first is applied before the second)."""
    events = [
        commissioning([sgtin(s) for s in new_serials(1)]),
        shipping([sgtin(serials[0])], "vendor-a", **{"chipledger:exportLicence": "TW-EL-1"}),
    ]
    doc = document(*events)
    second = events[1]
    if case == "not_an_epcis_document":
        doc["type"] = "EPCISQueryDocument"
    elif case == "not_json_ld":
        del doc["@context"]
    elif case == "schema_version":
        doc["schemaVersion"] = "1.2"
    elif case == "aggregation_event":
        second["type"] = "AggregationEvent"
    elif case == "unknown_biz_step":
        second["bizStep"] = "https://ref.gs1.org/cbv/BizStep-repairing"
    elif case == "wrong_action":
        second["action"] = "ADD"
    elif case == "bad_epc_uri":
        second["epcList"] = ["urn:epc:id:sscc:0614141.1234567890"]
    elif case == "bad_gtin_check_digit":
        second["epcList"] = [f"https://id.gs1.org/01/{GTIN[:-1]}3/21/{serials[0]}"]
    elif case == "unknown_chip":
        second["epcList"] = [sgtin("NO-SUCH-CHIP")]
    elif case == "missing_destination":
        del second["destinationList"]
    elif case == "gln_party":
        second["destinationList"][0]["destination"] = "urn:epc:id:pgln:0614141.00001"
    elif case == "error_declaration":
        second["errorDeclaration"] = {"declarationTime": "2026-03-01T12:00:00Z"}
    elif case == "missing_event_time":
        del second["eventTime"]
    elif case == "licence_off_shipping":
        events[0]["chipledger:exportLicence"] = "TW-EL-1"
    elif case == "parties_on_commissioning":
        events[0]["destinationList"] = second["destinationList"]
    elif case == "foreign_namespace_member":  # published for ever: a customer's name would be too
        second["acme:note"] = "secret customer Acme Corp"
    elif case == "foreign_namespace_in_ilmd":
        events[0]["ilmd"]["acme:note"] = "secret"
    elif case == "unknown_document_member":
        doc["epcisHeader"] = {"note": "secret"}
    elif case == "unknown_body_member":
        doc["epcisBody"]["note"] = "secret"
    elif case == "foreign_context":
        doc["@context"].append({"acme": "https://acme.example/secret-customer/"})
    return doc


MALFORMED = {
    "not_an_epcis_document": "type",
    "not_json_ld": "@context",
    "schema_version": "schemaVersion",
    "aggregation_event": "epcisBody.eventList[1].type",
    "unknown_biz_step": "epcisBody.eventList[1].bizStep",
    "wrong_action": "epcisBody.eventList[1].action",
    "bad_epc_uri": "epcisBody.eventList[1].epcList[0]",
    "bad_gtin_check_digit": "epcisBody.eventList[1].epcList[0]",
    "unknown_chip": "epcisBody.eventList[1].epcList[0]",
    "missing_destination": "epcisBody.eventList[1].destinationList",
    "gln_party": "epcisBody.eventList[1].destinationList[0].destination",
    "error_declaration": "epcisBody.eventList[1].errorDeclaration",
    "missing_event_time": "epcisBody.eventList[1].eventTime",
    "licence_off_shipping": "epcisBody.eventList[0].chipledger:exportLicence",
    "parties_on_commissioning": "epcisBody.eventList[0].destinationList",
    "foreign_namespace_member": "epcisBody.eventList[1].acme:note",
    "foreign_namespace_in_ilmd": "epcisBody.eventList[0].ilmd.acme:note",
    "unknown_document_member": "epcisHeader",
    "unknown_body_member": "epcisBody.note",
    "foreign_context": "@context[2]",
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_documents_are_refused_naming_the_path_and_write_nothing(world, case):
    serials = commissioned(world, 1)
    size, chips = ledger_selectors.ledger_size(), Chip.objects.count()
    response = world["fab"].post(CAPTURE, _broken(case, serials))
    assert response.status_code == 400, response.content
    assert list(response.json()) == [MALFORMED[case]], response.json()
    assert (ledger_selectors.ledger_size(), Chip.objects.count()) == (size, chips)


def test_every_bad_event_is_named_at_once(world):
    doc = document(object_event([sgtin("A-1")], "repairing", "OBSERVE"), {"type": "TransformationEvent"})
    assert set(world["fab"].post(CAPTURE, doc).json()) == {
        "epcisBody.eventList[0].bizStep",
        "epcisBody.eventList[1].type",
    }


# --- permissions, signatures ---------------------------------------------------------


def test_only_the_possessor_captures_a_shipment_and_only_the_consignee_a_receipt(world):
    serials = at_vendor_a(world, 1)
    epcs = [sgtin(serials[0])]
    size = ledger_selectors.ledger_size()
    response = capture(world["vendor_b"], shipping(epcs, "owner-a"))
    assert response.status_code == 400
    assert response.json() == {"epcisBody.eventList[0].epcList[0]": [f"unknown chip {serials[0]}"]}
    response = capture(world["fab"], shipping(epcs, "owner-a"))  # the owner, but not the possessor
    assert response.status_code == 400 and "possessor" in response.json()["epcisBody.eventList[0].epcList[0]"][0]
    on_behalf = shipping(epcs, "owner-a", sourceList=[{"type": "possessing_party", "source": "vendor-b"}])
    response = capture(world["vendor_a"], on_behalf)
    assert response.status_code == 400 and "epcisBody.eventList[0].sourceList" in response.json()
    assert capture(world["vendor_a"], shipping(epcs, "owner-a")).status_code == 201
    assert capture(world["vendor_b"], receiving(epcs, "wh-vendor-a")).status_code == 400
    assert ledger_selectors.ledger_size() == size + 1


def test_a_receiving_event_without_a_location_is_refused_naming_biz_location(world):
    serials = at_vendor_a(world, 1)
    epcs = [sgtin(serials[0])]
    assert capture(world["vendor_a"], shipping(epcs, "owner-a")).status_code == 201
    size = ledger_selectors.ledger_size()
    nowhere = object_event(epcs, "urn:epcglobal:cbv:bizstep:receiving", "OBSERVE")
    response = capture(world["owner_a"], nowhere)
    assert response.status_code == 400
    assert response.json() == {"epcisBody.eventList[0].bizLocation": ["required for received"]}
    assert ledger_selectors.ledger_size() == size
    assert Chip.objects.get(serial=serials[0]).status == "in_transit"


def test_duplicates_are_only_reported_for_chips_the_caller_may_see(world):
    serials = at_vendor_a(world, 1)
    ship = shipping([sgtin(serials[0])], "owner-a", eventID="urn:uuid:6b1d0c1e-5a2f-4c3e-8d7a-000000000001")
    assert capture(world["vendor_a"], ship).json()["captured"] == 1
    assert capture(world["vendor_a"], ship).json()["duplicates"] == 1
    response = capture(world["vendor_b"], ship)  # "duplicate" would tell vendor B about another's chip
    assert response.status_code == 400
    assert response.json() == {"epcisBody.eventList[0].epcList[0]": [f"unknown chip {serials[0]}"]}


def test_signature_replay_and_idempotency_are_inherited(world):
    client = world["fab"]
    body = client.body(document(commissioning([sgtin(s) for s in new_serials(1)])))
    size = ledger_selectors.ledger_size()
    assert client.api.post(CAPTURE, body, content_type="application/json").status_code == 403
    assert client.post(CAPTURE, raw=body, key=world["vendor_a"].key).status_code == 403
    assert ledger_selectors.ledger_size() == size
    first = client.post(CAPTURE, raw=body, idempotency_key="doc-1")
    assert first.status_code == 201
    again = client.post(CAPTURE, raw=body, idempotency_key="doc-1")
    assert (again.status_code, again.json()) == (201, first.json())
    replay = client.post(CAPTURE, raw=body)
    assert replay.status_code == 403 and "nonce" in replay.json()
    assert ledger_selectors.ledger_size() == size + 1


def respelled(key: str) -> str:
    """The same 32 bytes in a second base64 spelling: a spare bit of the last data character set."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    out = key[:-2] + alphabet[alphabet.index(key[-2]) | 1] + key[-1]
    assert out != key and base64.b64decode(out, validate=True) == base64.b64decode(key)
    return out


def test_a_chip_key_in_a_second_base64_spelling_is_refused_naming_it(world):
    """The ledger keeps a chip's key as filed, and the verifier refuses any spelling of its bytes but the canonical
    one (an outside verifier building its keys file from the ledger would have had a malformed one)."""
    doc = document(commissioning([sgtin(s) for s in new_serials(1)]))
    keys = doc["epcisBody"]["eventList"][0]["ilmd"]["chipledger:publicKeys"]
    epc = next(iter(keys))
    keys[epc] = respelled(keys[epc])
    size = ledger_selectors.ledger_size()
    response = world["fab"].post(CAPTURE, doc)
    assert response.status_code == 400, response.content
    where = f"epcisBody.eventList[0].ilmd.chipledger:publicKeys[{epc}]"
    assert "canonical" in str(response.json()[where]), response.json()
    assert ledger_selectors.ledger_size() == size
