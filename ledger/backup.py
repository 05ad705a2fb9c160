"""Export the ledger (and the tables beside it) to a file, and import it into an empty database.

The file is JSON Lines (gzip when its name ends in ``.gz``): a header, then every entry as its exact
leaf bytes, then every other row of the project's tables as Django's serializer writes it. Entries
and tree nodes are not copied as rows: the import re-derives their columns from the leaves and the
tree from the hashes, so a file cannot smuggle in a column that disagrees with its leaf. Everything
else (checkpoints, witnesses, the registry's and the inspections' projections, users, campaign
seeds) is copied as it is, so the imported database passes ``verify_ledger`` and
``rebuild_projections --check`` exactly as the exported one did.

The file holds secrets (campaign seeds, password hashes): keep it like the database itself.
"""

from __future__ import annotations

import base64
import gzip
import io
import json
from collections.abc import Iterator
from datetime import date, datetime, time
from pathlib import Path

from django.apps import apps
from django.core import serializers
from django.core.management.color import no_style
from django.db import connection, transaction
from django.db.models import Model

from tlog import chain, merkle

from . import integrity, keys, selectors
from .bulk import insert_rows
from .models import Entry, TreeNode
from .services import ENTRY_COLUMNS

FORMAT = "chipledger-export"
VERSION = 1
DERIVED = {Entry, TreeNode}  # rebuilt from the leaves on import
# Rows that belong to the framework or to a session, not to the regulator's world.
SKIPPED_APPS = {"contenttypes", "sessions", "admin", "messages", "staticfiles"}
# Created by migrate (permissions; the admin roles of registry.services.roles); users name them by natural key.
SKIPPED_MODELS = {"auth.permission", "auth.group"}
BATCH = 5000


class ImportRefused(Exception):
    """The file or the target database is not fit for an import; nothing was written."""


def exported_models() -> list[type[Model]]:
    """Every model whose rows the file carries, parents before children."""
    candidates = {
        config.label: [
            m
            for m in config.get_models()
            if m not in DERIVED and m._meta.label_lower not in SKIPPED_MODELS and m._meta.managed and not m._meta.proxy
        ]
        for config in apps.get_app_configs()
        if config.label not in SKIPPED_APPS
    }
    return serializers.sort_dependencies([(apps.get_app_config(label), models) for label, models in candidates.items()])


def export_ledger(path: Path) -> dict:
    """Write the file; returns the header."""
    header = {
        "format": FORMAT,
        "version": VERSION,
        "verifier_key": keys.verifier_key(),
        "entries": selectors.ledger_size(),
    }
    with _open(path, "wt") as out:
        out.write(json.dumps(header) + "\n")
        for seq, leaf in selectors.leaves():
            out.write(json.dumps({"seq": seq, "leaf": base64.b64encode(leaf).decode()}) + "\n")
        for model in exported_models():
            for row in model._default_manager.order_by("pk").iterator(chunk_size=BATCH):
                record = serializers.serialize("python", [row], use_natural_foreign_keys=True)[0]
                out.write(json.dumps(record, default=_plain, ensure_ascii=False) + "\n")
    return header


@transaction.atomic
def import_ledger(path: Path) -> dict:
    """Load the file into an empty database, in one transaction; returns the header."""
    lines = enumerate(_lines(path), start=1)
    header = _header(next(lines, (1, None))[1])
    if header["verifier_key"] != keys.verifier_key():
        raise ImportRefused(
            "the file was signed for by another log key: set LEDGER_SIGNING_KEY to that log's key first"
        )
    _refuse_unless_empty()
    verifier, stack, pending, allowed, rows_started = chain.ChainVerifier(), [], [], _labels(), False
    for number, line in lines:
        item = _json(line, number)
        if "model" not in item:  # an entry
            if rows_started:
                raise ImportRefused(f"line {number}: every entry must come before the other rows")
            pending.append(_entry_row(verifier, item, number))
            if len(pending) >= BATCH:
                pending = _insert_entries(pending, stack)
            continue
        if not rows_started:  # the ledger is complete before anything that refers to it
            pending, rows_started = _insert_entries(pending, stack), True
            _check_entry_count(verifier, header)
        _load_record(item, number, allowed)
    _insert_entries(pending, stack)
    _check_entry_count(verifier, header)
    _reset_sequences()
    try:
        integrity.verify_stored_ledger()  # still inside the transaction: a bad file leaves nothing behind
    except chain.LedgerFault as fault:
        raise ImportRefused(f"the imported ledger does not verify: {fault}") from fault
    return header


