"""GS1 EPCIS 2.0 capture and query over the chip lifecycle (registry/epcis.py)."""
import base64
import io
import json

import pytest
from django.core.management import call_command

from ledger import selectors as ledger_selectors
from ledger.models import Entry
from registry import epcis, signing
from registry.models import Chip, ChipEvent
from tests.registry.factories import (
    SignedClient, chip_model, chip_public_key, event, facility, new_serials, organisation,
)

pytestmark = pytest.mark.django_db
CAPTURE, EVENTS = "/api/epcis/capture", "/api/epcis/events"
GTIN = "09506000134352"  # a valid GTIN-14 (GS1's example)


@pytest.fixture
def world():
    fab, fab_key = organisation("fab-tw", ["fab"], "TW")
    vendor_a, key_a = organisation("vendor-a", ["vendor"], "US")
    vendor_b, key_b = organisation("vendor-b", ["vendor"], "US")
    owner_a, owner_key = organisation("owner-a", ["owner"], "US")
    regulator, regulator_key = organisation("regulator", ["regulator"], "US")
    facility(fab, "fab-tw-1", kind="fab")
    facility(vendor_a, "wh-vendor-a", kind="warehouse")
    facility(owner_a, "dc-owner-a")
    chip_model(vendor_a)
    clients = [SignedClient(*pair) for pair in [(fab, fab_key), (vendor_a, key_a), (vendor_b, key_b),
                                                (owner_a, owner_key), (regulator, regulator_key)]]
    return dict(zip(["fab", "vendor_a", "vendor_b", "owner_a", "regulator"], clients, strict=True))


# --- GS1-style documents -------------------------------------------------------------


def sgtin(serial):
    return f"urn:epc:id:sgtin:0614141.812345.{serial}"


def link(serial):
    return f"https://id.gs1.org/01/{GTIN}/21/{serial}"


def document(*events):
    return {"@context": ["https://ref.gs1.org/standards/epcis/2.0.0/epcis-context.jsonld",
                         {"chipledger": "https://chipledger.example/epcis/"}],
            "type": "EPCISDocument", "schemaVersion": "2.0", "creationDate": "2026-03-01T12:00:00Z",
            "epcisBody": {"eventList": list(events)}}


def object_event(epcs, biz_step, action, **members):
    return {"type": "ObjectEvent", "eventTime": "2026-03-01T10:00:00.000Z", "eventTimeZoneOffset": "+08:00",
            "epcList": epcs, "action": action, "bizStep": biz_step, **members}


def commissioning(epcs, location="https://chipledger.example/facility/fab-tw-1", **members):
    ilmd = {"chipledger:model": "h100-sxm", "chipledger:publicKeys": {epc: chip_public_key() for epc in epcs}}
    return object_event(epcs, "commissioning", "ADD", bizLocation={"id": location}, ilmd=ilmd, **members)


def shipping(epcs, to, reference="urn:epcglobal:cbv:bt:0614141000005:PO-42", **members):
    return object_event(
        epcs, "https://ref.gs1.org/cbv/BizStep-shipping", "OBSERVE", disposition="in_transit",
        bizTransactionList=[{"type": "po", "bizTransaction": reference}],
        destinationList=[{"type": "https://ref.gs1.org/cbv/SDT-possessing_party",
                          "destination": f"https://chipledger.example/org/{to}"}], **members)


def receiving(epcs, location):
    return object_event(epcs, "urn:epcglobal:cbv:bizstep:receiving", "OBSERVE", bizLocation={"id": location})


def capture(client, *events, **kwargs):
    return client.post(CAPTURE, document(*events), **kwargs)


def commissioned(world, count=2):
    serials = new_serials(count)
    response = capture(world["fab"], commissioning([sgtin(s) for s in serials]))
    assert response.status_code == 201, response.content
    return serials


def at_vendor_a(world, count=2):
    """Commissioned in TW, exported to vendor A in the US under a licence, received into its warehouse."""
    serials = commissioned(world, count)
    exported = shipping([sgtin(s) for s in serials], "vendor-a", **{"chipledger:exportLicence": "TW-EL-1"})
    assert capture(world["fab"], exported).status_code == 201
    assert capture(world["vendor_a"], receiving([link(s) for s in serials], "wh-vendor-a")).status_code == 201
    return serials


def chip(serial):
    return Chip.objects.select_related("owner", "possessor", "consignee", "facility").get(serial=serial)


# --- capture -------------------------------------------------------------------------


def test_commissioning_lands_on_the_ledger_with_the_signed_document(world):
    serials = new_serials(2)
    epcs = [sgtin(s) for s in serials]
    commission = commissioning(epcs)
    body = world["fab"].body(document(commission))
    response = world["fab"].api.post(CAPTURE, body, content_type="application/ld+json",
                                     HTTP_X_CHIPLEDGER_SIGNATURE=signing.sign(world["fab"].key, body))
    assert response.status_code == 201, response.content
    answer = response.json()
    assert answer["captured"] == 1 and answer["eventList"][0]["kind"] == "chip.fabricated"
    entry = Entry.objects.get(seq=answer["eventList"][0]["seq"])
    assert base64.b64decode(json.loads(bytes(entry.leaf))["submission"]["body"]) == body
    assert entry.payload["epcis"]["event_id"] == epcis.event_hash_id(commission)
    for serial, epc in zip(serials, epcs, strict=True):
        row = chip(serial)
        assert (row.status, row.owner.slug, row.facility.slug, row.model.slug) == (
            "fabricated", "fab-tw", "fab-tw-1", "h100-sxm")
        assert base64.b64encode(bytes(row.public_key)).decode() == commission["ilmd"]["chipledger:publicKeys"][epc]


