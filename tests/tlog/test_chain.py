"""tlog.chain: leaf bytes and the streaming chain verifier."""

import json

import orjson
import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import settings as hsettings
from hypothesis import strategies as hst
from hypothesis import strategies as st

from tlog import chain, merkle

TIME = "2025-01-02T03:04:05.123456Z"


def payload_for(seq: int) -> dict:
    """Varied payloads: nested, unicode, floats and big numbers take the slow path sometimes."""
    base = {"serial": f"CHIP-{seq:06d}", "count": seq % 7, "ok": seq % 2 == 0, "none": None}
    extra = [
        {},
        {"nested": {"list": [1, "two", {"three": 3}], "empty": []}},
        {"name": "Zürich – 東京", "emoji": "🙂"},
        {"flops": 3.2e25, "ratio": 0.5, "whole": 2.0},
        {"\ue000": 1, "\U00010000": 2},  # JCS orders keys by UTF-16 units
        {"big": 1e19, "neg": -(2**53 - 1), "ctrl": "tab\tnl\nnul\x00del\x7f"},
    ][seq % 6]
    return base | extra


def make_chain(n: int, start_prev: str = chain.GENESIS_PREV) -> list[bytes]:
    leaves, prev = [], start_prev
    for seq in range(n):
        submission = {"key": "k1", "body": "Ym9keQ==", "sig": "c2ln"} if seq % 3 == 0 else None
        kind = "chip.shipped" if seq % 2 else "org.registered"
        leaf = chain.canonical_leaf(seq, TIME, kind, "vendor-a", payload_for(seq), prev, submission)
        leaves.append(leaf)
        prev = merkle.leaf_hash(leaf).hex()
    return leaves


CHAIN = make_chain(40)
HASHES = [merkle.leaf_hash(leaf) for leaf in CHAIN]


def feed_all(leaves, verifier=None, seqs=None):
    verifier = verifier or chain.ChainVerifier()
    for seq, leaf in zip(seqs or range(len(leaves)), leaves):
        verifier.feed(seq, leaf)
    return verifier


def first_error(leaves, seqs=None) -> chain.LedgerFault:
    with pytest.raises(chain.LedgerFault) as info:
        feed_all(leaves, seqs=seqs)
    return info.value


def relabel(leaf: bytes, **changes) -> bytes:
    """The canonical leaf with some members changed (nothing else fixed up)."""
    return rfc8785.dumps(json.loads(leaf, parse_int=float) | changes)  # JCS numbers are doubles


# --- the happy path ------------------------------------------------------------------


def test_canonical_leaf_is_rfc8785_of_the_contract_object():
    leaf = chain.canonical_leaf(0, TIME, "org.registered", "system", {"b": 1, "a": "é"}, chain.GENESIS_PREV)
    assert leaf == (
        b'{"actor":"system","kind":"org.registered","payload":{"a":"\xc3\xa9","b":1},'
        b'"prev":"' + b"0" * 64 + b'","seq":0,"time":"2025-01-02T03:04:05.123456Z","v":1}'
    )
    sub = {"key": "k", "body": "YQ==", "sig": "c2ln"}
    with_sub = chain.canonical_leaf(1, TIME, "chip.shipped", "vendor-a", {}, "ab" * 32, sub)
    assert json.loads(with_sub)["submission"] == sub
    assert with_sub == rfc8785.dumps(json.loads(with_sub))


def test_valid_chain_is_accepted_and_root_matches():
    verifier = chain.ChainVerifier()
    for seq, leaf in enumerate(CHAIN):
        digest, parsed = verifier.feed(seq, leaf)
        assert digest == HASHES[seq]
        assert parsed == json.loads(leaf)
        assert verifier.size == seq + 1
    assert verifier.root() == merkle.root_from_leaf_hashes(HASHES)
    assert verifier.prev_hash == HASHES[-1]
    assert chain.ChainVerifier().root() == merkle.EMPTY_ROOT


