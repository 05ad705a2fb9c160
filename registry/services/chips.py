"""Chips: fabrication and every later lifecycle event, each request one ledger entry, all or nothing."""

from __future__ import annotations

import base64
import difflib
import re
from collections import defaultdict

from django.core.exceptions import ValidationError
from django.db import transaction

from ledger import services as ledger
from ledger.bulk import insert_rows
from rules.chip_lifecycle import RULES, ChipState, Facts, LifecycleError, Status, apply_chip_event, fabricate
from rules.identifiers import MAX_CHIPS, SERIAL, is_chip_public_key

from ..models import Chip, ChipEvent, ChipModel, Facility, Organisation, Role
from ..selectors import SEES_EVERYTHING
from ..signals import chip_notice
from .common import fail, organisation_by_slug, storable
from .licences import export_licence_use

# API event name -> lifecycle event (the ledger kind is "chip.<lifecycle event>")
CHIP_EVENTS = {
    "package": "packaged",
    "ship": "shipped",
    "export": "exported",
    "receive": "received",
    "transfer-offer": "transfer_offered",
    "transfer-accept": "transfer_accepted",
    "transfer-cancel": "transfer_cancelled",
    "install": "installed",
    "remove": "removed",
    "decommission": "decommissioned",
    "destroy": "destroyed",
    "report-lost": "reported_lost",
    "report-stolen": "reported_stolen",
    "found": "found",
}


@transaction.atomic
def chips_fabricate(
    *, organisation: Organisation, chips: list, submission: dict | None = None, epcis: dict | None = None
) -> ledger.AppendedEntry:
    """Register newly fabricated chips (fab role only), all or nothing.

    ``epcis`` (set by ``registry.services.epcis`` only, never from a request body) is kept in the payload so
    the ledger itself records which EPCIS event this entry is, for dedupe and round-trips.
    """
    if not organisation.has_role(Role.FAB):
        fail("organisation", f"{organisation.slug} is not a fab")
    items = _fabrication_items(chips)
    models = {m.slug: m for m in ChipModel.objects.filter(slug__in={item["model"] for item in items})}
    facilities = {
        f.slug: f for f in Facility.objects.filter(slug__in={i["facility"] for i in items if i.get("facility")})
    }
    existing = set(Chip.objects.filter(serial__in=[i["serial"] for i in items]).values_list("serial", flat=True))
    errors = {}
    states = []
    for position, item in enumerate(items):
        try:
            if item["serial"] in existing:
                raise LifecycleError(f"chip {item['serial']} already exists")
            if item["model"] not in models:
                raise LifecycleError(f"unknown chip model {item['model']!r}")
            facility = facilities.get(item.get("facility"))
            if item.get("facility") and facility is None:
                raise LifecycleError(f"unknown facility {item['facility']!r}")
            facts = Facts(
                actor=organisation.slug,
                facility_owner=facility.owner.slug if facility else None,
                facility_country=facility.country if facility else None,
                actor_country=organisation.country,
            )
            states.append(fabricate(item["serial"], item["model"], facts, item.get("facility")))
        except LifecycleError as error:
            errors[f"chips[{position}]"] = str(error)
    if errors:
        raise ValidationError(errors)
    payload = {"chips": items, **({"epcis": epcis} if epcis else {})}
    entry = ledger.append_entry("chip.fabricated", payload, organisation.slug, submission)
    _insert_chips(organisation, states, items, models, facilities, entry)
    return entry


def _insert_chips(organisation, states, items, models, facilities, entry) -> None:
    """COPY/executemany instead of bulk_create: 10,000-chip requests are the hot path."""
    columns = (
        "serial",
        "model_id",
        "fab_id",
        "public_key",
        "owner_id",
        "possessor_id",
        "facility_id",
        "country",
        "status",
        "status_before_missing",
        "packaged",
        "fabricated_seq",
        "updated_seq",
    )
    rows = []
    for state, item in zip(states, items):
        facility = facilities.get(state.facility)
        rows.append(
            (
                state.serial,
                models[state.model].id,
                organisation.id,
                base64.b64decode(item["public_key"]),
                organisation.id,
                organisation.id,
                facility.id if facility else None,
                state.country,
                state.status.value,
                "",
                False,
                entry.seq,
                entry.seq,
            )
        )
    insert_rows(Chip._meta.db_table, columns, rows)
    ids = dict(Chip.objects.filter(serial__in=[s.serial for s in states]).values_list("serial", "id"))
    _insert_events([ids[s.serial] for s in states], entry)


