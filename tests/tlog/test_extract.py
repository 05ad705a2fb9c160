"""tlog.extract: a ledger extract checked offline: entries of a small log with their proofs verify; any change
to a leaf, a proof, a seq, the subject, the key or the checkpoint is refused with a LedgerFault, never a crash."""

import base64
import copy
import json

import nacl.signing
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tlog import merkle, note
from tlog.chain import LedgerFault, canonical_leaf
from tlog.extract import build_extract, check_extract

ORIGIN = "example.org/log"
KEY = nacl.signing.SigningKey(b"\x07" * 32)
VKEY = note.verifier_key(ORIGIN, bytes(KEY.verify_key))
ACTORS = ["acme", "fab-tw", "regulator", "acme", "vendor-x", "fab-tw", "regulator", "acme"]


def _log():
    leaves, prev = [], "0" * 64
    for seq, actor in enumerate(ACTORS):
        payload = {"org": "acme"} if actor == "regulator" else {"note": seq}
        leaf = canonical_leaf(seq, "2026-11-26T00:00:00Z", "thing.done", actor, payload, prev)
        leaves.append(leaf)
        prev = merkle.leaf_hash(leaf).hex()
    return leaves


LEAVES = _log()
HASHES = [merkle.leaf_hash(leaf) for leaf in LEAVES]
SIZE = len(LEAVES)
CHECKPOINT = note.sign_note(note.checkpoint_body(ORIGIN, SIZE, merkle.root_from_leaf_hashes(HASHES)), ORIGIN, KEY)


def _proof(index: int) -> list[bytes]:
    """The inclusion proof from its definition: the root of each range the proof covers (RFC 9162)."""
    return [merkle.root_from_leaf_hashes(HASHES[begin:end]) for begin, end in merkle.inclusion_ranges(index, SIZE)]


def _extract(subject=None) -> dict:
    subject = subject or {"organisation": "acme"}
    seqs = [seq for seq, actor in enumerate(ACTORS) if actor in ("acme", "regulator")]
    return build_extract(subject, VKEY, CHECKPOINT, [(s, LEAVES[s], _proof(s)) for s in seqs], newer=0)


def test_an_extract_verifies_with_the_logs_key():
    report = check_extract(_extract(), VKEY)
    assert report.line() == f"OK extract organisation:acme entries=5 checkpoint size={SIZE} root={report.root}"


def test_an_entry_about_someone_else_is_refused():
    extract = _extract({"organisation": "vendor-x"})
    with pytest.raises(LedgerFault, match="does not concern"):
        check_extract(extract, VKEY)


def test_a_checkpoint_signed_by_another_key_is_refused():
    other = nacl.signing.SigningKey(b"\x08" * 32)
    forged = note.sign_note(note.checkpoint_body(ORIGIN, SIZE, merkle.root_from_leaf_hashes(HASHES)), ORIGIN, other)
    extract = {**_extract(), "checkpoint": forged}
    with pytest.raises(LedgerFault, match="checkpoint"):
        check_extract(extract, VKEY)
    forged_key = note.verifier_key(ORIGIN, bytes(other.verify_key))
    with pytest.raises(LedgerFault, match="not the pinned key"):
        check_extract({**extract, "key": forged_key}, VKEY)
    assert check_extract({**extract, "key": forged_key})  # unpinned, it only proves the forger's own log


@settings(max_examples=200, deadline=None)
@given(entry=st.integers(0, 4), position=st.integers(0, 10_000), bit=st.integers(0, 7))
def test_any_flipped_bit_in_a_leaf_is_refused(entry, position, bit):
    extract = copy.deepcopy(_extract())
    leaf = bytearray(base64.b64decode(extract["entries"][entry]["leaf"]))
    leaf[position % len(leaf)] ^= 1 << bit
    extract["entries"][entry]["leaf"] = base64.b64encode(bytes(leaf)).decode()
    with pytest.raises(LedgerFault):
        check_extract(extract, VKEY)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    path=st.sampled_from(["format", "subject", "key", "checkpoint", "entries", "entry", "seq", "leaf", "proof"]),
    value=JSON,
)
def test_any_field_replaced_by_any_json_is_refused_never_a_crash(path, value):
    extract = copy.deepcopy(_extract())
    target = extract["entries"][2] if path in ("seq", "leaf", "proof") else extract
    if path == "entry":
        original, extract["entries"][2] = extract["entries"][2], value
    else:
        original, target[path] = target[path], value
    try:
        check_extract(json.loads(json.dumps(extract)), VKEY)
    except LedgerFault:
        return
    # only the value that was there passes, or no entries at all (an extract proves what it lists, no more)
    assert value == original or (path == "entries" and value == [])
