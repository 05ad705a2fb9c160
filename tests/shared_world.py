"""Worlds seeded once per module and shared by its tests, each test rolled back to the seeded world.

Seeding a demo or inspections world costs 0.5-1 s (about a thousand queries), and a third of the PostgreSQL
leg went to seeding one per test. `seeded_once_per_module(seed)` makes a fixture whose world is seeded once
for the tests of a module that use it, inside an outer transaction held open around them; each test runs
in a savepoint inside it (pytest-django's `TestCase` atomics nest), as Django's `TestCase.setUpTestData`
does for a class. The outer transaction is rolled back, leaving the database as empty as before, before
any test that does not use that world runs: a transactional test, a test without it, another module's.

A transactional test (`transaction=True`, `live_server`) cannot run inside a transaction: its fixture
seeds its own world, in the test, as before. The fixture's value is `seed()`'s (primary keys, not model
instances: a test may change an instance it holds), and the world's key folders are the module's, so keys
written while seeding are found by every test of the module.
"""

from __future__ import annotations

import pytest
from django.db import transaction
from django.test import override_settings

SEEDS: dict = {}  # fixture name -> seed function
TRANSACTIONAL_FIXTURES = {"transactional_db", "live_server"}


def seeded_once_per_module(seed):
    """A fixture, named after `seed`, whose value is what `seed()` returned for this module's world."""
    if SEEDS.setdefault(seed.__name__, seed) is not seed:
        raise ValueError(f"two shared worlds named {seed.__name__}: a test names its world by the fixture's name")

    @pytest.fixture(name=seed.__name__)
    def fixture(request, db):  # `db` first: the world is entered as the test's database is set up (conftest)
        if is_transactional(request.node):
            return seed()  # in the test's own database, flushed after it, as any transactional test's rows
        return OPEN.value_for(request.node)

    return fixture


def key_folders_in(folder) -> dict:
    """The settings that name a test's demo, chip and token key folders, all inside `folder`."""
    return {
        "DEMO_KEY_DIR": folder / "demo-keys",
        "CHIP_KEY_DIR": folder / "chip-keys",
        "DEMO_TOKEN_DIR": folder / "demo-tokens",
    }


def is_transactional(item) -> bool:
    marker = item.get_closest_marker("django_db")
    flagged = marker and (marker.kwargs.get("transaction") or marker.kwargs.get("reset_sequences"))
    return bool(flagged) or bool(TRANSACTIONAL_FIXTURES & set(item.fixturenames))


def wanted(item) -> tuple | None:
    """(module, seed name) of the shared world this test runs in, or None."""
    names = [name for name in getattr(item, "fixturenames", ()) if name in SEEDS]
    if not names or is_transactional(item):
        return None
    if len(names) > 1:
        raise pytest.UsageError(f"{item.nodeid}: one shared world a test, not {names}")
    return (item.module.__name__, names[0])


class _OpenWorld:
    """The one shared world open now, if any: its key, outer transaction, seed's value and key folders."""

    def __init__(self):
        self.key = None
        self.atomic = None
        self.value = None
        self.folders: dict = {}  # key -> its key folders (made on first use: seeding or a test's settings)

    def key_folders(self, key, tmp_path_factory) -> dict:
        if key not in self.folders:
            self.folders[key] = key_folders_in(tmp_path_factory.mktemp("shared-keys"))
        return self.folders[key]

    def enter(self, key, tmp_path_factory) -> None:
        """Seed `key`'s world in an outer transaction, unless it is the one open; close any other first."""
        if key == self.key:
            return
        self.leave()
        atomic = transaction.atomic()
        atomic.__enter__()
        self.atomic = atomic
        try:
            fast_hashing = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # as tests/conftest.py's tests
            with override_settings(PASSWORD_HASHERS=fast_hashing, **self.key_folders(key, tmp_path_factory)):
                self.value = SEEDS[key[1]]()
        except BaseException:
            self.leave()
            raise
        self.key = key

    def leave(self) -> None:
        atomic, self.atomic, self.key, self.value = self.atomic, None, None, None
        if atomic is not None:
            transaction.set_rollback(True)
            atomic.__exit__(None, None, None)

    def value_for(self, item):
        if self.key is None or self.key != wanted(item):
            raise pytest.UsageError(
                f"{item.nodeid}: a shared world needs the test marked django_db (it is seeded before the test's "
                "own transaction opens)"
            )
        return self.value


OPEN = _OpenWorld()
