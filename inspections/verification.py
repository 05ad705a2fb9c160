"""Everything on the Django side that touches ``replay`` (docs/ARCHITECTURE.md, Parts): no other module imports it.

* Snapshot logs are checked in-process with replay's pure, torch-free firmware checker.
* A claim's material (the manifest and every file it commits to) is first copied into the claim's own
  storage by ``python -m replay.protocol.fetch`` in a limited subprocess, hashed against the manifest; only then is
  the claim's one nonce drawn (kept with the claim, reused on every retry). The verifier reads the copy.
* Claims are verified by the verifier CLI (setting ``REPLAY_VERIFIER_COMMAND``, by default
  ``python -m replay verify``) in a subprocess with a wall-clock and address-space limit. The default command
  runs forked from a fork server that has imported torch and the verifier once (``REPLAY_VERIFIER_FORKSERVER``):
  the same process limits, environment and output, without two seconds of start-up a claim. A
  transcript URL is handed to it as SOURCE and fetched inside that subprocess (``replay.protocol.fetch``),
  with the caps on bytes, files and time from the settings (in its environment, where the fetch
  reads them) and ``--allow-host`` for each allowed host: the worker itself never downloads.
* The verifier speaks the contract of docs/claims.md: one JSON verdict on stdout, exit 0 verified,
  1 rejected, 2 malformed, 3 error. Exit 3, a signal (an out-of-memory kill), a timeout, or output
  that is not a well-formed verdict raise ``VerifierFailed``: the verifier's failure, never the prover's.
"""

from __future__ import annotations

import ctypes
import json
import logging
import math
import multiprocessing
import multiprocessing.connection
import os
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from django.conf import settings

from replay.protocol import coverage
from replay.protocol.fetch import EXIT_BEYOND_CAPS, EXIT_UNAVAILABLE
from replay.protocol.firmware import log_lines, parse_record, verify_log
from replay.protocol.report import Report

from . import transcript_location

log = logging.getLogger(__name__)
EXITS = {0: "verified", 1: "rejected", 2: "malformed", 4: "incomplete"}
MAX_OUTPUT = 16 << 20
MAX_STDERR_LOGGED = 4000  # the end of a verifier's stderr, logged with its exit status
MAX_DRAWS = coverage.MAX_DRAWS  # the verifier's cap on a claims file's earlier_draws


class VerifierFailed(Exception):
    """The verifier did not produce a verdict (crash, signal, timeout, bad output): retried later.
    ``larger_worker``: a worker with larger budgets could (the step is beyond this one's)."""

    def __init__(self, message: str, larger_worker: bool = False):
        super().__init__(message)
        self.larger_worker = larger_worker


class MaterialUnavailable(Exception):
    """The prover's material could not be read (the prover's failure; final after bounded retries)."""


class MaterialRefused(Exception):
    """The prover's material is refused for good: ``verdict`` is the final verdict (malformed or rejected)."""

    def __init__(self, verdict: dict):
        super().__init__(verdict["reasons"][0])
        self.verdict = verdict


def material_dir(name: str) -> Path:
    """The claim's own storage (``Claim.material``): the copy of the prover's material every verification of the
    claim reads. Content-addressed by the manifest hash: every file in it was checked against that manifest, so
    the claims of one run share one copy (made before the first of their nonces existed)."""
    if not (len(name) == 64 and all(c in "0123456789abcdef" for c in name)):
        raise ValueError("a claim's material is named by its manifest hash")
    return Path(getattr(settings, "CLAIM_MATERIAL_ROOT", settings.VAR_DIR / "claim-material")) / name


