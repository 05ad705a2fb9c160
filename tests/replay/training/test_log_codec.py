"""The rounding log's C decoder (native.decode_flat, through determinism.decode_log) against the reference
(determinism.decode_log_reference): the same entries, code types included (a parity bool is not a wide
entry's int 0 or 1), and the same refusals, word for word, on valid, crafted and random bytes; its flat
arrays (determinism.FlatLog, what a static replay lays out) are the reference's entries made flat."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.training import native
from replay.training.determinism import (
    FlatLog,
    decode_log,
    decode_log_flat,
    decode_log_reference,
    encode_log,
    encode_log_reference,
)

pytestmark = pytest.mark.skipif(native.library() is None, reason="no C compiler: the reference decodes")


def _outcome(decode, data: bytes, max_entries: int):
    try:
        out = decode(data, max_entries)
    except ValueError as e:
        return ("refused", str(e))
    return ("entries", {k: (i, [(type(c), c) for c in cs]) for k, (i, cs) in out.items()})


def _same(data: bytes, max_entries: int = 1 << 20):
    ref = _outcome(decode_log_reference, data, max_entries)
    assert _outcome(decode_log, data, max_entries) == ref
    return ref


entries = st.dictionaries(
    st.one_of(st.integers(0, 10_000), st.integers(0, 2**70)),
    st.lists(
        st.tuples(
            st.one_of(st.integers(0, 10_000_000), st.integers(0, 2**70)),
            st.one_of(st.booleans(), st.integers(0, 2**32 - 1), st.sampled_from([0, 1])),
        ),
        min_size=1,
        max_size=30,
        unique_by=lambda e: e[0],
    ),
    max_size=8,
)


@settings(max_examples=150, deadline=None)
@given(entries)
def test_valid_logs_decode_the_same(raw):
    """Including keys and indices past 63 bits (the C decoder hands those to the reference; past 70
    bits a varint is too long for either)."""
    log = encode_log({k: ([i for i, _ in sorted(v)], [c for _, c in sorted(v)]) for k, v in raw.items()})
    kind, _ = _same(log)
    assert kind == "entries" or max(raw) >= 2**69 or max(i for v in raw.values() for i, _ in v) >= 2**68


@settings(max_examples=250, deadline=None)
@given(entries, st.data())
def test_crafted_logs_are_refused_the_same(raw, data):
    log = bytearray(encode_log({k: ([i for i, _ in sorted(v)], [c for _, c in sorted(v)]) for k, v in raw.items()}))
    how = data.draw(st.sampled_from(["flip", "cut", "append", "insert", "max entries"]))
    at = data.draw(st.integers(0, len(log) - 1))
    if how == "flip":
        log[at] ^= data.draw(st.integers(1, 255))
    elif how == "cut":
        del log[at:]
    elif how == "append":
        log += data.draw(st.binary(min_size=1, max_size=6))
    elif how == "insert":
        log[at:at] = data.draw(st.binary(min_size=1, max_size=4))
    limit = data.draw(st.integers(0, 40)) if how == "max entries" else 1 << 20
    _same(bytes(log), limit)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=96))
def test_random_bytes_are_refused_the_same(data):
    _same(b"\x01" + data)
    _same(data)


def test_the_c_decoder_is_used_and_hands_huge_values_to_the_reference():
    small = encode_log({3: ([1, 5], [True, 0x3F800000])})
    huge = encode_log({2**64: ([1], [True])})
    flat = decode_log_flat(small)
    assert isinstance(flat, FlatLog) and flat.as_dict() == {3: ([1, 5], [True, 0x3F800000])}
    assert native.decode_flat(huge, 1 << 20) is None and decode_log_flat(huge) == {2**64: ([1], [True])}
    assert FlatLog.from_dict(decode_log(huge)) is None, "no 63-bit key: no flat log (the deferred replay refuses it)"


@settings(max_examples=150, deadline=None)
@given(entries)
def test_the_flat_arrays_are_the_reference_entries(raw):
    """FlatLog from the C decoder equals FlatLog.from_dict of the reference's entries, field by field
    (parity bits 0 or 1, a wide entry's bits with 2^32 set, even where those bits are 0 or 1), and gives
    them back as the reference's dict."""
    log = encode_log({k: ([i for i, _ in sorted(v)], [c for _, c in sorted(v)]) for k, v in raw.items()})
    try:
        ref = decode_log_reference(log)
    except ValueError:
        return  # past 70 bits: refused by both (test_valid_logs_decode_the_same)
    flat, made = decode_log_flat(log), FlatLog.from_dict(ref)
    if not isinstance(flat, FlatLog):  # a varint past 63 bits (an index from 2^62): the reference's dict
        assert flat == ref and (max(i[-1] for i, _ in ref.values()) >= 2**62 or max(ref) >= 2**63)
        return
    for field in ("keys", "starts", "counts", "idx", "codes"):
        assert getattr(flat, field).tolist() == getattr(made, field).tolist(), field
    got = flat.as_dict()
    assert got == ref and [[type(c) for c in cs] for _, cs in got.values()] == [
        [type(c) for c in cs] for _, cs in ref.values()
    ]


@settings(max_examples=200, deadline=None)
@given(entries)
def test_the_c_encoder_writes_the_reference_bytes(raw):
    """A FlatLog (what a device recording keeps) encodes in C to the reference's bytes, wide entries whose
    bits are 0 or 1 and parity runs of any length included; keys and indices past 63 bits stay with the
    reference (no FlatLog holds them)."""
    d = {k: ([i for i, _ in sorted(v)], [c for _, c in sorted(v)]) for k, v in raw.items()}
    flat = FlatLog.from_dict(dict(sorted(d.items())))
    if flat is None:
        return
    ref = encode_log_reference(d)
    fast = native.encode_flat(flat.keys, flat.starts, flat.counts, flat.idx, flat.codes)
    assert fast == ref and encode_log(flat) == ref


def test_the_c_encoder_refuses_arrays_that_are_not_a_log():
    """Keys or indices that do not increase, a run past the arrays: no bytes (the caller's reference then
    says what is wrong), never a log that decodes to other entries."""
    import numpy as np

    a = lambda *v: np.array(v, dtype=np.int64)
    ok = (a(3, 9), a(0, 2), a(2, 1), a(1, 5, 7), a(1, 0, 1 << 32 | 7))
    assert decode_log(native.encode_flat(*ok)) == {3: ([1, 5], [True, False]), 9: ([7], [7])}
    assert native.encode_flat(a(9, 3), *ok[1:]) is None, "keys not increasing"
    assert native.encode_flat(ok[0], ok[1], ok[2], a(5, 1, 7), ok[4]) is None, "indices not increasing"
    assert native.encode_flat(ok[0], a(0, 2), a(2, 2), ok[3], ok[4]) is None, "a run past the entries"
    assert native.encode_flat(a(-1, 9), *ok[1:]) is None, "a negative key"
    # a run whose start + count wraps int64 (a bounds check by sum would pass it and read far out)
    assert native.encode_flat(a(5), a(10**11), a(2**63 - 10**11), a(1, 2, 3), a(0, 1, 0)) is None
    assert native.encode_flat(a(5), a(-1), a(2), a(1, 2, 3), a(0, 1, 0)) is None, "a negative start"
    for bad in (2, -2, 1 << 33, (1 << 32) - 1):  # neither a parity bit nor 32 bits | 2^32
        assert native.encode_flat(a(5), a(0), a(2), a(1, 2), a(0, bad)) is None, bad


def test_entries_that_no_log_holds_are_not_made_flat():
    """A key with no entries (the decoder refuses a count of 0), a key or index past 63 bits: no FlatLog,
    so a static replay hands them to the deferred one, which refuses them as before."""
    assert FlatLog.from_dict({3: ([1], [True]), 10**6: ([], [])}) is None
    assert FlatLog.from_dict({2**63: ([1], [True])}) is None and FlatLog.from_dict({3: ([2**63], [True])}) is None
    assert FlatLog.from_dict({3: ([1, 4], [True, 7])}).as_dict() == {3: ([1, 4], [True, 7])}


def test_a_flush_with_one_key_twice_keeps_the_later_run():
    """No step rounds one point twice; were it to, the entries are the dict's (the later run wins) and
    the count is theirs, as before the flat log."""
    import numpy as np

    from replay.training.determinism import Rounder

    r = Rounder("record")
    idx, code = np.array([1, 2, 5, 7, 9], dtype=np.int64), np.array([1, 0, 1, 0, 1 << 32 | 3], dtype=np.int64)
    r._store([4, 2, 4], [(0, 2), (2, 3), (3, 5)], idx, code)
    assert r.entries == {4: ([7, 9], [False, 3]), 2: ([5], [True])} and r.entry_count() == 3
