"""Run a scenario from an empty database, with a real Celery worker, and say what happened.

``manage.py run_scenario NAME`` never touches the configured database or var/: it makes a
throwaway world and runs the scenario in a child process pointed at it —

* a fresh database: a SQLite file in a temporary folder, or, when DATABASE_URL is PostgreSQL, a new
  database ``scenario_<random>`` on the same server, dropped afterwards;
* a fresh VAR_DIR in that folder (ledger key, chip keys, transcripts, the filesystem broker);
* a Celery worker of its own on a queue of its own (Redis when REDIS_URL is set, else kombu's
  filesystem broker in the fresh VAR_DIR).

The fresh database is a copy of an empty, migrated template kept for the project's migrations as they are
(migrating from nothing cost 3-4 s of a 12 s run): a SQLite file in a private folder of the temporary
directory, or a database ``scenario_template_<digest>`` on the PostgreSQL server, made by ``manage.py migrate``
the first time. The child (``run_scenario NAME --here``) migrates (nothing to apply on a copy of the
template; what the post-migrate hooks keep, roles and permissions, is synced again), refuses a ledger that is
not empty, starts the worker, runs the scenario and prints the summary. Exit status: 0 when the system reached the
expected verdict, 1 when it did not, 2 on a usage error.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import closing, suppress
from pathlib import Path

import django
from django.conf import settings
from django.core.management import call_command
from django.db import DatabaseError, connection
from django.db.migrations.loader import MigrationLoader

from ledger import selectors

from .actors import World
from .cases import SCENARIOS, Outcome

CHILD_SECONDS = 300  # a stuck scenario ends; the budget is two minutes


FOLDER_PREFIX = "scenario-"
OWNER_FILE = "owner.pid"  # the parent's pid: a folder (and database) whose owner is gone is swept


def run_fresh(name: str, *, keep: bool = False, stdout=sys.stdout) -> int:
    """Parent: make the throwaway database and folder, run the scenario in a child pointed at them.

    A SIGTERM (or Ctrl-C) ends the child and its worker and still drops the database and the folder; after a
    kill -9 of the parent, the next run sweeps what it left (``_sweep_leftovers``).
    """
    _sweep_leftovers(stdout)
    folder = Path(tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{name}-"))
    (folder / OWNER_FILE).write_text(str(os.getpid()))
    env = {
        **os.environ,
        "CHIPLEDGER_VAR_DIR": str(folder / "var"),
        "CELERY_DEFAULT_QUEUE": f"scenario-{secrets.token_hex(6)}",
        "DEMO_KEY_DIR": str(folder / "var" / "demo-keys"),
        "CHIP_KEY_DIR": str(folder / "var" / "chip-keys"),
        "TRANSCRIPT_ROOTS": str(folder / "var" / "transcripts"),
        "LEDGER_SIGNING_KEY": "",
        "LEDGER_KEY_FILE": str(folder / "var" / "ledger-signing.key"),
    }
    command = [sys.executable, str(settings.BASE_DIR / "manage.py"), "run_scenario", name, "--here"]
    previous = _exit_on_sigterm()  # before the database is made: a template build may take seconds
    child, database, drop = None, None, lambda: None
    try:
        database, drop = _fresh_database(folder)
        env["DATABASE_URL"] = database
        # Its own session: the child and the worker it starts end together (killpg) however the parent ends.
        child = subprocess.Popen(command, env=env, cwd=settings.BASE_DIR, start_new_session=True)
        return child.wait(timeout=CHILD_SECONDS)
    except subprocess.TimeoutExpired:
        stdout.write(f"FAIL {name}: did not finish within {CHILD_SECONDS} s\n")
        return 1
    finally:
        if child is not None:
            _end_group(child)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        drop()
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            stdout.write(f"kept {folder} ({database})\n")


def _exit_on_sigterm():
    """SIGTERM raises SystemExit, so the ``finally`` above cleans up; the previous handler, or None off the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, stop)


def _end_group(child: subprocess.Popen) -> None:
    if child.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            return
        try:
            child.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() else None


def _sweep_leftovers(stdout) -> None:
    """Drop the folders and databases of runs whose parent was killed (its pid is gone)."""
    for folder in Path(tempfile.gettempdir()).glob(f"{FOLDER_PREFIX}*"):
        try:
            owner = _owner((folder / OWNER_FILE).read_text().strip())
        except OSError:
            continue  # not ours (no owner file), or not readable
        if owner is not None and not _alive(owner):
            shutil.rmtree(folder, ignore_errors=True)
            stdout.write(f"swept {folder} (its run was killed)\n")
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT datname FROM pg_database WHERE datname LIKE 'scenario\\_%'")
        names = [row[0] for row in cursor.fetchall()]
    for name in names:
        parts = name.split("_")
        owner = _owner(parts[1]) if len(parts) == 3 else None
        if owner is not None and not _alive(owner):
            with connection.cursor() as cursor:
                cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            stdout.write(f"swept database {name} (its run was killed)\n")