def _insert_events(chip_ids: list[int], entry: ledger.AppendedEntry) -> None:
    insert_rows(
        ChipEvent._meta.db_table,
        ("chip_id", "seq", "kind", "actor"),
        [(chip_id, entry.seq, entry.kind, entry.actor) for chip_id in chip_ids],
    )


def _fabrication_items(chips) -> list[dict]:
    if not isinstance(chips, list) or not 1 <= len(chips) <= MAX_CHIPS:
        fail("chips", f"a list of 1 to {MAX_CHIPS} chips")
    items, seen, errors = [], set(), {}
    for position, chip in enumerate(chips):
        where = f"chips[{position}]"
        if not isinstance(chip, dict):
            errors[where] = "must be an object with serial, model, public_key and optionally facility"
            continue
        serial, model, key = chip.get("serial"), chip.get("model"), chip.get("public_key")
        if not isinstance(serial, str) or not SERIAL.fullmatch(serial):
            errors[f"{where}.serial"] = "1-64 characters of letters, digits, '.', '_' or '-'"
        elif serial in seen:
            errors[f"{where}.serial"] = f"{serial} appears twice in this request"
        if not isinstance(model, str) or not model:
            errors[f"{where}.model"] = "required: a chip model slug"
        if not is_chip_public_key(key):
            errors[f"{where}.public_key"] = (
                "required: base64 of the chip's 32-byte Ed25519 public key (canonical: padded, spare bits zero)"
            )
        facility = chip.get("facility")
        if facility is not None and not isinstance(facility, str):
            errors[f"{where}.facility"] = "a facility slug"
        unknown = set(chip) - {"serial", "model", "public_key", "facility"}
        if unknown:
            errors[f"{where}"] = f"unknown fields {sorted(unknown)}"
        if isinstance(serial, str):
            seen.add(serial)
        items.append({k: chip[k] for k in ("serial", "model", "public_key", "facility") if chip.get(k) is not None})
    if errors:
        raise ValidationError(errors)
    return items


EVENT_FIELDS = {
    # destination: the consignee's facility the chips go to; destination_country follows from it (or from the
    # consignee's registered country) and, if sent, must agree: countries are never the sender's choice.
    "shipped": {"consignee": True, "reference": True, "destination": False, "destination_country": False},
    "exported": {
        "consignee": True,
        "reference": True,
        "destination": False,
        "destination_country": False,
        "export_licence": True,
    },
    # a receipt names the facility the chips arrive at: a chip "in stock" must be in stock somewhere. Requests only:
    # rules.chip_lifecycle still replays older ledgers whose receipts named none.
    "received": {"facility": True},
    "packaged": {"facility": False},
    "installed": {"facility": True},
    "transfer_offered": {"to_owner": True, "reference": False},
    "decommissioned": {"reason": True, "evidence": True},
    "destroyed": {"reason": True, "evidence": True},
}
ORGANISATION_FIELDS = {"consignee", "to_owner"}  # fields that name a registered organisation
# who may own chips: the regulator and inspection bodies check chips, and owning one would make them a party
# to what they check (and a prover in the draws)
OWNING_ROLES = {Role.FAB, Role.PACKAGER, Role.VENDOR, Role.OWNER}
END_REASONS = ("end_of_life", "failed", "damaged", "recalled", "regulatory_order")
EVIDENCE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/#-]{0,127}")  # e.g. sha256:<hex of the certificate>, or its id