def test_root_at_every_size_across_batch_boundaries(monkeypatch):
    monkeypatch.setattr(chain.ChainVerifier, "BATCH", 3)
    verifier = chain.ChainVerifier()
    for seq, leaf in enumerate(CHAIN):
        verifier.feed(seq, leaf)
        if seq % 5 == 0:  # asking for the root mid-stream must not disturb later batches
            assert verifier.root() == merkle.root_from_leaf_hashes(HASHES[: seq + 1])
    assert verifier.root() == merkle.root_from_leaf_hashes(HASHES)


def test_resume_mid_ledger_from_a_trusted_frontier():
    for k in (1, 13, 32):
        frontier, _ = merkle.append_leaves([], 0, HASHES[:k])
        verifier = chain.ChainVerifier(k, HASHES[k - 1], frontier)
        feed_all(CHAIN[k:], verifier, seqs=range(k, len(CHAIN)))
        assert verifier.root() == merkle.root_from_leaf_hashes(HASHES)
    bare = chain.ChainVerifier(20, HASHES[19])  # no frontier: chain checks only
    feed_all(CHAIN[20:], bare, seqs=range(20, len(CHAIN)))
    with pytest.raises(ValueError):
        bare.root()
    with pytest.raises(ValueError):
        chain.ChainVerifier(5, HASHES[4], [HASHES[0]])  # size 5 needs two frontier hashes


def test_memoryview_leaves_are_accepted():
    verifier = chain.ChainVerifier()
    for seq, leaf in enumerate(CHAIN[:5]):
        verifier.feed(seq, memoryview(leaf))
    assert verifier.root() == merkle.root_from_leaf_hashes(HASHES[:5])


# --- the first bad seq is named -----------------------------------------------------


def test_edited_leaf_byte_that_stays_valid_json():
    leaves = list(CHAIN)
    leaves[7] = leaves[7].replace(b"CHIP-000007", b"CHIP-000008")
    err = first_error(leaves)
    assert (err.seq, err.reason) == (8, "prev does not match hash of seq 7")
    assert str(err) == "seq=8: prev does not match hash of seq 7"
    last = list(CHAIN)  # editing the newest entry is caught by the root instead
    last[-1] = last[-1].replace(b"CHIP-000039", b"CHIP-000038")
    assert feed_all(last).root() != merkle.root_from_leaf_hashes(HASHES)


def test_edited_leaf_byte_that_breaks_json():
    leaves = list(CHAIN)
    leaves[5] = leaves[5][:-1]  # lose the closing brace
    err = first_error(leaves)
    assert (err.seq, err.reason) == (5, "leaf is not valid JSON")


def test_every_single_byte_edit_is_caught_at_that_seq_or_the_next():
    target = 4
    original = CHAIN[target]
    for i in range(len(original)):
        for new in {0x20, 0x30, 0x61, original[i] ^ 1} - {original[i]}:
            leaves = list(CHAIN[: target + 2])
            leaves[target] = original[:i] + bytes([new]) + original[i + 1 :]
            err = first_error(leaves)
            assert err.seq in (target, target + 1), (i, new, err)
            if err.seq == target + 1:
                assert err.reason == f"prev does not match hash of seq {target}"


def test_broken_prev():
    leaves = list(CHAIN)
    leaves[9] = relabel(CHAIN[9], prev=HASHES[7].hex())
    err = first_error(leaves)
    assert (err.seq, err.reason) == (9, "prev does not match hash of seq 8")
    genesis = relabel(CHAIN[0], prev="11" * 32)
    err = first_error([genesis])
    assert err.seq == 0 and "prev does not match genesis" in err.reason


def test_seq_gap():
    err = first_error(CHAIN[:3] + CHAIN[4:6], seqs=[0, 1, 2, 4, 5])
    assert (err.seq, err.reason) == (3, "expected seq 3, got seq 4 (gap: entries missing)")
    assert str(err) == "seq=3: expected seq 3, got seq 4 (gap: entries missing)"


