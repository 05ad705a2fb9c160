"""Recompute a draw from ledger entries alone: pure functions, no Django, no database (docs/draws.md).

``audit_draw`` (``manage.py audit_draw``) feeds it the stored ledger; ``python -m rules.draw_auditor``
feeds it entries fetched from the public API and checked against the log's signed checkpoint.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from types import SimpleNamespace

from rules import draw_ranking
from rules.inspection_planning import ELIGIBLE, Holdings, counts_as_prover, prover_sample
from rules.registry_world import Scratch

MATCH, MISMATCH, NOT_DRAWN, UNKNOWN = "match", "mismatch", "not drawn yet", "no such campaign"


@dataclass
class DrawRecords:
    """The three entries a draw is made of (each ``{"seq", "payload", ...}``), as far as the ledger has them."""

    campaign: str
    period: int
    created: dict | None = None
    committed: dict | None = None
    drawn: dict | None = None
    amended: list[dict] = field(default_factory=list)  # the campaign's ``campaign.amended`` entries, in seq order

    def take(self, seq: int, kind: str, payload: dict) -> None:
        """Keep an entry if it is one of this draw's (the first of each kind), or an amendment of its campaign."""
        if kind == "campaign.created" and payload.get("slug") == self.campaign:
            self.created = self.created or {"seq": seq, "payload": payload}
        elif kind == "campaign.amended" and payload.get("campaign") == self.campaign:
            self.amended.append({"seq": seq, "payload": payload})
        elif kind in ("campaign.seed_committed", "campaign.drawn") and (
            payload.get("campaign"),
            payload.get("period"),
        ) == (self.campaign, self.period):
            slot = "committed" if kind == "campaign.seed_committed" else "drawn"
            setattr(self, slot, getattr(self, slot) or {"seq": seq, "payload": payload})

    def params_in_force(self) -> dict:
        """The campaign's parameters when it was drawn: the last amendment before the draw, else as created."""
        before = [
            a for a in self.amended if a["seq"] < self.drawn["seq"] and isinstance(a["payload"].get("params"), dict)
        ]
        return max(before, key=lambda a: a["seq"])["payload"]["params"] if before else self.created["payload"]

    @property
    def checkpoint_size(self) -> int | None:
        try:
            return int(self.drawn["payload"]["checkpoint"]["size"])
        except (TypeError, KeyError, ValueError):
            return None


@dataclass
class Audit:
    campaign: str
    period: int
    outcome: str = MATCH
    problems: list[str] = field(default_factory=list)
    provers: dict = field(default_factory=dict)

    @property
    def matches(self) -> bool:
        return self.outcome == MATCH

    def fail(self, problem: str) -> None:
        self.outcome = MISMATCH
        self.problems.append(problem)


def not_drawn(records: DrawRecords) -> Audit | None:
    """The audit of a draw the ledger does not (yet) hold, or None when there is one to recompute."""
    audit = Audit(records.campaign, records.period)
    if records.created is None:
        audit.outcome = UNKNOWN
        audit.problems.append(f"the ledger has no campaign {records.campaign!r}")
    elif records.drawn is None:
        audit.outcome = NOT_DRAWN
        committed = "its seed is committed" if records.committed else "no seed is committed yet"
        audit.problems.append(f"period {records.period} of {records.campaign} is not drawn yet ({committed})")
    else:
        return None
    return audit


def check_draw(records: DrawRecords, world: Scratch, root_at_size: bytes) -> Audit:
    """Check a drawn period against the registry ``world`` and tree root of the ledger's first
    ``records.checkpoint_size`` entries."""
    audit = not_drawn(records) or Audit(records.campaign, records.period)
    if audit.outcome != MATCH:
        return audit
    drawn, committed = records.drawn["payload"], records.committed
    try:
        seed = bytes.fromhex(drawn["seed"])
        root = base64.b64decode(drawn["checkpoint"]["root"], validate=True)
    except (KeyError, TypeError, ValueError, binascii.Error):
        audit.fail("the draw entry has no readable seed or checkpoint")
        return audit
    size = records.checkpoint_size
    if committed is None or draw_ranking.commitment(seed) != committed["payload"].get("commitment"):
        audit.fail("the revealed seed does not match its commitment")
    if committed is None or size is None or not committed["seq"] < size <= records.drawn["seq"]:
        audit.fail("the seed was not committed before the checkpoint the draw used")
    if root_at_size != root:
        audit.fail(f"the draw's root is not the ledger's root at size {size}")
    _compare_samples(audit, records.params_in_force(), drawn, seed, root, world)
    return audit


def _compare_samples(audit: Audit, params: dict, drawn: dict, seed: bytes, root: bytes, world: Scratch) -> None:
    campaign = SimpleNamespace(**params)
    eligible = [state for state in world.chips.values() if state.status in ELIGIBLE]
    if params.get("country"):
        roles = {slug: org.get("roles") for slug, org in world.organisations.items()}
        targets = sorted(
            {
                state.owner
                for state in eligible
                if state.country == params["country"] and counts_as_prover(params, roles.get(state.owner))
            }
        )
    else:
        targets = sorted(params.get("provers") or [])
    if sorted(drawn.get("provers") or {}) != targets:
        audit.fail(f"targeted provers {sorted(drawn.get('provers') or {})}, the ledger says {targets}")
    for prover in targets:
        chips = [state for state in eligible if state.owner == prover]
        peaks = [world.chip_models[state.model]["peak_flops_16bit"] for state in chips]
        serials = [state.serial for state in chips]
        holdings = Holdings(
            len(chips),
            max(peaks, default=None),
            lambda seed_, root_, slug, k, serials=serials: draw_ranking.draw(seed_, root_, slug, serials, k),
        )
        expected = prover_sample(campaign, prover, holdings, seed, root)
        audit.provers[prover] = expected
        if (drawn.get("provers") or {}).get(prover) != expected:
            audit.fail(f"{prover}: the draw on the ledger differs from its recomputation")