def event_fields_table() -> str:
    """Markdown: each event's required and optional fields beyond ``chips``, ``timestamp`` and ``nonce`` (the
    README and the OpenAPI description print this; a test keeps the README equal to it)."""
    rows = ["| event | required | optional |", "|---|---|---|"]
    rows.append("| `fabricate` | `chips: [{serial, model, public_key}]` | `facility` per chip |")
    for name, event in CHIP_EVENTS.items():
        fields = EVENT_FIELDS.get(event, {})
        required = ", ".join(f"`{f}`" for f, needed in fields.items() if needed) or "—"
        optional = ", ".join(f"`{f}`" for f, needed in fields.items() if not needed) or "—"
        rows.append(f"| `{name}` | {required} | {optional} |")
    return "\n".join(rows)


PUBLIC_NOTE = "not accepted: ledger entries are public (docs/security.md); keep free text in your own records"


@transaction.atomic
def chips_record_event(
    *,
    organisation: Organisation,
    event: str,
    payload: dict,
    submission: dict | None = None,
    epcis: dict | None = None,
) -> ledger.AppendedEntry:
    """Record one lifecycle event for a set of chips, all or nothing (docs/ARCHITECTURE.md, The flow). ``epcis``: see chips_fabricate."""
    if event not in RULES:
        fail("event", f"one of {sorted(RULES)}")
    normalised = _event_payload(event, payload)
    if epcis:
        normalised["epcis"] = epcis
    serials = normalised["chips"]
    rows = _locked_chip_rows(serials)
    if event == "transfer_offered":
        _owner_check(normalised["to_owner"])
    facts = _facts(organisation, event, normalised)
    errors, after = {}, {}
    for position, serial in enumerate(serials):
        row = rows.get(serial)
        if row is None or not _visible(organisation, row):  # others' chips do not exist for the caller (no state)
            errors[f"chips[{position}]"] = f"unknown chip {serial}"
            continue
        try:
            after[serial] = apply_chip_event(_state(row), event, facts, normalised)
        except LifecycleError as error:
            errors[f"chips[{position}]"] = f"{serial}: {error}"
    if errors:
        raise ValidationError(errors)
    if event == "exported":
        countries = {rows[serial]["country"] for serial in serials}
        export_licence_use(
            normalised["export_licence"],
            organisation,
            normalised["consignee"],
            countries,
            normalised["destination_country"],
            len(serials),
        )
    entry = ledger.append_entry(f"chip.{event}", normalised, organisation.slug, submission)
    _persist(rows, after, entry)
    _notify(event, rows, after, entry)
    return entry


def _notify(event: str, rows: dict[str, dict], after: dict[str, ChipState], entry) -> None:
    """Tell the regulator (``registry.signals.chip_notice``) of chips received abroad and of chips taken out of use."""
    by_owner: dict[str, list[str]] = defaultdict(list)
    if event == "received":
        for serial, state in after.items():
            if state.facility and state.country != rows[serial]["country"]:
                by_owner[state.owner].append(serial)
        kind = "diverted"
        say = "received in {country} at {facility}, but consigned to {declared} (seq {seq})"
    elif event in {"reported_lost", "reported_stolen"}:  # at once, not at the next sweep: one alert per chip
        for serial in after:
            chip_notice.send(
                sender=Chip,
                kind="lost",
                prover=after[serial].owner,
                serials=[serial],
                detail=f"{serial} was {event.replace('_', ' ')} (seq {entry.seq})",
            )
        return
    elif event in {"decommissioned", "destroyed"}:
        for serial, state in after.items():
            by_owner[state.owner].append(serial)
        kind = "lifecycle"
        say = f"{event} (reason {entry.payload['reason']}, evidence {entry.payload['evidence']}; seq {{seq}})"
    for owner, serials in by_owner.items():
        first = after[serials[0]]
        detail = say.format(
            country=first.country, facility=first.facility, declared=rows[serials[0]]["country"], seq=entry.seq
        )
        shown = ", ".join(serials[:5]) + (f" and {len(serials) - 5} more" if len(serials) > 5 else "")
        chip_notice.send(
            sender=Chip, kind=kind, prover=owner, serials=serials, detail=f"{len(serials)} chip(s) {shown}: {detail}"
        )


