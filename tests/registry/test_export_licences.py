"""Borders: countries come from registered facts, a crossing needs a recorded licence, a diverted receipt alerts."""

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command

from inspections.models import Alert
from registry import services
from registry.models import Chip, ExportLicence
from tests.registry.epcis_helpers import CAPTURE, document, epcis_world, sgtin, shipping
from tests.registry.factories import chip_model, event, fabricate, facility, organisation

pytestmark = pytest.mark.django_db


@pytest.fixture
def world():
    fab, _ = organisation("fab-us", ["fab"], "US")
    vendor, _ = organisation("vendor-us", ["vendor"], "US")
    owner_us, _ = organisation("owner-us", ["owner"], "US")
    owner_nl, _ = organisation("owner-nl", ["owner"], "NL")
    facility(fab, "fab-us-1", kind="fab")
    facility(vendor, "wh-us", kind="warehouse")
    facility(owner_us, "dc-us")
    facility(owner_us, "dc-us-in-nl", country="NL")  # a US company's data centre abroad
    facility(owner_nl, "dc-nl")
    serials = fabricate(fab, chip_model(fab), 4, "fab-us-1")
    return {"fab": fab, "vendor": vendor, "owner_us": owner_us, "owner_nl": owner_nl, "serials": serials}


def ship(org, serials, **fields):
    return services.chips_record_event(organisation=org, event="shipped", payload={"chips": serials, **fields})


def export(org, serials, **fields):
    return services.chips_record_event(organisation=org, event="exported", payload={"chips": serials, **fields})


def refused(call, field: str) -> str:
    with pytest.raises(ValidationError) as error:
        call()
    assert field in error.value.message_dict, error.value.message_dict
    return error.value.message_dict[field][0]


def grant(licence_id="US-EL-1", consignee="owner-nl", to="NL", quantity=2, **overrides):
    return services.export_licence_grant(
        **{
            "licence_id": licence_id,
            "exporter": "fab-us",
            "consignee": consignee,
            "from_country": "US",
            "to_country": to,
            "quantity": quantity,
            "expires_on": "2099-12-31",
            **overrides,
        }
    )


def test_the_sender_cannot_choose_the_destination_country(world):
    fab, serials = world["fab"], world["serials"][:1]
    reason = refused(
        lambda: ship(fab, serials, consignee="owner-nl", reference="PO", destination_country="US"),
        "destination_country",
    )
    assert "NL" in reason
    refused(lambda: ship(fab, serials, consignee="owner-nl", reference="PO"), "chips[0]")  # a crossing: an export
    refused(lambda: ship(fab, serials, consignee="owner-us", reference="PO", destination="dc-nl"), "destination")
    refused(lambda: ship(fab, serials, consignee="owner-us", reference="PO", destination="dc-us-in-nl"), "chips[0]")
    assert Chip.objects.get(serial=serials[0]).status == "fabricated"


def test_an_export_needs_a_recorded_licence_that_covers_it(world):
    fab, serials = world["fab"], world["serials"]
    assert "no export licence" in refused(
        lambda: export(fab, serials[:1], consignee="owner-nl", reference="PO", export_licence="MADE-UP-1"),
        "export_licence",
    )
    grant("US-EL-DE", to="DE")
    grant("US-EL-OTHER", consignee="owner-us", to="NL", exporter="vendor-us")
    grant("US-EL-OLD", expires_on="2020-01-01")
    for licence, says in (("US-EL-DE", "to DE"), ("US-EL-OTHER", "granted to vendor-us"), ("US-EL-OLD", "expired")):
        reason = refused(
            lambda: export(fab, serials[:1], consignee="owner-nl", reference="PO", export_licence=licence),
            "export_licence",
        )
        assert says in reason, reason
    grant()
    refused(
        lambda: export(fab, serials[:3], consignee="owner-nl", reference="PO", export_licence="US-EL-1"),
        "export_licence",
    )
    export(fab, serials[:2], consignee="owner-nl", reference="PO", export_licence="US-EL-1")
    assert ExportLicence.objects.get(licence_id="US-EL-1").used == 2
    assert "0 of 2" in refused(
        lambda: export(fab, serials[2:3], consignee="owner-nl", reference="PO", export_licence="US-EL-1"),
        "export_licence",
    )
    assert Chip.objects.get(serial=serials[0]).country == "NL"


def test_receipt_in_another_country_than_consigned_raises_an_alert(world):
    fab, owner, serials = world["fab"], world["owner_us"], world["serials"][:2]
    ship(fab, serials, consignee="owner-us", reference="PO")  # domestic, declared to the US
    event(owner, "received", serials, facility="dc-us-in-nl")
    alert = Alert.objects.get(kind="diverted")
    assert alert.prover.slug == "fab-us" and serials[0] in alert.detail and "consigned to US" in alert.detail
    assert Chip.objects.get(serial=serials[0]).country == "NL"  # the ledger records what happened
    call_command("rebuild_projections", "--check")


def test_out_of_use_needs_reason_and_evidence_and_raises_a_notice(world):
    fab, serials = world["fab"], world["serials"][:1]
    payload = {"chips": serials, "reason": "failed"}
    refused(lambda: services.chips_record_event(organisation=fab, event="destroyed", payload=payload), "evidence")
    bad = {**payload, "evidence": "x\n"}
    refused(lambda: services.chips_record_event(organisation=fab, event="destroyed", payload=bad), "evidence")
    odd = {**payload, "reason": "because", "evidence": "RMA-7"}
    refused(lambda: services.chips_record_event(organisation=fab, event="destroyed", payload=odd), "reason")
    services.chips_record_event(organisation=fab, event="destroyed", payload={**payload, "evidence": "RMA-7"})
    assert "RMA-7" in Alert.objects.get(kind="lifecycle").detail


def test_install_only_in_a_data_centre(world):
    fab, vendor, serials = world["fab"], world["vendor"], world["serials"][:1]
    ship(fab, serials, consignee="vendor-us", reference="PO")
    event(vendor, "received", serials, facility="wh-us")
    assert "data centre" in refused(lambda: event(vendor, "installed", serials, facility="wh-us"), "chips[0]")


def test_free_text_notes_are_refused_because_the_ledger_is_public(world):
    fab, serials = world["fab"], world["serials"][:1]
    payload = {"chips": serials, "note": "rack 7, cage B, Building 3"}
    assert "public" in refused(
        lambda: services.chips_record_event(organisation=fab, event="reported_lost", payload=payload), "note"
    )


def test_epcis_shipping_needs_a_recorded_licence_too():
    clients = epcis_world()
    fab = clients["fab"]
    serials = fabricate(fab.org, chip_model_of(), 1, "fab-tw-1")
    made_up = shipping([sgtin(serials[0])], "vendor-a", **{"chipledger:exportLicence": "MADE-UP"})
    response = fab.post(CAPTURE, document(made_up))
    assert response.status_code == 400
    assert "no export licence" in response.json()["epcisBody.eventList[0].chipledger:exportLicence"][0]


def chip_model_of():
    from registry.models import ChipModel

    return ChipModel.objects.get()
