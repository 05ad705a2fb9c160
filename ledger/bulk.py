"""Bulk inserts for hot paths (ledger appends, registry bulk writes)."""

from collections.abc import Sequence
from datetime import datetime

from django.db import connection


def insert_rows(table: str, columns: Sequence[str], values: list[tuple]) -> None:
    """Bulk insert without the ORM's per-row SQL compilation: the append hot path.

    PostgreSQL gets COPY; SQLite an executemany. Values must already be in
    column order, JSON as text. bulk_create costs ~10x more per row here.
    """
    if not values:
        return
    names = ", ".join(connection.ops.quote_name(column) for column in columns)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # the raw psycopg cursor: wrap its errors as Django's (IntegrityError, DataError) like any query's
            with connection.wrap_database_errors, cursor.cursor.copy(f"COPY {table} ({names}) FROM STDIN") as copy:
                for row in values:
                    copy.write_row(row)
        else:
            adapt = connection.ops.adapt_datetimefield_value
            placeholders = ", ".join(["%s"] * len(columns))
            rows = [tuple(adapt(v) if isinstance(v, datetime) else v for v in row) for row in values]
            cursor.executemany(f"INSERT INTO {table} ({names}) VALUES ({placeholders})", rows)