def _event_payload(event: str, payload: dict) -> dict:
    if not isinstance(payload, dict):
        fail("body", "must be a JSON object")
    chips = payload.get("chips")
    if not isinstance(chips, list) or not 1 <= len(chips) <= MAX_CHIPS:
        fail("chips", f"a list of 1 to {MAX_CHIPS} chip serials")
    if not all(isinstance(s, str) and SERIAL.fullmatch(s) for s in chips):
        fail("chips", "every item must be a chip serial")
    if len(set(chips)) != len(chips):
        fail("chips", "a serial appears twice")
    normalised = {"chips": chips}
    fields = EVENT_FIELDS.get(event, {})
    missing = {
        name: f"required for {event}" for name, required in fields.items() if required and payload.get(name) is None
    }
    unknown = _unknown_fields(payload, fields, event)
    if missing or unknown:  # every missing and unknown field at once, so a client fixes its request in one go
        raise ValidationError({**missing, **unknown})
    for name in fields:
        value = payload.get(name)
        if value is None:
            continue
        if not isinstance(value, str) or not value or len(value) > 128:
            fail(name, "a non-empty string of at most 128 characters")
        if not storable(value):
            fail(name, "must not contain control characters or lone surrogates")
        normalised[name] = value
    if "note" in payload:
        fail("note", PUBLIC_NOTE)
    if event in {"shipped", "exported"}:
        normalised["destination_country"] = shipment_destination_country(normalised)
    if event in {"decommissioned", "destroyed"}:
        if normalised["reason"] not in END_REASONS:
            fail("reason", f"one of {list(END_REASONS)}")
        if not EVIDENCE.fullmatch(normalised["evidence"]):
            fail("evidence", "a reference to the evidence, e.g. sha256:<hex of the destruction certificate>")
    return normalised


def _unknown_fields(payload: dict, fields: dict, event: str) -> dict[str, str]:
    """Each field the event does not take, named, with the field it probably meant (``consignee_org`` ->
    ``consignee``) and, where its value names no registered organisation, that too."""
    known = [*fields, "chips", "timestamp", "nonce"]
    errors = {}
    for name in sorted(k for k in payload if k not in known and k != "note"):
        guess = (
            difflib.get_close_matches(name, list(fields), n=1, cutoff=0.5)
            or [field for field in fields if field in name][:1]
        )
        words = f"unknown field for {event}" + (f": did you mean {guess[0]!r}?" if guess else "")
        value = payload[name]
        names_organisation = guess and guess[0] in ORGANISATION_FIELDS and isinstance(value, str) and len(value) <= 128
        if names_organisation and not Organisation.objects.filter(slug=value).exists():
            words += f" (and no organisation {value!r} is registered)"
        errors[str(name)[:64]] = words
    return errors


def shipment_destination_country(payload: dict) -> str:
    """Where a shipment goes, from registered facts: the named facility of the consignee, else the consignee."""
    consignee = organisation_by_slug(payload["consignee"], "consignee")
    country, where = consignee.country, f"consignee {consignee.slug}"
    if payload.get("destination"):
        facility = Facility.objects.filter(slug=payload["destination"]).first()
        if facility is None or facility.owner_id != consignee.pk:
            fail("destination", f"{payload['destination']!r} is not a registered facility of {consignee.slug}")
        country, where = facility.country, f"facility {facility.slug}"
    claimed = payload.get("destination_country")
    if claimed is not None and claimed != country:
        fail("destination_country", f"the destination is {country} ({where}); it follows from registered facts")
    return country


def _owner_check(slug: str) -> None:
    """A transfer goes only to an organisation that may own chips (an unknown one is named by the lifecycle)."""
    to = Organisation.objects.filter(slug=slug).first()
    if to is not None and not OWNING_ROLES & set(to.roles):
        roles = ", ".join(to.roles)
        fail("to_owner", f"{slug} ({roles}) may not own chips: only a fab, packager, vendor or owner may")


