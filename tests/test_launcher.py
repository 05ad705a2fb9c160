"""`make run`'s launcher (bin/serve: gunicorn, Celery worker and beat, the witness) stops cleanly on Ctrl-C.

The launcher runs on free ports with a var dir of its own (its own SQLite database and filesystem broker,
migrated and keyed here, nothing seeded) and an empty $HOME: a running `make run` is never touched. Ctrl-C
is a SIGINT to the launcher's whole process group, as a terminal sends it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from django.conf import settings

from tests.helpers import wait_for

ROOT = Path(settings.BASE_DIR)
STOP_SECONDS = 3.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launcher_environment(var: Path, home: Path) -> dict[str, str]:
    """The test run's environment without its database, broker and caches: the launcher makes its own in ``var``."""
    own = ("DATABASE_URL", "REDIS_URL", "MPLCONFIGDIR", "REPLAY_NATIVE_CACHE")
    env = {key: value for key, value in os.environ.items() if key not in own}
    return {**env, "CHIPLEDGER_VAR_DIR": str(var), "HOME": str(home), "PORT": str(free_port())}


def prepare(env: dict[str, str], var: Path) -> None:
    """What `make setup` does, less the demo world: a migrated database, the ledger key, the witness key."""
    for command in (
        ["manage.py", "migrate", "--noinput", "-v0"],
        ["manage.py", "ledger_open"],
        ["-m", "ledger.witness", "--print-key", "--key-file", str(var / "witness.key"), "--name", "localhost/w"],
    ):
        subprocess.run([sys.executable, *command], cwd=ROOT, env=env, check=True, capture_output=True, timeout=180)


def healthy(port: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


def processes_of(var: Path) -> list[str]:
    """Every process whose environment names this var dir (the launcher's children and theirs)."""
    marker = f"CHIPLEDGER_VAR_DIR={var}\0".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if marker in (proc / "environ").read_bytes():
                command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{proc.name}: {command[:200]}")
        except OSError:  # gone meanwhile, or not ours
            continue
    return found


def test_ctrl_c_stops_everything_in_under_3_s_without_errors_or_kills(tmp_path):
    var, home = tmp_path / "var", tmp_path / "home"
    var.mkdir()
    home.mkdir()
    env = launcher_environment(var, home)
    env["WITNESS_PORT"] = str(free_port())
    prepare(env, var)
    launcher = subprocess.Popen(
        [str(ROOT / "bin" / "serve")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # a process group of its own, as a terminal's foreground job
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(line.decode(errors="replace") for line in launcher.stdout))
    reader.start()
    try:
        wait_for(lambda: healthy(env["PORT"]), timeout=120, what="/healthz")
        wait_for(lambda: any(" ready." in line for line in lines), timeout=60, what="the Celery worker")
        wait_for(lambda: any("beat: Starting" in line for line in lines), timeout=60, what="Celery beat")
        wait_for(lambda: any("witness: listening" in line for line in lines), timeout=60, what="the witness")
        began = time.monotonic()
        os.killpg(launcher.pid, signal.SIGINT)
        launcher.wait(timeout=30)
        stopped = time.monotonic() - began
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
        reader.join(timeout=10)
    output = "".join(lines)
    assert stopped < STOP_SECONDS, f"stopped in {stopped:.1f} s:\n{output[-3000:]}"
    for bad in ("ERROR", "SIGKILL", "Killed", "Traceback"):
        assert bad not in output, f"{bad!r} in the launcher's output:\n{output[-3000:]}"
    assert processes_of(var) == []
    assert list(home.iterdir()) == []  # nothing written to $HOME (gunicorn's control socket, matplotlib's cache)
    assert list(var.glob("celerybeat-schedule*"))  # beat's schedule is under var/
