"""C2SP tlog-tiles: the pure path/bundle code (properties), the /tlog/ endpoints against a naive tree, the
leaf-size bound, and an independent client (aics-tlog, tests/ledger/independent_client.py) over a live log."""

from __future__ import annotations

import base64
import hashlib

import pytest
from django.core.exceptions import ValidationError
from hypothesis import given
from hypothesis import strategies as st

from ledger import selectors, services
from tests.factories import append_sample_entries
from tests.ledger import independent_client
from tests.ledger.naive_merkle import mth
from tlog import chain, merkle, tiles

# --- pure -------------------------------------------------------------------------


def test_index_encoding_follows_the_spec_example():
    assert tiles.encode_index(1234067) == "x001/x234/067"
    assert tiles.encode_index(0) == "000" and tiles.encode_index(1000) == "x001/000"
    assert tiles.tile_path(2, 5, 17) == "tile/2/005.p/17"
    assert tiles.bundle_path(1234067) == "tile/entries/x001/x234/067"


@given(
    level=st.none() | st.integers(0, 63),
    index=st.integers(0, 2**64),
    width=st.none() | st.integers(1, 255),
)
def test_paths_round_trip(level, index, width):
    path = tiles.bundle_path(index, width) if level is None else tiles.tile_path(level, index, width)
    assert tiles.parse_path(path) == (level, index, width)


@pytest.mark.parametrize(
    "path",
    [
        "tile/0/1",  # not padded
        "tile/0/0001",
        "tile/0/x000/001",  # a leading zero group: 1 has one name
        "tile/00/001",
        "tile/64/001",  # level 0..63
        "tile/0/001.p/0",
        "tile/0/001.p/256",
        "tile/0/001.p/07",
        "tile/0/001/",
        "tile/0/001\n",
        "tile/-1/001",
        "tile/entries/x1/001",
        "tile/0/x001",
        "tile/0/０01",  # fullwidth digit
        "tile/0/001.p/",
        "tile/data/001",
    ],
)
def test_non_canonical_paths_are_refused(path):
    with pytest.raises(tiles.TilePathError):
        tiles.parse_path(path)


@given(st.lists(st.binary(max_size=300), max_size=256))
def test_bundles_round_trip(entries):
    assert tiles.decode_bundle(tiles.encode_bundle(entries)) == entries


@given(st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=5), st.data())
def test_a_truncated_bundle_is_refused(entries, data):
    bundle = tiles.encode_bundle(entries)
    cut = data.draw(st.integers(1, len(bundle) - 1))
    try:
        decoded = tiles.decode_bundle(bundle[:-cut])
    except ValueError:
        return
    assert len(decoded) < len(entries)  # cut at an entry's boundary: a shorter bundle, which its tile refutes


def test_an_entry_over_65535_bytes_cannot_be_bundled():
    tiles.encode_bundle([b"x" * 65_535])
    with pytest.raises(ValueError, match="65535"):
        tiles.encode_bundle([b"x" * 65_536])


def test_geometry_follows_the_spec_example_of_70000():
    found = list(tiles.tiles_for_size(70_000))
    assert [t for t in found if t[0] == 0 and t[2] is None] == [(0, i, None) for i in range(273)]
    assert (0, 273, 112) in found and (1, 0, None) in found and (1, 1, 17) in found and (2, 0, 1) in found
    assert len(found) == 273 + 1 + 1 + 1 + 1
    assert list(tiles.tiles_for_size(256)) == [(0, 0, None), (1, 0, 1)]
    assert list(tiles.bundles_for_size(300)) == [(0, None), (1, 44)]


@given(st.integers(0, 2**40), st.integers(0, 5), st.integers(0, 2**20))
def test_tile_width_is_what_the_tree_has_at_that_level(size, level, index):
    width = tiles.tile_width(size, level, index)
    listed = {(lv, i): w for lv, i, w in tiles.tiles_for_size(size)} if size < 70_000 else None
    assert 0 <= width <= 256
    assert width == max(0, min(256, (size >> 8 * level) - 256 * index))
    if listed is not None:
        expected = listed.get((level, index), 0)
        assert width == (256 if expected is None else expected)


