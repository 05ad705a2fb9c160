"""An independent C2SP client (``aics-tlog`` from PyPI, not our code) run as a subprocess.

aics-tlog needs Python >= 3.12 and this project runs on 3.11, so it lives in its own venv,
``var/aics-venv``, built once from the first Python >= 3.12 found (``AICS_PYTHON``, ``python3.1x`` on
PATH, pyenv) and reused; ``make aics-venv`` builds it ahead (CI). Tests skip, saying so, only when no
Python >= 3.12 exists on the machine.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("AICS_VENV", REPO / "var" / "aics-venv"))
PACKAGES = ["aics-tlog==0.2.1", "aics-witness==0.1.0"]
SCRIPT = Path(__file__).with_name("aics_check.py")


def _version_ok(python: str) -> bool:
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print(sys.version_info >= (3, 12))"], capture_output=True, text=True, timeout=30
        )
    except OSError:
        return False
    return out.stdout.strip() == "True"


def find_python() -> str | None:
    candidates = [os.environ.get("AICS_PYTHON")]
    candidates += [shutil.which(f"python3.{minor}") for minor in range(12, 16)]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[2-9]*/bin/python3")))
    candidates += sorted(glob.glob("/root/.pyenv/versions/3.1[2-9]*/bin/python3"))
    return next((c for c in candidates if c and _version_ok(c)), None)


def venv_python() -> str:
    """The venv's interpreter, building the venv first if needed (a marker names the packages installed)."""
    python = VENV / "bin" / "python"
    marker = VENV / "installed.txt"
    if python.exists() and marker.exists() and marker.read_text().split() == PACKAGES:
        return str(python)
    base = find_python()
    if base is None:
        pytest.skip("the independent client aics-tlog needs Python >= 3.12, and none is installed (set AICS_PYTHON)")
    subprocess.run([base, "-m", "venv", "--clear", str(VENV)], check=True, timeout=300)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *PACKAGES], check=True, timeout=600)
    marker.write_text("\n".join(PACKAGES) + "\n")
    return str(python)


def run(*args: str) -> tuple[int, dict]:
    """Run ``aics_check.py`` with ``args`` in the venv; (exit status, its JSON report)."""
    result = subprocess.run(
        [venv_python(), str(SCRIPT), *args], capture_output=True, text=True, timeout=600, env={"PATH": "/usr/bin:/bin"}
    )
    try:
        report = json.loads(result.stdout or "{}")
    except ValueError:
        report = {"stdout": result.stdout}
    report["stderr"] = result.stderr[-2000:]
    return result.returncode, report
