"""Every scenario, as a user runs it: `manage.py run_scenario NAME` makes its own empty database and its own
Celery worker (kombu's filesystem broker on the SQLite leg, Redis on the PostgreSQL leg) and exits 0 only
when the system reached the expected verdict."""

import os
import subprocess
import sys

import pytest
from django.conf import settings

from scenarios.cases import SCENARIOS
from tests.helpers import subprocess_database_url

NAMES = list(SCENARIOS)


def run_scenario(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DATABASE_URL": subprocess_database_url()}  # the leg's server; the scenario makes its own
    command = [sys.executable, "manage.py", "run_scenario", *args]
    return subprocess.run(command, env=env, cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=290)


@pytest.mark.django_db
@pytest.mark.parametrize("name", NAMES)
def test_the_scenario_reaches_its_verdict(name):
    done = run_scenario(name)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert done.stdout.startswith(f"PASS {name}: ")
    assert "NOT MET" not in done.stdout


@pytest.mark.django_db
def test_the_list_names_every_scenario():
    done = run_scenario("--list")
    assert done.returncode == 0
    assert [line.split()[0] for line in done.stdout.splitlines()] == list(SCENARIOS)


@pytest.mark.django_db(transaction=True)
def test_here_refuses_a_ledger_that_is_not_empty(tmp_path):
    from ledger import services

    services.ledger_open()
    env = {**os.environ, "DATABASE_URL": subprocess_database_url(), "CHIPLEDGER_VAR_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "manage.py", "run_scenario", "honest", "--here"],
        env=env,
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "is not empty" in done.stdout
