"""The verifier's segment draw (replay/protocol/coverage.py, docs/transcripts.md §4): recomputable from the nonce,
uniform over the segments never replayed, stopping exactly when the run's coverage reaches its target, and
counted so that one fabricated segment escapes with the target met with probability <= 1 - target whatever the
prover does between verifications (forcing segments with claims it files after seeing draws, making segments slow
to replay so that a budget ends the draws). bench/detection.py measures it on real transcripts."""

from __future__ import annotations

import hashlib
import math
import random
from collections import Counter
from fractions import Fraction

from hypothesis import given
from hypothesis import strategies as st

from replay.protocol import coverage

MANIFEST = "ab" * 32


def seed_of(i: int) -> bytes:
    return coverage.seed(hashlib.sha256(i.to_bytes(8, "little")).digest()[:16], MANIFEST, b"[]")


def draw_until(starts, target, at_most, seeds, must=()):
    """Verifications one after another, each forcing `must`, as the ledger tells them the run's replays and
    draws, until the target is met. Returns the drawn segments."""
    done, drawn, draws = set(must), set(), []
    for s in seeds:
        d = coverage.draw(starts, list(must), done, s, target, at_most, coverage.missed(draws))
        if not d.fresh:
            break
        done |= set(d.fresh)
        drawn |= set(d.fresh)
        draws.append((d.pool, len(d.fresh)))
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


@given(
    n=st.integers(2, 60),
    earlier=st.sets(st.integers(0, 59), max_size=30),
    must=st.sets(st.integers(0, 59), max_size=3),
    pending=st.sets(st.integers(0, 59), max_size=4),
    at_most=st.integers(0, 8),
    nonce=st.binary(min_size=16, max_size=16),
)
def test_pending_draws_come_first_then_the_nonce_order_of_the_pool(n, earlier, must, pending, at_most, nonce):
    starts = list(range(n))
    earlier, must = {s for s in earlier if s < n}, sorted(s for s in must if s < n)
    pending = {s for s in pending if s < n}
    seed = coverage.seed(nonce, MANIFEST, b"[]")
    d = coverage.draw(starts, must, earlier, seed, 1.0, at_most, pending=pending)
    waiting = sorted(pending - earlier - set(must))
    assert list(d.carried) == waiting[:at_most]
    pool = [s for s in starts if s not in earlier and s not in must and s not in pending]
    assert d.pool == len(pool)
    # anyone holding the nonce recomputes it: SHA-256 ranks of the pool's starts, lowest first
    rank = lambda s: hashlib.sha256(b"chipledger-segments/1" + seed + s.to_bytes(8, "little")).digest()
    assert list(d.fresh) == sorted(pool, key=rank)[: max(at_most - len(d.carried), 0)]
    assert coverage.draw(starts, must, earlier, seed, 1.0, at_most, pending=pending) == d


@given(
    missed=st.fractions(min_value=0, max_value=1),
    pool=st.integers(0, 500),
    target=st.floats(0, 1),
)
def test_draws_needed_is_the_fewest_that_meet_the_target(missed, pool, target):
    c = coverage.draws_needed(missed, pool, target)
    after = lambda k: coverage.coverage(missed * Fraction(pool - k, pool), pool - k) if pool else 1.0
    assert 0 <= c <= pool
    assert c == pool or after(c) >= target
    assert c == 0 or after(c - 1) < target


@given(draws=st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50)), max_size=20))
def test_missed_is_the_product_of_the_escape_chances(draws):
    draws = [(p, min(d, p)) for p, d in draws]
    m = coverage.missed(draws)
    assert m == math.prod((Fraction(p - d, p) for p, d in draws if p), start=Fraction(1))
    assert 0 <= m <= 1


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


# --- an adaptive prover: it sees every verification's draws (the nonce is revealed with the verdict) --------


def attacked_run(n, fabricated, strategy, trial, target=0.9, at_most=2):
    """One run verified claim after claim, as the ledger would tell each verification the run's replays, draws
    and pending cut draws; between verifications the prover plays `strategy`. Returns (caught, target_met,
    whether the rule before pools, drawn / (drawn + never replayed) >= target, was ever met with it unreplayed)."""
    starts = list(range(n))
    replayed, draws, pending, drawn_total, forced = set(), [], set(), set(), set()
    old_fooled = False
    rng = random.Random(trial)
    for k in range(4 * n):
        must = strategy(rng, starts, fabricated, replayed, drawn_total, forced)
        forced |= set(must)
        if fabricated in must:  # forcing the fabricated segment replays it: caught
            return True, False, old_fooled
        unforced, never = drawn_total - forced, n - len(replayed | set(must))
        old_fooled |= len(unforced) / max(len(unforced) + never, 1) >= target  # the old rule: met, f never drawn
        missed = coverage.missed(draws)
        d = coverage.draw(starts, must, replayed, seed_of(trial * 1000 + k), target, at_most, missed, pending)
        replayed |= set(must)
        done = []
        for s in (*d.carried, *d.fresh):
            if s == fabricated and s not in pending and strategy.slow:  # made slow: the budget ends the draws on it
                pending.add(s)
                break
            if s == fabricated:
                return True, False, old_fooled
            done.append(s)
        replayed |= set(done)
        fresh_done = [s for s in done if s in d.fresh]
        drawn_total |= set(fresh_done)
        draws.append((d.pool, len(fresh_done)))
        pending -= replayed
        never = n - len(replayed)
        if coverage.coverage(coverage.missed(draws), never) >= target and not pending:
            return False, True, old_fooled
    return False, False, old_fooled


def force_all_but_the_fabrication_once_nine_are_drawn(rng, starts, fabricated, replayed, drawn, forced):
    """The old rule's best attack: coverage drawn / (drawn + never replayed) is met once 9 draws leave only the
    fabrication unreplayed, so file claims that force every other never-replayed segment."""
    if len(drawn - forced) >= 9:
        return [s for s in starts if s not in replayed and s != fabricated]
    return []


def force_a_few_at_random(rng, starts, fabricated, replayed, drawn, forced):
    left = [s for s in starts if s not in replayed and s != fabricated]
    return rng.sample(left, min(len(left), rng.randint(0, 3)))


def force_nothing(rng, starts, fabricated, replayed, drawn, forced):
    return []


for strategy, slow in (
    (force_all_but_the_fabrication_once_nine_are_drawn, False),
    (force_a_few_at_random, True),
    (force_nothing, True),
):
    strategy.slow = slow


def test_claims_filed_after_the_draws_do_not_shrink_what_a_fabrication_must_escape():
    """Issue #19: the prover files claims after seeing draws, forcing never-replayed segments so that fewer draws
    meet the target. Counted per verification ((pool - drawn) / pool), a fabrication escapes with the target met
    at most 1 - target of the time whatever it forces or cuts; counted as drawn / (drawn + never replayed) the
    first strategy escaped about two runs in three at 30 segments."""
    trials = 600
    for strategy in (force_all_but_the_fabrication_once_nine_are_drawn, force_a_few_at_random, force_nothing):
        outcomes = [attacked_run(30, trial % 30, strategy, trial) for trial in range(trials)]
        escaped = sum(1 for caught, met, _ in outcomes if not caught and met)
        # binomial(600, 0.1): mean 60, sd 7.3; 90 is 4 sd above (a wrong count escapes far more often)
        assert escaped <= 90, (strategy.__name__, escaped)
        if strategy is force_all_but_the_fabrication_once_nine_are_drawn:
            fooled_before = sum(1 for _, _, old in outcomes if old)
            assert fooled_before >= trials // 2, fooled_before  # the attack the old rule let through
