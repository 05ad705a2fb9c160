"""C2SP tlog-tiles served by the ledger (the pure part: tests/tlog/test_tiles.py): the /tlog/ endpoints against a naive tree, the
leaf-size bound, and an independent client (aics-tlog, tests/ledger/independent_client.py) over a live log."""

from __future__ import annotations

import base64
import hashlib

import pytest
from django.core.exceptions import ValidationError

from ledger import selectors, services
from tests.factories import append_sample_entries
from tests.ledger import independent_client
from tests.tlog.naive_merkle import mth
from tlog import chain, merkle, tiles

# --- the ledger's leaves fit a tlog-tiles entry -------------------------------------


def test_the_largest_valid_request_fits_a_tiles_entry():
    from api import request_bodies as bodies
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
@pytest.mark.parametrize(
    "path",
    ["tile/entries/" + "x999/" * 2000 + "000", "tile/0/" + "x999/" * 7 + "000", "tile/entries/000.p/1%0A"],
    ids=["2000 groups", "7 groups", "trailing newline"],
)
def test_a_crafted_tile_path_is_a_4xx_never_a_500_nor_a_second_name(client, path):
    append_sample_entries(3)
    answer = client.get("/tlog/" + path)
    assert 400 <= answer.status_code < 500


@pytest.mark.django_db
def test_entry_bundles_are_gzipped_for_a_client_that_accepts_it(client):
    import gzip

    append_sample_entries(600)
    leaves = _leaves()
    plain = client.get("/tlog/tile/entries/000")
    zipped = client.get("/tlog/tile/entries/000", HTTP_ACCEPT_ENCODING="gzip, identity")
    assert "Content-Encoding" not in plain and zipped["Content-Encoding"] == "gzip"
    assert gzip.decompress(zipped.content) == plain.content and tiles.decode_bundle(plain.content) == leaves[:256]
    assert len(zipped.content) < len(plain.content) / 2
    assert client.get("/tlog/tile/entries/000", HTTP_ACCEPT_ENCODING="gzip").content == zipped.content  # cached
    assert all("Accept-Encoding" in response["Vary"] for response in (plain, zipped))
    assert (
        zipped["ETag"] == '"' + hashlib.sha256(zipped.content).hexdigest() + '"' != plain["ETag"]
    )  # one per representation
    revalidated = client.get("/tlog/tile/entries/000", HTTP_ACCEPT_ENCODING="gzip", HTTP_IF_NONE_MATCH=zipped["ETag"])
    assert revalidated.status_code == 304 and "Accept-Encoding" in revalidated["Vary"]
    assert client.get("/tlog/tile/entries/000", HTTP_IF_NONE_MATCH=zipped["ETag"]).status_code == 200  # not this one's
    assert client.get("/tlog/tile/entries/000", HTTP_IF_NONE_MATCH=f'"x", W/{plain["ETag"]}').status_code == 304
    partial = client.get("/tlog/tile/entries/002.p/88", HTTP_ACCEPT_ENCODING="gzip")
    assert tiles.decode_bundle(gzip.decompress(partial.content)) == leaves[512:600]
    refused = client.get("/tlog/tile/entries/000", HTTP_ACCEPT_ENCODING="gzip;q=0, identity")
    assert "Content-Encoding" not in refused and refused.content == plain.content
    tile = client.get("/tlog/tile/0/000", HTTP_ACCEPT_ENCODING="gzip")  # hashes do not compress: never gzipped
    assert "Content-Encoding" not in tile and "Accept-Encoding" not in tile.get("Vary", "")


@pytest.mark.parametrize(
    ("header", "accepted"),
    [
        ("gzip", True),
        ("gzip, deflate, br", True),
        ("br;q=1.0, GZIP;q=0.5", True),
        ("x-gzip", True),
        ("*", True),
        ("", False),
        ("identity", False),
        ("gzip;q=0", False),
        ("gzip;q=0.000, *", False),
        ("*;q=0", False),
        ("deflate, br", False),
        ("gzip;q=nonsense", False),
    ],
)
def test_accept_encoding_is_read_with_its_q_values(header, accepted):
    from ledger.tile_views import accepts_gzip

    assert accepts_gzip(header) is accepted


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
