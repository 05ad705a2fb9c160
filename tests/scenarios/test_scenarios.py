"""Every scenario, as a user runs it: `manage.py run_scenario NAME` makes its own empty database and its own
Celery worker (kombu's filesystem broker on the SQLite leg, Redis on the PostgreSQL leg) and exits 0 only
when the system reached the expected verdict."""

import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg
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
    # a run killed before this one (a timeout) is swept first, and said so: not this scenario's report
    report = "".join(line for line in done.stdout.splitlines(keepends=True) if not line.startswith("swept "))
    assert report.startswith(f"PASS {name}: ")
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


def _folders_of(pid: int) -> list:
    import tempfile
    from pathlib import Path

    found = []
    for folder in Path(tempfile.gettempdir()).glob("scenario-*"):
        try:
            if (folder / "owner.pid").read_text().strip() == str(pid):
                found.append(folder)
        except OSError:
            continue
    return found


@pytest.mark.django_db
def test_a_run_ended_by_sigterm_leaves_no_folder_and_no_process():
    import signal

    from tests.helpers import wait_for

    env = {**os.environ, "DATABASE_URL": subprocess_database_url()}
    parent = subprocess.Popen(
        [sys.executable, "manage.py", "run_scenario", "honest"],
        env=env,
        cwd=settings.BASE_DIR,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    folder = wait_for(lambda: _folders_of(parent.pid), what="the run's folder")[0]
    wait_for(lambda: (folder / "var").exists() or parent.poll() is not None, what="the child to start")
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(timeout=60) != 0
    assert not folder.exists()
    leftovers = subprocess.run(["pgrep", "-f", str(folder)], capture_output=True, text=True).stdout.split()
    assert leftovers == []  # neither the child nor its worker outlives the run


@pytest.mark.django_db
def test_the_leftovers_of_a_killed_run_are_swept_by_the_next():
    import io
    import tempfile
    from pathlib import Path

    from scenarios.runner import _sweep_leftovers

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that no longer runs: the killed parent
    dead = Path(tempfile.mkdtemp(prefix="scenario-killed-"))
    (dead / "owner.pid").write_text(str(gone.pid))
    alive = Path(tempfile.mkdtemp(prefix="scenario-running-"))
    (alive / "owner.pid").write_text(str(os.getpid()))
    try:
        out = io.StringIO()
        _sweep_leftovers(out)
        assert not dead.exists() and alive.exists() and f"swept {dead}" in out.getvalue()
    finally:
        import shutil

        shutil.rmtree(alive, ignore_errors=True)
        shutil.rmtree(dead, ignore_errors=True)


def _in(database: str, code: str, env: dict) -> subprocess.CompletedProcess:
    command = [sys.executable, "manage.py", "shell", "-v", "0", "-c", code]
    return subprocess.run(
        command, env={**env, "DATABASE_URL": database}, cwd=settings.BASE_DIR, capture_output=True, text=True
    )


@pytest.mark.django_db(transaction=True)  # CREATE DATABASE on PostgreSQL runs outside a transaction
def test_a_runs_database_is_migrated_and_empty_before_its_child_starts(tmp_path):
    from scenarios import runner

    env = {**os.environ, "CHIPLEDGER_VAR_DIR": str(tmp_path / "var")}
    database, drop = runner._fresh_database(tmp_path)
    try:
        done = subprocess.run(
            [sys.executable, "manage.py", "migrate", "--check"],
            env={**env, "DATABASE_URL": database},
            cwd=settings.BASE_DIR,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stdout + done.stderr  # nothing left to apply: a copy of the template
        sizes = _in(database, "from ledger import selectors; print(selectors.ledger_size())", env)
        assert sizes.stdout.split() == ["0"], sizes.stderr
    finally:
        drop()


@pytest.mark.django_db(transaction=True)
def test_a_template_that_cannot_be_made_is_never_used_half_made(tmp_path, monkeypatch):
    from scenarios import runner

    digest = f"t{os.getpid()}x{runner.secrets.token_hex(4)}"
    monkeypatch.setattr(runner, "migrations_digest", lambda: digest)
    monkeypatch.setattr(runner.tempfile, "tempdir", str(tmp_path))

    def half_way(database: str, folder) -> bool:  # a migrate that wrote part of a database, then failed
        if database.startswith("sqlite:///"):
            Path(database.removeprefix("sqlite:///")).write_bytes(b"SQLite format 3\x00" + bytes(100))
        return False

    monkeypatch.setattr(runner, "_migrate", half_way)
    if runner.connection.vendor == "postgresql":
        assert runner._postgres_template(tmp_path) is None
        with runner.connection.cursor() as cursor:
            cursor.execute("SELECT datname FROM pg_database WHERE datname LIKE 'scenario\\_%%'")
            names = [row[0] for row in cursor.fetchall()]
        assert [n for n in names if digest in n or n.startswith(f"scenario_{os.getpid()}_")] == []  # no build left
    else:
        assert runner._sqlite_template(tmp_path) is None
        assert list(runner._template_folder().iterdir()) == []  # no template, whole or in part
    database, drop = runner._fresh_database(tmp_path)  # the run goes on: its child migrates from nothing
    drop()
    assert database


def test_a_template_folder_others_may_write_to_is_not_used(tmp_path, monkeypatch):
    from scenarios import runner

    monkeypatch.setattr(runner.tempfile, "tempdir", str(tmp_path))
    assert runner._template_folder() is not None
    runner._template_folder().chmod(0o777)  # another user could plant a template there
    assert runner._template_folder() is None
    assert runner._sqlite_template(tmp_path) is None


def test_the_templates_name_follows_the_migrations_and_djangos_version(monkeypatch):
    from scenarios import runner

    now = runner.migrations_digest()
    assert runner.migrations_digest() == now
    monkeypatch.setattr(runner.django, "get_version", lambda: "0.0")
    assert runner.migrations_digest() != now


def test_a_template_that_is_not_a_database_is_made_anew_and_the_run_still_gets_a_migrated_one(tmp_path, monkeypatch):
    import sqlite3
    from contextlib import closing

    from scenarios import runner

    if runner.connection.vendor == "postgresql":
        pytest.skip("the SQLite template file (the PostgreSQL one is a database only this server's owner writes)")
    monkeypatch.setattr(runner.tempfile, "tempdir", str(tmp_path))
    template = runner._template_folder() / f"{runner.migrations_digest()}.sqlite3"
    template.write_bytes(b"garbage\x00 not SQLite\n")  # overwritten, or cut short by a full disk
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    runner._fresh_database(first)
    assert not template.exists()  # dropped: not copied again and again
    database, _ = runner._fresh_database(second)
    assert template.exists()
    with closing(sqlite3.connect(database.removeprefix("sqlite:///"))) as copy:
        assert copy.execute("SELECT count(*) FROM django_migrations").fetchone()[0] > 0


WEEK = 7 * 86_400


def test_sqlite_templates_of_other_migrations_unused_for_a_week_are_removed(tmp_path, monkeypatch):
    """One template is left per migration change, and nothing else removes them: a run sweeps the others no run
    has used for a week, and notes its own use (mtime), so that another checkout's sweep leaves it."""
    from scenarios import runner

    monkeypatch.setattr(runner.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(runner, "migrations_digest", lambda: "current")
    folder = runner._template_folder()
    long_ago = time.time() - WEEK - 60
    for name in ("current", "stale", "recent"):
        (folder / f"{name}.sqlite3").write_bytes(b"SQLite format 3\x00")
    for name in ("current", "stale"):
        os.utime(folder / f"{name}.sqlite3", (long_ago, long_ago))
    (folder / "not-a-template").write_bytes(b"")
    os.utime(folder / "not-a-template", (long_ago, long_ago))
    assert runner._sqlite_template(tmp_path) == folder / "current.sqlite3"
    assert sorted(p.name for p in folder.iterdir()) == ["current.sqlite3", "not-a-template", "recent.sqlite3"]
    assert (folder / "current.sqlite3").stat().st_mtime > time.time() - 60  # its use noted


@pytest.mark.django_db(transaction=True)
def test_postgres_templates_of_other_migrations_unused_for_a_week_are_dropped(tmp_path, monkeypatch):
    from scenarios import runner

    if runner.connection.vendor != "postgresql":
        pytest.skip("the template databases of a PostgreSQL server")
    tag = runner.secrets.token_hex(8)  # a template's name: 20 hex digits
    kinds = ("current", "stale", "unnoted", "recent", "busy", "odd", "not-ours")
    names = {k: f"scenario_template_{tag}{i:04x}" for i, k in enumerate(kinds)}
    names["not-ours"] = f"scenario_template_{tag}-mine"  # not a name the runner makes: never dropped
    long_ago = int(time.time()) - WEEK - 60
    with runner.connection.cursor() as cursor:
        for name in names.values():
            cursor.execute(f'CREATE DATABASE "{name}"')
        for key, when in (("current", long_ago), ("stale", long_ago), ("recent", int(time.time()))):
            cursor.execute(f"COMMENT ON DATABASE \"{names[key]}\" IS 'used {when}'")
        cursor.execute(f"COMMENT ON DATABASE \"{names['odd']}\" IS 'used \u00b2'")  # a digit to isdigit(), not to int()
    busy = psycopg.connect(runner._postgres_url(names["busy"]))  # being copied at that instant: DROP refuses it
    try:
        monkeypatch.setattr(runner, "migrations_digest", lambda: f"{tag}0000")
        assert runner._postgres_template(tmp_path) == names["current"]
        with runner.connection.cursor() as cursor:
            cursor.execute(
                "SELECT datname, shobj_description(oid, 'pg_database') FROM pg_database WHERE datname LIKE %s",
                [f"scenario_template_{tag}%"],
            )
            left = dict(cursor.fetchall())
        assert sorted(left) == sorted(names[k] for k in ("current", "recent", "busy", "not-ours"))
        assert int(left[names["current"]].removeprefix("used ")) > time.time() - 60  # its use noted
    finally:
        busy.close()
        with runner.connection.cursor() as cursor:
            for name in names.values():
                cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_a_template_removed_before_its_copy_leaves_no_empty_file_behind(tmp_path, monkeypatch):
    """Another checkout's sweep removed it between the check and the copy: opened read-only, it is an error (the
    child migrates from nothing), never a new empty database that later runs would copy as the template."""
    from scenarios import runner

    if runner.connection.vendor == "postgresql":
        pytest.skip("the SQLite template file")
    gone = tmp_path / "templates" / "gone.sqlite3"
    gone.parent.mkdir()
    monkeypatch.setattr(runner, "_sqlite_template", lambda folder: gone)
    database, _ = runner._fresh_database(tmp_path)
    assert not gone.exists() and database == f"sqlite:///{tmp_path / 'scenario.sqlite3'}"
