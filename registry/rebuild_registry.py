"""Rebuild the registry from the ledger alone and compare it with the live tables.

The rebuild replays every entry, in order, into a scratch copy of the world held
in memory (not the live tables), through the same lifecycle rules the services
use; then each live projection row is compared with its rebuilt twin. A
difference means a projection was written without (or unlike) its entry.
"""

from __future__ import annotations

import base64
import json
from collections import defaultdict
from dataclasses import asdict

from ledger import selectors as ledger
from rules.chip_lifecycle import ChipState, Status
from rules.registry_world import Scratch, apply

from .models import Chip, ChipEvent, ChipModel, ExportLicence, Facility, Organisation, OrganisationKey


def rebuild(size: int | None = None) -> Scratch:
    """The registry as the ledger's first ``size`` entries (all of them by default) make it."""
    scratch = Scratch()
    for seq, leaf in ledger.leaves(0, size):
        entry = json.loads(leaf)
        apply(scratch, seq, entry["kind"], entry["actor"], entry["payload"])
    return scratch


# --- comparison -------------------------------------------------------------------------


def differences(scratch: Scratch, limit: int = 50) -> list[str]:
    """Human-readable differences between the live tables and the rebuilt scratch world."""
    return compare(tables(scratch), limit)


def compare(named_tables, limit: int = 50) -> list[str]:
    """``name key: live=... rebuilt=...`` for each row that differs; ``named_tables`` yields (name, live, rebuilt),
    each a dict from a natural key (a string, or a tuple shown joined by '/') to the row's compared values."""
    found: list[str] = []
    for name, live, rebuilt in named_tables:
        for key in _sorted(live.keys() | rebuilt.keys()):
            if live.get(key) != rebuilt.get(key):
                shown = "/".join(map(str, key)) if isinstance(key, tuple) else key
                found.append(f"{name} {shown}: live={live.get(key)} rebuilt={rebuilt.get(key)}")
                if len(found) >= limit:
                    return found
    return found


def _sorted(keys) -> list:
    try:
        return sorted(keys)
    except TypeError:  # keys of mixed types
        return sorted(keys, key=repr)


def tables(scratch: Scratch):
    """(name, live rows, rebuilt rows) for each registry table."""
    yield (
        "organisation",
        _live_organisations(),
        {
            slug: (o["legal_name"], o["country"], sorted(o["roles"]), o["parent"], o["registered_seq"])
            for slug, o in scratch.organisations.items()
        },
    )
    yield (
        "key",
        _live_keys(),
        {
            key_id: (k["org"], k["public_key"], k["registered_seq"], k["revoked_seq"])
            for key_id, k in scratch.keys.items()
        },
    )
    yield (
        "facility",
        _live_facilities(),
        {
            slug: (f["owner"], f["kind"], f["country"], f["location"], f["registered_seq"])
            for slug, f in scratch.facilities.items()
        },
    )
    yield (
        "chip model",
        _live_chip_models(),
        {
            slug: (
                m["name"],
                m["vendor"],
                m["export_class"],
                m["peak_flops_16bit"],
                m["memory_bytes"],
                m["registered_seq"],
            )
            for slug, m in scratch.chip_models.items()
        },
    )
    yield (
        "chip",
        _live_chips(),
        {serial: _chip_row(state, scratch.chip_extra[serial]) for serial, state in scratch.chips.items()},
    )
    yield "chip history", _live_events(), {serial: tuple(events) for serial, events in scratch.events.items()}
    yield (
        "export licence",
        _live_licences(),
        {lid: tuple(lic[k] for k in LICENCE_FIELDS) for lid, lic in scratch.licences.items()},
    )


LICENCE_FIELDS = (
    "exporter",
    "consignee",
    "from_country",
    "to_country",
    "quantity",
    "used",
    "expires_on",
    "granted_seq",
)


def _live_licences() -> dict:
    rows = ExportLicence.objects.values_list(
        "licence_id",
        "exporter__slug",
        "consignee__slug",
        "from_country",
        "to_country",
        "quantity",
        "used",
        "expires_on",
        "granted_seq",
    )
    return {row[0]: (*row[1:7], row[7].isoformat(), row[8]) for row in rows}


def _chip_row(state: ChipState, extra: dict) -> tuple:
    values = asdict(state)
    values["status"] = Status(values["status"]).value
    values["status_before_missing"] = state.status_before_missing.value if state.status_before_missing else ""
    return tuple(sorted({**values, **extra}.items()))


def _live_organisations() -> dict:
    rows = Organisation.objects.values_list("slug", "legal_name", "country", "roles", "parent__slug", "registered_seq")
    return {slug: (name, country, sorted(roles), parent, seq) for slug, name, country, roles, parent, seq in rows}


def _live_keys() -> dict:
    rows = OrganisationKey.objects.values_list(
        "key_id", "organisation__slug", "public_key", "registered_seq", "revoked_seq"
    )
    return {key_id: (org, base64.b64encode(bytes(pk)).decode(), reg, rev) for key_id, org, pk, reg, rev in rows}


def _live_facilities() -> dict:
    rows = Facility.objects.values_list("slug", "owner__slug", "kind", "country", "location", "registered_seq")
    return {row[0]: tuple(row[1:]) for row in rows}


def _live_chip_models() -> dict:
    rows = ChipModel.objects.values_list(
        "slug", "name", "vendor__slug", "export_class", "peak_flops_16bit", "memory_bytes", "registered_seq"
    )
    return {row[0]: tuple(row[1:]) for row in rows}


def _live_chips() -> dict:
    rows = Chip.objects.values(
        "serial",
        "model__slug",
        "fab__slug",
        "owner__slug",
        "possessor__slug",
        "status",
        "facility__slug",
        "country",
        "consignee__slug",
        "pending_owner__slug",
        "status_before_missing",
        "packaged",
        "public_key",
        "fabricated_seq",
        "updated_seq",
    ).iterator(chunk_size=5000)
    live = {}
    for row in rows:
        values = {
            "serial": row["serial"],
            "model": row["model__slug"],
            "fab": row["fab__slug"],
            "owner": row["owner__slug"],
            "possessor": row["possessor__slug"],
            "status": row["status"],
            "facility": row["facility__slug"],
            "country": row["country"],
            "consignee": row["consignee__slug"],
            "pending_owner": row["pending_owner__slug"],
            "status_before_missing": row["status_before_missing"],
            "packaged": row["packaged"],
            "public_key": base64.b64encode(bytes(row["public_key"])).decode(),
            "fabricated_seq": row["fabricated_seq"],
            "updated_seq": row["updated_seq"],
        }
        live[row["serial"]] = tuple(sorted(values.items()))
    return live


def _live_events() -> dict:
    history: dict[str, list] = defaultdict(list)
    rows = ChipEvent.objects.order_by("chip__serial", "seq").values_list("chip__serial", "seq", "kind", "actor")
    for serial, seq, kind, actor in rows.iterator(chunk_size=10000):
        history[serial].append((seq, kind, actor))
    return {serial: tuple(events) for serial, events in history.items()}