def _visible(organisation: Organisation, row: dict) -> bool:
    """The rule of ``registry.selectors.chips_visible_to``, on a locked row."""
    if SEES_EVERYTHING & set(organisation.roles):
        return True
    parties = ("owner__slug", "possessor__slug", "consignee__slug", "pending_owner__slug", "fab__slug")
    return organisation.slug in {row[party] for party in parties}


def _facts(organisation: Organisation, event: str, payload: dict) -> Facts:
    facility = None
    if payload.get("facility"):
        facility = Facility.objects.select_related("owner").filter(slug=payload["facility"]).first()
        if facility is None:
            fail("facility", f"unknown facility {payload['facility']!r}")
    other = payload.get("consignee") or payload.get("to_owner")
    return Facts(
        actor=organisation.slug,
        facility_owner=facility.owner.slug if facility else None,
        facility_country=facility.country if facility else None,
        facility_kind=facility.kind if facility else None,
        consignee_exists=other is None or Organisation.objects.filter(slug=other).exists(),
        actor_country=organisation.country,
    )


CHIP_STATE_FIELDS = (
    "id",
    "serial",
    "model__slug",
    "fab__slug",
    "owner__slug",
    "possessor__slug",
    "consignee__slug",
    "pending_owner__slug",
    "facility__slug",
    "country",
    "status",
    "status_before_missing",
    "packaged",
)


def _locked_chip_rows(serials: list[str]) -> dict[str, dict]:
    """The chips' current rows, locked so a concurrent event cannot interleave (PostgreSQL): in one order (by id), so
    two events over the same chips wait for each other, never deadlock; FOR NO KEY UPDATE, so a row naming a chip
    (a snapshot, an alert) inserted by a writer that holds the ledger's lock does not wait for this one."""
    locked = Chip.objects.filter(serial__in=serials).order_by("id").select_for_update(of=("self",), no_key=True)
    return {row["serial"]: row for row in locked.values(*CHIP_STATE_FIELDS)}


def _state(row: dict) -> ChipState:
    return ChipState(
        serial=row["serial"],
        model=row["model__slug"],
        fab=row["fab__slug"],
        owner=row["owner__slug"],
        possessor=row["possessor__slug"],
        status=Status(row["status"]),
        facility=row["facility__slug"],
        country=row["country"],
        consignee=row["consignee__slug"],
        pending_owner=row["pending_owner__slug"],
        status_before_missing=Status(row["status_before_missing"]) if row["status_before_missing"] else None,
        packaged=row["packaged"],
    )


def _persist(rows: dict[str, dict], after: dict[str, ChipState], entry: ledger.AppendedEntry) -> None:
    """Write the new chip states, one UPDATE per distinct new state (a bulk event has one)."""
    org_ids = _ids(
        Organisation,
        {s for st in after.values() for s in (st.owner, st.possessor, st.consignee, st.pending_owner) if s},
    )
    facility_ids = _ids(Facility, {st.facility for st in after.values() if st.facility})
    groups: dict[tuple, list[int]] = defaultdict(list)
    for serial, state in after.items():
        values = (
            ("owner_id", org_ids[state.owner]),
            ("possessor_id", org_ids[state.possessor]),
            ("consignee_id", org_ids.get(state.consignee)),
            ("pending_owner_id", org_ids.get(state.pending_owner)),
            ("facility_id", facility_ids.get(state.facility)),
            ("country", state.country),
            ("status", state.status.value),
            ("status_before_missing", state.status_before_missing.value if state.status_before_missing else ""),
            ("packaged", state.packaged),
        )
        groups[values].append(rows[serial]["id"])
    for values, ids in groups.items():
        Chip.objects.filter(id__in=ids).update(updated_seq=entry.seq, **dict(values))
    _insert_events([rows[serial]["id"] for serial in after], entry)


def _ids(model, slugs: set[str]) -> dict[str, int]:
    return dict(model.objects.filter(slug__in=slugs).values_list("slug", "id")) if slugs else {}
