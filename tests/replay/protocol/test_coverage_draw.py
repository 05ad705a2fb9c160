"""The verifier's segment draw (replay/protocol/coverage.py, docs/transcripts.md §4): recomputable from the nonce,
uniform over the segments not yet replayed, and stopping exactly when the run's coverage reaches its target, so
that one fabricated segment is caught with probability >= the target (bench/detection.py measures it)."""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from fractions import Fraction

from hypothesis import given
from hypothesis import strategies as st

from replay.protocol import coverage

MANIFEST = "ab" * 32


def seed_of(i: int) -> bytes:
    return coverage.seed(hashlib.sha256(i.to_bytes(8, "little")).digest()[:16], MANIFEST, b"[]")


def draw_until(starts, target, at_most, seeds, must=()):
    """Verifications one after another, each forcing `must` and carrying over what was replayed and drawn,
    until the target is met. Returns the drawn segments."""
    done, drawn = set(must), set()
    for s in seeds:
        fresh = coverage.plan(starts, list(must), done, s, target, at_most, drawn)[len(must) :]
        if not fresh:
            break
        done |= set(fresh)
        drawn |= set(fresh)
    return drawn


@given(
    n=st.integers(1, 400),
    interval=st.integers(1, 50),
    target=st.decimals(min_value=0, max_value=1, places=3),
    at_most=st.integers(1, 8),
    nonce=st.binary(min_size=16, max_size=16),
)
def test_the_draw_stops_at_the_first_count_that_meets_the_target(n, interval, target, at_most, nonce):
    starts = [interval * k for k in range(n)]
    seeds = [coverage.seed(nonce + k.to_bytes(2, "little"), MANIFEST, b"[]") for k in range(n + 1)]
    done = draw_until(starts, float(target), at_most, seeds)
    # exactly ceil(target * n) segments (the decimal target, not its binary rounding): never one short of it
    assert len(done) == math.ceil(Fraction(str(target)) * n)
    assert coverage.coverage(starts, done, done) >= float(target)


@given(
    n=st.integers(1, 200),
    forced=st.sets(st.integers(0, 199), max_size=20),
    target=st.decimals(min_value=0, max_value=1, places=3),
    at_most=st.integers(1, 8),
    nonce=st.binary(min_size=16, max_size=16),
)
def test_segments_the_claims_force_are_not_coverage(n, forced, target, at_most, nonce):
    """The prover knows which segments its claims force and fabricates elsewhere: the draws alone must reach the
    target over the segments no claim forced, ceil(target x (n - forced)) of them."""
    starts, must = list(range(n)), sorted(s for s in forced if s < n)
    seeds = [coverage.seed(nonce + k.to_bytes(2, "little"), MANIFEST, b"[]") for k in range(n + 1)]
    drawn = draw_until(starts, float(target), at_most, seeds, must)
    assert not drawn & set(must)
    assert len(drawn) == math.ceil(Fraction(str(target)) * (n - len(must)))
    assert coverage.coverage(starts, set(must) | drawn, drawn) >= float(target)


@given(
    n=st.integers(2, 60),
    earlier=st.sets(st.integers(0, 59), max_size=30),
    must=st.sets(st.integers(0, 59), max_size=3),
    at_most=st.integers(0, 8),
    nonce=st.binary(min_size=16, max_size=16),
)
def test_fresh_draws_are_the_nonce_order_of_what_is_not_yet_covered(n, earlier, must, at_most, nonce):
    starts = list(range(n))
    earlier, must = {s for s in earlier if s < n}, sorted(s for s in must if s < n)
    seed = coverage.seed(nonce, MANIFEST, b"[]")
    chosen = coverage.plan(starts, must, earlier, seed, 1.0, at_most)
    assert chosen[: len(must)] == must
    fresh = chosen[len(must) :]
    uncovered = [s for s in starts if s not in earlier and s not in must]
    # anyone holding the nonce recomputes it: SHA-256 ranks of the uncovered starts, lowest first
    rank = lambda s: hashlib.sha256(b"chipledger-segments/1" + seed + s.to_bytes(8, "little")).digest()
    assert fresh == sorted(uncovered, key=rank)[:at_most]
    assert coverage.plan(starts, must, earlier, seed, 1.0, at_most) == chosen


def test_a_fabrication_away_from_the_forced_segments_is_caught_with_the_target_probability():
    """20 segments, the last forced by every claim, target 0.9: the draws take 18 of the 19 others (never the
    forced one), and the one left out is each of the 19 equally often: caught 18/19 >= 0.9 wherever placed."""
    starts, trials, must = list(range(0, 40, 2)), 3800, [38]
    left = Counter()
    for t in range(trials):
        drawn = draw_until(starts, 0.9, 2, [seed_of(t * 16 + k) for k in range(16)], must)
        assert len(drawn) == 18 and 38 not in drawn
        left[(set(starts) - drawn - {38}).pop()] += 1
    assert set(left) == set(starts) - {38}
    expected = trials / 19
    chi2 = sum((left[s] - expected) ** 2 / expected for s in left)
    assert chi2 < 42.3  # 18 degrees of freedom: p = 0.001


def test_the_segment_left_unreplayed_is_uniform():
    """10 segments, target 0.9, 2 draws per verification: the one segment never replayed is each of the ten
    equally often (chi-square over 5,000 fixed nonces, so the test is deterministic; a draw that favoured or
    avoided any position, the first or the last included, fails it). A fabricated segment is then caught with
    probability exactly 9/10."""
    starts, trials = list(range(0, 20, 2)), 5000
    left = Counter()
    for t in range(trials):
        done = draw_until(starts, 0.9, 2, [seed_of(t * 16 + k) for k in range(16)])
        assert len(done) == 9
        left[(set(starts) - done).pop()] += 1
    assert set(left) == set(starts)
    expected = trials / len(starts)
    chi2 = sum((left[s] - expected) ** 2 / expected for s in starts)
    assert chi2 < 27.9  # 9 degrees of freedom: p = 0.001
