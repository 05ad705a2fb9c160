"""export_ledger / import_ledger: a world round-trips through a file into a fresh database, where
verify_ledger and rebuild_projections --check pass; a bad file or a non-empty target imports nothing."""

import base64
import gzip
import io
import json
import os
import shutil
import subprocess
import sys

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from ledger import keys, selectors
from ledger.backup import ImportRefused, import_ledger
from registry.models import Chip

pytestmark = pytest.mark.django_db


@pytest.fixture
def exported(tmp_path):
    call_command("seed_demo", "--password", "demo-pass-123", "--chips", "50", stdout=io.StringIO())
    path = tmp_path / "ledger.jsonl.gz"
    call_command("export_ledger", str(path), stdout=io.StringIO())
    return path


def _manage(database, *command: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{database}",
        "LEDGER_SIGNING_KEY": base64.b64encode(bytes(keys.signing_key())).decode(),
    }
    env.pop("REDIS_URL", None)
    return subprocess.run(
        [sys.executable, "manage.py", *command], env=env, cwd=settings.BASE_DIR, capture_output=True, text=True
    )


@pytest.fixture(scope="module")
def migrated(tmp_path_factory):
    """An empty, migrated SQLite database, made once and copied for each restore."""
    database = tmp_path_factory.mktemp("restore") / "template.sqlite3"
    assert _manage(database, "migrate", "--noinput").returncode == 0
    return database


def _fresh_database(migrated, tmp_path, *commands: list[str]) -> list[subprocess.CompletedProcess]:
    """Run manage.py commands against a new database with this log's key (a restore on another host)."""
    database = tmp_path / "restored.sqlite3"
    shutil.copy(migrated, database)
    return [_manage(database, *command) for command in commands]


def test_a_world_round_trips_into_a_fresh_database(exported, migrated, tmp_path):
    size, root = selectors.ledger_size(), selectors.root_at(selectors.ledger_size()).hex()
    imported, verified, rebuilt = _fresh_database(
        migrated, tmp_path, ["import_ledger", str(exported)], ["verify_ledger"], ["rebuild_projections", "--check"]
    )
    assert imported.returncode == 0, imported.stderr
    assert verified.returncode == 0 and verified.stdout.strip() == f"OK entries={size} root={root}", verified.stderr
    assert rebuilt.returncode == 0 and "OK projections match the ledger" in rebuilt.stdout, (
        rebuilt.stdout + rebuilt.stderr
    )


def test_import_into_a_database_that_is_not_empty_is_refused(exported):
    chips = Chip.objects.count()
    with pytest.raises(CommandError, match="not empty"):
        call_command("import_ledger", str(exported))
    assert Chip.objects.count() == chips


def _rewrite(path, tmp_path, edit) -> str:
    with gzip.open(path, "rt") as handle:
        lines = handle.read().splitlines()
    edit(lines)
    out = tmp_path / "edited.jsonl"
    out.write_text("\n".join(lines) + "\n")
    return str(out)


def _tamper_leaf(lines):
    entry = json.loads(lines[5])
    leaf = json.loads(base64.b64decode(entry["leaf"]))
    leaf["actor"] = "someone-else"
    entry["leaf"] = base64.b64encode(json.dumps(leaf).encode()).decode()
    lines[5] = json.dumps(entry)


def _drop_entry(lines):
    del lines[3]


def _foreign_table(lines):
    lines.append(json.dumps({"model": "sessions.session", "pk": "x", "fields": {}}))


def _entry_after_rows(lines):
    lines.append(lines[1])


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (_tamper_leaf, "line 6: seq=4"),
        (_drop_entry, "seq=2"),
        (_foreign_table, "is not a table this file may fill"),
        (_entry_after_rows, "every entry must come before"),
    ],
)
def test_a_bad_file_imports_nothing_and_names_the_line(exported, migrated, tmp_path, edit, reason):
    edited = _rewrite(exported, tmp_path, edit)
    imported, verified = _fresh_database(migrated, tmp_path, ["import_ledger", edited], ["verify_ledger"])
    assert imported.returncode != 0 and reason in imported.stderr, imported.stderr
    assert "OK entries=0 " in verified.stdout  # the failed import left nothing behind


def test_a_file_of_another_log_is_refused(exported, settings):
    settings.LEDGER_ORIGIN = "another.example/log"  # another name, so another verifier key
    with pytest.raises(ImportRefused, match="another log key"):
        import_ledger(exported)
