"""Which segments a verification replays, and the coverage they give (docs/transcripts.md).

A segment is the run of steps between two checkpoints, named by its start step. A claim at step s
replays from the checkpoint c before s, so it trusts c: the segment that produced c is always
replayed and compared with c ("mandatory"). Then segments not yet replayed for this run are drawn in
the order of SHA-256("chipledger-segments/1" ‖ seed ‖ start as 8 bytes LE), seed = SHA-256(nonce ‖
manifest hash ‖ canonical claims): fresh randomness the prover cannot steer (the nonce is drawn after
its material is in the verifier's hands, and no field it controls is hashed before the nonce). At most
`at_most` are drawn per claim (bounded work), none once the run's coverage reaches the target.

Coverage: the probability that ONE fabricated segment anywhere in the run would have been caught by
the segments replayed so far (this claim's and earlier claims'): replayed distinct segments / all.
"""

from __future__ import annotations

import hashlib


def mandatory(checkpoints: list[int], claim_steps: list[int]) -> list[int]:
    """Start steps of the segments that produced the checkpoints the claims replay from."""
    out = set()
    for s in claim_steps:
        c = max(x for x in checkpoints if x <= max(s - 1, 0))
        if c > 0:
            out.add(max(x for x in checkpoints if x < c))
    return sorted(out)


def seed(nonce: bytes, manifest_hash: str, claims_bytes: bytes) -> bytes:
    return hashlib.sha256(nonce + bytes.fromhex(manifest_hash) + claims_bytes).digest()


def order(seed_: bytes, starts: list[int]) -> list[int]:
    """The segments in the verifier's random order (recomputable by anyone given the nonce)."""
    rank = lambda s: hashlib.sha256(b"chipledger-segments/1" + seed_ + s.to_bytes(8, "little")).digest()
    return sorted(starts, key=rank)


def plan(starts: list[int], must: list[int], earlier: set[int], seed_: bytes, target: float, at_most: int) -> list[int]:
    """Segments to replay now: the mandatory ones, then at most `at_most` fresh draws (bounded work per
    claim: a run's coverage grows over its claims and re-verifications, never in one giant replay);
    none once the run's coverage target is met."""
    chosen = list(must)
    covered = set(earlier) | set(must)
    for drawn, s in enumerate(order(seed_, [s for s in starts if s not in covered])):
        if drawn >= at_most or len(covered) / len(starts) >= target:
            break
        chosen.append(s)
        covered.add(s)
    return chosen


def coverage(starts: list[int], replayed: set[int]) -> float:
    return len(set(starts) & replayed) / len(starts) if starts else 1.0
