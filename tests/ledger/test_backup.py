"""export_ledger / import_ledger: a world round-trips through a file into a fresh database, where
verify_ledger and rebuild_projections --check pass; a bad, forged or cut file, or a non-empty target,
imports nothing and says why (no traceback)."""

import base64
import collections
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import time

import nacl.signing
import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from ledger import keys, selectors, services
from ledger.backup import ExportRefused, ImportRefused, _trailer, export_ledger, import_ledger
from registry.models import ApiToken, Chip
from tlog import chain, merkle, note

pytestmark = pytest.mark.django_db


@pytest.fixture
def exported(tmp_path):
    call_command("seed_demo", "--password", "demo-pass-123", "--chips", "50", stdout=io.StringIO())
    path = tmp_path / "ledger.jsonl.gz"
    call_command("export_ledger", str(path), stdout=io.StringIO())
    return path


@pytest.fixture(scope="module")
def exported_once(django_db_setup, django_db_blocker, tmp_path_factory):
    """The same demo world's export, made once for the tests that only read or edit the file (seeding a world
    costs seconds): seeded and exported inside a transaction that is rolled back, so no test sees the world."""
    from django.db import transaction

    path = tmp_path_factory.mktemp("export") / "ledger.jsonl.gz"
    with django_db_blocker.unblock(), transaction.atomic():
        call_command("seed_demo", "--password", "demo-pass-123", "--chips", "50", stdout=io.StringIO())
        call_command("export_ledger", str(path), stdout=io.StringIO())
        transaction.set_rollback(True)
    path.chmod(0o444)  # a test edits a copy of its lines, never the file
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
    tmp_path.mkdir(parents=True, exist_ok=True)
    database = tmp_path / "restored.sqlite3"
    shutil.copy(migrated, database)
    return [_manage(database, *command) for command in commands]


def test_a_world_round_trips_into_a_fresh_database(exported, migrated, tmp_path):
    size, root = selectors.ledger_size(), selectors.root_at(selectors.ledger_size()).hex()
    imported, verified, rebuilt = _fresh_database(
        migrated, tmp_path, ["import_ledger", str(exported)], ["verify_ledger"], ["rebuild_projections", "--check"]
    )
    assert imported.returncode == 0, imported.stderr
    assert "skipped" in imported.stdout and "auth.user rows" in imported.stdout  # not named: not imported
    assert verified.returncode == 0 and verified.stdout.strip() == f"OK entries={size} root={root}", verified.stderr
    assert rebuilt.returncode == 0 and "OK projections match the ledger" in rebuilt.stdout, (
        rebuilt.stdout + rebuilt.stderr
    )


def test_import_into_a_database_that_is_not_empty_is_refused(exported):
    chips = Chip.objects.count()
    with pytest.raises(CommandError, match="not empty"):
        call_command("import_ledger", str(exported))
    assert Chip.objects.count() == chips


def test_users_and_tokens_come_only_when_named(exported, migrated, tmp_path):
    users, tokens = get_user_model().objects.count(), ApiToken.objects.count()
    assert users and tokens
    count_users = ["shell", "-c", "from django.contrib.auth.models import User; print(User.objects.count())"]
    bare, bare_users = _fresh_database(migrated, tmp_path, ["import_ledger", str(exported)], count_users)
    assert bare.returncode == 0 and bare_users.stdout.split()[-1] == "0", bare.stderr
    assert f"skipped {tokens} registry.apitoken rows" in bare.stdout
    named, named_users = _fresh_database(
        migrated, tmp_path / "x", ["import_ledger", str(exported), "--include", "users,tokens"], count_users
    )
    assert named.returncode == 0 and named_users.stdout.split()[-1] == str(users), named.stderr
    with pytest.raises(ImportRefused, match="tokens needs users"):
        import_ledger(exported, include={"tokens"})


# --- forged and cut files ------------------------------------------------------------------------------


