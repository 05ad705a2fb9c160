"""GS1 EPCIS 2.0 parsing and rendering (rules/epcis_format.py): pure functions, no database."""

import pytest

from rules import epcis_format
from tests.registry.epcis_helpers import commissioning, document, link, receiving, sgtin, shipping


@pytest.mark.parametrize(
    "epc, serial",
    [
        ("urn:epc:id:sgtin:0614141.812345.H100-0001", "H100-0001"),
        ("urn:epc:id:sgtin:061414112345.1.SN%2D9", "SN-9"),
        ("https://id.gs1.org/01/09506000134352/21/A.B_c", "A.B_c"),
        ("https://brand.example.com/01/00614141123452/21/X1", "X1"),
        ("https://chipledger.example/chip/SN-0000042", "SN-0000042"),
    ],
)
def test_epc_forms_name_the_chip_serial(epc, serial):
    assert epcis_format.chip_serial(epc) == serial


@pytest.mark.parametrize(
    "epc",
    [
        "urn:epc:id:sgtin:0614141.81234.X",  # 12 digits of prefix and item reference, not 13
        "urn:epc:id:sgln:0614141.12345.0",
        "https://id.gs1.org/01/09506000134353/21/X",  # wrong check digit
        "https://id.gs1.org/01/09506000134352/21/a%20b",  # a space is no chip serial
        "SN-1",  # bare serials only in queries
    ],
)
def test_unsupported_epcs_are_refused(epc):
    with pytest.raises(ValueError):
        epcis_format.chip_serial(epc)


def test_a_document_parses_into_capture_events_without_a_database():
    ship = shipping([sgtin("S-1"), link("S-2")], "vendor-a", **{"chipledger:exportLicence": "TW-EL-1"})
    commission, shipped, received = epcis_format.parse_document(
        document(commissioning([sgtin("S-1")]), ship, receiving([sgtin("S-1")], "wh-vendor-a"))
    )
    assert (commission.step, commission.serials, commission.model, commission.facility) == (
        "commissioning",
        ("S-1",),
        "h100-sxm",
        "fab-tw-1",
    )
    assert (shipped.step, shipped.serials, shipped.destination, shipped.export_licence) == (
        "shipping",
        ("S-1", "S-2"),
        {"possessing_party": "vendor-a"},
        "TW-EL-1",
    )
    assert shipped.reference == "urn:epcglobal:cbv:bt:0614141000005:PO-42"
    assert shipped.event_id == epcis_format.event_hash_id(ship)
    assert (received.step, received.facility) == ("receiving", "wh-vendor-a")


def test_a_bad_event_is_refused_naming_its_path():
    bad = receiving([sgtin("S-1")], "wh-vendor-a")
    bad["action"] = "ADD"
    with pytest.raises(epcis_format.EpcisInvalid) as error:
        epcis_format.parse_document(document(receiving([sgtin("S-1")], "wh-vendor-a"), bad))
    assert list(error.value.message_dict) == ["epcisBody.eventList[1].action"]


def test_an_entry_renders_as_an_object_event():
    from datetime import UTC, datetime

    entry = {
        "seq": 7,
        "time": datetime(2026, 3, 1, 12, tzinfo=UTC),
        "kind": "chip.shipped",
        "actor": "vendor-a",
        "payload": {
            "chips": ["S-1"],
            "consignee": "owner-a",
            "reference": "PO-1",
            "destination_country": "US",
            "epcis": {"event_id": "urn:uuid:1"},
        },
    }
    event = epcis_format.object_event(entry, "S-1", sgtin("S-1"))
    assert (event["bizStep"], event["action"], event["disposition"], event["eventID"]) == (
        "shipping",
        "OBSERVE",
        "in_transit",
        "urn:uuid:1",
    )
    assert event["eventTime"] == "2026-03-01T12:00:00.000000Z" and event["epcList"] == [sgtin("S-1")]
    assert event["destinationList"] == [{"type": "possessing_party", "destination": epcis_format.ORG_URI + "owner-a"}]
    assert (event["chipledger:seq"], event["chipledger:destinationCountry"]) == (7, "US")