def _fresh_database(folder: Path):
    """(DATABASE_URL of a new, empty, migrated database, a function that drops it): a copy of the template, or,
    where no template could be made or copied, an empty database the child migrates from nothing."""
    if connection.vendor != "postgresql":
        database = folder / "scenario.sqlite3"
        template = _sqlite_template(folder)
        if template is not None:
            try:
                # read-only: a template another checkout's sweep removed meanwhile is an error, not a new empty file
                source_uri = f"{template.as_uri()}?mode=ro"
                with (
                    closing(sqlite3.connect(source_uri, uri=True)) as source,
                    closing(sqlite3.connect(database)) as copy,
                ):
                    source.backup(copy)  # a consistent copy, page by page
            except (sqlite3.Error, OSError):  # not a database (cut short, overwritten): the next run makes it anew
                database.unlink(missing_ok=True)
                template.unlink(missing_ok=True)
        return f"sqlite:///{database}", lambda: None
    name = f"scenario_{os.getpid()}_{secrets.token_hex(6)}"
    _create_postgres_database(name, _postgres_template(folder))

    def drop() -> None:
        with connection.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return _postgres_url(name), drop


def _postgres_url(name: str) -> str:
    params = connection.settings_dict
    user, host, port = params.get("USER") or "postgres", params.get("HOST") or "127.0.0.1", params.get("PORT") or 5432
    password = f":{params['PASSWORD']}" if params.get("PASSWORD") else ""
    return f"postgres://{user}{password}@{host}:{port}/{name}"


def _create_postgres_database(name: str, template: str | None) -> None:
    with connection.cursor() as cursor:  # CREATE DATABASE runs outside a transaction: autocommit here
        if template is not None:
            try:
                cursor.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
                return
            except DatabaseError:  # the template in use by another session at that instant: migrate from nothing
                pass
        cursor.execute(f'CREATE DATABASE "{name}"')


def migrations_digest() -> str:
    """What an empty migrated database is made of: Django's version, the pinned requirements (django-pgtrigger
    turns migrations into SQL) and every installed app's migration files."""
    digest = hashlib.sha256(django.get_version().encode())
    requirements = settings.BASE_DIR / "requirements.txt"
    digest.update(requirements.read_bytes() if requirements.exists() else b"")
    loader = MigrationLoader(None, ignore_no_migrations=True)  # the files on disk; no database read
    for key in sorted(loader.disk_migrations):
        path = Path(sys.modules[loader.disk_migrations[key].__module__].__file__)
        digest.update(repr(key).encode() + path.read_bytes())
    return digest.hexdigest()[:20]


def _migrate(database: str, folder: Path) -> bool:
    """`manage.py migrate` into `database`, with a var folder of its own (the run's is the child's)."""
    env = {**os.environ, "DATABASE_URL": database, "CHIPLEDGER_VAR_DIR": str(folder / "template-var")}
    command = [sys.executable, str(settings.BASE_DIR / "manage.py"), "migrate", "--noinput", "-v0"]
    return subprocess.run(command, env=env, cwd=settings.BASE_DIR, capture_output=True).returncode == 0


def _template_folder() -> Path | None:
    """This user's folder of SQLite templates (0700, owned by this user: nobody else's file is copied), or None."""
    folder = Path(tempfile.gettempdir()) / f"chipledger-scenario-templates-{os.getuid()}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        status = folder.lstat()
    except OSError:
        return None
    private = stat.S_ISDIR(status.st_mode) and status.st_uid == os.getuid() and not status.st_mode & 0o077
    return folder if private else None


def _sqlite_template(folder: Path) -> Path | None:
    """The migrated template file, made now if it is missing (built in the run's folder, then renamed into
    place, so a run never copies a half-made one, and a killed build goes with its folder); None if it cannot
    be made."""
    templates = _template_folder()
    if templates is None:
        return None
    template = templates / f"{migrations_digest()}.sqlite3"
    _forget_stale_sqlite(templates, template)
    if template.exists():
        with suppress(OSError):
            os.utime(template)  # in use: another checkout's sweep leaves it
        return template
    build = folder / "template-build.sqlite3"
    if not _migrate(f"sqlite:///{build}", folder):
        return None
    with closing(sqlite3.connect(build)) as db:
        db.execute("PRAGMA journal_mode=DELETE")  # out of WAL: one self-contained file
    try:
        os.replace(build, template)
    except OSError:  # another filesystem or a full disk: this run migrates from nothing
        return None
    return template


