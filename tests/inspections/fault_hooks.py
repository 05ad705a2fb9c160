"""Loaded into a fault test's worker before Celery starts: the first snapshot-log check blocks until killed.

``FAULT_DIR/started`` gets the pid of the process running the check, so the test knows whom to kill -9.
"""

import os
import threading
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup()

from inspections import verification  # noqa: E402

_real = verification.snapshot_log_check


def _blocking_once(*args):
    started = Path(os.environ["FAULT_DIR"]) / "started"
    if not started.exists():
        started.write_text(str(os.getpid()))
        threading.Event().wait()  # the test kills this process here
    return _real(*args)


verification.snapshot_log_check = _blocking_once
