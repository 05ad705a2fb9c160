"""The outside verifier's tiles audit (tlog.log_verifier.audit_tiles) over a file:// copy of a log's tiles.

The copy is written from tlog.merkle's node table (not from tlog.tiles), for a tree with tiles at three
levels. Any flipped byte in any tile or bundle is caught and named within the leaves it covers; the
audit in worker processes gives the same answers, first fault included, as the audit in one.
"""

from __future__ import annotations

import shutil
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tlog import merkle, tiles
from tlog.chain import LedgerFault
from tlog.log_verifier import audit_tiles
from tlog.logclient import LogClient

SIZE = 65_536 + 3 * 256 + 5  # level 0: 259 full tiles + 1 partial; level 1: 1 full + 1 partial; level 2: 1 partial
LEAVES = [b"leaf %d" % i + b"." * (i % 13) for i in range(SIZE)]


@cache
def _nodes() -> dict[tuple[int, int], bytes]:
    leaf_hashes = [merkle.leaf_hash(leaf) for leaf in LEAVES]
    _, nodes = merkle.append_leaves([], 0, leaf_hashes)
    table = {(level, index): digest for level, index, digest in nodes}
    table.update({(0, i): digest for i, digest in enumerate(leaf_hashes)})
    return table


def _files() -> dict[str, bytes]:
    nodes = _nodes()
    files = {}
    for level, index, width in tiles.tiles_for_size(SIZE):
        count = width or tiles.TILE_WIDTH
        first = index * tiles.TILE_WIDTH
        files[tiles.tile_path(level, index, width)] = b"".join(nodes[8 * level, first + i] for i in range(count))
    for index, width in tiles.bundles_for_size(SIZE):
        first = index * tiles.TILE_WIDTH
        files[tiles.bundle_path(index, width)] = tiles.encode_bundle(LEAVES[first : first + (width or 256)])
    return files


ROOT = merkle.root_from_leaf_hashes([merkle.leaf_hash(leaf) for leaf in LEAVES])
PATHS = sorted(_files())
# every kind drawn as often: (level or bundles, full or partial) -> its paths
KINDS = {}
for _path in PATHS:
    _level, _, _width = tiles.parse_path(_path)
    KINDS.setdefault((_level, _width is None), []).append(_path)
ANY_PATH = st.sampled_from(sorted(KINDS, key=str)).flatmap(lambda kind: st.sampled_from(KINDS[kind]))


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tiles")
    for path, data in _files().items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_bytes(data)
    return folder


def _audit(folder: Path, jobs: int = 1, chunk: int = 256) -> int:
    return audit_tiles(LogClient.mirror_only([folder.as_uri()]), SIZE, ROOT, jobs=jobs, chunk=chunk)


def _covered(path: str) -> range:
    """The leaves whose hashes a tile or bundle commits to."""
    level, index, width = tiles.parse_path(path)
    height = 0 if level is None else tiles.TILE_HEIGHT * level
    first = index * tiles.TILE_WIDTH << height
    return range(first, min(SIZE, first + ((width or tiles.TILE_WIDTH) << height)) + 1)


def test_the_fixture_has_tiles_at_three_levels_and_audits_clean(copy):
    assert set(KINDS) == {(None, True), (None, False), (0, True), (0, False), (1, True), (1, False), (2, False)}
    assert "tile/2/000.p/1" in PATHS and "tile/1/000" in PATHS and "tile/entries/259.p/5" in PATHS
    assert _audit(copy) == 260 + 2 + 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=ANY_PATH, data=st.data())
def test_any_flipped_byte_in_any_tile_or_bundle_is_caught_where_it_is(copy, path, data):
    original = (copy / path).read_bytes()
    position = data.draw(st.integers(0, len(original) - 1), label="byte")
    bit = data.draw(st.integers(0, 7), label="bit")
    altered = bytearray(original)
    altered[position] ^= 1 << bit
    (copy / path).write_bytes(bytes(altered))
    try:
        with pytest.raises(LedgerFault) as fault:
            _audit(copy)
    finally:
        (copy / path).write_bytes(original)
    assert fault.value.where in _covered(path), (path, fault.value)


