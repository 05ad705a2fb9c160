"""Conformance of ``python -m ledger.witness serve`` (tlog/witness_server.py) with C2SP tlog-witness:
every status code, concurrent submissions, a restart between two submissions, rollback attempts."""

from __future__ import annotations

import base64
import http.client
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nacl.signing
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers import wait_for
from tests.tlog.naive_merkle import mth, proof
from tlog import note, witness_server
from tlog.log_witness import witness_verifier_key

REPO = Path(__file__).resolve().parents[2]
ORIGIN = "log.example/tlog"
LOG_KEY = nacl.signing.SigningKey(b"\x07" * 32)
LOG_VKEY = note.verifier_key(ORIGIN, bytes(LOG_KEY.verify_key))
WITNESS_KEY = nacl.signing.SigningKey(b"\x09" * 32)
WITNESS_VKEY = witness_verifier_key("witness.example/w1", WITNESS_KEY)
LEAVES = [b"leaf %d" % i for i in range(40)]
NOW = 1_800_000_000


def checkpoint(size: int, leaves=LEAVES, key=LOG_KEY, origin=ORIGIN) -> str:
    return note.sign_note(note.checkpoint_body(origin, size, mth(leaves[:size])), origin, key)


def body(old: int, size: int, hashes=None, text=None) -> bytes:
    if hashes is None:
        hashes = proof(old, LEAVES[:size]) if 0 < old < size else []
    lines = "".join(base64.b64encode(h).decode() + "\n" for h in hashes)
    return f"old {old}\n{lines}\n{text or checkpoint(size)}".encode()


@pytest.fixture
def witness(tmp_path):
    return witness_server.Witness(
        "witness.example/w1", WITNESS_KEY, [LOG_VKEY], witness_server.Store(str(tmp_path / "w.db")), lambda: NOW
    )


def test_a_first_checkpoint_is_cosigned_with_a_timestamped_cosignature(witness):
    answer = witness.add_checkpoint(body(0, 5))
    assert answer.status == 200 and answer.body.startswith("— witness.example/w1 ") and answer.body.endswith("\n")
    signed = note.split_note(checkpoint(5))[0]
    (signature,) = note.split_note(signed + "\n" + answer.body)[1]
    assert note.verify_cosignature(signed, signature, note.parse_verifier_key(WITNESS_VKEY)) == NOW


def test_a_consistent_extension_is_cosigned_and_becomes_the_new_size(witness):
    assert witness.add_checkpoint(body(0, 5)).status == 200
    assert witness.add_checkpoint(body(5, 13)).status == 200
    assert witness.store.latest(ORIGIN) == (13, mth(LEAVES[:13]))
    assert witness.add_checkpoint(body(13, 13)).status == 200  # the same checkpoint again


def test_409_names_the_cosigned_size_in_text_x_tlog_size(witness):
    witness.add_checkpoint(body(0, 5))
    for old in (0, 4, 6):
        answer = witness.add_checkpoint(body(old, 13))
        assert (answer.status, answer.body, answer.content_type) == (409, "5\n", "text/x.tlog.size")
    assert witness.store.latest(ORIGIN)[0] == 5


def test_404_for_an_origin_it_does_not_witness(witness):
    other = nacl.signing.SigningKey(b"\x05" * 32)
    answer = witness.add_checkpoint(body(0, 5, text=checkpoint(5, key=other, origin="other.example/log")))
    assert answer.status == 404


@pytest.mark.parametrize("how", ["another key", "a bad signature", "no signature by the log"])
def test_403_without_a_valid_signature_by_the_log(witness, how):
    text = checkpoint(5)
    if how == "another key":
        text = checkpoint(5, key=nacl.signing.SigningKey(b"\x06" * 32))
    elif how == "a bad signature":
        head, sig = text.rsplit(" ", 1)
        raw = bytearray(base64.b64decode(sig))
        raw[10] ^= 1
        text = head + " " + base64.b64encode(bytes(raw)).decode() + "\n"
    else:
        text = note.split_note(text)[0] + "\n" + note.cosign(note.split_note(text)[0], "x.example/w", WITNESS_KEY, 1)
    assert witness.add_checkpoint(body(0, 5, text=text)).status == 403
    assert witness.store.latest(ORIGIN) == (0, None)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"old 0\n",
        b"old 00\n\n" + checkpoint(5).encode(),
        b"old -1\n\n" + checkpoint(5).encode(),
        b"old 1 \n\n" + checkpoint(5).encode(),
        b"new 0\n\n" + checkpoint(5).encode(),
        b"old 0\nnot base64!\n\n" + checkpoint(5).encode(),
        b"old 0\n" + base64.b64encode(b"short") + b"\n\n" + checkpoint(5).encode(),
        b"old 0\n\n" + b"\xff" + checkpoint(5).encode(),
        b"old 0\n\nnot a checkpoint\n",
        b"old 99999999999999999999\n\n" + checkpoint(5).encode(),
        b"old 0\n" + (base64.b64encode(bytes(32)) + b"\n") * 64 + b"\n" + checkpoint(5).encode(),
    ],
)
def test_400_for_a_malformed_request(witness, raw):
    assert witness.add_checkpoint(raw).status == 400