# --- reading -------------------------------------------------------------------------------


def _open(path: Path, mode: str):
    path = Path(path)
    return gzip.open(path, mode, encoding="utf-8") if path.suffix == ".gz" else open(path, mode, encoding="utf-8")


def _lines(path: Path) -> Iterator[str]:
    with _open(path, "rt") as handle:
        for line in handle:
            if line.strip():
                yield line


def _json(line: str, number: int) -> dict:
    try:
        item = json.loads(line)
    except (ValueError, RecursionError) as error:
        raise ImportRefused(f"line {number}: not JSON ({error})") from error
    if not isinstance(item, dict):
        raise ImportRefused(f"line {number}: not a JSON object")
    return item


def _header(line: str | None) -> dict:
    if line is None:
        raise ImportRefused("the file is empty")
    header = _json(line, 1)
    if header.get("format") != FORMAT or header.get("version") != VERSION:
        raise ImportRefused(f"line 1: not a {FORMAT} file of version {VERSION}")
    if (
        type(header.get("entries")) is not int
        or header["entries"] < 0
        or not isinstance(header.get("verifier_key"), str)
    ):
        raise ImportRefused("line 1: the header needs entries (a count) and verifier_key")
    return header


def _entry_row(verifier: chain.ChainVerifier, item: dict, number: int) -> tuple:
    try:
        leaf = base64.b64decode(item["leaf"], validate=True)
        digest, parsed = verifier.feed(item["seq"], leaf)
    except (KeyError, TypeError, ValueError) as error:
        raise ImportRefused(f"line {number}: not an entry ({error})") from error
    except chain.LedgerFault as fault:
        raise ImportRefused(f"line {number}: {fault}") from fault
    try:
        when = datetime.fromisoformat(parsed["time"].replace("Z", "+00:00"))
    except ValueError as error:
        raise ImportRefused(f"line {number}: seq={parsed['seq']}: time {parsed['time']!r} is not storable") from error
    payload = json.dumps(parsed["payload"], ensure_ascii=False, separators=(",", ":"))
    return (parsed["seq"], when, parsed["kind"], parsed["actor"], payload, leaf, digest)


def _insert_entries(rows: list[tuple], stack: list[bytes]) -> list:
    """Insert a batch of entry rows and the tree nodes they complete; returns a fresh batch."""
    if not rows:
        return rows
    size = rows[0][0]
    nodes: list[tuple[int, int, bytes]] = []
    merkle.extend_frontier(stack, size, [row[-1] for row in rows], nodes)
    insert_rows(Entry._meta.db_table, ENTRY_COLUMNS, rows)
    insert_rows(TreeNode._meta.db_table, ("level", "index", "hash"), nodes)
    return []


def _check_entry_count(verifier: chain.ChainVerifier, header: dict) -> None:
    if verifier.size != header["entries"]:
        raise ImportRefused(f"the header promises {header['entries']} entries, the file holds {verifier.size}")


def _labels() -> set[str]:
    return {model._meta.label_lower for model in exported_models()}


def _load_record(record: dict, number: int, allowed: set[str]) -> None:
    if record.get("model") not in allowed:
        raise ImportRefused(f"line {number}: {record.get('model')!r} is not a table this file may fill")
    try:
        for obj in serializers.deserialize("python", [record], handle_forward_references=False):
            obj.save()
    except Exception as error:  # any deserialisation or integrity error names the line; all is rolled back
        raise ImportRefused(f"line {number}: {record['model']} {record.get('pk')!r}: {error}") from error


# --- checks and housekeeping ---------------------------------------------------------------


def _refuse_unless_empty() -> None:
    busy = [m._meta.label for m in [Entry, *exported_models()] if m._default_manager.exists()]
    if busy:
        raise ImportRefused(f"the database is not empty ({', '.join(busy[:5])} have rows): import into a fresh one")


def _reset_sequences() -> None:
    """Rows came with their primary keys: move PostgreSQL's id sequences past them."""
    statements = connection.ops.sequence_reset_sql(no_style(), exported_models())
    with connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement)


def _plain(value):
    """JSON for what Django's python serializer leaves as objects, at full precision (no millisecond cut)."""
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, io.IOBase):
        raise TypeError("file fields are not exported")
    return str(value)  # Decimal, UUID