def _postgres_template(folder: Path) -> str | None:
    """The migrated template database's name, made now if it is missing (built under a name the sweep knows, then
    renamed); None if it cannot be made."""
    template = f"scenario_template_{migrations_digest()}"
    _forget_stale_postgres(template)
    if _database_exists(template):
        _note_use(template)
        return template
    build = f"scenario_{os.getpid()}_{secrets.token_hex(6)}"  # swept like a run's if this process is killed
    with connection.cursor() as cursor:
        cursor.execute(f'CREATE DATABASE "{build}"')
    try:
        if not _migrate(_postgres_url(build), folder):
            return None
        with connection.cursor() as cursor, suppress(DatabaseError):  # fails where another run made it meanwhile
            cursor.execute(f'ALTER DATABASE "{build}" RENAME TO "{template}"')
        if not _database_exists(template):
            return None
        _note_use(template)
        return template
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{build}" WITH (FORCE)')


# a template of other migrations unused this long is removed (each run notes its use)
STALE_TEMPLATE_SECONDS = 7 * 86_400
TEMPLATE_NAME = re.compile(r"scenario_template_[0-9a-f]{20}", re.ASCII)  # what `_postgres_template` names, nothing else


def _forget_stale_sqlite(templates: Path, current: Path) -> None:
    """Remove the template files of other migrations (older checkouts) that no run has used for
    STALE_TEMPLATE_SECONDS: one is left per migration change, and nothing else ever removes them."""
    cutoff = time.time() - STALE_TEMPLATE_SECONDS
    for path in templates.glob("*.sqlite3"):
        with suppress(OSError):
            if path != current and path.lstat().st_mtime < cutoff:
                path.unlink()


def _note_use(template: str) -> None:
    """The template database's last use, in its comment (PostgreSQL keeps no access time): the sweep reads it."""
    with connection.cursor() as cursor, suppress(DatabaseError):
        cursor.execute(f"COMMENT ON DATABASE \"{template}\" IS 'used {int(time.time())}'")


def _forget_stale_postgres(current: str) -> None:
    """Drop the template databases of other migrations no run has used for STALE_TEMPLATE_SECONDS (by their
    comment; one without a use noted is as old as can be). One being copied at that instant stays (DROP refuses
    a database in use): the next sweep takes it."""
    cutoff = time.time() - STALE_TEMPLATE_SECONDS
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT datname, shobj_description(oid, 'pg_database') FROM pg_database "
            "WHERE datname LIKE 'scenario\\_template\\_%'"
        )
        rows = cursor.fetchall()
    for name, comment in rows:
        used = re.fullmatch(r"used (\d{1,12})", comment or "", re.ASCII)
        if name != current and TEMPLATE_NAME.fullmatch(name) and not (used and int(used[1]) >= cutoff):
            with connection.cursor() as cursor, suppress(DatabaseError):
                cursor.execute(f'DROP DATABASE IF EXISTS "{name}"')  # a template's name: no quote in it


def _database_exists(name: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
        return cursor.fetchone() is not None


def run_here(name: str, *, stdout=sys.stdout) -> int:
    """Child: on this (empty) database, with a worker of its own, run the scenario and print the summary."""
    scenario = SCENARIOS[name]
    started = time.monotonic()
    call_command("migrate", verbosity=0, interactive=False)
    if selectors.ledger_size():
        stdout.write(f"refused: the ledger of {connection.settings_dict['NAME']} is not empty; scenarios start empty\n")
        return 2
    worker = _start_worker()
    try:
        outcome = scenario.run(World())
    except Exception as error:  # a scenario that breaks is a failed scenario, with its reason
        outcome = Outcome()
        outcome.expect("the scenario runs to its end", False, f"{type(error).__name__}: {error}")
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    _print(name, scenario.summary, outcome, time.monotonic() - started, stdout)
    return 0 if outcome.passed else 1


def _start_worker() -> subprocess.Popen:
    command = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "config",
        "worker",
        "--pool=solo",
        "-Q",
        settings.CELERY_TASK_DEFAULT_QUEUE,
        "--without-heartbeat",
        "--without-gossip",
        "--without-mingle",
        "--loglevel=WARNING",
    ]
    log = (settings.VAR_DIR / "worker.log").open("w")  # with --keep, the worker's log stays for a look
    return subprocess.Popen(command, cwd=settings.BASE_DIR, stdout=log, stderr=subprocess.STDOUT)


def _print(name: str, summary: str, outcome: Outcome, seconds: float, stdout) -> None:
    verdict = "PASS" if outcome.passed else "FAIL"
    stdout.write(f"{verdict} {name}: {summary} ({seconds:.0f} s, ledger entries {selectors.ledger_size()})\n")
    for line in outcome.story:
        stdout.write(f"  - {line}\n")
    for what, met, evidence in outcome.checks:
        stdout.write(f"  [{'ok' if met else 'NOT MET'}] {what}\n")
        if evidence:
            stdout.write(f"        {evidence[:400]}\n")
    stdout.flush()
