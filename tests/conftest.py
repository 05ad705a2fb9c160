"""Shared fixtures. Tests run against the real database of the leg (SQLite or PostgreSQL)."""

from __future__ import annotations

import importlib

import pytest
from django.db import connection

append_only_migration = importlib.import_module("ledger.migrations.0002_sqlite_append_only")

TRANSACTIONAL_FIXTURES = {"transactional_db", "live_server"}


@pytest.fixture(autouse=True)
def _own_key_folders(settings, tmp_path_factory):
    """Tests keep demo and chip keys in folders of their own: a running `make run` keeps its var/ keys."""
    folder = tmp_path_factory.mktemp("keys")
    settings.DEMO_KEY_DIR = folder / "demo-keys"
    settings.CHIP_KEY_DIR = folder / "chip-keys"


def _test_is_transactional(request) -> bool:
    marker = request.node.get_closest_marker("django_db")
    return bool(marker and marker.kwargs.get("transaction")) or bool(TRANSACTIONAL_FIXTURES & set(request.fixturenames))


@pytest.fixture(autouse=True)
def _sqlite_append_only_triggers(request):
    """Keep SQLite's append-only triggers in place for every test.

    Django flushes the tables of a transactional test with DELETE, which the
    triggers rightly refuse, so they are lifted just for that flush and put
    back at the start of the next test. PostgreSQL flushes with TRUNCATE,
    which row triggers do not see.
    """
    uses_db = request.node.get_closest_marker("django_db") or {"db", *TRANSACTIONAL_FIXTURES} & set(
        request.fixturenames
    )
    if not uses_db or connection.vendor != "sqlite":
        yield
        return
    _sqlite_triggers(install=True)
    yield
    if _test_is_transactional(request):
        _sqlite_triggers(install=False)


def _sqlite_triggers(install: bool) -> None:
    with connection.cursor() as cursor:
        for table in append_only_migration.TABLES:
            for operation in ("UPDATE", "DELETE"):
                create, drop = append_only_migration._statements(table, operation)
                cursor.execute(create if install else drop)
