"""The outside verifier and witness (``python -m tlog.log_verifier`` / ``tlog.log_witness``, also run by their
compatibility names ``python -m ledger.verify`` / ``ledger.witness``, which the end-to-end runs use).

Pure tests of their state and decision logic first; then end-to-end runs against the real app
served by ``live_server``, with a small HTTP proxy in front of it where a lying log is needed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import nacl.signing
import pytest

from tlog import log_verifier as verify_tool
from tlog import log_witness as witness_tool
from tlog import merkle, note, tiles
from tlog.log_witness import Decision, State, decide

REPO = Path(__file__).resolve().parents[2]
ORIGIN = "test.example/log"
OTHER_ROOT = hashlib.sha256(b"another tree").digest()


def _cp(size: int, root: bytes, origin: str = ORIGIN) -> note.Checkpoint:
    return note.parse_checkpoint(note.checkpoint_body(origin, size, root))


def _state(size: int, root: bytes, origin: str = ORIGIN, log_key: str = "k") -> State:
    return State(origin=origin, log_key=log_key, size=size, root=root, checkpoint="")


def _tool_env() -> dict:
    """The environment of a third party: no Django settings, the repo importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO")}
    env["PYTHONPATH"] = str(REPO)
    return env


def _run_tool(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        env=_tool_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


# ---------------------------------------------------------------------------------------------
# Pure: no server, no database


def test_tools_import_without_django():
    code = (
        "import ledger.verify, ledger.witness, tlog.log_verifier, tlog.log_witness, sys; "
        "assert not any(m.startswith('django') for m in sys.modules), "
        "[m for m in sys.modules if m.startswith('django')]"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_tool_env(), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


class TestDecide:
    root = merkle.leaf_hash(b"x")

    def test_first_use_is_trusted_and_says_so(self):
        d = decide(None, _cp(5, self.root))
        assert d.cosign and d.first_use and d.consistency_from is None

    def test_same_checkpoint_is_cosigned_again_without_proof(self):
        assert decide(_state(5, self.root), _cp(5, self.root)) == Decision(
            True, "same checkpoint as last cosigned, size 5"
        )

    def test_same_size_other_root_is_a_fork(self):
        d = decide(_state(5, self.root), _cp(5, OTHER_ROOT))
        assert not d.cosign and d.reason.startswith("fork")

    def test_smaller_size_is_a_rollback(self):
        d = decide(_state(6, self.root), _cp(5, self.root))
        assert not d.cosign and d.reason.startswith("rollback")

    def test_larger_size_needs_consistency_from_last_size(self):
        d = decide(_state(5, self.root), _cp(9, OTHER_ROOT))
        assert d.cosign and d.consistency_from == 5 and not d.first_use

    def test_growing_from_the_empty_tree_needs_no_proof(self):
        d = decide(_state(0, merkle.EMPTY_ROOT), _cp(3, self.root))
        assert d.cosign and d.consistency_from is None

    def test_empty_state_with_non_empty_root_is_refused(self):
        assert not decide(_state(0, self.root), _cp(3, self.root)).cosign

    def test_other_origin_is_refused(self):
        d = decide(_state(5, self.root), _cp(9, self.root, origin="evil.example/log"))
        assert not d.cosign and "origin" in d.reason


class TestStateFile:
    def test_missing_state_is_none(self, tmp_path):
        assert witness_tool.load_state(str(tmp_path / "state.json")) is None

    def test_round_trip_and_no_temporary_files_left(self, tmp_path):
        path = tmp_path / "state.json"
        state = State(ORIGIN, "vkey", 7, OTHER_ROOT, "note text\n")
        witness_tool.save_state(str(path), state)
        assert witness_tool.load_state(str(path)) == state
        data = json.loads(path.read_text())
        assert data == {
            "origin": ORIGIN,
            "log_key": "vkey",
            "size": 7,
            "root": base64.b64encode(OTHER_ROOT).decode(),
            "checkpoint": "note text\n",
        }
        assert os.listdir(tmp_path) == ["state.json"]

    def test_failed_write_leaves_old_state(self, tmp_path, monkeypatch):
        path = tmp_path / "state.json"
        old = State(ORIGIN, "vkey", 1, OTHER_ROOT, "")
        witness_tool.save_state(str(path), old)

        def broken_replace(src, dst):
            raise OSError("disk full")

        monkeypatch.setattr(witness_tool.os, "replace", broken_replace)
        with pytest.raises(OSError):
            witness_tool.save_state(str(path), State(ORIGIN, "vkey", 2, OTHER_ROOT, ""))
        assert witness_tool.load_state(str(path)) == old
        assert os.listdir(tmp_path) == ["state.json"]

    @pytest.mark.parametrize(
        "text",
        [
            "not json",
            "[]",
            '{"origin": "o"}',
            '{"origin":"o","log_key":"k","size":-1,'
            '"root":"' + base64.b64encode(OTHER_ROOT).decode() + '","checkpoint":""}',
        ],
    )
    def test_malformed_state_is_an_error(self, tmp_path, text):
        path = tmp_path / "state.json"
        path.write_text(text)
        with pytest.raises(witness_tool.WitnessError):
            witness_tool.load_state(str(path))


class TestKeyFile:
    def test_created_0600_with_name_and_seed_and_reloaded(self, tmp_path):
        path = str(tmp_path / "witness.key")
        name, key, created = witness_tool.load_or_create_key(path, "gov-a")
        assert created and name == "gov-a"
        assert os.stat(path).st_mode & 0o777 == 0o600
        lines = Path(path).read_text().splitlines()
        assert lines == ["gov-a", base64.b64encode(bytes(key)).decode()]
        name2, key2, created2 = witness_tool.load_or_create_key(path, None)
        assert (name2, bytes(key2), created2) == ("gov-a", bytes(key), False)

    def test_creating_needs_a_name(self, tmp_path):
        with pytest.raises(witness_tool.WitnessError):
            witness_tool.load_or_create_key(str(tmp_path / "witness.key"), None)
        assert not (tmp_path / "witness.key").exists()

    def test_other_name_than_the_key_files_is_an_error(self, tmp_path):
        path = str(tmp_path / "witness.key")
        witness_tool.load_or_create_key(path, "gov-a")
        with pytest.raises(witness_tool.WitnessError):
            witness_tool.load_or_create_key(path, "gov-b")

    def test_print_key_prints_a_cosignature_verifier_key(self, tmp_path, capsys):
        path = str(tmp_path / "witness.key")
        assert witness_tool.main(["--key-file", path, "--name", "gov-a", "--print-key"]) == 0
        out, err = capsys.readouterr()
        verifier = note.parse_verifier_key(out.strip())
        assert verifier.name == "gov-a" and verifier.sig_type == note.COSIGNATURE_V1
        _, key, _ = witness_tool.load_or_create_key(path, None)
        assert verifier.public_key == bytes(key.verify_key)
        assert out.strip() in err  # announced on creation, for the regulator to register


def test_unreachable_log_exits_2(capsys):
    # Port 9 (discard) on localhost: nothing listens there in a test environment.
    assert verify_tool.main(["--url", "http://127.0.0.1:9", "--timeout", "5"]) == 2
    assert "cannot reach" in capsys.readouterr().err


class HostileLog:
    """A 'log' that answers GETs from ``routes`` (the last path part -> body; ``body`` otherwise), sending
    ``drip`` bytes at a time with a pause between."""

    def __init__(self, body: bytes, drip: int | None = None, pause: float = 0.5, routes: dict | None = None):
        stop = self.stop = threading.Event()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                answer = (routes or {}).get(self.path.split("?")[0].rsplit("/", 1)[-1], body)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                step = drip or len(answer)
                for at in range(0, len(answer), step):
                    try:
                        self.wfile.write(answer[at : at + step])
                        self.wfile.flush()
                    except OSError:
                        return  # the client hung up
                    if drip and stop.wait(pause):  # the adversary's drip, not the test waiting
                        return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hostile():
    logs = []

    def start(body: bytes, drip: int | None = None, routes: dict | None = None) -> str:
        logs.append(HostileLog(body, drip, routes=routes))
        return logs[-1].url

    yield start
    for log in logs:
        log.close()


DEEP = b"[" * 200_000 + b"]" * 200_000


def test_a_200000_deep_json_page_is_a_clear_error_not_a_recursion_crash(hostile, capsys):
    from inspections import drawaudit

    origin, key = "log.example/x", nacl.signing.SigningKey.generate()
    vkey = note.verifier_key(origin, bytes(key.verify_key))
    checkpoint = note.sign_note(note.checkpoint_body(origin, 1, bytes(32)), origin, key)
    routes = {"key": vkey.encode(), "checkpoint": checkpoint.encode()}
    url = hostile(b'{"entries": ' + DEEP + b"}", routes=routes)
    # The verifier reads entries from tlog-tiles bundles: the deep page served as a bundle is the log's fault,
    # named as such (exit 1), never a crash.
    assert verify_tool.main(["--url", url, "--key", vkey, "--timeout", "5", "-q"]) == 1
    assert "FAIL seq=0: entry bundle 0 is malformed" in capsys.readouterr().err
    code = drawaudit.main(["--url", url, "--campaign", "c", "--period", "0", "--key", vkey, "--timeout", "5"])
    assert code == 2 and "entry bundle 0 is malformed" in capsys.readouterr().err  # not 1 (MISMATCH)


def test_a_deeply_nested_leaf_is_a_named_fault():
    from tlog.chain import ChainVerifier, LedgerFault

    with pytest.raises(LedgerFault, match="nested too deeply"):
        ChainVerifier().feed(0, DEEP)


def test_a_server_dripping_bytes_is_cut_off_at_the_total_timeout(hostile, capsys):
    import time

    url = hostile(b'{"entries": []}' + b" " * 100, drip=1)  # a byte every 0.5 s: 58 s for the whole answer
    started = time.monotonic()
    assert verify_tool.main(["--url", url, "--key", _any_key(), "--timeout", "2", "-q"]) == 2
    assert time.monotonic() - started < 10
    assert "no complete answer within 2 s" in capsys.readouterr().err


def _any_key() -> str:
    return note.verifier_key("log.example/x", bytes(32))


def test_unreachable_log_witness_exits_2_and_signs_nothing(tmp_path, capsys):
    state = tmp_path / "state.json"
    args = ["--url", "http://127.0.0.1:9", "--key-file", str(tmp_path / "k"), "--name", "w"]
    assert witness_tool.main([*args, "--state-file", str(state), "--timeout", "5"]) == 2
    assert capsys.readouterr().out == ""
    assert not state.exists()


# ---------------------------------------------------------------------------------------------
# End to end against the real app


class Proxy:
    """An HTTP proxy in front of the log; ``rewrite(path, body) -> body`` lets it lie."""

    def __init__(self, upstream: str):
        self.upstream = upstream.rstrip("/")
        self.rewrite = lambda path, body: body
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _forward(self, data=None):
                request = urllib.request.Request(proxy.upstream + self.path, data=data, method=self.command)
                if data is not None:
                    request.add_header("Content-Type", self.headers["Content-Type"])
                try:
                    with urllib.request.urlopen(request, timeout=30) as resp:
                        status, ctype, body = resp.status, resp.headers["Content-Type"], resp.read()
                except urllib.error.HTTPError as err:
                    status, ctype, body = err.code, err.headers["Content-Type"], err.read()
                if 200 <= status < 300:
                    body = proxy.rewrite(self.path, body)
                self.send_response(status)
                self.send_header("Content-Type", ctype or "application/octet-stream")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._forward()

            def do_POST(self):
                self._forward(self.rfile.read(int(self.headers["Content-Length"])))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def _rewrite_entries(change):
    """A proxy rewrite applying ``change(entry)`` to every entry served in a tlog-tiles entry bundle
    (``entry``: seq, leaf as base64, hash as hex; the level-0 tile is re-served to match if the change set ``hash``)."""
    changed_hashes = {}

    def rewrite(path, body):
        if path.startswith("/tlog/tile/0/"):
            _, index, _ = tiles.parse_path(path.removeprefix("/tlog/"))
            hashes = [body[i : i + 32] for i in range(0, len(body), 32)]
            for position in range(len(hashes)):
                hashes[position] = changed_hashes.get(index * 256 + position, hashes[position])
            return b"".join(hashes)
        if not path.startswith("/tlog/tile/entries/"):
            return body
        _, index, _ = tiles.parse_path(path.removeprefix("/tlog/"))
        out = []
        for position, leaf in enumerate(tiles.decode_bundle(body)):
            seq = index * 256 + position
            entry = {"seq": seq, "leaf": base64.b64encode(leaf).decode(), "hash": merkle.leaf_hash(leaf).hex()}
            original = entry["hash"]
            if change(entry) is False and entry.get("drop"):
                continue
            if entry["hash"] != original:
                changed_hashes[seq] = bytes.fromhex(entry["hash"])
            out.append(base64.b64decode(entry["leaf"]))
        return tiles.encode_bundle(out)

    return rewrite


def _tamper_leaf(entry, recompute_hash=False):
    leaf = base64.b64decode(entry["leaf"])
    parsed = json.loads(leaf)
    forged = leaf.replace(json.dumps(parsed["payload"], separators=(",", ":")).encode(), b'{"i":999}')
    assert forged != leaf
    entry["leaf"] = base64.b64encode(forged).decode()
    if recompute_hash:
        entry["hash"] = merkle.leaf_hash(forged).hex()


@pytest.fixture
def proxy(live_server):
    p = Proxy(live_server.url)
    yield p
    p.close()


def _append(n: int, start: int = 0):
    from ledger import services

    for i in range(start, start + n):
        services.append_entry("test.event", {"i": i}, "acme")
    return services.checkpoint_sign()


def _log_key() -> str:
    from ledger import keys

    return keys.verifier_key()


def _served_checkpoint(url: str) -> str:
    with urllib.request.urlopen(url + "/api/ledger/checkpoint", timeout=30) as resp:
        return resp.read().decode()


def _new_witness(tmp_path, name="gov-a", register=True) -> tuple[str, str]:
    """A witness key file; registered with the log unless told not. Returns (path, vkey)."""
    from ledger import services

    path = str(tmp_path / f"{name}.key")
    wname, key, _ = witness_tool.load_or_create_key(path, name)
    vkey = witness_tool.witness_verifier_key(wname, key)
    if register:
        services.witness_register(vkey, actor="regulator")
    return path, vkey


db = pytest.mark.django_db(transaction=True)


@db
def test_verify_honest_log_via_python_m(live_server):
    checkpoint = _append(7)
    result = _run_tool("ledger.verify", "--url", live_server.url, "--key", _log_key())
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"OK entries=7 root={bytes(checkpoint.root).hex()}\n"


@db
def test_verify_reads_entries_from_tiles_not_the_json_api(live_server, proxy, capsys):
    checkpoint = _append(7)

    def no_json_entries(path, body):
        return b"{}" if path.startswith("/api/ledger/entries") else body

    proxy.rewrite = no_json_entries
    assert verify_tool.main(["--url", proxy.url, "--json"]) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert report["ok"] and report["size"] == 7 and report["root"] == bytes(checkpoint.root).hex()
    assert "trusting the key the log serves" in err


@db
def test_verify_log_asks_for_pages_the_server_allows(live_server, settings):
    settings.LEDGER_MAX_PAGE = 3  # the server answers a larger page with 400
    checkpoint = _append(8)
    client = verify_tool.LogClient(live_server.url, page_size=3)
    report = verify_tool.verify_log(client, pinned_key=_log_key())
    assert (report.size, report.root) == (8, bytes(checkpoint.root).hex())
    assert report.key_pinned and report.inclusion_checked is not None
    assert report.consistency_checked is not None


@db
def test_verify_names_the_seq_of_a_tampered_leaf(live_server, proxy):
    _append(7)
    proxy.rewrite = _rewrite_entries(lambda e: e["seq"] == 3 and _tamper_leaf(e))
    result = _run_tool("ledger.verify", "--url", proxy.url, "--key", _log_key())
    assert result.returncode == 1
    assert result.stdout == ""
    assert "FAIL seq=3:" in result.stderr


@db
def test_verify_follows_the_chain_past_a_tampered_leaf_with_its_own_hash(live_server, proxy, capsys):
    _append(7)
    proxy.rewrite = _rewrite_entries(lambda e: e["seq"] == 3 and _tamper_leaf(e, True))
    assert verify_tool.main(["--url", proxy.url]) == 1
    assert "FAIL seq=4:" in capsys.readouterr().err  # its prev no longer matches


@db
def test_verify_fails_when_the_last_leaf_is_swapped_consistently(live_server, proxy, capsys):
    _append(7)
    proxy.rewrite = _rewrite_entries(lambda e: e["seq"] == 6 and _tamper_leaf(e, True))
    assert verify_tool.main(["--url", proxy.url]) == 1
    assert "FAIL checkpoint: root" in capsys.readouterr().err


@db
def test_verify_names_the_seq_where_a_hash_tile_disagrees_with_its_bundle(live_server, proxy, capsys):
    _append(5)
    proxy.rewrite = lambda path, body: body[:64] + OTHER_ROOT + body[96:] if path == "/tlog/tile/0/000.p/5" else body
    assert verify_tool.main(["--url", proxy.url]) == 1
    assert "FAIL seq=2: tile/0/000.p/5 differs" in capsys.readouterr().err


@db
def test_verify_fails_when_the_log_withholds_entries(live_server, proxy, capsys):
    _append(5)

    proxy.rewrite = _rewrite_entries(lambda e: e["seq"] >= 3 and e.update(drop=True) is None and False)
    assert verify_tool.main(["--url", proxy.url]) == 1
    assert "FAIL seq=3: entry bundle 0 has 3 entries" in capsys.readouterr().err


@db
def test_verify_fails_on_an_altered_checkpoint(live_server, proxy, capsys):
    _append(3)

    def shrink(path, body):
        if path == "/tlog/checkpoint":
            return body.replace(b"\n3\n", b"\n2\n", 1)
        return body

    proxy.rewrite = shrink
    assert verify_tool.main(["--url", proxy.url, "--key", _log_key()]) == 1
    assert "FAIL checkpoint:" in capsys.readouterr().err


@db
def test_verify_with_a_pinned_wrong_key_fails(live_server, capsys):
    _append(3)
    wrong = note.verifier_key("localhost/chipledger", bytes(nacl.signing.SigningKey.generate().verify_key))
    assert verify_tool.main(["--url", live_server.url, "--key", wrong]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "FAIL checkpoint: served key" in err


@pytest.mark.parametrize("proof", ["inclusion", "consistency"])
@db
def test_verify_checks_the_proof_endpoints(live_server, proxy, capsys, proof):
    _append(6)

    def bad_proof(path, body):
        if path.startswith(f"/api/ledger/proof/{proof}"):
            data = json.loads(body)
            data["hashes"] = [base64.b64encode(OTHER_ROOT).decode()] * len(data["hashes"])
            return json.dumps(data).encode()
        return body

    proxy.rewrite = bad_proof
    assert verify_tool.main(["--url", proxy.url]) == 1
    assert f"{proof} proof" in capsys.readouterr().err


@db
def test_witness_first_run_cosigns_and_submits_via_python_m(live_server, tmp_path):
    key_file, vkey = _new_witness(tmp_path)
    checkpoint = _append(4)
    state_file = tmp_path / "state.json"

    result = _run_tool(
        "ledger.witness",
        "--url",
        live_server.url,
        "--key-file",
        key_file,
        "--state-file",
        str(state_file),
    )
    assert result.returncode == 0, result.stderr
    assert "first use" in result.stderr
    line = result.stdout.strip()
    assert line.startswith("— gov-a ")
    assert line in _served_checkpoint(live_server.url).splitlines()

    state = witness_tool.load_state(str(state_file))
    assert (state.size, state.root) == (checkpoint.size, bytes(checkpoint.root))
    assert state.log_key == _log_key() and state.origin == note.parse_verifier_key(_log_key()).name

    # The outside verifier counts the cosignature towards a quorum.
    result = _run_tool("ledger.verify", "--url", live_server.url, "--witness", vkey, "--quorum", "1")
    assert result.returncode == 0, result.stderr


@db
def test_verify_quorum_fails_without_cosignatures(live_server, tmp_path, capsys):
    _, vkey = _new_witness(tmp_path)
    _append(2)
    assert verify_tool.main(["--url", live_server.url, "--witness", vkey, "--quorum", "1"]) == 1
    assert "FAIL checkpoint: 0 valid witness cosignature(s), quorum is 1" in capsys.readouterr().err


@db
def test_witness_second_run_checks_consistency_and_cosigns_new_size(live_server, proxy, tmp_path, capsys):
    key_file, _ = _new_witness(tmp_path)
    _append(3)
    state_file = str(tmp_path / "state.json")
    args = ["--url", proxy.url, "--key-file", key_file, "--state-file", state_file]
    assert witness_tool.main(args) == 0
    first = witness_tool.load_state(state_file)

    bigger = _append(5, start=3)
    assert bigger.size > first.size

    # A log whose new tree does not extend the old one is refused...
    def bad_consistency(path, body):
        if path.startswith("/api/ledger/proof/consistency"):
            data = json.loads(body)
            data["hashes"] = [base64.b64encode(OTHER_ROOT).decode()] * len(data["hashes"])
            return json.dumps(data).encode()
        return body

    proxy.rewrite = bad_consistency
    capsys.readouterr()
    assert witness_tool.main(args) == 1
    out, err = capsys.readouterr()
    assert out == "" and "not an extension" in err
    assert witness_tool.load_state(state_file) == first

    # ...and with the real proof the new size is cosigned and served.
    proxy.rewrite = lambda path, body: body
    assert witness_tool.main(args) == 0
    line = capsys.readouterr().out.strip()
    state = witness_tool.load_state(state_file)
    assert (state.size, state.root) == (bigger.size, bytes(bigger.root))
    assert line in _served_checkpoint(live_server.url).splitlines()


@pytest.mark.parametrize(
    ("size_delta", "root", "reason"),
    [(0, OTHER_ROOT, "fork"), (5, None, "rollback")],
)
@db
def test_witness_refuses_fork_and_rollback(live_server, tmp_path, capsys, size_delta, root, reason):
    key_file, _ = _new_witness(tmp_path)
    checkpoint = _append(4)
    state_file = tmp_path / "state.json"
    witness_tool.save_state(
        str(state_file),
        State(
            origin=note.parse_verifier_key(_log_key()).name,
            log_key=_log_key(),
            size=checkpoint.size + size_delta,
            root=root or bytes(checkpoint.root),
            checkpoint="earlier",
        ),
    )
    before = state_file.read_bytes()

    code = witness_tool.main(["--url", live_server.url, "--key-file", key_file, "--state-file", str(state_file)])
    assert code == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert f"REFUSED: {reason}" in err
    assert state_file.read_bytes() == before
    assert "— gov-a " not in _served_checkpoint(live_server.url)


@db
def test_witness_refuses_a_log_key_other_than_the_pinned_one(live_server, tmp_path, capsys):
    key_file, _ = _new_witness(tmp_path)
    _append(2)
    state_file = str(tmp_path / "state.json")
    args = ["--url", live_server.url, "--key-file", key_file, "--state-file", state_file]
    assert witness_tool.main(args) == 0
    before = Path(state_file).read_bytes()
    other = note.verifier_key("localhost/chipledger", bytes(nacl.signing.SigningKey.generate().verify_key))
    capsys.readouterr()
    assert witness_tool.main([*args, "--log-key", other]) == 1
    assert "REFUSED: --log-key differs" in capsys.readouterr().err
    assert Path(state_file).read_bytes() == before


@db
def test_witness_refuses_a_checkpoint_not_signed_by_the_given_log_key(live_server, tmp_path, capsys):
    key_file, _ = _new_witness(tmp_path)
    _append(2)
    state_file = tmp_path / "state.json"
    other = note.verifier_key(
        note.parse_verifier_key(_log_key()).name,
        bytes(nacl.signing.SigningKey.generate().verify_key),
    )
    args = ["--url", live_server.url, "--key-file", key_file, "--state-file", str(state_file)]
    assert witness_tool.main([*args, "--log-key", other]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "REFUSED: checkpoint does not verify" in err
    assert not state_file.exists()


@db
def test_unregistered_witness_is_rejected_by_the_log(live_server, tmp_path, capsys):
    key_file, _ = _new_witness(tmp_path, "gov-x", register=False)
    checkpoint = _append(3)
    state_file = str(tmp_path / "state.json")
    code = witness_tool.main(["--url", live_server.url, "--key-file", key_file, "--state-file", state_file])
    assert code == 3
    out, err = capsys.readouterr()
    assert out.startswith("— gov-x ")  # it did cosign...
    assert "the log REJECTED it: HTTP 400" in err and "no registered witness" in err
    assert witness_tool.load_state(state_file).size == checkpoint.size  # ...so it remembers
    assert "gov-x" not in _served_checkpoint(live_server.url)


@db
def test_witness_no_submit_cosigns_without_posting(live_server, tmp_path, capsys):
    key_file, vkey = _new_witness(tmp_path)
    checkpoint = _append(2)
    state_file = str(tmp_path / "state.json")
    args = ["--url", live_server.url, "--key-file", key_file, "--state-file", state_file]
    assert witness_tool.main([*args, "--no-submit"]) == 0
    line = capsys.readouterr().out.strip()
    body, _ = note.split_note(_served_checkpoint(live_server.url))
    sig = note.split_note(body + "\n" + line + "\n")[1][0]
    assert note.verify_cosignature(body, sig, note.parse_verifier_key(vkey)) > 0
    assert line not in _served_checkpoint(live_server.url)
    assert witness_tool.load_state(state_file).size == checkpoint.size
