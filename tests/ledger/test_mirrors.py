"""Mirrors: any static file server holding a copy of the tiles serves the outside verifiers (docs/ledger.md,
Mirrors). The copy is made the way docs/ledger.md says, served by Python's http.server, and the log itself
is unreachable while the verifiers run."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading
import urllib.request
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ledger import keys, services
from tests.factories import append_sample_entries
from tlog import note, tiles

REPO = Path(__file__).resolve().parents[2]
DEAD_LOG = "http://127.0.0.1:9"  # the discard port: nothing answers


def copy_tiles(prefix: str, into: Path) -> int:
    """Copy the checkpoint and every tile and bundle its tree needs; returns how many files were copied."""
    with urllib.request.urlopen(prefix + "checkpoint", timeout=30) as answer:
        checkpoint = answer.read()
    size = note.parse_checkpoint(note.split_note(checkpoint.decode())[0]).size
    paths = [tiles.tile_path(*tile) for tile in tiles.tiles_for_size(size)]
    paths += [tiles.bundle_path(*bundle) for bundle in tiles.bundles_for_size(size)]
    for path in paths:
        with urllib.request.urlopen(prefix + path, timeout=30) as answer:
            (into / path).parent.mkdir(parents=True, exist_ok=True)
            (into / path).write_bytes(answer.read())
    (into / "checkpoint").write_bytes(checkpoint)
    return len(paths) + 1


@pytest.fixture
def static_server():
    servers = []

    def serve(directory: Path) -> str:
        handler = functools.partial(QuietHandler, directory=str(directory))
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/"

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def _run(module: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO") and k != "DATABASE_URL"}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.django_db(transaction=True)
def test_verify_works_from_a_static_mirror_of_copied_tiles_alone(live_server, static_server, tmp_path):
    append_sample_entries(600)
    checkpoint = services.checkpoint_sign()
    assert copy_tiles(live_server.url + "/tlog/", tmp_path) == 1 + 4 + 3  # L0: 2 full + 1 partial, L1: 1; 3 bundles
    empty = tmp_path / "empty"
    empty.mkdir()
    first, mirror = static_server(empty), static_server(tmp_path)  # tried in order: the first holds nothing
    result = _run(
        "ledger.verify", "--url", DEAD_LOG, "--key", keys.verifier_key(), "--mirror", first, "--mirror", mirror
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"OK entries=600 root={bytes(checkpoint.root).hex()}\n"
    local = _run("ledger.verify", "--url", DEAD_LOG, "--key", keys.verifier_key(), "--mirror", tmp_path.as_uri())
    assert local.returncode == 0 and local.stdout == result.stdout, local.stderr


@pytest.mark.django_db(transaction=True)
def test_a_mirror_with_an_altered_bundle_fails_verification(live_server, static_server, tmp_path):
    append_sample_entries(300)
    services.checkpoint_sign()
    copy_tiles(live_server.url + "/tlog/", tmp_path)
    bundle = tmp_path / "tile/entries/000"
    data = bytearray(bundle.read_bytes())
    data[-5] ^= 1  # inside the last leaf of the bundle
    bundle.write_bytes(bytes(data))
    result = _run("ledger.verify", "--url", DEAD_LOG, "--key", keys.verifier_key(), "--mirror", static_server(tmp_path))
    assert result.returncode == 1 and "FAIL seq=255: tile/0/000 differs" in result.stderr, result.stderr


@pytest.mark.django_db(transaction=True)
def test_verify_without_a_pinned_key_needs_the_log(static_server, tmp_path, live_server):
    append_sample_entries(3)
    services.checkpoint_sign()
    copy_tiles(live_server.url + "/tlog/", tmp_path)
    result = _run("ledger.verify", "--url", DEAD_LOG, "--mirror", static_server(tmp_path))
    assert result.returncode == 2 and "cannot reach" in result.stderr


@pytest.mark.django_db(transaction=True)
def test_drawaudit_works_from_a_static_mirror(live_server, static_server, tmp_path):
    from tests.inspections.test_drawaudit import drawn

    drawn.__wrapped__()
    copy_tiles(live_server.url + "/tlog/", tmp_path)
    args = ["--url", DEAD_LOG, "--campaign", "frontier-2026", "--period", "0", "--key", keys.verifier_key()]
    result = _run("inspections.drawaudit", *args, "--mirror", static_server(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("MATCH campaign=frontier-2026 period=0 provers=2")


@pytest.mark.django_db(transaction=True)
def test_the_tiles_audit_reads_a_local_copy_and_finds_an_altered_level_1_tile(live_server, tmp_path):
    from tlog.chain import LedgerFault
    from tlog.log_verifier import audit_tiles
    from tlog.logclient import LogClient

    append_sample_entries(256 * 3 + 7)
    checkpoint = services.checkpoint_sign()
    copy_tiles(live_server.url + "/tlog/", tmp_path)
    client = LogClient.mirror_only([tmp_path.as_uri()])
    assert audit_tiles(client, checkpoint.size, bytes(checkpoint.root)) == 4 + 1  # L0: 3 full + 1 partial; L1
    level1 = tmp_path / "tile/1/000.p/3"
    data = bytearray(level1.read_bytes())
    data[40] ^= 1  # the second hash: the root of bundle 1
    level1.write_bytes(bytes(data))
    with pytest.raises(LedgerFault) as fault:
        audit_tiles(client, checkpoint.size, bytes(checkpoint.root))
    assert fault.value.where == 256 and "tile/1/000.p/3" in fault.value.reason


@pytest.mark.django_db(transaction=True)
def test_tlog_mirror_copies_audits_and_refreshes_only_what_changed(live_server, static_server, tmp_path):
    append_sample_entries(600)
    services.checkpoint_sign()
    prefix, key = live_server.url + "/tlog/", keys.verifier_key()
    first = _run("tlog.mirror", "--url", prefix, "--out", str(tmp_path), "--key", key)
    assert first.returncode == 0 and first.stdout == "OK entries=600 fetched=7\n", first.stderr
    append_sample_entries(100)
    checkpoint = services.checkpoint_sign()
    again = _run("tlog.mirror", "--url", prefix, "--out", str(tmp_path), "--key", key)
    # only the right edge (full tiles 0/000, 0/001 and their bundles are kept): 0/002.p/188, its bundle, 1/000.p/2
    assert again.returncode == 0 and again.stdout == "OK entries=700 fetched=3\n", again.stderr
    result = _run("ledger.verify", "--url", DEAD_LOG, "--key", key, "--mirror", static_server(tmp_path))
    assert result.stdout == f"OK entries=700 root={bytes(checkpoint.root).hex()}\n", result.stderr


@pytest.mark.django_db(transaction=True)
def test_verify_tiles_only_audits_every_tile_of_a_mirror_and_names_an_altered_one(live_server, static_server, tmp_path):
    import json

    append_sample_entries(600)
    checkpoint = services.checkpoint_sign()
    copy_tiles(live_server.url + "/tlog/", tmp_path)
    args = ["--url", DEAD_LOG, "--key", keys.verifier_key(), "--mirror", static_server(tmp_path), "--tiles-only"]
    result = _run("ledger.verify", *args, "--jobs", "2", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] and report["size"] == 600 and report["root"] == bytes(checkpoint.root).hex()
    assert report["tiles_checked"] == 4  # L0: 2 full + 1 partial; L1: 1 partial
    level1 = tmp_path / "tile/1/000.p/2"
    data = bytearray(level1.read_bytes())
    data[40] ^= 1  # the root of bundle 1
    level1.write_bytes(bytes(data))
    failed = _run("ledger.verify", *args)
    assert failed.returncode == 1 and "FAIL seq=256: tile/1/000.p/2 differs" in failed.stderr, failed.stderr
    refused = _run("ledger.verify", *args, "--jobs", "0")
    assert refused.returncode == 2 and "--jobs is at least 1" in refused.stderr
