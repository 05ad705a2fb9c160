"""Helpers for tests that start real subprocesses (workers, concurrent writers)."""

from __future__ import annotations

import os
import time

import pytest
from django.db import connection


def subprocess_database_url() -> str:
    """DATABASE_URL of the test database, for worker and writer subprocesses."""
    settings = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{settings['NAME']}"
    user = settings.get("USER") or "postgres"
    host = settings.get("HOST") or "127.0.0.1"
    port = settings.get("PORT") or 5432
    return f"postgres://{user}@{host}:{port}/{settings['NAME']}"


requires_postgres = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="PostgreSQL leg only (set DATABASE_URL)"
)


def append_writer(worker: int, count: int) -> None:
    """Runs in a fresh (spawned) process: its own Django, its own connection.

    The parent puts DATABASE_URL in the environment before spawning, because a
    spawned child may load settings while it unpickles its target.
    """
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from ledger import services

    for n in range(count):
        services.append_entry("test.concurrent", {"worker": worker, "n": n}, f"writer-{worker}")


def wait_for(condition, timeout: float = 90, what: str = "condition"):
    """Poll ``condition`` until it is truthy and return its value; fail after ``timeout`` seconds.

    For tests that wait on another process (a worker, gunicorn, a database backend): the wait is on a
    condition with a deadline, never a fixed sleep, and the poll interval only keeps it off the CPU.
    """
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return result