@pytest.mark.parametrize("cut", ["a truncated tile", "an extra byte in a bundle", "a missing bundle"])
def test_a_tile_or_bundle_of_the_wrong_length_is_caught(copy, tmp_path, cut):
    folder = tmp_path / "copy"
    shutil.copytree(copy, folder)
    if cut == "a truncated tile":
        target = folder / "tile/1/000"
        target.write_bytes(target.read_bytes()[:-32])
    elif cut == "an extra byte in a bundle":
        target = folder / "tile/entries/007"
        target.write_bytes(target.read_bytes() + b"\x00")
    else:
        (folder / "tile/entries/007").unlink()
    with pytest.raises(Exception) as raised:
        _audit(folder)
    assert isinstance(raised.value, LedgerFault) or "tile/entries/007" in str(raised.value)


def _outcome(folder: Path, jobs: int, chunk: int):
    try:
        return ("ok", _audit(folder, jobs=jobs, chunk=chunk))
    except LedgerFault as fault:
        return ("fault", fault.where, fault.reason)


@pytest.mark.parametrize(
    "altered",
    [
        [],
        ["tile/0/200"],
        ["tile/1/000", "tile/0/258"],  # the level-1 tile is checked first (after bundle 255), in one job or many
        ["tile/entries/258", "tile/0/010"],  # the earlier run's fault wins over a later run's
        ["tile/2/000.p/1"],
        ["tile/entries/259.p/5"],
    ],
)
def test_the_audit_in_worker_processes_answers_as_in_one(copy, tmp_path, altered):
    folder = tmp_path / "copy"
    shutil.copytree(copy, folder)
    for path in altered:
        data = bytearray((folder / path).read_bytes())
        data[-1] ^= 0x40
        (folder / path).write_bytes(bytes(data))
    alone = _outcome(folder, jobs=1, chunk=256)
    assert alone[0] == ("fault" if altered else "ok")
    assert _outcome(folder, jobs=1, chunk=100) == alone
    assert _outcome(folder, jobs=2, chunk=100) == alone  # runs of 100 bundles: a level-1 tile ends mid-run


def test_ledger_verify_tiles_only_runs_its_workers_from_the_command_line(copy, tmp_path):
    """Two runs of bundles (260 > 256): the worker processes are spawned from ``python -m ledger.verify``."""
    import json
    import os
    import subprocess
    import sys

    import nacl.signing

    from tlog import note

    key = nacl.signing.SigningKey.generate()
    origin = "example.org/audit/tlog"
    folder = tmp_path / "copy"
    shutil.copytree(copy, folder)
    (folder / "checkpoint").write_text(note.sign_note(note.checkpoint_body(origin, SIZE, ROOT), origin, key))
    vkey = note.verifier_key(origin, bytes(key.verify_key))
    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO") and k != "DATABASE_URL"}
    env["PYTHONPATH"] = str(repo)
    args = ["--url", "http://127.0.0.1:9", "--key", vkey, "--mirror", folder.as_uri(), "--tiles-only", "--json"]

    def run(*extra: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "ledger.verify", *args, *extra]
        return subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=300)

    result = run("--jobs", "2")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["tiles_checked"] == 263 and json.loads(result.stdout)["root"] == ROOT.hex()
    data = bytearray((folder / "tile/0/257").read_bytes())
    data[100] ^= 4  # hash 3 of tile 257: leaf 257 * 256 + 3
    (folder / "tile/0/257").write_bytes(bytes(data))
    failed = run("--jobs", "2")
    assert failed.returncode == 1 and "FAIL seq=65795: tile/0/257 differs" in failed.stderr, failed.stderr
    assert run("--jobs", "1").stderr == failed.stderr


def test_workers_are_forked_only_from_a_single_threaded_caller(copy):
    import threading

    from tlog import log_verifier

    release = threading.Event()
    thread = threading.Thread(target=release.wait)
    thread.start()
    try:
        assert log_verifier._start_method() == "spawn"  # a fresh interpreter: no lock of a thread left behind
        assert _audit(copy, jobs=2, chunk=100) == 263
    finally:
        release.set()
        thread.join()