def _lines(path) -> list[str]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as handle:
        return handle.read().splitlines()


def _write(tmp_path, lines: list[str], name="edited.jsonl") -> str:
    out = tmp_path / name
    out.write_text("".join(line + "\n" for line in lines))
    return str(out)


def _body(lines: list[str]) -> list[str]:
    return [line for line in lines if not line.startswith('{"trailer"')]


def _rehashed(lines: list[str]) -> list[str]:
    """Fix the trailer's SHA-256 and counts, keeping its old signature: what anyone without the log's key can do."""
    body = _body(lines)
    old = json.loads(lines[-1])["trailer"]
    old["sha256"] = hashlib.sha256("".join(line + "\n" for line in body).encode()).hexdigest()
    old["rows"] = dict(collections.Counter(json.loads(line)["model"] for line in body if '"model"' in line))
    return [*body, json.dumps({"trailer": old})]


def _resigned(lines: list[str]) -> list[str]:
    """A new trailer signed with the log's key: the forger holds the key, so only the checkpoint rule is left."""
    body = _body(lines)
    digest = hashlib.sha256("".join(line + "\n" for line in body).encode()).hexdigest()
    rows = dict(collections.Counter(json.loads(line)["model"] for line in body if '"model"' in line))
    header = json.loads(body[0])
    return [*body, json.dumps({"trailer": _trailer(header["entries"], rows, digest)})]


def _entries(lines):
    return [i for i, line in enumerate(lines) if line.startswith('{"seq"')]


def _leaf(line) -> dict:
    return json.loads(base64.b64decode(json.loads(line)["leaf"]))


def _entry_line(leaf: dict) -> str:
    raw = chain.canonical_leaf(
        leaf["seq"], leaf["time"], leaf["kind"], leaf["actor"], leaf["payload"], leaf["prev"], leaf.get("submission")
    )
    return json.dumps({"seq": leaf["seq"], "leaf": base64.b64encode(raw).decode()}), merkle.leaf_hash(raw)


def _append_forged_licence(lines):
    """One re-chained entry after the last (an export licence for 10^7 chips), the header fixed to count it."""
    positions = _entries(lines)
    last = _leaf(lines[positions[-1]])
    prev = merkle.leaf_hash(base64.b64decode(json.loads(lines[positions[-1]])["leaf"])).hex()
    forged = {
        **last,
        "seq": last["seq"] + 1,
        "kind": "export_licence.granted",
        "actor": "regulator",
        "payload": {"licence_id": "L-FORGED", "quantity": 10**7},
        "prev": prev,
    }
    forged.pop("submission", None)
    line, _ = _entry_line(forged)
    lines.insert(positions[-1] + 1, line)
    header = json.loads(lines[0])
    header["entries"] += 1
    lines[0] = json.dumps(header)


def _rewrite_entry_one_and_drop_checkpoints(lines):
    positions = _entries(lines)
    prev = None
    for position in positions:
        leaf = _leaf(lines[position])
        if leaf["seq"] == 1:
            leaf["actor"] = "someone-else"
        if prev is not None:
            leaf["prev"] = prev.hex()
        lines[position], prev = _entry_line(leaf)
    dropped = ('{"model": "ledger.checkpoint"', '{"model": "ledger.cosignature"')
    lines[:] = [line for line in lines if not line.startswith(dropped)]


def _forged_superuser(lines):
    user = {"model": "auth.user", "pk": 999, "fields": {"username": "mallory", "password": "x", "is_superuser": True}}
    lines.insert(len(lines) - 1, json.dumps({**user, "fields": {**user["fields"], "is_staff": True}}))


@pytest.mark.parametrize("forge", [_append_forged_licence, _rewrite_entry_one_and_drop_checkpoints, _forged_superuser])
def test_a_forged_file_without_the_log_key_is_refused_before_anything_is_written(exported, tmp_path, forge):
    lines = _lines(exported)
    forge(lines)
    with pytest.raises(ImportRefused, match="trailer's signature is over other counts"):
        import_ledger(_write(tmp_path, _rehashed(lines)))  # refused on the first pass: the seeded DB is untouched


