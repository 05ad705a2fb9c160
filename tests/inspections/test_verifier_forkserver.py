"""The default verifier runs forked from a fork server that imported torch once: the same verdict, limits and
environment as a spawned ``python -m replay verify``, or a spawned one where that cannot hold."""

import dataclasses
import json
import logging
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import socket
import threading
from pathlib import Path

import pytest

from inspections import verification
from tests.helpers import wait_for

NONCE = "00112233445566778899aabbccddeeff"


@pytest.fixture(autouse=True)
def fresh_fork_server():
    """Each test starts the fork server itself, in its own environment (an earlier test may have changed it), and
    stops it after."""
    multiprocessing.forkserver._forkserver._stop()
    verification._fork_server.clear()
    yield
    multiprocessing.forkserver._forkserver._stop()
    verification._fork_server.clear()


@pytest.fixture
def spawned(monkeypatch):
    """The spawned verifier's runs (the real one runs): a forked verifier adds none."""
    runs = []
    real = verification._run_spawned

    def spy(command, scratch, env):
        runs.append(command)
        return real(command, scratch, env)

    monkeypatch.setattr(verification, "_run_spawned", spy)
    return runs


def check(transcript, tmp_path, name: str):
    scratch = tmp_path / name
    scratch.mkdir()
    request = json.loads((transcript / "claims.json").read_text())
    return verification.claim_check(transcript, request, 1e21, scratch, NONCE)


def without_timing(verdict) -> dict:
    return {k: v for k, v in dataclasses.asdict(verdict).items() if k != "seconds"}


def test_the_forked_verifier_reaches_the_spawned_verdict(transcript, tmp_path, settings, spawned):
    settings.REPLAY_VERIFIER_FORKSERVER = True
    forked = [check(transcript, tmp_path, f"forked-{n}") for n in range(2)]  # the second from a running server
    assert spawned == []
    settings.REPLAY_VERIFIER_FORKSERVER = False
    fresh = check(transcript, tmp_path, "spawned")
    assert len(spawned) == 1
    assert forked[0].verdict == "verified" and forked[0].nonce == NONCE and forked[0].segments_replayed
    assert without_timing(forked[0]) == without_timing(forked[1]) == without_timing(fresh)


def test_the_forked_verifier_meets_the_address_space_cap(transcript, tmp_path, settings, spawned, caplog):
    settings.REPLAY_VERIFIER_FORKSERVER = True
    settings.REPLAY_MAX_MEMORY_BYTES = 64 << 20  # below what torch alone maps: nothing more can be allocated
    caplog.set_level(logging.INFO, logger=verification.__name__)
    with pytest.raises(verification.VerifierFailed):
        check(transcript, tmp_path, "capped")
    assert spawned == [] and "MemoryError" in caplog.text  # the verifier's stderr, logged by the worker


def test_a_forked_verifier_past_its_time_is_killed(transcript, tmp_path, settings, monkeypatch, spawned):
    settings.REPLAY_VERIFIER_FORKSERVER = True
    check(transcript, tmp_path, "warm")  # the server runs: what is timed next is the replay alone
    monkeypatch.setattr(verification, "time_limit", lambda: 0.01)
    with pytest.raises(verification.VerifierFailed, match=r"ran longer than 0\.01 s"):
        check(transcript, tmp_path, "late")
    assert spawned == [] and not [p for p in multiprocessing.active_children() if p.name == "replay-verify"]


def test_a_changed_environment_spawns_a_fresh_verifier(transcript, tmp_path, settings, monkeypatch, spawned):
    """torch and OpenMP read some of the environment at import: the fork server's import is not for another."""
    settings.REPLAY_VERIFIER_FORKSERVER = True
    check(transcript, tmp_path, "server")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    verdict = check(transcript, tmp_path, "other-environment")
    assert len(spawned) == 1 and verdict.verdict == "verified"