# --- the ledger's leaves fit a tlog-tiles entry -------------------------------------


def test_the_largest_valid_request_fits_a_tiles_entry():
    from config import bodies
    from rules.identifiers import MAX_CHIPS

    body_limit = bodies.body_limit("/api/registry/chips/events/fabricate")
    assert body_limit == bodies.body_limit("/api/epcis/capture")
    chips = [
        {"serial": "S" * 60 + f"{i:04d}", "model": "m" * 64, "public_key": "A" * 44, "facility": "f" * 64}
        for i in range(MAX_CHIPS)
    ]
    payload = {"chips": chips, "epcis": {"event_id": "urn:" + "e" * 250}, "destination_country": "ZZ"}
    submission = {"key": "k" * 64, "body": base64.b64encode(b"x" * body_limit).decode(), "sig": "s" * 88}
    leaf = chain.canonical_leaf(
        2**53 - 1, "2026-11-23T18:33:52.123456Z", "chip.fabricated", "a" * 128, payload, "0" * 64, submission
    )
    assert len(leaf) <= services.MAX_LEAF_BYTES == tiles.MAX_ENTRY_BYTES


@pytest.mark.django_db
def test_a_leaf_over_65535_bytes_is_refused_and_nothing_is_written():
    append_sample_entries(1)
    with pytest.raises(ValidationError) as refused:
        services.append_entries(
            [
                services.NewEntry("test.small", {"a": 1}, "acme"),
                services.NewEntry("test.big", {"x": "y" * 70_000}, "acme"),
            ]
        )
    assert "65535" in str(refused.value) and "entries[1]" in str(refused.value)
    assert selectors.ledger_size() == 1


# --- the /tlog/ endpoints -----------------------------------------------------------------


def _leaves() -> list[bytes]:
    return [leaf for _, leaf in selectors.leaves()]


@pytest.mark.django_db
def test_level_0_tiles_and_bundles_are_the_leaf_hashes_and_leaves(client):
    append_sample_entries(600)
    leaves = _leaves()
    hashes = [merkle.leaf_hash(leaf) for leaf in leaves]
    full = client.get("/tlog/tile/0/001")
    assert full.status_code == 200 and full.content == b"".join(hashes[256:512])
    assert full["Content-Type"] == "application/octet-stream"
    assert full["Cache-Control"] == "public, max-age=31536000, immutable"
    assert full["ETag"] == '"' + hashlib.sha256(full.content).hexdigest() + '"'
    again = client.get("/tlog/tile/0/001", HTTP_IF_NONE_MATCH=full["ETag"])
    assert again.status_code == 304
    partial = client.get("/tlog/tile/0/002.p/88")
    assert partial.status_code == 200 and partial.content == b"".join(hashes[512:600])
    assert "immutable" not in partial["Cache-Control"]
    assert client.get("/tlog/tile/0/002.p/30").content == b"".join(hashes[512:542])  # a narrower, older width
    bundle = client.get("/tlog/tile/entries/002.p/88")
    assert tiles.decode_bundle(bundle.content) == leaves[512:600]
    assert tiles.decode_bundle(client.get("/tlog/tile/entries/000").content) == leaves[:256]
    for missing in (
        "/tlog/tile/0/002",
        "/tlog/tile/0/002.p/89",
        "/tlog/tile/0/003.p/1",
        "/tlog/tile/entries/002",
        "/tlog/tile/1/000.p/3",
        "/tlog/tile/0/2",
        "/tlog/tile/0/x000/002",
        "/tlog/tile/64/000",
        "/tlog/tile/0/" + tiles.encode_index(2**64),  # beyond int64: 404, not a database error
        "/tlog/tile/6/x036/028/797/018/963/968",
        "/tlog/tile/entries/" + tiles.encode_index(2**62),
    ):
        answer = client.get(missing)
        assert answer.status_code == 404 and answer["Cache-Control"] == "no-store", missing
    assert client.post("/tlog/tile/0/000").status_code == 405


