"""Append-only on SQLite: the same guarantee pgtrigger gives on PostgreSQL.

pgtrigger installs PostgreSQL triggers only, so SQLite gets hand-written ones
that abort any UPDATE or DELETE on the ledger's append-only tables.
"""

from django.db import migrations

TABLES = ("ledger_entry", "ledger_treenode", "ledger_checkpoint", "ledger_cosignature")


def _statements(table: str, operation: str) -> tuple[str, str]:
    name = f"{table}_append_only_{operation.lower()}"
    create = (
        f"CREATE TRIGGER IF NOT EXISTS {name} BEFORE {operation} ON {table} "
        f"BEGIN SELECT RAISE(ABORT, '{table} is append-only: {operation} refused'); END;"
    )
    return create, f"DROP TRIGGER IF EXISTS {name};"


def install(apps, schema_editor):
    if schema_editor.connection.vendor != "sqlite":
        return
    for table in TABLES:
        for operation in ("UPDATE", "DELETE"):
            schema_editor.execute(_statements(table, operation)[0])


def uninstall(apps, schema_editor):
    if schema_editor.connection.vendor != "sqlite":
        return
    for table in TABLES:
        for operation in ("UPDATE", "DELETE"):
            schema_editor.execute(_statements(table, operation)[1])


class Migration(migrations.Migration):
    dependencies = [("ledger", "0001_initial")]
    operations = [migrations.RunPython(install, uninstall)]