def test_400_when_the_old_size_is_above_the_checkpoints(witness):
    witness.add_checkpoint(body(0, 9))
    answer = witness.add_checkpoint(body(9, 5))  # a rollback attempt: the log shows a smaller tree
    assert answer.status == 400 and witness.store.latest(ORIGIN)[0] == 9


def test_a_rollback_to_a_smaller_tree_is_never_cosigned(witness):
    witness.add_checkpoint(body(0, 9))
    assert witness.add_checkpoint(body(0, 5)).status == 409  # pretending never to have cosigned
    assert witness.add_checkpoint(body(5, 5)).status == 409
    assert witness.store.latest(ORIGIN) == (9, mth(LEAVES[:9]))


def test_422_for_a_bad_proof_a_fork_or_a_proof_from_zero(witness):
    assert witness.add_checkpoint(body(0, 5, hashes=[bytes(32)])).status == 422  # old 0 takes no proof
    assert witness.add_checkpoint(body(0, 5)).status == 200
    assert witness.add_checkpoint(body(5, 13, hashes=[bytes(32)] * 3)).status == 422
    forked = LEAVES[:3] + [b"forged"] + LEAVES[4:]  # another tree under the cosigned size
    assert witness.add_checkpoint(body(5, 13, hashes=proof(5, forked[:13]), text=checkpoint(13, forked))).status == 422
    assert witness.add_checkpoint(body(5, 5, text=checkpoint(5, forked[:4] + [b"x"]))).status == 422
    assert witness.store.latest(ORIGIN) == (5, mth(LEAVES[:5]))


def test_422_for_an_empty_tree_with_a_non_empty_root(witness):
    forged = note.sign_note(note.checkpoint_body(ORIGIN, 0, mth(LEAVES[:1])), ORIGIN, LOG_KEY)
    assert witness.add_checkpoint(body(0, 0, text=forged)).status == 422
    assert witness.add_checkpoint(body(0, 0)).status == 200


@given(st.integers(1, 40), st.data())
def test_any_honest_sequence_of_sizes_is_cosigned(tmp_path_factory, first, data):
    store = witness_server.Store(str(tmp_path_factory.mktemp("w") / "w.db"))
    witness = witness_server.Witness("witness.example/w1", WITNESS_KEY, [LOG_VKEY], store, lambda: NOW)
    old = 0
    for size in sorted({first, *data.draw(st.lists(st.integers(first, 40), max_size=4))}):
        assert witness.add_checkpoint(body(old, size)).status == 200
        old = size


def test_a_restart_between_two_submissions_keeps_the_size(tmp_path):
    def fresh():
        return witness_server.Witness(
            "witness.example/w1", WITNESS_KEY, [LOG_VKEY], witness_server.Store(str(tmp_path / "w.db"))
        )

    assert fresh().add_checkpoint(body(0, 5)).status == 200
    restarted = fresh()
    assert restarted.add_checkpoint(body(0, 13)).status == 409
    assert restarted.add_checkpoint(body(5, 13)).status == 200


def test_concurrent_submissions_cosign_each_size_once_and_never_roll_back(witness):
    witness.add_checkpoint(body(0, 5))
    # Twenty racing requests, all from size 5: exactly one may win; the others see its size (409).
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda size: witness.add_checkpoint(body(5, size)), range(6, 26)))
    winners = [a for a in answers if a.status == 200]
    assert len(winners) == 1
    won = witness.store.latest(ORIGIN)[0]
    assert all(a.status == 409 and a.body == f"{won}\n" for a in answers if a.status != 200)


