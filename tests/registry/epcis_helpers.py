"""An EPCIS world and GS1-style documents, shared by the EPCIS capture and query tests."""

from registry import services
from registry.models import Chip
from tests.registry.factories import (
    SignedClient,
    chip_model,
    chip_public_key,
    facility,
    new_serials,
    organisation,
)

CAPTURE, EVENTS = "/api/epcis/capture", "/api/epcis/events"
GTIN = "09506000134352"  # a valid GTIN-14 (GS1's example)


def epcis_world() -> dict:
    """A fab in TW, two vendors, an owner and the regulator, each with a signed API client."""
    fab, fab_key = organisation("fab-tw", ["fab"], "TW")
    vendor_a, key_a = organisation("vendor-a", ["vendor"], "US")
    vendor_b, key_b = organisation("vendor-b", ["vendor"], "US")
    owner_a, owner_key = organisation("owner-a", ["owner"], "US")
    regulator, regulator_key = organisation("regulator", ["regulator"], "US")
    facility(fab, "fab-tw-1", kind="fab")
    facility(vendor_a, "wh-vendor-a", kind="warehouse")
    facility(owner_a, "dc-owner-a")
    chip_model(vendor_a)
    for licence_id in ("TW-EL-1", "TW-EL-9"):  # the regulator recorded these licences for fab-tw's exports
        services.export_licence_grant(
            licence_id=licence_id,
            exporter="fab-tw",
            consignee="vendor-a",
            from_country="TW",
            to_country="US",
            quantity=1000,
            expires_on="2099-12-31",
        )
    clients = [
        SignedClient(*pair)
        for pair in [
            (fab, fab_key),
            (vendor_a, key_a),
            (vendor_b, key_b),
            (owner_a, owner_key),
            (regulator, regulator_key),
        ]
    ]
    return dict(zip(["fab", "vendor_a", "vendor_b", "owner_a", "regulator"], clients, strict=True))


# --- GS1-style documents -------------------------------------------------------------


def sgtin(serial):
    return f"urn:epc:id:sgtin:0614141.812345.{serial}"


def link(serial):
    return f"https://id.gs1.org/01/{GTIN}/21/{serial}"


def document(*events):
    return {
        "@context": [
            "https://ref.gs1.org/standards/epcis/2.0.0/epcis-context.jsonld",
            {"chipledger": "https://chipledger.example/epcis/"},
        ],
        "type": "EPCISDocument",
        "schemaVersion": "2.0",
        "creationDate": "2026-03-01T12:00:00Z",
        "epcisBody": {"eventList": list(events)},
    }


def object_event(epcs, biz_step, action, **members):
    if biz_step in ("decommissioning", "destroying"):  # a regulator asks why, and for the evidence
        members = {"chipledger:reason": "end_of_life", "chipledger:evidence": "sha256:" + "ab" * 32, **members}
    return {
        "type": "ObjectEvent",
        "eventTime": "2026-03-01T10:00:00.000Z",
        "eventTimeZoneOffset": "+08:00",
        "epcList": epcs,
        "action": action,
        "bizStep": biz_step,
        **members,
    }


def commissioning(epcs, location="https://chipledger.example/facility/fab-tw-1", **members):
    ilmd = {"chipledger:model": "h100-sxm", "chipledger:publicKeys": {epc: chip_public_key() for epc in epcs}}
    return object_event(epcs, "commissioning", "ADD", bizLocation={"id": location}, ilmd=ilmd, **members)


def shipping(epcs, to, reference="urn:epcglobal:cbv:bt:0614141000005:PO-42", **members):
    return object_event(
        epcs,
        "https://ref.gs1.org/cbv/BizStep-shipping",
        "OBSERVE",
        disposition="in_transit",
        bizTransactionList=[{"type": "po", "bizTransaction": reference}],
        destinationList=[
            {
                "type": "https://ref.gs1.org/cbv/SDT-possessing_party",
                "destination": f"https://chipledger.example/org/{to}",
            }
        ],
        **members,
    )


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