def material_copy(location: str, manifest: str, dest: Path, scratch: Path) -> None:
    """Copy the manifest at ``location`` and every file it commits to into ``dest`` (a bounded subprocess,
    ``python -m replay.protocol.fetch``: the worker never reads a prover's bytes itself). Atomic: the files land in a
    scratch directory and are renamed into place only when all are in and hashed.

    Raises ``MaterialUnavailable`` (a read failed: retried), ``MaterialRefused`` (final), ``VerifierFailed``
    (ours), or ``transcript_location.TranscriptUnavailable``
    for a local location outside the allowed roots (malformed, as before)."""
    source = location if transcript_location.is_url(location) else str(transcript_location.local_directory(location))
    # beside dest (one filesystem: the rename is atomic), named for this delivery alone
    staging = dest.with_name(f"{dest.name}.partial-{secrets.token_hex(8)}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        _copy_into(source, manifest, staging, scratch)
        try:
            os.rename(staging, dest)  # complete or absent
        except OSError:
            if not dest.is_dir():  # another delivery's complete copy of the same manifest is fine; else ours
                raise VerifierFailed("the copy could not be put in place") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _copy_into(source: str, manifest: str, staging: Path, scratch: Path) -> None:
    command = [sys.executable, "-m", "replay.protocol.fetch", source, str(staging), "--manifest", manifest]
    if transcript_location.is_url(source):
        for host in settings.REPLAY_FETCH_ALLOWED_HOSTS:
            command += ["--allow-host", host]
    else:  # resolved and checked inside TRANSCRIPT_ROOTS: a link swapped in since, anywhere along it, is refused
        command.append("--no-links")
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            cwd=settings.BASE_DIR,
            env=verifier_environment(scratch),
            timeout=settings.REPLAY_FETCH_SECONDS + 60,
            preexec_fn=_limit,
        )
    except subprocess.TimeoutExpired:  # the fetch's own deadline is REPLAY_FETCH_SECONDS: a slow share is theirs
        raise MaterialUnavailable(f"copying the material took longer than {settings.REPLAY_FETCH_SECONDS} s") from None
    except OSError as error:
        raise VerifierFailed(f"the copy could not start ({type(error).__name__})") from None
    try:
        said = json.loads(done.stdout[:MAX_OUTPUT])
    except ValueError:
        said = {}
    if done.returncode == EXIT_UNAVAILABLE and isinstance(said, dict):
        raise MaterialUnavailable(str(said.get("unavailable", "the material could not be copied"))[:500])
    if done.returncode == EXIT_BEYOND_CAPS and isinstance(said, dict):  # ours: for a worker with larger caps
        why = str(said.get("beyond_caps", "over the copy's caps"))[:400]
        raise VerifierFailed(f"the material is beyond this worker's copy caps: {why}", larger_worker=True)
    if done.returncode == 2 and isinstance(said, dict) and said.get("verdict") in ("malformed", "rejected"):
        reasons = [str(r)[:500] for r in said.get("reasons") or []][:1] or ["the material is refused"]
        raise MaterialRefused({"verdict": said["verdict"], "reasons": reasons, "mismatch_step": None})
    if done.returncode != 0:
        raise VerifierFailed(f"copying the material failed (exit {done.returncode})")


def snapshot_log_check(text: str, public_key: bytes, serial: str) -> tuple[list[dict], list[dict]]:
    """(problems, authentic records) of a chip's firmware log: lines flagged malformed or forged are not records."""
    lines = [line for line in log_lines(text) if line.strip()]
    problems = verify_log(lines, public_key, serial=serial)
    flagged = {p["line"] for p in problems if p["kind"] in ("malformed", "forged")}
    records = [parse_record(line) for n, line in enumerate(lines) if n not in flagged]
    return problems, records


def log_serials(text: str) -> set[str]:
    """The chip serials a firmware log's well-formed lines name (an inspector may upload another chip's log)."""
    serials = set()
    for line in log_lines(text):
        try:
            serials.add(parse_record(line)["serial"])
        except ValueError:
            continue
    return serials


def new_nonce() -> str:
    """The claim's one nonce: drawn once its material is copied, kept with the claim, reused on every retry."""
    return secrets.token_hex(16)