@pytest.mark.django_db
def test_level_1_tiles_are_roots_of_full_level_0_tiles(client):
    append_sample_entries(256 * 256 + 300)
    leaves = _leaves()
    level1 = client.get("/tlog/tile/1/000")
    assert level1.status_code == 200 and len(level1.content) == 8192
    for i in (0, 1, 137, 255):
        assert level1.content[32 * i : 32 * i + 32] == mth(leaves[256 * i : 256 * (i + 1)])
    level1_partial = client.get("/tlog/tile/1/001.p/1").content
    assert level1_partial == mth(leaves[65536 : 65536 + 256])
    assert client.get("/tlog/tile/2/000.p/1").content == mth(leaves[:65536])
    assert client.get("/tlog/tile/1/001.p/2").status_code == 404


@pytest.mark.django_db
def test_the_checkpoint_is_the_served_note_with_its_cosignatures(client):
    assert client.get("/tlog/checkpoint").status_code == 404
    append_sample_entries(3)
    checkpoint = services.checkpoint_sign()
    answer = client.get("/tlog/checkpoint")
    assert answer.status_code == 200 and answer["Content-Type"] == "text/plain; charset=utf-8"
    assert answer.content.decode() == selectors.checkpoint_text(checkpoint)
    assert answer.content.decode() == client.get("/api/ledger/checkpoint").content.decode()
    assert "no-cache" in answer["Cache-Control"]


# --- an independent client over the live log -------------------------------------------


def _log_key() -> str:
    from ledger import keys

    return keys.verifier_key()


@pytest.mark.django_db(transaction=True)
def test_an_independent_client_audits_every_tile_and_agrees_with_our_proofs(live_server):
    append_sample_entries(700)
    checkpoint = services.checkpoint_sign()
    specs = [(0, 700, 1), (699, 700, 699), (300, 513, 256), (511, 512, 300), (5, 6, 5)]
    status, report = independent_client.run(
        live_server.url + "/tlog/", _log_key(), *[f"--proofs={i},{s},{o}" for i, s, o in specs]
    )
    assert status == 0, report
    assert report["size"] == 700 and report["root"] == bytes(checkpoint.root).hex()
    assert report["tiles"] == 3 + 1 and report["bundles"] == 3  # L0: 2 full + partial 188; L1: partial 2
    leaves = _leaves()
    for (index, size, old), proof in zip(specs, report["proofs"], strict=True):
        assert base64.b64decode(proof["entry"]) == leaves[index]
        assert proof["inclusion"] == [base64.b64encode(h).decode() for h in selectors.inclusion_proof(index, size)]
        assert proof["consistency"] == [base64.b64encode(h).decode() for h in selectors.consistency_proof(old, size)]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("target", ["/tlog/tile/0/001", "/tlog/tile/entries/000", "/tlog/tile/1/000.p/2"])
def test_the_independent_client_rejects_an_altered_tile(live_server, target):
    from tests.ledger.test_standalone_tools import Proxy

    append_sample_entries(700)
    services.checkpoint_sign()
    proxy = Proxy(live_server.url)

    def flip_a_byte(path, body):
        if path != target:
            return body
        at = len(body) - 1  # a hash byte, or the last byte of the last leaf
        return body[:at] + bytes([body[at] ^ 1]) + body[at + 1 :]

    proxy.rewrite = flip_a_byte
    try:
        status, report = independent_client.run(proxy.url + "/tlog/", _log_key())
    finally:
        proxy.close()
    assert status == 1 and not report["ok"], report
    assert "Verification" in report["error"] or "verif" in report["error"].lower(), report