@pytest.mark.parametrize(
    ("forge", "reason"),
    [
        (_append_forged_licence, "entries beyond a signed checkpoint are refused"),
        (_rewrite_entry_one_and_drop_checkpoints, "newest signed checkpoint covers none"),
    ],
)
def test_a_forged_ledger_must_end_at_a_signed_checkpoint_even_with_the_log_key(
    exported_once, migrated, tmp_path, forge, reason
):
    lines = _lines(exported_once)
    forge(lines)
    imported, verified = _fresh_database(
        migrated, tmp_path, ["import_ledger", _write(tmp_path, _resigned(lines))], ["verify_ledger"]
    )
    assert imported.returncode == 1 and reason in imported.stderr, imported.stderr
    assert "Traceback" not in imported.stderr
    assert "OK entries=0 " in verified.stdout  # the failed import left nothing behind


def test_a_forged_superuser_signed_with_the_log_key_is_still_not_imported_unless_named(
    exported_once, migrated, tmp_path
):
    lines = _lines(exported_once)
    _forged_superuser(lines)
    imported, users = _fresh_database(
        migrated,
        tmp_path,
        ["import_ledger", _write(tmp_path, _resigned(lines))],
        [
            "shell",
            "-c",
            "from django.contrib.auth.models import User; print(User.objects.filter(is_superuser=True).count())",
        ],
    )
    assert imported.returncode == 0, imported.stderr
    assert users.stdout.split()[-1] == "0"


def _cut_last_row(lines):
    del lines[-2]


def _cut_30_percent(lines):
    del lines[int(len(lines) * 0.7) :]


def _drop_trailer(lines):
    del lines[-1]


def _row_after_trailer(lines):
    lines.append(lines[1])


@pytest.mark.parametrize(
    ("cut", "reason"),
    [
        (_cut_last_row, "SHA-256 differs from its trailer"),
        (_cut_30_percent, "without its trailer: it was cut short"),
        (_drop_trailer, "without its trailer"),
        (_row_after_trailer, "something follows the trailer"),
    ],
)
def test_a_cut_file_is_refused_and_says_so(exported_once, migrated, tmp_path, cut, reason):
    lines = _lines(exported_once)
    cut(lines)
    (imported,) = _fresh_database(migrated, tmp_path, ["import_ledger", _write(tmp_path, lines)])
    assert imported.returncode == 1 and reason in imported.stderr, imported.stderr
    assert "Traceback" not in imported.stderr


@pytest.mark.parametrize("keep", [0.3, 0.999])
def test_a_truncated_gzip_is_a_clear_error_not_a_traceback(exported_once, migrated, tmp_path, keep):
    data = exported_once.read_bytes()
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(data[: int(len(data) * keep)])
    (imported,) = _fresh_database(migrated, tmp_path, ["import_ledger", str(cut)])
    assert imported.returncode == 1, imported.stderr
    assert "cut short or corrupt" in imported.stderr and "Traceback" not in imported.stderr, imported.stderr


def test_deeper_checks_still_name_the_line(exported_once, migrated, tmp_path):
    """A re-signed file (the forger holds the key) with a tampered leaf is still caught by the chain."""
    lines = _lines(exported_once)
    entry = json.loads(lines[5])
    leaf = json.loads(base64.b64decode(entry["leaf"]))
    leaf["actor"] = "someone-else"
    entry["leaf"] = base64.b64encode(json.dumps(leaf).encode()).decode()
    lines[5] = json.dumps(entry)
    (imported,) = _fresh_database(migrated, tmp_path, ["import_ledger", _write(tmp_path, _resigned(lines))])
    assert imported.returncode == 1 and "line 6: seq=4" in imported.stderr, imported.stderr