def test_reordered_pair():
    err = first_error(CHAIN[:3] + [CHAIN[4], CHAIN[3]], seqs=[0, 1, 2, 4, 3])
    assert err.seq == 3 and "expected seq 3, got seq 4" in err.reason
    # Swapped rows served under contiguous seqs: the leaf itself says where it belongs.
    err = first_error(CHAIN[:3] + [CHAIN[4], CHAIN[3]])
    assert (err.seq, err.reason) == (3, "leaf says seq 4")
    err = first_error(CHAIN[:3] + [CHAIN[2]], seqs=[0, 1, 2, 2])
    assert (err.seq, err.reason) == (3, "expected seq 3, got seq 2 (duplicate or out of order)")


def non_canonical_variants(leaf: bytes) -> list[bytes]:
    obj = json.loads(leaf)
    reordered = {k: obj[k] for k in reversed(list(obj))}
    variants = [
        json.dumps(obj, ensure_ascii=False, sort_keys=True).encode(),  # extra whitespace
        json.dumps(reordered, ensure_ascii=False, separators=(",", ":")).encode(),  # unsorted keys
        json.dumps(obj, sort_keys=True, separators=(",", ":")).encode(),  # \u escapes for non-ASCII
        leaf + b"\n",
        b" " + leaf,
        b"\xef\xbb\xbf" + leaf,  # byte order mark
        leaf.replace(b'"v":1}', b'"v":1.0}'),
        leaf.replace(b'"v":1}', b'"v":1E0}'),
        leaf.replace(b'{"actor"', b'{"actor":"x","actor"', 1),  # duplicate member
        leaf.replace(b'"payload":{', b'"payload":{"a":1.50,', 1),
        leaf.replace(b'"payload":{', b'"payload":{"a":"\\u0041",', 1),
        leaf.replace(b'"payload":{', b'"payload":{"a":"\\/",', 1),
    ]
    return [v for v in variants if v != leaf]


@pytest.mark.parametrize("target", [0, 3, 4, 5])
def test_non_canonical_leaf_is_named(target):
    for variant in non_canonical_variants(CHAIN[target]):
        leaves = CHAIN[:target] + [variant] + CHAIN[target + 1 :]
        err = first_error(leaves)
        assert err.seq == target, variant
        expected = {"leaf is not RFC 8785 canonical JSON", "leaf is not valid JSON"}
        if b'"v":1}' not in variant:
            expected.add("unsupported leaf version v=1.0")  # "1.0"/"1E0" parse as a float
        assert err.reason in expected, (variant, err)


def test_non_bmp_key_order_follows_utf16():
    leaf = CHAIN[4]  # payload has "\ue000" and "\U00010000" keys
    assert leaf.index("\U00010000".encode()) < leaf.index("\ue000".encode())
    feed_all(CHAIN[:5])
    code_point_order = orjson.dumps(json.loads(leaf), option=orjson.OPT_SORT_KEYS)
    assert code_point_order != leaf
    err = first_error(CHAIN[:4] + [code_point_order])
    assert (err.seq, err.reason) == (4, "leaf is not RFC 8785 canonical JSON")


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"v": 2}, "unsupported leaf version v=2"),
        ({"v": True}, "unsupported leaf version v=True"),
        ({"v": "1"}, "unsupported leaf version v='1'"),
        ({"seq": 6}, "leaf says seq 6"),
        ({"seq": "5"}, "leaf seq '5' is not an integer in [0, 2^53)"),
        ({"time": "2025-01-02 03:04:05Z"}, "leaf time '2025-01-02 03:04:05Z' is not RFC 3339 UTC"),
        ({"time": "2025-13-02T03:04:05Z"}, "leaf time '2025-13-02T03:04:05Z' is not RFC 3339 UTC"),
        ({"time": "2025-01-02T03:04:05+01:00"}, "leaf time '2025-01-02T03:04:05+01:00' is not RFC 3339 UTC"),
        ({"kind": 3}, "leaf kind must be a non-empty string"),
        ({"actor": ""}, "leaf actor must be a non-empty string"),
        ({"payload": [1]}, "leaf payload must be an object"),
        ({"prev": None}, "leaf prev must be 64 lowercase hex digits"),
        ({"extra": 1}, "leaf members wrong: missing [], unknown ['extra']"),
        ({"submission": {"key": "k"}}, 'leaf submission must be {"key","body","sig"} strings'),
        ({"submission": None}, 'leaf submission must be {"key","body","sig"} strings'),
    ],
)
def test_bad_members_are_named(change, reason):
    leaves = list(CHAIN[:8])
    leaves[5] = relabel(CHAIN[5], **change)
    err = first_error(leaves)
    assert (err.seq, err.reason) == (5, reason)


