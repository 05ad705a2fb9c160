"""Which segments a verification replays, and the coverage they give (docs/transcripts.md §4).

A segment is the run of steps between two checkpoints, named by its start step. A claim at step s
replays from the checkpoint c before s, so it trusts c: the segment that produced c is always
replayed and compared with c ("mandatory", or forced). Then segments not yet replayed for this run are
drawn in the order of SHA-256("chipledger-segments/1" ‖ seed ‖ start as 8 bytes LE), seed = SHA-256(nonce
‖ manifest hash ‖ canonical claims): fresh randomness the prover cannot steer (the nonce is drawn after
its material is in the verifier's hands, and no field it controls is hashed before the nonce). At most
`at_most` are drawn per claim (bounded work), none once the run's coverage reaches the target.

Coverage counts draws only. The prover knows which segments its claims force (it knows the claims' steps),
so it would fabricate a segment no claim forces: a forced replay says nothing about those. Coverage is the
probability that one fabricated segment placed where no claim forces a replay is caught by the draws:
|drawn - forced| / |segments - forced| = drawn / (drawn + never replayed) once forced segments leave the
drawn set. A segment forced by any claim, before or after a draw chose it, is forced: a prover that could
force the drawn segments (or luck) must not turn draws of segments it never needed to fabricate into coverage.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


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


def plan(
    starts: list[int],
    must: list[int],
    earlier: set[int],
    seed_: bytes,
    target: float,
    at_most: int,
    drawn: Iterable[int] = (),
) -> list[int]:
    """Segments to replay now: the mandatory ones, then at most `at_most` fresh draws (bounded work per
    claim: a run's coverage grows over its claims and re-verifications, never in one giant replay);
    none once the run's coverage target is met. `earlier`: the run's segments replayed so far, `drawn`:
    those of them a random draw chose and no claim forced (the rest were forced)."""
    drawn = (set(drawn) - set(must)) & set(starts)
    replayed = set(earlier) | set(must) | drawn
    pool = [s for s in starts if s not in replayed]
    open_ = len(drawn) + len(pool)  # stays put: each draw moves one segment from never replayed to drawn
    chosen = list(must)
    for s in order(seed_, pool)[:at_most]:
        if _share(len(drawn), open_) >= target:
            break
        chosen.append(s)
        drawn.add(s)
    return chosen


def coverage(starts: Iterable[int], replayed: Iterable[int], drawn: Iterable[int]) -> float:
    """P(one fabricated segment where no claim forced a replay is caught) = drawn / (drawn + never replayed);
    `drawn`: segments a draw chose and no claim forced."""
    starts = set(starts)
    drawn = set(drawn) & starts
    return drawn_share(len(starts), len((set(replayed) & starts) | drawn), len(drawn))


def drawn_share(total: int, replayed: int, drawn: int) -> float:
    """The same from counts (replayed includes drawn): a run with every segment forced, or none, is covered."""
    return _share(drawn, drawn + total - replayed)


def _share(drawn: int, open_: int) -> float:
    """drawn of the open segments (drawn + never replayed); none open: every segment replayed, covered."""
    return drawn / open_ if open_ > 0 else 1.0