def test_a_file_of_another_log_is_refused(exported, monkeypatch):
    monkeypatch.setattr(keys, "origin", lambda: "another.example/log")  # another name, so another verifier key
    with pytest.raises(ImportRefused, match="not signed by this log's key"):
        import_ledger(exported)


def test_export_ends_at_a_checkpoint_it_signs(exported):
    header = json.loads(_lines(exported)[0])
    assert header["entries"] == selectors.ledger_size() == selectors.checkpoint_latest().size


# --- witnesses ------------------------------------------------------------------------------------


WITNESS = "witness.example/w1"


@pytest.fixture
def witnessed(tmp_path):
    call_command("seed_demo", "--password", "demo-pass-123", "--chips", "50", stdout=io.StringIO())
    key = nacl.signing.SigningKey.generate()
    services.witness_register(note.verifier_key(WITNESS, bytes(key.verify_key), note.COSIGNATURE_V1), "system")
    return key


def _cosign_latest(key):
    checkpoint = services.checkpoint_sign()
    body, _ = note.split_note(checkpoint.note)
    services.cosignature_add(checkpoint.note, note.cosign(body, WITNESS, key, int(time.time())))


def test_export_refuses_when_an_active_witness_has_not_cosigned(witnessed, tmp_path):
    path = tmp_path / "w.jsonl"
    with pytest.raises(ExportRefused, match=f"lacks the cosignature of {WITNESS}"):
        export_ledger(path, witness_wait=0)
    assert not path.exists()


def test_a_witnessed_backup_imports_only_with_the_cosignature(witnessed, migrated, tmp_path):
    _cosign_latest(witnessed)
    path = tmp_path / "w.jsonl"
    export_ledger(path, witness_wait=0)
    (imported,) = _fresh_database(migrated, tmp_path, ["import_ledger", str(path)])
    assert imported.returncode == 0, imported.stderr
    without = [line for line in _lines(path) if not line.startswith('{"model": "ledger.cosignature"')]
    (refused,) = _fresh_database(migrated, tmp_path / "x", ["import_ledger", _write(tmp_path, _resigned(without))])
    assert refused.returncode == 1 and f"not cosigned by active witness {WITNESS}" in refused.stderr, refused.stderr


def test_private_case_text_travels_in_its_own_table_and_never_on_the_ledger(migrated, tmp_path):
    from inspections.models import Alert
    from inspections.services.alerts import alert_act

    call_command("seed_demo", "--password", "demo-pass-123", "--chips", "50", stdout=io.StringIO())
    alert = Alert.objects.first()
    secret = "lab manager J. Doe present"
    alert_act(alert, action="comment", by="regulator", reason=secret)
    path = tmp_path / "private.jsonl"
    export_ledger(path, witness_wait=0)
    lines = _lines(path)
    assert not any(secret in line for line in lines if line.startswith('{"seq"'))  # not in any leaf (JSON-escaped)
    assert not any(
        secret.encode() in base64.b64decode(json.loads(line)["leaf"]) for line in lines if line.startswith('{"seq"')
    )
    assert sum(line.startswith('{"model": "inspections.casetext"') for line in lines) >= 1
    count = ["shell", "-c", "from inspections.models import CaseText; print(CaseText.objects.count())"]
    imported, restored, rebuilt = _fresh_database(
        migrated, tmp_path, ["import_ledger", str(path)], count, ["rebuild_projections", "--check"]
    )
    assert imported.returncode == 0, imported.stderr
    assert restored.stdout.split()[-1] == str(
        sum(line.startswith('{"model": "inspections.casetext"') for line in lines)
    )
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    public_only = tmp_path / "public.jsonl"
    call_command("export_ledger", str(public_only), "--without-private", stdout=io.StringIO())
    assert secret not in public_only.read_text() and "inspections.casetext" not in public_only.read_text()
