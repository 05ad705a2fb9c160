"""The chip lifecycle as a pure state machine (no Django): what may happen to a chip, and who may do it.

Live writes (``registry.services``) and the rebuild from the ledger
(``rebuild_projections``) both go through ``apply_chip_event``, so the
projection can only ever hold states this module allows.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum


class Status(StrEnum):
    FABRICATED = "fabricated"
    PACKAGED = "packaged"
    IN_TRANSIT = "in_transit"
    IN_STOCK = "in_stock"
    INSTALLED = "installed"
    DECOMMISSIONED = "decommissioned"
    DESTROYED = "destroyed"
    LOST = "lost"
    STOLEN = "stolen"


HELD = {Status.FABRICATED, Status.PACKAGED, Status.IN_STOCK}  # in someone's hands, not installed
ACTIVE = HELD | {Status.INSTALLED}
MISSING = {Status.LOST, Status.STOLEN}


@dataclass(frozen=True)
class ChipState:
    serial: str
    model: str
    fab: str
    owner: str
    possessor: str
    status: Status
    facility: str | None = None
    country: str = ""
    consignee: str | None = None
    pending_owner: str | None = None
    status_before_missing: Status | None = None
    packaged: bool = False


class LifecycleError(ValueError):
    """An event that cannot happen to this chip, or that this actor may not cause."""


@dataclass(frozen=True)
class Facts:
    """What the state machine needs to know about the world beyond the chip."""

    actor: str
    facility_owner: str | None = None  # owner of payload["facility"], if one is named
    facility_country: str | None = None
    facility_kind: str | None = None
    consignee_exists: bool = True
    actor_country: str = ""


# Each event: (allowed statuses, who may act: "owner" | "possessor" | "consignee" | "pending_owner" | "holder")
RULES: dict[str, tuple[frozenset[Status], str]] = {
    "packaged": (frozenset({Status.FABRICATED, Status.IN_STOCK}), "possessor"),
    "shipped": (frozenset(HELD), "possessor"),
    "exported": (frozenset(HELD), "possessor"),
    "received": (frozenset({Status.IN_TRANSIT}), "consignee"),
    "transfer_offered": (frozenset(ACTIVE | {Status.IN_TRANSIT, Status.DECOMMISSIONED}), "owner"),
    "transfer_accepted": (frozenset(ACTIVE | {Status.IN_TRANSIT, Status.DECOMMISSIONED}), "pending_owner"),
    "transfer_cancelled": (frozenset(ACTIVE | {Status.IN_TRANSIT, Status.DECOMMISSIONED}), "owner"),
    "installed": (frozenset({Status.PACKAGED, Status.IN_STOCK}), "possessor"),
    "removed": (frozenset({Status.INSTALLED}), "possessor"),
    "decommissioned": (frozenset(ACTIVE), "owner"),
    "destroyed": (frozenset(ACTIVE | {Status.DECOMMISSIONED}), "owner"),
    "reported_lost": (frozenset(ACTIVE | {Status.IN_TRANSIT, Status.DECOMMISSIONED}), "holder"),
    "reported_stolen": (frozenset(ACTIVE | {Status.IN_TRANSIT, Status.DECOMMISSIONED}), "holder"),
    "found": (frozenset(MISSING), "holder"),
}
EVENTS = ("fabricated", *RULES)


def fabricate(serial: str, model: str, facts: Facts, facility: str | None) -> ChipState:
    """A new chip, owned and held by the fab that made it."""
    if facility is not None and facts.facility_owner != facts.actor:
        raise LifecycleError(f"facility {facility!r} does not belong to {facts.actor}")
    country = facts.facility_country if facility else facts.actor_country
    return ChipState(serial, model, facts.actor, facts.actor, facts.actor, Status.FABRICATED, facility, country or "")


def apply_chip_event(chip: ChipState, event: str, facts: Facts, payload: dict) -> ChipState:
    """The chip after ``event`` (payload as on the ledger), or LifecycleError saying why not."""
    allowed, party = RULES[event]
    if chip.status not in allowed:
        raise LifecycleError(f"a chip that is {chip.status.replace('_', ' ')} cannot be {event.replace('_', ' ')}")
    _check_party(chip, party, facts.actor, event)
    return _TRANSITIONS[event](chip, facts, payload)


def _check_party(chip: ChipState, party: str, actor: str, event: str) -> None:
    allowed = {
        "owner": {chip.owner},
        "possessor": {chip.possessor},
        "consignee": {chip.consignee},
        "pending_owner": {chip.pending_owner},
        "holder": {chip.owner, chip.possessor},
    }[party]
    if actor not in allowed:
        raise LifecycleError(f"only the chip's {party.replace('_', ' ')} may record {event.replace('_', ' ')}")


def _at_facility(chip: ChipState, facts: Facts, payload: dict, status: Status, moves: bool = False) -> ChipState:
    """The chip at the named facility. Only a receipt (``moves``) may put it in another country: a chip in
    transit arrives where it arrives, and a receipt elsewhere than consigned is recorded and alerted
    (``registry.services.chips``); installing or packaging it abroad would be a border crossing with no export."""
    facility = payload.get("facility")
    if facility is None:
        return replace(chip, status=status)
    if facts.facility_owner != facts.actor:
        raise LifecycleError(f"facility {facility!r} does not belong to {facts.actor}")
    country = facts.facility_country or chip.country
    if not moves and chip.country and country != chip.country:
        raise LifecycleError(f"{chip.country} to {country} (facility {facility!r}) crosses a border: record an export")
    return replace(chip, status=status, facility=facility, country=country)


def _consigned(chip: ChipState, facts: Facts, payload: dict) -> ChipState:
    consignee = payload["consignee"]
    if consignee == chip.possessor:
        raise LifecycleError("a chip cannot be shipped to its own possessor")
    if not facts.consignee_exists:
        raise LifecycleError(f"unknown consignee {consignee!r}")
    return replace(
        chip, status=Status.IN_TRANSIT, consignee=consignee, facility=None, country=payload["destination_country"]
    )


def _shipped(chip: ChipState, facts: Facts, payload: dict) -> ChipState:
    if payload["destination_country"] != chip.country:
        raise LifecycleError(f"{chip.country} to {payload['destination_country']} crosses a border: record an export")
    return _consigned(chip, facts, payload)


def _exported(chip: ChipState, facts: Facts, payload: dict) -> ChipState:
    """Export, or re-export of a chip abroad from its fab; always under an export licence."""
    if payload["destination_country"] == chip.country:
        raise LifecycleError(f"destination {chip.country} is the chip's own country: record a shipment")
    if not payload.get("export_licence"):
        raise LifecycleError(
            f"exporting from {chip.country} to {payload['destination_country']} needs an export licence"
        )
    return _consigned(chip, facts, payload)


def _received(chip: ChipState, facts: Facts, payload: dict) -> ChipState:
    received = replace(chip, possessor=chip.consignee, consignee=None)
    return _at_facility(received, facts, payload, Status.IN_STOCK, moves=True)


def _transfer_offered(chip: ChipState, facts: Facts, payload: dict) -> ChipState:
    if chip.pending_owner is not None:
        raise LifecycleError(f"a transfer to {chip.pending_owner} is already pending")
    if payload["to_owner"] == chip.owner:
        raise LifecycleError("a chip cannot be transferred to its own owner")
    if not facts.consignee_exists:
        raise LifecycleError(f"unknown organisation {payload['to_owner']!r}")
    return replace(chip, pending_owner=payload["to_owner"])


def _transfer_accepted(chip: ChipState, facts: Facts, payload: dict) -> ChipState:
    return replace(chip, owner=chip.pending_owner, pending_owner=None)


def _transfer_cancelled(chip: ChipState, facts: Facts, payload: dict) -> ChipState:
    if chip.pending_owner is None:
        raise LifecycleError("no transfer is pending")
    return replace(chip, pending_owner=None)


def _removed(chip: ChipState, facts: Facts, payload: dict) -> ChipState:
    return replace(chip, status=Status.IN_STOCK)


def _missing(status: Status):
    def transition(chip: ChipState, facts: Facts, payload: dict) -> ChipState:
        return replace(chip, status=status, status_before_missing=chip.status)

    return transition


def _found(chip: ChipState, facts: Facts, payload: dict) -> ChipState:
    return replace(chip, status=chip.status_before_missing or Status.IN_STOCK, status_before_missing=None)


_TRANSITIONS = {
    "packaged": lambda chip, facts, payload: _packaged(chip, facts, payload),
    "shipped": _shipped,
    "exported": _exported,
    "received": _received,
    "transfer_offered": _transfer_offered,
    "transfer_accepted": _transfer_accepted,
    "transfer_cancelled": _transfer_cancelled,
    "installed": lambda chip, facts, payload: _installed(chip, facts, payload),
    "removed": _removed,
    "decommissioned": lambda chip, facts, payload: _ended(chip, payload, Status.DECOMMISSIONED),
    "destroyed": lambda chip, facts, payload: _ended(chip, payload, Status.DESTROYED),
    "reported_lost": _missing(Status.LOST),
    "reported_stolen": _missing(Status.STOLEN),
    "found": _found,
}


def _packaged(chip: ChipState, facts: Facts, payload: dict) -> ChipState:
    """At the fab itself or at a packager it was shipped to; once."""
    if chip.packaged:
        raise LifecycleError("the chip is already packaged")
    return replace(_at_facility(chip, facts, payload, Status.PACKAGED), packaged=True)


def _installed(chip: ChipState, facts: Facts, payload: dict) -> ChipState:
    if payload.get("facility") is None:
        raise LifecycleError("installing a chip needs a facility")
    if facts.facility_kind != "datacentre":
        raise LifecycleError(f"chips are installed only in a data centre, not a {facts.facility_kind}")
    return _at_facility(chip, facts, payload, Status.INSTALLED)


def _ended(chip: ChipState, payload: dict, status: Status) -> ChipState:
    """Out of use for good: a regulator asks why, and for the evidence."""
    if not payload.get("reason") or not payload.get("evidence"):
        raise LifecycleError(f"a chip is {status} only with a reason and an evidence reference")
    return replace(chip, status=status)