def claim_check(material: Path, request: dict, rule_flops: float, scratch: Path, nonce: str) -> Report:
    """The verifier's verdict on one claim from the claim's own copy of the material (``request``: the
    contract's claims file), with the claim's nonce; raises ``VerifierFailed``."""
    claims_file = scratch / "claims.json"
    claims_file.write_text(json.dumps(request))
    command = verifier_command(str(material), claims_file, rule_flops, nonce)
    return _run(command, scratch, nonce)


def verifier_command(source: str, claims_file: Path, rule_flops: float, nonce: str) -> list[str]:
    command = [
        *settings.REPLAY_VERIFIER_COMMAND,
        source,
        "--claims",
        str(claims_file),
        "--json",
        "--nonce",
        nonce,
        "--max-seconds",
        str(settings.REPLAY_MAX_SECONDS),
        "--max-flops",
        repr(rule_flops),
    ]
    if transcript_location.is_url(source):
        for host in settings.REPLAY_FETCH_ALLOWED_HOSTS:
            command += ["--allow-host", host]
    return command


def verifier_environment(scratch: Path) -> dict[str, str]:
    """The worker's environment, plus: TMPDIR in the claim's scratch directory (a fetched transcript lands
    there and is removed even if the verifier is killed), the fetch caps, which ``replay.protocol.fetch``
    applies whatever the command line says, and the verifier's threads (REPLAY_VERIFIER_THREADS)."""
    return {
        **os.environ,
        # (no more than the cores: torch caps a spawn's count there, and a forked one is set as a spawn's is)
        "OMP_NUM_THREADS": str(min(settings.REPLAY_VERIFIER_THREADS, settings.CORES)),
        "TMPDIR": str(scratch),
        "REPLAY_FETCH_MAX_BYTES": str(settings.REPLAY_FETCH_MAX_BYTES),
        "REPLAY_FETCH_MAX_FILES": str(settings.REPLAY_FETCH_MAX_FILES),
        "REPLAY_FETCH_SECONDS": str(settings.REPLAY_FETCH_SECONDS),
    }


def time_limit() -> int:
    """Wall-clock seconds the verifier subprocess gets: its fetch, its replay budget, and start-up."""
    return settings.REPLAY_MAX_SECONDS + settings.REPLAY_FETCH_SECONDS + 60


def _run(command: list[str], scratch: Path, nonce: str) -> Report:
    env = verifier_environment(scratch)
    ran = _run_forked(command, scratch, env) if _forkable(command) else None
    returncode, stdout, stderr = ran or _run_spawned(command, scratch, env)
    if stderr:
        log.info("verifier stderr (exit %s): %s", returncode, stderr[-MAX_STDERR_LOGGED:].decode(errors="replace"))
    return verdict_of(returncode, stdout[:MAX_OUTPUT], nonce)


def _run_spawned(command: list[str], scratch: Path, env: dict) -> tuple[int, bytes, bytes]:
    try:
        done = subprocess.run(
            command, capture_output=True, cwd=settings.BASE_DIR, env=env, timeout=time_limit(), preexec_fn=_limit
        )
    except subprocess.TimeoutExpired:
        raise VerifierFailed(f"the verifier ran longer than {time_limit()} s") from None
    except OSError as error:
        raise VerifierFailed(f"the verifier could not start ({type(error).__name__})") from None
    return done.returncode, done.stdout, done.stderr


# --- the fork server: the default verifier without its start-up ---------------------------------------------

FORKED_COMMAND = [sys.executable, "-m", "replay", "verify"]  # the default REPLAY_VERIFIER_COMMAND
# "environ": the worker's environment when the fork server started; "failed": why forking stopped in this process
_fork_server: dict = {}
# multiprocessing polls every child of the process in any thread's start() (and reads a forked child's status off
# one socket): the worker's threads start and poll their verifiers one at a time (waiting on them is not polling)
_fork_lock = threading.Lock()


def _forkable(command: list[str]) -> bool:
    """Whether the verifier may be forked from the fork server: the default command, the setting on, forking not
    failed in this process, and the worker's environment as it was when the server started (torch and OpenMP read
    some of it at import: a changed one gets a fresh process, as before)."""
    if not settings.REPLAY_VERIFIER_FORKSERVER or command[: len(FORKED_COMMAND)] != FORKED_COMMAND:
        return False
    if "failed" in _fork_server:
        return False
    return _fork_server.setdefault("environ", _import_environment()) == _import_environment()


