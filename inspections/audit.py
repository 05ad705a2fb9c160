"""Recompute a past draw from the ledger alone (``manage.py audit_draw``). Read-only.

Anyone holding the ledger can do this: the campaign's parameters, the seed's
commitment, the revealed seed and the checkpoint are all entries, and the
prover's chips at the checkpoint come from replaying the registry's entries.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from types import SimpleNamespace

from ledger import selectors as ledger
from registry.rebuild import rebuild

from . import draws
from .planning import ELIGIBLE, Holdings, prover_sample


@dataclass
class Audit:
    campaign: str
    period: int
    problems: list[str] = field(default_factory=list)
    provers: dict = field(default_factory=dict)

    @property
    def matches(self) -> bool:
        return not self.problems


def audit_draw(campaign: str, period: int) -> Audit:
    audit = Audit(campaign, period)
    created = ledger.first_entry("campaign.created", slug=campaign)
    committed = ledger.first_entry("campaign.seed_committed", campaign=campaign, period=period)
    drawn = ledger.first_entry("campaign.drawn", campaign=campaign, period=period)
    if created is None or committed is None or drawn is None:
        audit.problems.append("the ledger has no such campaign, commitment or draw")
        return audit
    seed = bytes.fromhex(drawn["payload"]["seed"])
    size = drawn["payload"]["checkpoint"]["size"]
    root = base64.b64decode(drawn["payload"]["checkpoint"]["root"])
    if draws.commitment(seed) != committed["payload"]["commitment"]:
        audit.problems.append("the revealed seed does not match its commitment")
    if not committed["seq"] < size <= drawn["seq"]:
        audit.problems.append("the seed was not committed before the checkpoint the draw used")
    if ledger.root_at(size) != root:
        audit.problems.append(f"the draw's root is not the ledger's root at size {size}")
    _compare_samples(audit, created["payload"], drawn["payload"], seed, root, size)
    return audit


def _compare_samples(audit: Audit, params: dict, drawn: dict, seed: bytes, root: bytes, size: int) -> None:
    world = rebuild(size)
    campaign = SimpleNamespace(**params)
    targets = (
        sorted({s.owner for s in world.chips.values() if s.country == params["country"] and s.status in ELIGIBLE})
        if params["country"]
        else params["provers"]
    )
    if sorted(drawn["provers"]) != targets:
        audit.problems.append(f"targeted provers {sorted(drawn['provers'])}, the ledger says {targets}")
    for prover in targets:
        chips = [s for s in world.chips.values() if s.owner == prover and s.status in ELIGIBLE]
        peaks = [world.chip_models[s.model]["peak_flops_16bit"] for s in chips]
        serials = [s.serial for s in chips]
        holdings = Holdings(
            len(chips),
            max(peaks, default=None),
            lambda seed_, root_, slug, k, serials=serials: draws.draw(seed_, root_, slug, serials, k),
        )
        expected = prover_sample(campaign, prover, holdings, seed, root)
        audit.provers[prover] = expected
        if drawn["provers"].get(prover) != expected:
            audit.problems.append(f"{prover}: the draw on the ledger differs from its recomputation")
