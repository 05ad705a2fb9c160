"""Export the ledger (and the tables beside it) to a file, and import it into an empty database.

The file is JSON Lines (gzip when its name ends in ``.gz``): a header, then every entry as its exact
leaf bytes, then every other row of the project's tables as Django's serializer writes it, then a
trailer. Entries and tree nodes are not copied as rows: the import re-derives their columns from the
leaves and the tree from the hashes, so a file cannot smuggle in a column that disagrees with its
leaf. Everything else (checkpoints, cosignatures, witnesses, the registry's and the inspections'
projections, campaign seeds, the private case files) is copied as it is, so the imported database
passes ``verify_ledger`` and ``rebuild_projections --check`` exactly as the exported one did.

A backup proves itself (docs/operations.md "Backups"):

- the export signs a checkpoint of the whole log first and writes the entries up to it, holding the
  ledger's write lock, so the entries end exactly at a signed checkpoint and the rows match them;
- the trailer holds the row count of every table and the SHA-256 of every byte before it, in a note
  signed with the log's key: a cut, truncated or edited file is refused before anything is written;
- the import refuses entries that do not end exactly at a checkpoint verifying under the log's pinned
  key (so an appended or re-chained entry needs the log's key), and, where the imported ledger has
  active witnesses, a last checkpoint without a valid cosignature from each of them (so it needs
  their keys too);
- users (and their memberships) and API tokens are imported only when named (``--include
  users,tokens``); otherwise their rows are skipped and counted.

The file holds secrets (campaign seeds, private case files, password hashes): keep it like the
database itself.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import time as time_module
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import date, datetime, time
from pathlib import Path

from django.apps import apps
from django.core import serializers
from django.core.management.color import no_style
from django.db import connection, transaction
from django.db.models import Model

from tlog import chain, merkle, note

from . import integrity, keys, selectors, services
from .bulk import insert_rows
from .models import Checkpoint, Entry, TreeNode, Witness
from .services import ENTRY_COLUMNS

FORMAT = "chipledger-export"
VERSION = 2
DERIVED = {Entry, TreeNode}  # rebuilt from the leaves on import
# Rows that belong to the framework or to a session, not to the regulator's world.
SKIPPED_APPS = {"contenttypes", "sessions", "admin", "messages", "staticfiles"}
# Created by migrate (permissions; the admin roles of registry.services.roles); users name them by natural key.
SKIPPED_MODELS = {"auth.permission", "auth.group"}
# Who may log in and act: imported only when the operator names the group (--include).
GUARDED = {"users": ("auth.user", "registry.member"), "tokens": ("registry.apitoken",)}
# Access-controlled tables beside the public ledger: rows of their own in the file, left out with private=False
# (a backup handed to someone who may read the ledger but not the case files).
PRIVATE = {"inspections.casetext"}
# The trailer's signed body: two lines, so it can never parse as a checkpoint (origin, size, root).
TRAILER_TITLE = "chipledger backup v2"
BATCH = 5000
# How often the export looks for the witnesses' cosignatures while it waits for them.
COSIGNATURE_POLL_SECONDS = 0.5
EXPORT_ATTEMPTS = 3


class ImportRefused(Exception):
    """The file or the target database is not fit for an import; nothing was written."""


class ExportRefused(Exception):
    """No backup could be written that would import (e.g. the witnesses did not cosign); no file was left."""


@dataclass
class ImportResult:
    header: dict
    skipped: Counter = field(default_factory=Counter)  # label -> rows not imported (guarded, not named)


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


# --- export ----------------------------------------------------------------------------------


def export_ledger(path: Path, witness_wait: float = 60.0, private: bool = True) -> dict:
    """Sign a checkpoint, wait for the active witnesses' cosignatures on it, write the file; returns the header.

    The rows are read under the ledger's write lock, with the head still at the signed checkpoint (if the
    log grew while waiting for the witnesses, sign again, at most ``EXPORT_ATTEMPTS`` times).
    """
    path = Path(path)
    for _ in range(EXPORT_ATTEMPTS):
        checkpoint = services.checkpoint_sign()
        _await_cosignatures(checkpoint, witness_wait)
        with transaction.atomic():
            services.ledger_write_lock()
            if selectors.ledger_size() != checkpoint.size:
                continue  # appended meanwhile: the rows would run past the checkpoint
            try:
                return _write(path, checkpoint, private)
            except BaseException:
                path.unlink(missing_ok=True)
                raise
    raise ExportRefused(f"the log kept growing during {EXPORT_ATTEMPTS} attempts; try again in a quieter moment")


def missing_cosigners(checkpoint: Checkpoint) -> list[str]:
    """Active witnesses without a cosignature on this checkpoint."""
    cosigned = set(checkpoint.cosignatures.values_list("witness_id", flat=True))
    return sorted(w.name for w in Witness.objects.filter(revoked_seq=None) if w.pk not in cosigned)


def _await_cosignatures(checkpoint: Checkpoint, wait: float) -> None:
    deadline = time_module.monotonic() + wait
    while missing := missing_cosigners(checkpoint):
        if time_module.monotonic() >= deadline:
            raise ExportRefused(
                f"checkpoint of size {checkpoint.size} lacks the cosignature of {', '.join(missing)}: "
                "a backup without it would not import (run the witnesses, or revoke a retired one)"
            )
        time_module.sleep(COSIGNATURE_POLL_SECONDS)


def _write(path: Path, checkpoint: Checkpoint, private: bool = True) -> dict:
    header = {
        "format": FORMAT,
        "version": VERSION,
        "verifier_key": keys.verifier_key(),
        "entries": checkpoint.size,
    }
    digest, counts = hashlib.sha256(), Counter()
    with _open(path, "wb") as out:

        def emit(item: dict) -> None:
            line = (json.dumps(item, default=_plain, ensure_ascii=False) + "\n").encode("utf-8")
            digest.update(line)
            out.write(line)

        emit(header)
        for seq, leaf in selectors.leaves(0, checkpoint.size):
            emit({"seq": seq, "leaf": base64.b64encode(leaf).decode()})
        for model in exported_models():
            label = model._meta.label_lower
            if label in PRIVATE and not private:
                continue
            counts[label] += 0
            for row in model._default_manager.order_by("pk").iterator(chunk_size=BATCH):
                emit(serializers.serialize("python", [row], use_natural_foreign_keys=True)[0])
                counts[label] += 1
        out.write(
            (json.dumps({"trailer": _trailer(checkpoint.size, dict(counts), digest.hexdigest())}) + "\n").encode()
        )
    return header


def _trailer_body(entries: int, rows: dict, sha256: str) -> str:
    rows_digest = hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()
    return f"{TRAILER_TITLE}\nentries {entries} rows {rows_digest} sha256 {sha256}\n"


def _trailer(entries: int, rows: dict, sha256: str) -> dict:
    signed = note.sign_note(_trailer_body(entries, rows, sha256), keys.origin(), keys.signing_key())
    return {"entries": entries, "rows": rows, "sha256": sha256, "signature": signed}


# --- import ----------------------------------------------------------------------------------


def import_ledger(path: Path, include: frozenset[str] | set[str] = frozenset()) -> ImportResult:
    """Load the file into an empty database, in one transaction.

    First pass: the trailer (count, SHA-256 and the log key's signature) must cover every byte of the
    file; nothing is written before. Second pass: load, then refuse (rolling everything back) unless the
    entries end exactly at a verifying checkpoint, cosigned by every active witness.
    """
    unknown = set(include) - set(GUARDED)
    if unknown:
        raise ImportRefused(f"--include names unknown groups {sorted(unknown)}; known: {sorted(GUARDED)}")
    if "tokens" in include and "users" not in include:
        raise ImportRefused("--include tokens needs users too: a token belongs to a user")
    trailer = _checked_trailer(path)
    with transaction.atomic():
        result = _load(path, trailer, _guarded_labels(include))
        _refuse_unless_ends_at_a_witnessed_checkpoint(result.header["entries"])
    return result


def _guarded_labels(include) -> set[str]:
    return {label for group, labels in GUARDED.items() if group not in include for label in labels}


def _open(path: Path, mode: str):
    path = Path(path)
    return gzip.open(path, mode) if path.suffix == ".gz" else open(path, mode)


def _raw_lines(path: Path) -> Iterator[bytes]:
    """Every line as bytes; a cut or corrupt gzip stream is an ImportRefused, never a traceback."""
    try:
        with _open(path, "rb") as handle:
            yield from handle
    except (EOFError, gzip.BadGzipFile, zlib.error) as error:
        raise ImportRefused(f"the file is cut short or corrupt ({error or type(error).__name__})") from error


def _checked_trailer(path: Path) -> dict:
    """Read the whole file once; return its trailer if it is signed by this log and covers every byte."""
    digest, trailer, count = hashlib.sha256(), None, 0
    for number, raw in enumerate(_raw_lines(path), start=1):
        if trailer is not None:
            raise ImportRefused(f"line {number}: something follows the trailer")
        item = _json(raw, number) if raw.startswith(b'{"trailer"') else None
        if item is not None and set(item) == {"trailer"}:
            trailer = item["trailer"]
            continue
        digest.update(raw)
        count = number
    if count == 0:
        raise ImportRefused("the file is empty")
    if trailer is None:
        raise ImportRefused(f"the file ends at line {count} without its trailer: it was cut short")
    _verify_trailer(trailer)
    if trailer["sha256"] != digest.hexdigest():
        raise ImportRefused("the file's SHA-256 differs from its trailer's: it was altered or cut")
    return trailer


def _verify_trailer(trailer) -> None:
    if (
        not isinstance(trailer, dict)
        or type(trailer.get("entries")) is not int
        or not isinstance(trailer.get("rows"), dict)
        or not all(type(n) is int and n >= 0 for n in trailer["rows"].values())
        or not isinstance(trailer.get("sha256"), str)
        or not isinstance(trailer.get("signature"), str)
    ):
        raise ImportRefused("the trailer needs entries, rows (counts), sha256 and signature")
    try:
        body = note.verify_note(trailer["signature"], note.parse_verifier_key(keys.verifier_key()))
    except note.NoteError as error:
        raise ImportRefused(f"the trailer is not signed by this log's key ({error})") from error
    if body != _trailer_body(trailer["entries"], trailer["rows"], trailer["sha256"]):
        raise ImportRefused("the trailer's signature is over other counts or another SHA-256")


def _load(path: Path, trailer: dict, guarded: set[str]) -> ImportResult:
    lines = enumerate(_raw_lines(path), start=1)
    digest = hashlib.sha256()
    first = next(lines, (1, None))[1]
    header = _header(first)
    digest.update(first)
    if header["verifier_key"] != keys.verifier_key():
        raise ImportRefused(
            "the file was signed for by another log key: set LEDGER_SIGNING_KEY to that log's key first"
        )
    _refuse_unless_empty()
    result = ImportResult(header)
    verifier, stack, pending, allowed, rows_started = chain.ChainVerifier(), [], [], _labels(), False
    counts: Counter = Counter()
    for number, raw in lines:
        if not raw.strip():
            digest.update(raw)
            continue
        item = _json(raw, number)
        if set(item) == {"trailer"}:
            break
        digest.update(raw)
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
        counts[item.get("model")] += 1
        if item.get("model") in guarded:
            result.skipped[item["model"]] += 1
            continue
        _load_record(item, number, allowed)
    _insert_entries(pending, stack)
    _check_entry_count(verifier, header)
    if digest.hexdigest() != trailer["sha256"]:
        raise ImportRefused("the file changed while it was imported")
    if header["entries"] != trailer["entries"] or {k: v for k, v in counts.items()} != {
        k: v for k, v in trailer["rows"].items() if v
    }:
        raise ImportRefused("the rows in the file differ from the counts in its trailer")
    _reset_sequences()
    try:
        integrity.verify_stored_ledger()  # still inside the transaction: a bad file leaves nothing behind
    except chain.LedgerFault as fault:
        raise ImportRefused(f"the imported ledger does not verify: {fault}") from fault
    return result


def _refuse_unless_ends_at_a_witnessed_checkpoint(size: int) -> None:
    """The entries end exactly at a checkpoint (its signature is checked by verify_stored_ledger), and every
    witness active on the imported ledger cosigned it: a forged tail needs the log's key and theirs."""
    last = selectors.checkpoint_latest()
    if last is None or last.size != size:
        raise ImportRefused(
            f"the entries end at {size}, but the newest signed checkpoint covers "
            f"{'none' if last is None else last.size}: entries beyond a signed checkpoint are refused"
        )
    body, _ = note.split_note(last.note)
    for witness in Witness.objects.filter(revoked_seq=None).order_by("name"):
        verifier = note.Verifier(witness.name, note.COSIGNATURE_V1, bytes(witness.public_key), bytes(witness.key_id))
        lines = [c.line for c in last.cosignatures.filter(witness=witness)]
        try:
            if not lines:
                raise note.NoteError("no cosignature")
            note.verify_cosignature(body, note.split_note(body + "\n" + lines[0] + "\n")[1][0], verifier)
        except note.NoteError as error:
            raise ImportRefused(
                f"checkpoint of size {size} is not cosigned by active witness {witness.name} ({error})"
            ) from error


def _json(raw: bytes, number: int) -> dict:
    try:
        item = json.loads(raw)
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError
        raise ImportRefused(f"line {number}: not JSON ({error})") from error
    if not isinstance(item, dict):
        raise ImportRefused(f"line {number}: not a JSON object")
    return item


def _header(line: bytes | None) -> dict:
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