def _import_environment() -> dict:
    """The worker's environment, all of it but pytest's marker of the running test (no import reads it)."""
    return {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}


def _run_forked(command: list[str], scratch: Path, env: dict) -> tuple[int, bytes, bytes] | None:
    """The verifier forked from the fork server (multiprocessing's, which preloads the verifier): its exit status
    (negative: killed by that signal), stdout and stderr, as ``subprocess.run`` gives them; None when the server
    could not start one or the child never reached the verifier (the caller spawns it instead, and so does every
    later claim of this process)."""
    out, err = scratch / "verifier.stdout", scratch / "verifier.stderr"
    argv = command[len(FORKED_COMMAND) - 1 :]  # "verify" and its arguments
    limit = time_limit()
    request = (argv, env, str(settings.BASE_DIR), str(out), str(err), settings.REPLAY_MAX_MEMORY_BYTES, limit)
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["replay.__main__", __name__])
    process = context.Process(target=forked_verifier, args=request, name="replay-verify", daemon=True)
    try:
        with _fork_lock:
            process.start()
    except Exception as error:  # a server that cannot start or died: spawning still works
        return _fork_failed(f"the fork server could not start the verifier ({type(error).__name__})")
    returncode = _wait(process, limit)
    if not out.exists():  # died before it could say anything (in multiprocessing's start-up): not the verifier
        return _fork_failed(f"the forked verifier ended before it started (exit {returncode})")
    return returncode, _head(out, MAX_OUTPUT), _tail(err, MAX_STDERR_LOGGED)


def _wait(process, limit: float) -> int:
    deadline = time.monotonic() + limit
    while True:
        multiprocessing.connection.wait([process.sentinel], max(0.0, deadline - time.monotonic()))
        with _fork_lock:
            if process.exitcode is not None:
                return process.exitcode
            if time.monotonic() >= deadline:
                process.kill()
                process.join()
                raise VerifierFailed(f"the verifier ran longer than {time_limit()} s")


def _fork_failed(why: str) -> None:
    _fork_server["failed"] = why
    log.warning("%s: this worker spawns its verifiers from now on", why)
    return None


def forked_verifier(argv: list[str], env: dict, cwd: str, out: str, err: str, memory: int, seconds: float) -> None:
    """In the forked child: what ``preexec_fn`` and ``exec`` give a spawned verifier (output, limits, working
    directory, environment), then ``python -m replay verify``'s own entry point. It dies with the fork server and
    at its deadline by itself (the worker, which is not its parent, kills it too)."""
    for fd, path in ((1, out), (2, err)):
        opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    _die_with_parent()
    signal.alarm(max(1, math.ceil(seconds)) + 5)
    _cap(memory)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None  # TMPDIR is the claim's scratch: read again, not the server's
    import torch  # preloaded by the server, which read the thread count at its own start: set it as a spawn's is

    torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    from replay.__main__ import main  # preloaded by the server: no import here

    sys.exit(main(argv))


