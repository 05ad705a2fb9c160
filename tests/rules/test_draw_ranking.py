"""Draw ranking: reproducible, seed-dependent, and the lowest HMAC ranks win."""

import hashlib
import hmac

from hypothesis import given, settings
from hypothesis import strategies as st

from rules import draw_ranking

SERIALS = [f"A{n:06d}" for n in range(500)]


def test_draw_is_the_lowest_hmac_ranks_in_order():
    seed, root = bytes(range(32)), bytes(32)
    drawn = draw_ranking.draw(seed, root, "camp-1", SERIALS, 7)
    by_rank = sorted(SERIALS, key=lambda s: hmac.new(seed, root + b"camp-1\x00" + s.encode(), hashlib.sha256).digest())
    assert drawn == by_rank[:7]


@settings(max_examples=30, deadline=None)
@given(seed=st.binary(min_size=32, max_size=32), root=st.binary(min_size=32, max_size=32))
def test_draw_is_reproducible_and_changes_with_the_seed(seed, root):
    first = draw_ranking.draw(seed, root, "camp-1", SERIALS, 10)
    assert first == draw_ranking.draw(seed, root, "camp-1", list(reversed(SERIALS)), 10)  # order of input irrelevant
    other = draw_ranking.draw(hashlib.sha256(seed).digest(), root, "camp-1", SERIALS, 10)
    assert other != first  # 10 of 500: a collision has probability ~1e-20
    assert draw_ranking.draw(seed, hashlib.sha256(root).digest(), "camp-1", SERIALS, 10) != first
    assert draw_ranking.draw(seed, root, "camp-2", SERIALS, 10) != first


def test_campaign_and_serial_are_separated():
    seed, root = bytes(32), bytes(32)
    assert draw_ranking.rank(seed, root, "c1", "23") != draw_ranking.rank(seed, root, "c12", "3")


def test_commitment_binds_the_seed():
    seed = draw_ranking.new_seed()
    assert draw_ranking.commitment(seed) == hashlib.sha256(seed).hexdigest()
    assert draw_ranking.commitment(seed[:-1] + bytes([seed[-1] ^ 1])) != draw_ranking.commitment(seed)


def test_edge_counts():
    assert draw_ranking.draw(bytes(32), bytes(32), "c", SERIALS, 0) == []
    assert sorted(draw_ranking.draw(bytes(32), bytes(32), "c", SERIALS[:5], 10)) == SERIALS[:5]


@settings(max_examples=50, deadline=None)
@given(seed=st.binary(max_size=100), message=st.binary(max_size=200))
def test_hmac_pads_rebuild_hmac_sha256(seed, message):
    inner, outer = draw_ranking.hmac_pads(seed)
    rebuilt = hashlib.sha256(outer + hashlib.sha256(inner + message).digest()).digest()
    assert rebuilt == hmac.new(seed, message, hashlib.sha256).digest()
