"""EPCIS capture: apply a parsed EPCISDocument (``epcis_document_parse``) as lifecycle entries.

The mapping of events onto the lifecycle is documented in ``rules.epcis_format`` (pure); here its
refusals become the ValidationError that the API turns into a 400 naming the path.
"""

from __future__ import annotations

import re

from django.core.exceptions import ValidationError
from django.db import transaction

from ledger import services as ledger
from rules.epcis_format import CaptureEvent, EpcisInvalid, parse_document, query_serial

from .. import selectors
from ..models import Chip, ExportLicence, Organisation
from .chips import chips_fabricate, chips_record_event, shipment_destination_country
from .common import fail, storable


def epcis_document_parse(data) -> list[CaptureEvent]:
    """The document's events (``rules.epcis_format.parse_document``), or ValidationError naming every bad path."""
    try:
        return parse_document(data)
    except EpcisInvalid as error:
        raise ValidationError(error.message_dict) from None


def epcis_query_serial(epc) -> str:
    """The chip serial of ``?epc=`` (``rules.epcis_format.query_serial``), or ValidationError on ``epc``."""
    try:
        return query_serial(epc)
    except EpcisInvalid as error:
        raise ValidationError(error.message_dict) from None


@transaction.atomic
def epcis_capture(*, organisation: Organisation, events: list[CaptureEvent], submission: dict | None) -> dict:
    """Record each new event as one lifecycle entry, in order; skip ids already captured."""
    serials = {serial for event in events for serial in event.serials}
    # Lock the chips first so a concurrent capture of the same events waits, then sees them as captured; then the
    # export licences the events cite, before the first event's entry: a later event must not wait for a licence
    # while this capture holds the ledger (an export citing it elsewhere holds it while waiting for the ledger).
    list(Chip.objects.filter(serial__in=serials).order_by("id").select_for_update(no_key=True).values_list("id"))
    # (an id with a control character or a lone surrogate names no recorded licence, and a query cannot carry it:
    # the event itself refuses it, naming the field)
    licences = {event.export_licence for event in events if event.export_licence and storable(event.export_licence)}
    list(ExportLicence.objects.filter(licence_id__in=licences).order_by("id").select_for_update(no_key=True))
    seen = selectors.captured_event_ids(organisation, serials)
    answers = []
    for event in events:
        answer = {"eventID": event.event_id, "status": "duplicate"}
        if event.event_id not in seen:
            seen.add(event.event_id)
            entry = _apply(organisation, event, submission)
            answer.update(status="captured", seq=entry.seq, kind=entry.kind, count=len(event.serials))
        answers.append(answer)
    captured = sum(answer["status"] == "captured" for answer in answers)
    return {"captured": captured, "duplicates": len(answers) - captured, "eventList": answers}


def _apply(organisation: Organisation, event: CaptureEvent, submission: dict | None) -> ledger.AppendedEntry:
    stamp = {"event_id": event.event_id}
    try:
        if event.step == "commissioning":
            at = {"facility": event.facility} if event.facility else {}
            chips = [
                {"serial": serial, "model": event.model, "public_key": key, **at}
                for serial, key in zip(event.serials, event.public_keys, strict=True)
            ]
            return chips_fabricate(organisation=organisation, chips=chips, submission=submission, epcis=stamp)
        countries = _visible_countries(organisation, event)
        kind, payload = _lifecycle_event(organisation, event, countries)
        return chips_record_event(
            organisation=organisation, event=kind, payload=payload, submission=submission, epcis=stamp
        )
    except ValidationError as error:
        raise _at(event, error) from None


def _visible_countries(organisation: Organisation, event: CaptureEvent) -> dict[str, str]:
    """serial -> country of the event's chips; chips the caller may not see do not exist for it (as on GET)."""
    visible = dict(
        selectors.chips_visible_to(organisation).filter(serial__in=event.serials).values_list("serial", "country")
    )
    for index, serial in enumerate(event.serials):
        if serial not in visible:
            fail(f"chips[{index}]", f"unknown chip {serial}")
    return visible


def _lifecycle_event(organisation: Organisation, event: CaptureEvent, countries: dict[str, str]) -> tuple[str, dict]:
    payload = {"chips": list(event.serials)}
    if event.step == "receiving":
        _check_acting_party(organisation, event.destination, "destinationList")
        return "received", {**payload, **({"facility": event.facility} if event.facility else {})}
    if event.step != "shipping":
        kind = {"decommissioning": "decommissioned", "destroying": "destroyed"}[event.step]
        return kind, {**payload, "reason": event.reason, "evidence": event.evidence}
    _check_acting_party(organisation, event.source, "sourceList")
    consignee = event.destination.get("possessing_party") or event.destination["owning_party"]
    payload.update(consignee=consignee, reference=event.reference)
    if event.destination.get("location"):
        payload["destination"] = event.destination["location"]
    country = shipment_destination_country(payload)
    abroad = sorted({c for c in countries.values() if c != country})
    if not abroad and not event.export_licence:
        return "shipped", payload
    if not event.export_licence:
        fail("export_licence", f"required: {', '.join(abroad)} to {country} crosses a border, an export")
    return "exported", {**payload, "export_licence": event.export_licence}


def _check_acting_party(organisation: Organisation, parties: dict, field_name: str) -> None:
    named = parties.get("possessing_party")
    if named not in (None, organisation.slug):
        fail(field_name, f"possessing_party {named!r} is not the signer {organisation.slug!r}")


# Where a service's field lives in the event, so a 400 names the document's path.
SERVICE_PATHS = {
    "consignee": "destinationList",
    "destination_country": "destinationList",
    "destination": "destinationList",
    "reason": "chipledger:reason",
    "evidence": "chipledger:evidence",
    "reference": "bizTransactionList",
    "export_licence": "chipledger:exportLicence",
    "facility": "bizLocation",
    "sourceList": "sourceList",
    "destinationList": "destinationList",
    "chips": "epcList",
}


def _at(event: CaptureEvent, error: ValidationError) -> ValidationError:
    located: dict[str, list] = {}
    for key, messages in error.message_dict.items():
        chip = re.match(r"chips\[(\d+)\]", key)
        if chip:
            where = f"{event.path}.epcList[{chip[1]}]"
        elif key in SERVICE_PATHS:
            where = f"{event.path}.{SERVICE_PATHS[key]}"
        else:
            where = event.path
        located.setdefault(where, []).extend(messages)
    return ValidationError(located)
