"""The registry as a sequence of ledger entries makes it: a pure replay (no Django, no database).

The same lifecycle rules the services use (``rules.chip_lifecycle``) applied to each entry in order. The
rebuild (``registry.rebuild_registry``) feeds it the stored ledger; the standalone draw audit
(``python -m rules.draw_auditor``) feeds it entries fetched from the public API.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from rules.chip_lifecycle import ChipState, Facts, LifecycleError, apply_chip_event, fabricate


@dataclass
class Scratch:
    organisations: dict[str, dict] = field(default_factory=dict)
    keys: dict[str, dict] = field(default_factory=dict)
    facilities: dict[str, dict] = field(default_factory=dict)
    chip_models: dict[str, dict] = field(default_factory=dict)
    chips: dict[str, ChipState] = field(default_factory=dict)
    chip_extra: dict[str, dict] = field(default_factory=dict)  # public key, fabricated/updated seq
    events: dict[str, list[tuple[int, str, str]]] = field(default_factory=lambda: defaultdict(list))
    licences: dict[str, dict] = field(default_factory=dict)


def apply(scratch: Scratch, seq: int, kind: str, actor: str, payload: dict) -> None:
    """Replay one entry into the scratch world; other apps' kinds pass through (a rebuild of several
    apps feeds each entry to each app's ``apply`` in one pass over the ledger)."""
    if kind == "org.registered":
        scratch.organisations[payload["slug"]] = {**payload, "registered_seq": seq}
    elif kind == "org.key_registered":
        scratch.keys[payload["key_id"]] = {
            "org": payload["org"],
            "public_key": payload["public_key"],
            "registered_seq": seq,
            "revoked_seq": None,
        }
    elif kind == "org.key_revoked":
        scratch.keys[payload["key_id"]]["revoked_seq"] = seq
    elif kind == "facility.registered":
        scratch.facilities[payload["slug"]] = {**payload, "registered_seq": seq}
    elif kind == "chip_model.registered":
        scratch.chip_models[payload["slug"]] = {**payload, "registered_seq": seq}
    elif kind == "export_licence.granted":
        scratch.licences[payload["licence_id"]] = {**payload, "used": 0, "granted_seq": seq}
    elif kind == "chip.fabricated":
        _fabricated(scratch, seq, kind, actor, payload)
    elif kind.startswith("chip."):
        _chip_event(scratch, seq, kind, actor, payload)


def _facts(scratch: Scratch, actor: str, payload: dict) -> Facts:
    facility = scratch.facilities.get(payload.get("facility") or "")
    other = payload.get("consignee") or payload.get("to_owner")
    return Facts(
        actor=actor,
        facility_owner=facility["owner"] if facility else None,
        facility_country=facility["country"] if facility else None,
        facility_kind=facility["kind"] if facility else None,
        consignee_exists=other is None or other in scratch.organisations,
        actor_country=scratch.organisations.get(actor, {}).get("country", ""),
    )


def _fabricated(scratch: Scratch, seq: int, kind: str, actor: str, payload: dict) -> None:
    for item in payload["chips"]:
        scratch.chips[item["serial"]] = fabricate(
            item["serial"], item["model"], _facts(scratch, actor, item), item.get("facility")
        )
        scratch.chip_extra[item["serial"]] = {
            "public_key": item["public_key"],
            "fabricated_seq": seq,
            "updated_seq": seq,
        }
        scratch.events[item["serial"]].append((seq, kind, actor))


def _chip_event(scratch: Scratch, seq: int, kind: str, actor: str, payload: dict) -> None:
    event = kind.removeprefix("chip.")
    facts = _facts(scratch, actor, payload)
    for serial in payload["chips"]:
        try:
            scratch.chips[serial] = apply_chip_event(scratch.chips[serial], event, facts, payload)
        except (KeyError, LifecycleError) as error:
            raise LifecycleError(f"ledger seq {seq}: {kind} of {serial} cannot be replayed: {error}") from error
        scratch.chip_extra[serial]["updated_seq"] = seq
        scratch.events[serial].append((seq, kind, actor))
    if kind == "chip.exported" and payload["export_licence"] in scratch.licences:
        scratch.licences[payload["export_licence"]]["used"] += len(payload["chips"])
