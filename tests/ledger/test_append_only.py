"""The database itself refuses UPDATE and DELETE on the ledger's tables (both legs)."""

import pytest
from django.db import DatabaseError, connection, transaction

from ledger import services
from ledger.models import Checkpoint, Entry, TreeNode
from tests.factories import append_sample_entries

pytestmark = pytest.mark.django_db

STATEMENTS = [
    "UPDATE ledger_entry SET kind = 'chip.stolen' WHERE seq = 1",
    "UPDATE ledger_entry SET seq = seq + 100",
    "DELETE FROM ledger_entry WHERE seq = 3",
    "DELETE FROM ledger_entry",
    "UPDATE ledger_treenode SET hash = hash",
    "DELETE FROM ledger_treenode",
    "UPDATE ledger_checkpoint SET note = 'forged'",
    "DELETE FROM ledger_checkpoint",
]


@pytest.mark.parametrize("statement", STATEMENTS)
def test_raw_sql_update_and_delete_fail(statement):
    append_sample_entries(4)
    services.checkpoint_sign()
    before = _snapshot()
    with (
        pytest.raises(DatabaseError, match=r"append-only|append_only|Protect"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(statement)
    assert _snapshot() == before


@pytest.mark.postgres
@pytest.mark.parametrize("table", ["ledger_entry", "ledger_treenode", "ledger_checkpoint", "ledger_cosignature"])
def test_truncate_fails_on_postgres(table):
    append_sample_entries(4)
    services.checkpoint_sign()
    before = _snapshot()
    with pytest.raises(DatabaseError, match="append-only: TRUNCATE"), transaction.atomic(), connection.cursor() as c:
        c.execute(f"TRUNCATE {table} CASCADE")
    assert _snapshot() == before


def test_orm_update_and_delete_fail():
    append_sample_entries(2)
    entry = Entry.objects.get(seq=0)
    entry.kind = "chip.stolen"
    with pytest.raises(DatabaseError), transaction.atomic():
        entry.save()
    with pytest.raises(DatabaseError), transaction.atomic():
        Entry.objects.filter(seq=1).delete()
    assert Entry.objects.get(seq=0).kind == "test.sample" and Entry.objects.count() == 2


def _snapshot():
    return (
        list(Entry.objects.values_list("seq", "kind", "leaf")),
        TreeNode.objects.count(),
        list(Checkpoint.objects.values_list("size", "note")),
    )