def test_missing_member_and_non_object():
    obj = json.loads(CHAIN[2])
    del obj["time"]
    err = first_error(CHAIN[:2] + [rfc8785.dumps(obj)])
    assert (err.seq, err.reason) == (2, "leaf members wrong: missing ['time'], unknown []")
    err = first_error(CHAIN[:2] + [b"[1,2]"])
    assert (err.seq, err.reason) == (2, "leaf is not a JSON object")
    err = first_error([b"\xff"])
    assert (err.seq, err.reason) == (0, "leaf is not valid JSON")


@pytest.mark.parametrize(
    "args",
    [
        (-1, TIME, "k", "a", {}, chain.GENESIS_PREV),
        (0, "yesterday", "k", "a", {}, chain.GENESIS_PREV),
        (0, TIME, "", "a", {}, chain.GENESIS_PREV),
        (0, TIME, "k", "a", [], chain.GENESIS_PREV),
        (0, TIME, "k", "a", {}, "AB" * 32),
        (0, TIME, "k", "a", {}, chain.GENESIS_PREV, {"key": "k"}),
        (0, TIME, "k", "a", {"x": 2**53}, chain.GENESIS_PREV),
        (0, TIME, "k", "a", {"x": float("nan")}, chain.GENESIS_PREV),
        (0, TIME, "k", "a", {1: "x"}, chain.GENESIS_PREV),
        (0, TIME, "k", "a", {"x": "\ud800"}, chain.GENESIS_PREV),
    ],
)
def test_canonical_leaf_refuses_what_verifiers_would_reject(args):
    with pytest.raises(ValueError):
        chain.canonical_leaf(*args)


def test_canonical_leaf_never_returns_bytes_the_verifier_rejects(monkeypatch):
    # Should the serialiser ever drift from JCS, canonical_leaf refuses rather than store it.
    # (A float keeps the payload off the orjson fast path, so rfc8785 serialises it.)
    monkeypatch.setattr(chain.rfc8785, "dumps", lambda obj: json.dumps(obj, sort_keys=True).encode())
    with pytest.raises(ValueError):
        chain.canonical_leaf(0, TIME, "k", "a", {"f": 1.5}, chain.GENESIS_PREV)


def test_large_numbers_follow_jcs_double_semantics():
    # 1e19 is printed by JCS as 20 digits; verifiers parse that as an integer beyond 2^53.
    leaf = chain.canonical_leaf(0, TIME, "k", "a", {"big": 1e19, "max": 2.0**53, "f": 3.0}, chain.GENESIS_PREV)
    assert b'"big":10000000000000000000' in leaf and b'"f":3' in leaf
    chain.ChainVerifier().feed(0, leaf)
    for text in (b'"big":10000000000000000001', b'"big":1e19', b'"big":10000000000000000000.0'):
        bad = leaf.replace(b'"big":10000000000000000000', text)
        with pytest.raises(chain.LedgerFault, match="not RFC 8785 canonical"):
            chain.ChainVerifier().feed(0, bad)
    near = leaf.replace(b'"f":3', b'"f":9007199254740993')  # 2^53 + 1 is no double
    with pytest.raises(chain.LedgerFault, match="not RFC 8785 canonical"):
        chain.ChainVerifier().feed(0, near)


