"""Reads of the registry: what a caller may see, chip histories with their ledger proofs or as EPCIS events."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Q, QuerySet

from ledger import selectors as ledger_selectors
from rules import epcis_format

from .models import Chip, ChipEvent, Member, Organisation, Role

SEES_EVERYTHING = {Role.REGULATOR, Role.INSPECTION_BODY}


def organisation_of(user) -> Organisation | None:
    """The organisation the user acts for; remembered on the user object for the request."""
    if not hasattr(user, "_chipledger_organisation"):
        member = Member.objects.select_related("organisation").filter(user_id=user.pk).first()
        user._chipledger_organisation = member.organisation if member else None
    return user._chipledger_organisation


def chips_visible_to(organisation: Organisation) -> QuerySet[Chip]:
    """A vendor or owner sees its own chips and those consigned or offered to it; the regulator all."""
    chips = Chip.objects.select_related("model", "owner", "possessor", "facility", "consignee", "pending_owner", "fab")
    if SEES_EVERYTHING & set(organisation.roles):
        return chips
    me = organisation.pk
    return chips.filter(
        Q(owner_id=me) | Q(possessor_id=me) | Q(consignee_id=me) | Q(pending_owner_id=me) | Q(fab_id=me)
    )


def chip_visible_to(organisation: Organisation, serial: str) -> Chip | None:
    # Slicing, not .first(): first() orders by id, and PostgreSQL may then walk the
    # primary key instead of using the serial's unique index.
    found = list(chips_visible_to(organisation).filter(serial=serial)[:1])
    return found[0] if found else None


def chip_sold_by(organisation: Organisation, serial: str) -> tuple[Chip, dict] | None:
    """A chip the organisation no longer sees but sold: it offered the chip's ownership and the buyer accepted.
    (chip, the sale's ``chip.transfer_accepted`` event): the seller may read the chip's history up to the sale,
    nothing after it (where the buyer keeps it is the buyer's business)."""
    chip = Chip.objects.select_related("model", "fab").filter(serial=serial).first()
    if chip is None:
        return None
    sale = None
    events = ChipEvent.objects.filter(chip=chip).order_by("seq").values("seq", "kind", "actor")
    offered = False
    for event in events:
        if event["kind"] == "chip.transfer_offered":
            offered = event["actor"] == organisation.slug
        elif event["kind"] == "chip.transfer_cancelled":
            offered = False
        elif event["kind"] == "chip.transfer_accepted":
            sale = event if offered else sale
            offered = False
    return (chip, sale) if sale is not None else None


def chip_history(chip: Chip, up_to_seq: int | None = None) -> list[dict]:
    """The chip's events in order (up to and including ``up_to_seq``, if given), each with its RFC 9162 inclusion
    proof in the latest checkpoint."""
    checkpoint = ledger_selectors.checkpoint_latest()
    size = checkpoint.size if checkpoint else 0
    rows = ChipEvent.objects.filter(chip=chip)
    if up_to_seq is not None:
        rows = rows.filter(seq__lte=up_to_seq)
    events = list(rows.order_by("seq").values("seq", "kind", "actor"))
    signed = [e["seq"] for e in events if e["seq"] < size]
    proofs = ledger_selectors.inclusion_proofs(signed, size, size_is_signed=True) if signed else {}
    return [{**event, "tree_size": size, "proof": proofs.get(event["seq"])} for event in events]


def chip_object_events(chip: Chip, epc: str) -> list[dict]:
    """The chip's ledger history as EPCIS ObjectEvents (``rules.epcis_format.object_event``), one per entry in ledger order.

    eventTime and recordTime are the entry's ledger time; bizStep/action/disposition follow KIND_STEPS;
    eventID is the captured one for entries that came through EPCIS; parties, reference, facility and
    ILMD come from the payload; ``chipledger:seq``/``kind``/``actor`` name the entry. Each epcList is
    the chip as the caller named it (a bare serial becomes ``https://chipledger.example/chip/<serial>``).
    """
    entries = ledger_selectors.entries_at(ChipEvent.objects.filter(chip=chip).values("seq"))
    name = epc if ":" in epc else epcis_format.CHIP_URI + epc
    return [epcis_format.object_event(entry, chip.serial, name) for entry in entries]


def captured_event_ids(organisation: Organisation, serials) -> set[str]:
    """EPCIS event ids on the ledger entries of these chips: the dedupe memory of EPCIS capture.

    Only chips the caller may see count, so "duplicate" never reveals others' chips' history.
    """
    chips = chips_visible_to(organisation).filter(serial__in=serials).values("id")
    entries = ledger_selectors.entries_at(ChipEvent.objects.filter(chip__in=chips).values("seq"))
    return {(entry["payload"].get("epcis") or {}).get("event_id") for entry in entries} - {None}


def chip_owner_at(chip: Chip, when: datetime, recorded_seq: int) -> str:
    """The slug of the chip's owner at ``when`` (a time the chip itself signed), as the ledger recorded it then:
    the fab that made it, then each accepted transfer's buyer from the time of its entry (only
    ``chip.transfer_accepted`` changes an owner). ``recorded_seq``: the entry that recorded the signed time (an
    inspection reading the chip's log). The chip's clock is held within what the ledger knows: a time before the
    chip's registration (a clock behind, or a chip registered after it entered service) is placed at its
    recording, and so is a time after its recording (a clock ahead: it was signed before it was read)."""
    times = ledger_selectors.entry_times([chip.fabricated_seq, recorded_seq])
    registered, recorded = times.get(chip.fabricated_seq), times.get(recorded_seq)
    if recorded is not None and (when > recorded or (registered is not None and when < registered)):
        when = recorded
    sales = ChipEvent.objects.filter(chip=chip, kind="chip.transfer_accepted").values("seq")
    return ledger_selectors.latest_actor_by(sales, when) or chip.fab.slug