def test_a_fork_server_that_cannot_start_the_verifier_leaves_spawning(
    transcript, tmp_path, settings, monkeypatch, spawned
):
    settings.REPLAY_VERIFIER_FORKSERVER = True

    def refused(self, process):
        raise ConnectionRefusedError("the fork server is gone")

    monkeypatch.setattr(multiprocessing.context.ForkServerProcess, "_Popen", refused)
    verdicts = [check(transcript, tmp_path, f"claim-{n}") for n in range(2)]
    assert [v.verdict for v in verdicts] == ["verified", "verified"] and len(spawned) == 2
    assert "could not start" in verification._fork_server["failed"]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_a_forked_verifier_dies_with_its_fork_server(tmp_path, settings):
    """Its status goes to the worker through the server: a verifier whose server died (killed, out of memory) would
    run on unwatched, past its deadline. It is killed with the server; the claim is the verifier's failure."""
    settings.REPLAY_VERIFIER_FORKSERVER = True
    silent = socket.socket()  # a transcript URL that accepts and never answers: the verifier waits on it
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    silent.settimeout(60)
    (tmp_path / "claims.json").write_text("{}")
    url = f"http://127.0.0.1:{silent.getsockname()[1]}/run"
    command = [
        *verification.FORKED_COMMAND,
        url,
        "--claims",
        str(tmp_path / "claims.json"),
        "--json",
        "--allow-host",
        "127.0.0.1",
    ]
    ran = {}
    thread = threading.Thread(
        target=lambda: ran.update(
            r=verification._run_forked(command, tmp_path, verification.verifier_environment(tmp_path))
        )
    )
    thread.start()
    try:
        child = wait_for(lambda: [p for p in multiprocessing.active_children() if p.name == "replay-verify"], 60)[0]
        request, _ = silent.accept()  # the verifier's request, held open unanswered: it runs, past its start-up
        os.kill(multiprocessing.forkserver._forkserver._forkserver_pid, signal.SIGKILL)
        wait_for(lambda: not _alive(child.pid), 10, "the verifier's end")
        thread.join(30)
        assert ran["r"][0] not in verification.EXITS  # no verdict: the verifier's failure, retried
        request.close()
    finally:
        silent.close()


def test_two_threads_verify_at_once(transcript, tmp_path, settings, spawned):
    """The embedded worker's two threads: each gets its own verifier's verdict."""
    settings.REPLAY_VERIFIER_FORKSERVER = True
    check(transcript, tmp_path, "server")
    verdicts = {}
    threads = [
        threading.Thread(target=lambda n=n: verdicts.update({n: check(transcript, tmp_path, f"thread-{n}")}))
        for n in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert [verdicts[n].verdict for n in range(2)] == ["verified", "verified"] and spawned == []


@pytest.mark.parametrize("forked", [True, False])
@pytest.mark.parametrize("threads", sorted({1, len(os.sched_getaffinity(0))}))
def test_a_verifier_replays_on_the_threads_the_setting_gives_forked_or_spawned(
    transcript, tmp_path, settings, monkeypatch, spawned, forked, threads
):
    """REPLAY_VERIFIER_THREADS, whatever the fork server read at its start (the report says the threads it ran on):
    two verifiers of the host's every core each, side by side, had run 9x slower."""
    settings.REPLAY_VERIFIER_FORKSERVER = forked
    settings.REPLAY_VERIFIER_THREADS = threads
    said = []
    real = verification.verdict_of
    monkeypatch.setattr(verification, "verdict_of", lambda code, out, nonce: said.append(out) or real(code, out, nonce))
    assert check(transcript, tmp_path, "threads").verdict == "verified"
    assert json.loads(said[-1])["threads"] == threads
    assert (spawned == []) == forked


def test_a_verifier_never_gets_more_threads_than_the_cores(settings, tmp_path):
    """A setting past the cores (10^5 threads would be made by a forked verifier's set_num_threads) is the cores."""
    settings.REPLAY_VERIFIER_THREADS = 100_000
    assert verification.verifier_environment(tmp_path)["OMP_NUM_THREADS"] == str(len(os.sched_getaffinity(0)))