# --- over HTTP, as a separate process ------------------------------------------------


def post(port: int, path: str, data: bytes) -> tuple[int, str, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", path, data, {"Content-Type": "text/plain"})
        answer = connection.getresponse()
        return answer.status, answer.getheader("Content-Type"), answer.read().decode()
    finally:
        connection.close()


@pytest.fixture
def served(tmp_path):
    """``python -m ledger.witness serve`` in a subprocess; yields a function (re)starting it, and its port."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    key_file = tmp_path / "w.key"
    key_file.write_text("witness.example/w1\n" + base64.b64encode(bytes(WITNESS_KEY)).decode() + "\n")
    processes = []

    def start():
        env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO")}
        env["PYTHONPATH"] = str(REPO)
        args = ["serve", "--key-file", str(key_file), "--state-db", str(tmp_path / "w.db"), "--log-key", LOG_VKEY]
        process = subprocess.Popen(
            [sys.executable, "-m", "ledger.witness", *args, "--listen", f"127.0.0.1:{port}", "--prefix", "/w/"],
            cwd=REPO,
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        processes.append(process)
        wait_for(lambda: _listening(port), what="the witness to listen")
        return process

    yield start, port
    for process in processes:
        process.kill()
        process.wait()
        process.stderr.close()


def _listening(port: int) -> bool:
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def test_the_served_witness_answers_per_the_spec_and_survives_a_kill(served):
    start, port = served
    process = start()
    assert post(port, "/w/add-checkpoint", body(0, 5))[0] == 200
    assert post(port, "/w/add-checkpoint", body(0, 9))[:3] == (409, "text/x.tlog.size", "5\n")
    assert post(port, "/w/other", body(5, 9))[0] == 404
    process.kill()  # no clean shutdown: the size must already be on disk
    process.wait()
    start()
    status, ctype, line = post(port, "/w/add-checkpoint", body(5, 9))
    assert status == 200 and ctype.startswith("text/plain") and line.startswith("— witness.example/w1 ")
    signed = note.split_note(checkpoint(9))[0]
    assert note.verify_note(signed + "\n" + line, note.parse_verifier_key(WITNESS_VKEY)) == signed
    racing = [threading.Thread(target=post, args=(port, "/w/add-checkpoint", body(9, size))) for size in (20, 21)]
    for thread in racing:
        thread.start()
    for thread in racing:
        thread.join()
    assert post(port, "/w/add-checkpoint", body(0, 30))[2] in ("20\n", "21\n")


def test_an_independent_log_side_client_gets_cosigned_and_recovers_from_a_409(tmp_path):
    """aics-witness's WitnessClient (not our code) as the log: our server's answers are what it expects."""
    import json

    from tests.ledger import independent_client

    served = witness_server.Witness(
        "witness.example/w1", WITNESS_KEY, [LOG_VKEY], witness_server.Store(str(tmp_path / "w.db"))
    )
    server = witness_server.make_server(served, "127.0.0.1", 0, "/w/")
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def step(size, fresh=False):
        olds = range(1, size)
        proofs = {old: [base64.b64encode(h).decode() for h in proof(old, LEAVES[:size])] for old in olds}
        return {"note": checkpoint(size), "proofs": proofs, "fresh": fresh}

    url = f"http://127.0.0.1:{server.server_address[1]}/w/"
    spec = {"url": url, "vkey": WITNESS_VKEY, "steps": [step(5), step(13), step(20, fresh=True), step(3)]}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    try:
        result = subprocess.run(
            [
                independent_client.venv_python(),
                str(independent_client.SCRIPT.with_name("aics_feed.py")),
                str(tmp_path / "spec.json"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env={"PATH": "/usr/bin:/bin"},
        )
    finally:
        server.shutdown()
        server.server_close()
    assert result.returncode == 0, result.stderr
    answers = json.loads(result.stdout)
    assert [a["ok"] for a in answers] == [True, True, True, False], answers
    assert "WitnessAhead" in answers[3]["error"] or "ahead" in answers[3]["error"].lower(), answers[3]
    for size, answer in zip((5, 13, 20), answers, strict=False):
        signed = note.split_note(checkpoint(size))[0]
        assert note.verify_note(signed + "\n" + answer["lines"], note.parse_verifier_key(WITNESS_VKEY)) == signed
    assert served.store.latest(ORIGIN)[0] == 20
