"""Which segments a verification replays, and the coverage they give (docs/transcripts.md §4).

A segment is the run of steps between two checkpoints, named by its start step. A claim at step s
replays from the checkpoint c before s, so it trusts c: the segment that produced c is always
replayed and compared with c ("mandatory", or forced). Then segments not yet replayed for this run are
drawn in the order of SHA-256("chipledger-segments/1" ‖ seed ‖ start as 8 bytes LE), seed = SHA-256(nonce
‖ manifest hash ‖ canonical claims): fresh randomness the prover cannot steer (each verification's nonce,
a claim's or a re-verification's, is drawn after the material is in the verifier's hands and revealed only
with its verdict). At most `at_most` are drawn per verification (bounded work), none once the target is met.

Coverage is the probability that one fabricated segment no claim forced is caught, whatever the prover does
between verifications (files claims that force segments, so pools shrink; makes segments slow to replay, so a
budget ends the draws): each verification draws `drawn` of the `pool` segments never replayed, uniformly, so a
segment not yet caught escapes it with probability exactly (pool - drawn) / pool, and

    missed = product over the run's verified verifications of (pool - drawn) / pool,  coverage = 1 - missed

(1 once every segment has been replayed). A draw the budget cut while it was being replayed is pending: it
was revealed, so it is replayed first by the next verification (outside the pool, counting for nothing), and
the target is not met while one is pending. Counting a pending draw for nothing only raises `missed`, so
P(a fabrication escapes and the target is declared met) <= 1 - target holds for any strategy
(a supermartingale argument, docs/transcripts.md §4).
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction


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


MAX_DRAWS = 100_000  # earlier verifications' (pool, drawn) pairs a claims file may list (earlier_draws)


@dataclass(frozen=True)
class Draw:
    carried: tuple[int, ...]  # pending draws an earlier verification's budget cut: replayed first, no coverage
    fresh: tuple[int, ...]  # new draws, in the nonce's order
    pool: int  # the segments the fresh draws were taken from: never replayed, not forced now, not pending


def missed(draws: Iterable[tuple[int, int]]) -> Fraction:
    """P(a segment no claim forced escaped every draw): the product of (pool - drawn) / pool over the
    verifications' (pool, drawn) pairs, exact (a rounded figure could stop the draws one short)."""
    draws = [(pool, drawn) for pool, drawn in draws if pool > 0]
    # one reduction at the end: reducing after every factor costs a gcd of ever longer numbers
    return Fraction(math.prod(pool - drawn for pool, drawn in draws), math.prod(pool for pool, _ in draws))


def coverage(missed_: Fraction, never_replayed: int) -> float:
    """The run's coverage: 1 - missed, or 1 once no segment is left unreplayed (a fabrication anywhere is caught)."""
    return 1.0 if never_replayed <= 0 else float(1 - missed_)


def draws_needed(missed_: Fraction, pool: int, target: float) -> int:
    """The fewest draws from `pool` that bring the coverage to `target` (all of them when none does)."""
    reached = lambda c: coverage(missed_ * Fraction(pool - c, pool), pool - c) >= target if pool else True
    return bisect.bisect_left(range(pool + 1), True, key=reached)


def draw(
    starts: list[int],
    must: list[int],
    earlier: Iterable[int],
    seed_: bytes,
    target: float,
    at_most: int,
    missed_: Fraction = Fraction(1),
    pending: Iterable[int] = (),
) -> Draw:
    """What this verification replays beyond the mandatory segments: the pending draws first, then fresh draws
    until the coverage reaches `target`, at most `at_most` in all (bounded work per verification: a run's
    coverage grows over its claims and re-verifications). `earlier`: the run's segments replayed so far,
    `missed_`: the run's miss probability so far (`missed` of its verifications' draws)."""
    starts_ = set(starts)
    replayed = set(earlier) | set(must)
    pending_ = {s for s in pending if s in starts_} - replayed
    carried = sorted(pending_)[: max(at_most, 0)]
    pool = [s for s in starts if s not in replayed and s not in pending_]
    room = max(at_most - len(carried), 0)
    fresh = order(seed_, pool)[: min(room, draws_needed(missed_, len(pool), target))]
    return Draw(tuple(carried), tuple(fresh), len(pool))
