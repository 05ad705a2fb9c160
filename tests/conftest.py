"""Shared fixtures. Tests run against the real database of the leg (SQLite or PostgreSQL)."""

from __future__ import annotations

import importlib
import os

import pgtrigger
import pytest
from django.db import connection
from pytest_django.plugin import blocking_manager_key

from tests import shared_world

append_only_migration = importlib.import_module("ledger.migrations.0002_sqlite_append_only")

TRANSACTIONAL_FIXTURES = shared_world.TRANSACTIONAL_FIXTURES


@pytest.fixture(autouse=True)
def _own_key_folders(request, settings, tmp_path_factory):
    """Tests keep demo and chip keys in folders of their own: a running `make run` keeps its var/ keys. The tests
    of a shared world (tests/shared_world.py) share its folders, which hold the keys its seeding wrote."""
    shared = shared_world.wanted(request.node)
    if shared:
        folders = shared_world.OPEN.key_folders(shared, tmp_path_factory)
    else:
        folders = shared_world.key_folders_in(tmp_path_factory.mktemp("keys"))
    for name, path in folders.items():
        setattr(settings, name, path)


@pytest.hookimpl(tryfirst=True)
def pytest_fixture_setup(fixturedef, request):
    """As a test's database is set up, before its own transaction opens: enter its shared world (seeded now if it
    is not the one open), or leave the one open (tests/shared_world.py)."""
    if fixturedef.argname != "_django_db_helper":
        return
    shared = shared_world.wanted(request.node)
    with request.config.stash[blocking_manager_key].unblock():
        if shared:
            shared_world.OPEN.enter(shared, request.getfixturevalue("tmp_path_factory"))
        else:
            shared_world.OPEN.leave()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """A test that does not run in the open shared world (one without a database, say) runs after it is left;
    ``@pytest.mark.postgres``: runs in the PostgreSQL leg only (as tests.helpers.requires_postgres)."""
    if shared_world.OPEN.key is not None and shared_world.wanted(item) != shared_world.OPEN.key:
        with item.config.stash[blocking_manager_key].unblock():
            shared_world.OPEN.leave()
    if item.get_closest_marker("postgres") and connection.vendor != "postgresql":
        pytest.skip("PostgreSQL leg only (set DATABASE_URL)")


@pytest.fixture(autouse=True, scope="module")
def _shared_world_left(django_db_blocker):
    """A module's shared world is left after its last test, before the next module's tests."""
    yield
    with django_db_blocker.unblock():
        shared_world.OPEN.leave()


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    """Tests hash passwords with a fast hasher (Django's advice for tests): a demo world hashes one per user, and
    PBKDF2's 10^6 rounds made seeding one cost seconds per test. Servers started by tests keep the real one."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _sqlite_append_only_triggers(request):
    """Keep SQLite's append-only triggers in place for every test.

    Django flushes the tables of a transactional test with DELETE, which the
    triggers rightly refuse, so they are lifted just for that flush and put
    back at the start of the next test. PostgreSQL flushes with TRUNCATE, which
    the statement-level no_truncate triggers refuse: they are lifted likewise.
    """
    uses_db = request.node.get_closest_marker("django_db") or {"db", *TRANSACTIONAL_FIXTURES} & set(
        request.fixturenames
    )
    if not uses_db:
        yield
        return
    lift = _sqlite_triggers if connection.vendor == "sqlite" else _postgres_truncate_triggers
    lift(install=True)
    yield
    if shared_world.is_transactional(request.node):
        lift(install=False)


NO_TRUNCATE = [f"ledger.{model}:no_truncate" for model in ("Entry", "TreeNode", "Checkpoint", "Cosignature")]


def _postgres_truncate_triggers(install: bool) -> None:
    """PostgreSQL flushes with TRUNCATE, which the no_truncate triggers rightly refuse: lifted for the flush only."""
    (pgtrigger.enable if install else pgtrigger.disable)(*NO_TRUNCATE)


def _sqlite_triggers(install: bool) -> None:
    with connection.cursor() as cursor:
        for table in append_only_migration.TABLES:
            for operation in ("UPDATE", "DELETE"):
                create, drop = append_only_migration._statements(table, operation)
                cursor.execute(create if install else drop)


DATABASE_FIXTURES = {"db", "transactional_db", "live_server", "django_db_setup", "client", "admin_client", "admin_user"}


def _uses_services(item) -> bool:
    """Whether a test may touch the leg's database or broker (a test without one cannot: pytest-django blocks it)."""
    if item.get_closest_marker("django_db") or item.get_closest_marker("postgres"):
        return True
    return bool(DATABASE_FIXTURES & set(getattr(item, "fixturenames", ())))


BROWSER_FIXTURES = {"browser", "chromium", "page"}  # Playwright's Chromium (tests/desk/test_browser.py and others)


def _left_out(item) -> bool:
    if os.environ.get("CHIPLEDGER_PURE_TESTS") == "skip" and not _uses_services(item):
        return True
    return os.environ.get("CHIPLEDGER_BROWSER_TESTS") == "skip" and bool(
        BROWSER_FIXTURES & set(getattr(item, "fixturenames", ()))
    )


def pytest_collection_modifyitems(config, items):
    """``CHIPLEDGER_PURE_TESTS=skip``: leave out the tests that touch no database or broker;
    ``CHIPLEDGER_BROWSER_TESTS=skip``: leave out the pages' browser tests.

    CI runs both once, in the SQLite leg; the PostgreSQL + Redis leg runs only what the services can change.
    """
    for name in ("CHIPLEDGER_PURE_TESTS", "CHIPLEDGER_BROWSER_TESTS"):
        if os.environ.get(name, "skip") != "skip":  # a typo would quietly run every test
            raise pytest.UsageError(f"{name}={os.environ[name]!r}: use skip, or leave it unset")
    left_out = [item for item in items if _left_out(item)]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if not _left_out(item)]