def test_commissioning_through_decommissioning_with_sgtin_and_digital_link(world):
    serials = at_vendor_a(world)
    assert (chip(serials[0]).possessor.slug, chip(serials[0]).facility.slug) == ("vendor-a", "wh-vendor-a")
    domestic = shipping([link(s) for s in serials], "owner-a", reference="INV-7",
                        sourceList=[{"type": "urn:epcglobal:cbv:sdt:possessing_party", "source": "vendor-a"}])
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
        "decommissioned", "owner-a", "owner-a", "dc-owner-a")
    kinds = list(ChipEvent.objects.filter(chip=row).values_list("kind", flat=True))
    assert kinds == ["chip.fabricated", "chip.exported", "chip.received", "chip.shipped", "chip.received",
                     "chip.transfer_offered", "chip.transfer_accepted", "chip.decommissioned"]
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
    assert answer == {"captured": 0, "duplicates": 2, "eventList": [
        {"eventID": epcis.event_hash_id(ship), "status": "duplicate"}] * 2}
    assert ledger_selectors.ledger_size() == size + 1
    assert ChipEvent.objects.filter(chip__serial=serials[0], kind="chip.fabricated").count() == 1


def test_captured_chips_equal_their_rebuild_from_the_ledger(world):
    serials = at_vendor_a(world)
    capture(world["vendor_a"], shipping([sgtin(s) for s in serials], "owner-a"))
    out = io.StringIO()
    call_command("rebuild_projections", "--check", stdout=out)  # exits 1 on any difference
    assert f"{len(serials)} chips" in out.getvalue()
    assert epcis.captured_event_ids(world["vendor_a"].org, serials) == {
        e.payload["epcis"]["event_id"] for e in Entry.objects.filter(kind__startswith="chip.")}


def _broken(case, serials):
    """A commissioning and a shipment, valid but for what ``case`` breaks (the first is applied before the second)."""
    events = [commissioning([sgtin(s) for s in new_serials(1)]),
              shipping([sgtin(serials[0])], "vendor-a", **{"chipledger:exportLicence": "TW-EL-1"})]
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
        "epcisBody.eventList[0].bizStep", "epcisBody.eventList[1].type"}


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


# --- query ---------------------------------------------------------------------------


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
        ("commissioning", "ADD"), ("shipping", "OBSERVE"), ("receiving", "OBSERVE")]
    assert all(e["epcList"] == [sgtin(serials[0])] and e["type"] == "ObjectEvent" for e in events)
    entries = {e.seq: e for e in Entry.objects.filter(seq__in=[h.seq for h in history])}
    for item in events:
        entry = entries[item["chipledger:seq"]]
        assert item["eventTime"] == entry.time.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        assert item["eventID"] == entry.payload["epcis"]["event_id"]
    commission, export, receipt = events
    assert commission["ilmd"]["chipledger:model"] == "h100-sxm"
    assert commission["ilmd"]["chipledger:publicKeys"][sgtin(serials[0])] == base64.b64encode(
        bytes(chip(serials[0]).public_key)).decode()
    assert export["destinationList"] == [{"type": "possessing_party", "destination": "https://chipledger.example/org/vendor-a"}]
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
        f"https://chipledger.example/chip/{serials[0]}"]
    assert world["vendor_b"].get(EVENTS, epc=sgtin(serials[0])).status_code == 404
    assert world["vendor_b"].get(EVENTS, epc=sgtin("NO-SUCH-CHIP")).status_code == 404
    assert "epc" in world["vendor_a"].get(EVENTS, epc="urn:epc:id:sscc:0614141.1234567890").json()
    assert world["vendor_a"].get(EVENTS).status_code == 400


# --- identifiers and schema ----------------------------------------------------------


@pytest.mark.parametrize("epc, serial", [
    ("urn:epc:id:sgtin:0614141.812345.H100-0001", "H100-0001"),
    ("urn:epc:id:sgtin:061414112345.1.SN%2D9", "SN-9"),
    ("https://id.gs1.org/01/09506000134352/21/A.B_c", "A.B_c"),
    ("https://brand.example.com/01/00614141123452/21/X1", "X1"),
    ("https://chipledger.example/chip/SN-0000042", "SN-0000042"),
])
def test_epc_forms_name_the_chip_serial(epc, serial):
    assert epcis.chip_serial(epc) == serial


@pytest.mark.parametrize("epc", [
    "urn:epc:id:sgtin:0614141.81234.X",  # 12 digits of prefix and item reference, not 13
    "urn:epc:id:sgln:0614141.12345.0",
    "https://id.gs1.org/01/09506000134353/21/X",  # wrong check digit
    "https://id.gs1.org/01/09506000134352/21/a%20b",  # a space is no chip serial
    "SN-1",  # bare serials only in queries
])
def test_unsupported_epcs_are_refused(epc):
    with pytest.raises(ValueError):
        epcis.chip_serial(epc)


def test_schema_documents_both_endpoints_with_their_errors(world):
    schema = world["regulator"].get("/api/schema/", format="json").json()
    capture_op = schema["paths"]["/api/epcis/capture"]["post"]
    query_op = schema["paths"]["/api/epcis/events"]["get"]
    assert {"201", "400", "403", "409", "429"} <= set(capture_op["responses"])
    assert {"200", "400", "404"} <= set(query_op["responses"])
    example = capture_op["requestBody"]["content"]["application/json"]["examples"]
    assert next(iter(example.values()))["value"]["type"] == "EPCISDocument"