# --- the fast canonical check equals the definition --------------------------------


def test_orjson_string_escapes_equal_jcs_for_every_code_point():
    chars = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)
    for start in range(0, len(chars), 1 << 16):
        chunk = chars[start : start + (1 << 16)]
        assert orjson.dumps(chunk) == rfc8785.dumps(chunk)


json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**60), 2**60)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
    | st.sampled_from(["\ue000", "\U00010000", "é", "\x00", "\u2028", "🙂"])
)
json_keys = st.text(max_size=4) | st.sampled_from(["\ue000", "\U00010000"])
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(json_keys, inner, max_size=4),
    max_leaves=12,
)


def renderings(value) -> list[bytes]:
    out = [
        json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode(),
        json.dumps(value).encode(),
    ]
    try:
        out.append(rfc8785.dumps(value))
    except ValueError:
        pass
    try:
        out.append(orjson.dumps(value, option=orjson.OPT_SORT_KEYS))
    except TypeError:
        pass
    return out


def definition(leaf: bytes) -> bool:
    try:
        return rfc8785.dumps(json.loads(leaf, parse_int=float)) == leaf
    except ValueError:
        return False


@settings(max_examples=400, deadline=None)
@given(json_values)
def test_fast_canonical_check_agrees_with_rfc8785(value):
    for leaf in renderings(value):
        try:
            parsed = orjson.loads(leaf)
        except orjson.JSONDecodeError:
            parsed = json.loads(leaf)
        assert chain.is_canonical(leaf, parsed) == definition(leaf), leaf


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(json_keys, json_values, max_size=5))
def test_leaves_made_by_canonical_leaf_verify(payload):
    try:
        leaf = chain.canonical_leaf(0, TIME, "k", "a", payload, chain.GENESIS_PREV)
    except ValueError:
        return  # e.g. integers beyond 2^53: refused at write time, never stored
    digest, _ = chain.ChainVerifier().feed(0, leaf)
    assert digest == merkle.leaf_hash(leaf)
    for other in renderings(json.loads(leaf)):
        if other != leaf:  # any other rendering of the same leaf is refused
            with pytest.raises(chain.LedgerFault):
                chain.ChainVerifier().feed(0, other)


# --- canonical_leaf's fast path must be byte-identical to rfc8785 -------------------------


_json_leaves = hst.one_of(
    hst.none(),
    hst.booleans(),
    hst.integers(min_value=-(2**53) + 1, max_value=2**53 - 1),
    hst.floats(allow_nan=False, allow_infinity=False),
    hst.text(),
)
_json_values = hst.recursive(
    _json_leaves,
    lambda children: hst.lists(children, max_size=4) | hst.dictionaries(hst.text(), children, max_size=4),
    max_leaves=12,
)


@hsettings(max_examples=400, deadline=None)
@given(payload=hst.dictionaries(hst.text(), _json_values, max_size=6))
def test_canonical_leaf_equals_rfc8785_for_any_json_payload(payload):
    import rfc8785

    from tlog.chain import canonical_leaf

    envelope = {
        "v": 1,
        "seq": 7,
        "time": "2026-01-02T03:04:05.000006Z",
        "kind": "chip.shipped",
        "actor": "vendor-a",
        "payload": payload,
        "prev": "0" * 64,
    }
    try:
        expected = rfc8785.dumps(envelope)
    except Exception:
        expected = None
    try:
        actual = canonical_leaf(7, envelope["time"], "chip.shipped", "vendor-a", payload, "0" * 64)
    except ValueError:
        actual = None
    if actual is not None:
        assert actual == expected