def _die_with_parent() -> None:
    """SIGKILL when the fork server ends (Linux's PR_SET_PDEATHSIG): a verifier whose server died has no one left to
    report its status or to kill it at its deadline."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the alarm still ends it
        pass


PR_SET_PDEATHSIG = 1


def _head(path: Path, size: int) -> bytes:
    try:
        with path.open("rb") as f:
            return f.read(size)
    except FileNotFoundError:  # the child died before it opened its output (a signal): it said nothing
        return b""


def _tail(path: Path, size: int) -> bytes:
    try:
        with path.open("rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - size))
            return f.read(size)
    except FileNotFoundError:
        return b""


# The worker's own caps on a replay and on the copy of a prover's material: each must be positive
POSITIVE_SETTINGS = ("REPLAY_MAX_SECONDS", "REPLAY_FETCH_MAX_BYTES", "REPLAY_FETCH_MAX_FILES", "REPLAY_FETCH_SECONDS")


def replay_settings_problem() -> str | None:
    """Why the verifier this worker starts could not replay on this host (REPLAY_DEVICE names a device it cannot
    run, a replay budget in the environment is not a positive number, REPLAY_VERIFIER_THREADS or one of
    POSITIVE_SETTINGS below 1), or None.
    The default (cpu, budgets unset) imports nothing: torch stays out of the worker."""
    if settings.REPLAY_VERIFIER_THREADS < 1:
        return f"REPLAY_VERIFIER_THREADS={settings.REPLAY_VERIFIER_THREADS} is not a positive number of threads"
    for name in POSITIVE_SETTINGS:  # a cap of 0 had called every honest transcript too large: malformed, final
        if getattr(settings, name) < 1:
            return f"{name}={getattr(settings, name)} is not a positive number"
    budgets_set = any(os.environ.get(n) for n in ("REPLAY_MEMORY_BUDGET_BYTES", "REPLAY_FLOP_BUDGET"))
    if settings.REPLAY_DEVICE == "cpu" and not budgets_set:
        return None
    from replay.protocol import limits

    try:  # neither opens a CUDA context here: the verifiers this worker starts are the ones to use the card
        limits.resolve_device(settings.REPLAY_DEVICE)
        limits.check_budget_settings()
    except ValueError as e:
        return str(e)
    return None


def verdict_of(returncode: int, stdout: bytes, nonce: str) -> Report:
    """The verdict a finished verifier reported, or ``VerifierFailed`` when it reported none that holds."""
    if returncode < 0:
        raise VerifierFailed(f"the verifier was killed by signal {-returncode} (e.g. out of memory)")
    if returncode == 3:
        raise VerifierFailed(*_failure(stdout, nonce))
    if returncode not in EXITS:
        raise VerifierFailed(f"the verifier exited with status {returncode}")
    try:
        verdict = json.loads(stdout)
    except (ValueError, RecursionError):  # (nested past the parser: no verdict either)
        raise VerifierFailed("the verifier's output is not JSON") from None
    if not isinstance(verdict, dict) or verdict.get("verdict") != EXITS[returncode]:
        raise VerifierFailed(f"the verifier's output does not state the verdict of its exit status {returncode}")
    if not isinstance(verdict.get("reasons", []), list) or verdict.get("nonce", nonce) != nonce:
        raise VerifierFailed("the verifier's output is not a well-formed verdict for this request")
    return Report.from_json(verdict)


def _failure(stdout: bytes, nonce: str) -> tuple[str, bool]:
    """Exit 3's (message, whether a larger worker could verify): the verifier's own reason where its output states
    one for this request (a device, or a step beyond this worker's budgets: `beyond_budget`), else the bare status."""
    try:
        verdict = json.loads(stdout)
    except (ValueError, RecursionError):
        verdict = None
    ours = isinstance(verdict, dict) and verdict.get("verdict") == "error" and verdict.get("nonce") == nonce
    reasons = verdict.get("reasons") if ours else None
    if not (isinstance(reasons, list) and reasons and isinstance(reasons[0], str)):
        return "the verifier failed (exit 3)", False
    reason = "".join(ch for ch in reasons[0][:400] if ch.isprintable())
    return f"the verifier failed (exit 3): {reason}", verdict.get("beyond_budget") is True


def _limit() -> None:
    """In the child before exec: an address-space cap (a hostile transcript meets it, not the worker) and no core."""
    _cap(settings.REPLAY_MAX_MEMORY_BYTES)


def _cap(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def run_coverage_share(draws: list[tuple[int, int]], never_replayed: int) -> float:
    """A run's coverage from its verifications' (pool, drawn) pairs and its count of segments never replayed
    (replay.protocol.coverage: 1 - the product of (pool - drawn) / pool)."""
    return coverage.coverage(coverage.missed(draws), never_replayed)
