"""manage.py verify_ledger: OK on an honest log; names the first bad seq for every tamper case.

Each tamper drops the append-only triggers first, as an attacker with direct
database access would (the test transaction rolls the drop back).
"""

import json

import pytest
import rfc8785
from django.conf import settings
from django.core.management import call_command
from django.db import connection

from ledger import keys, services
from ledger.models import Checkpoint, Entry
from tests.factories import append_sample_entries
from tlog import merkle, note

pytestmark = pytest.mark.django_db
SIZE = 40


@pytest.fixture
def log():
    append_sample_entries(SIZE)
    services.checkpoint_sign()


def drop_append_only_triggers():
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")
            for (name,) in cursor.fetchall():
                cursor.execute(f"DROP TRIGGER {name}")
        else:
            cursor.execute(
                "SELECT tgname, tgrelid::regclass::text FROM pg_trigger WHERE NOT tgisinternal "
                "AND tgrelid::regclass::text LIKE 'ledger_%%'"
            )
            for name, table in cursor.fetchall():
                cursor.execute(f'DROP TRIGGER "{name}" ON {table}')


def run_verify(capsys) -> tuple[int, str]:
    try:
        call_command("verify_ledger")
    except SystemExit as exit_:
        return exit_.code, capsys.readouterr().err
    return 0, capsys.readouterr().out


def sql(statement: str, params=()):
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def leaf_of(seq: int) -> dict:
    return json.loads(bytes(Entry.objects.get(seq=seq).leaf))


def rewrite(seq: int, leaf: dict, fix_hash: bool, fix_payload: bool = True):
    data = rfc8785.dumps(leaf)
    sql("UPDATE ledger_entry SET leaf = %s WHERE seq = %s", [data, seq])
    if fix_hash:
        sql("UPDATE ledger_entry SET hash = %s WHERE seq = %s", [merkle.leaf_hash(data), seq])
    if fix_payload:
        sql("UPDATE ledger_entry SET payload = %s WHERE seq = %s", [json.dumps(leaf["payload"]), seq])


def test_honest_log_verifies(log, capsys):
    code, out = run_verify(capsys)
    hashes = [bytes(h) for h in Entry.objects.order_by("seq").values_list("hash", flat=True)]
    assert code == 0
    assert out.strip() == f"OK entries={SIZE} root={merkle.root_from_leaf_hashes(hashes).hex()}"


def test_empty_log_verifies(capsys):
    services.checkpoint_sign()
    assert run_verify(capsys) == (0, f"OK entries=0 root={merkle.EMPTY_ROOT.hex()}\n")


def test_edited_payload_column(log, capsys):
    drop_append_only_triggers()
    sql("UPDATE ledger_entry SET payload = %s WHERE seq = 17", [json.dumps({"n": 17, "serial": "SN-FORGED"})])
    code, err = run_verify(capsys)
    assert code == 1 and "seq=17:" in err and "payload" in err


def test_edited_leaf_bytes(log, capsys):
    drop_append_only_triggers()
    leaf = leaf_of(11)
    leaf["payload"]["serial"] = "SN-FORGED"
    rewrite(11, leaf, fix_hash=False)
    code, err = run_verify(capsys)
    assert code == 1 and "seq=11:" in err


def test_edited_leaf_with_recomputed_hash_breaks_the_next_link(log, capsys):
    drop_append_only_triggers()
    leaf = leaf_of(11)
    leaf["payload"]["serial"] = "SN-FORGED"
    rewrite(11, leaf, fix_hash=True)
    code, err = run_verify(capsys)
    assert code == 1 and "seq=12:" in err and "prev" in err


def test_edited_last_leaf_is_caught_by_the_checkpoint_root(log, capsys):
    drop_append_only_triggers()
    leaf = leaf_of(SIZE - 1)
    leaf["payload"]["serial"] = "SN-FORGED"
    rewrite(SIZE - 1, leaf, fix_hash=True)
    code, err = run_verify(capsys)
    assert code == 1 and f"seq={SIZE - 1}:" in err and "checkpoint" in err


def test_broken_prev_link(log, capsys):
    drop_append_only_triggers()
    leaf = leaf_of(23)
    leaf["prev"] = "ab" * 32
    rewrite(23, leaf, fix_hash=True)
    code, err = run_verify(capsys)
    assert code == 1 and "seq=23:" in err and "prev" in err


def test_gap_in_seq(log, capsys):
    drop_append_only_triggers()
    sql("DELETE FROM ledger_entry WHERE seq = 29")
    code, err = run_verify(capsys)
    assert code == 1 and "seq=29:" in err


def test_reordered_pair(log, capsys):
    drop_append_only_triggers()
    columns = "leaf, hash, kind, actor, time, payload"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {columns} FROM ledger_entry WHERE seq IN (5, 6) ORDER BY seq")
        five, six = cursor.fetchall()
    assignments = ", ".join(f"{c.strip()} = %s" for c in columns.split(","))
    sql(f"UPDATE ledger_entry SET {assignments} WHERE seq = 5", list(six))
    sql(f"UPDATE ledger_entry SET {assignments} WHERE seq = 6", list(five))
    code, err = run_verify(capsys)
    assert code == 1 and "seq=5:" in err


def test_checkpoint_with_a_bad_signature(log, capsys):
    drop_append_only_triggers()
    body, signatures = note.split_note(Checkpoint.objects.get().note)
    forged = bytearray(signatures[0].signature)
    forged[-1] ^= 1
    text = body + "\n" + note.signature_line(signatures[0].name, signatures[0].key_id, bytes(forged))
    sql("UPDATE ledger_checkpoint SET note = %s", [text])
    code, err = run_verify(capsys)
    assert code == 1 and f"seq={SIZE - 1}:" in err and "signature" in err


def test_checkpoint_whose_root_does_not_match(log, capsys):
    drop_append_only_triggers()
    sql("UPDATE ledger_checkpoint SET root = %s", [bytes(32)])
    code, err = run_verify(capsys)
    assert code == 1 and f"seq={SIZE - 1}:" in err and "root" in err


def test_checkpoint_signed_over_a_different_root(log, capsys):
    """A correctly signed checkpoint (stolen key) whose body commits to another tree."""
    drop_append_only_triggers()
    body = note.checkpoint_body(settings.LEDGER_ORIGIN, SIZE, bytes(32))
    text = note.sign_note(body, settings.LEDGER_ORIGIN, keys.signing_key())
    sql("UPDATE ledger_checkpoint SET note = %s", [text])
    code, err = run_verify(capsys)
    assert code == 1 and f"seq={SIZE - 1}:" in err


def test_corrupted_tree_cache(log, capsys):
    drop_append_only_triggers()
    sql('UPDATE ledger_treenode SET hash = %s WHERE level = 5 AND "index" = 0', [bytes(32)])
    code, err = run_verify(capsys)
    assert code == 1 and "tree node cache" in err
