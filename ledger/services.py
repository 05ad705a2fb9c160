"""Writes to the ledger: the only code that creates Entry, TreeNode and Checkpoint rows.

Every write takes the ledger's write lock inside the caller's transaction, so
a projection written in the same ``transaction.atomic()`` block commits or
rolls back together with its entries (docs/ARCHITECTURE.md, The flow).
"""

from __future__ import annotations

import base64
import logging
import re
import time as time_module
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import orjson
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models.base import ModelState
from django.utils import timezone

from tlog import chain, merkle, note
from tlog.chain import LedgerFault, format_time  # format_time: the leaf's time text, used by the apps too

from . import keys, selectors
from .bulk import insert_rows
from .models import Checkpoint, Cosignature, Entry, TreeNode, Witness
from .selectors import frontier_hashes

log = logging.getLogger(__name__)

KIND_PATTERN = re.compile(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+")
ACTOR_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")
SUBMISSION_KEYS = {"key", "body", "sig"}
# Arbitrary but fixed: the PostgreSQL advisory lock that serialises ledger writers.
LEDGER_LOCK_ID = 0x6368_6970_6C65_6467 & 0x7FFF_FFFF_FFFF_FFFF  # "chipledg"
# 10,000-entry batches must fit one transaction; bound them so a caller cannot exhaust memory.
MAX_BATCH = 100_000
# C2SP tlog-tiles entry bundles prefix each entry with a big-endian uint16 length, and the spec fixes that
# format at tile/entries/: a leaf longer than this could not be served there, so it is never written.
MAX_LEAF_BYTES = 65_535


# Called with each appended batch inside the append's transaction: apps that keep an index of
# entries (the desk's "entries about X") register here, so ledger imports none of them.
APPEND_LISTENERS: list[Callable[[list[Entry]], None]] = []


def append_listener_add(listener: Callable[[list[Entry]], None]) -> None:
    if listener not in APPEND_LISTENERS:
        APPEND_LISTENERS.append(listener)


# What append_entry returns: read its seq, time, kind, actor and payload (apps never import ledger.models).
AppendedEntry = Entry


class Conflict(Exception):
    """A request that contradicts what the ledger already holds (HTTP 409)."""


@dataclass(frozen=True)
class NewEntry:
    kind: str
    payload: dict
    actor: str
    submission: dict | None = None


def append_entry(kind: str, payload: dict, actor: str, submission: dict | None = None) -> Entry:
    """Append one entry; see ``append_entries``."""
    return append_entries([NewEntry(kind, payload, actor, submission)])[0]


def append_entries(entries: Sequence[NewEntry]) -> list[Entry]:
    """Append ``entries`` in order, in one transaction, under the ledger's write lock.

    Raises ``ValidationError`` (naming the item and field) before anything is written.
    """
    if not entries:
        return []
    if len(entries) > MAX_BATCH:
        raise ValidationError({"entries": f"at most {MAX_BATCH} entries per batch"})
    for position, entry in enumerate(entries):
        _validate(entry, position)
    with transaction.atomic():
        _lock_ledger()
        size, prev_hash, prev_time = _head()
        _refuse_if_behind_its_checkpoint(size)
        when = max(timezone.now(), prev_time) if prev_time else timezone.now()
        rows = _build_rows(entries, size, prev_hash, when)
        frontier = frontier_hashes(size)
        _, nodes = merkle.append_leaves(frontier, size, [bytes(row.hash) for row in rows])
        insert_rows(Entry._meta.db_table, ENTRY_COLUMNS, [_entry_values(row) for row in rows])
        insert_rows(TreeNode._meta.db_table, ("level", "index", "hash"), nodes)
        for listener in APPEND_LISTENERS:
            listener(rows)
        if size == 0:
            checkpoint_sign()  # the first entry is signed for at once: a non-empty log always has a checkpoint
    return rows


# (size, root) of the latest checkpoint whose prefix this process has checked: the root once, the size always.
_extends_checkpoint: tuple[int, bytes] | None = None


def _refuse_if_behind_its_checkpoint(size: int) -> None:
    """Nothing appends to, or signs, a log that does not extend its latest signed checkpoint.

    A log that shrank (a TRUNCATE past the triggers, a restored old backup) or was refilled differently
    would otherwise grow a fork that contradicts what witnesses and verifiers hold.
    """
    global _extends_checkpoint
    latest = Checkpoint.objects.order_by("-size").first()
    if latest is None:
        return
    known = (latest.size, bytes(latest.root))
    problem = selectors.checkpoint_problem(size, latest, check_root=known != _extends_checkpoint)
    if problem:
        raise LedgerFault(min(size, latest.size), problem)
    _extends_checkpoint = known


GENESIS_KIND = selectors.GENESIS_KIND


def ledger_open() -> bool:
    """Write the genesis entry (the log's origin and verifier key) if the log is empty; True if it did.

    Run at start-up (``manage.py ledger_open``); appending it also signs the first checkpoint.
    """
    with transaction.atomic():
        _lock_ledger()
        if _head()[0] != 0:
            return False
        append_entry(GENESIS_KIND, {"origin": keys.origin(), "verifier_key": keys.verifier_key()}, "system")
        return True


ENTRY_COLUMNS = ("seq", "time", "kind", "actor", "payload", "leaf", "hash")


def _entry_values(row: Entry) -> tuple:
    return (row.seq, row.time, row.kind, row.actor, orjson.dumps(row.payload).decode(), row.leaf, row.hash)


def _validate(entry: NewEntry, position: int) -> None:
    def fail(field: str, reason: str) -> None:
        raise ValidationError({f"entries[{position}].{field}": reason})

    if not isinstance(entry.kind, str) or not KIND_PATTERN.fullmatch(entry.kind) or len(entry.kind) > 64:
        fail("kind", "must be dotted lower-case words, e.g. 'chip.shipped' (at most 64 characters)")
    if not isinstance(entry.actor, str) or not ACTOR_PATTERN.fullmatch(entry.actor):
        fail("actor", "must be an organisation slug or 'system'")
    if not isinstance(entry.payload, dict):
        fail("payload", "must be a JSON object")
    if entry.submission is not None:
        if not isinstance(entry.submission, dict) or set(entry.submission) != SUBMISSION_KEYS:
            fail("submission", "must have exactly the keys key, body, sig")
        if not all(isinstance(value, str) for value in entry.submission.values()):
            fail("submission", "key, body and sig must be strings")


def ledger_write_lock() -> None:
    """Hold the ledger's write lock until the caller's transaction ends (a consistent export)."""
    _lock_ledger()


def _lock_ledger() -> None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [LEDGER_LOCK_ID])
    # SQLite: transactions are BEGIN IMMEDIATE (settings), which already holds
    # the database's single write lock for the whole transaction.


def _head() -> tuple[int, bytes, datetime | None]:
    """(size, hash of the last entry, its time). Raw SQL: this runs on every append."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT seq, hash, time FROM ledger_entry ORDER BY seq DESC LIMIT 1")
        last = cursor.fetchone()
    if last is None:
        return 0, bytes(32), None
    seq, digest, when = last
    if isinstance(when, str):
        when = datetime.fromisoformat(when)
    if when.tzinfo is None:  # SQLite stores naive UTC
        when = when.replace(tzinfo=UTC)
    return seq + 1, bytes(digest), when


def _build_rows(entries: Sequence[NewEntry], size: int, prev_hash: bytes, when: datetime) -> list[Entry]:
    stamp = format_time(when)
    rows = []
    for offset, entry in enumerate(entries):
        seq = size + offset
        try:
            leaf = chain.canonical_leaf(
                seq, stamp, entry.kind, entry.actor, entry.payload, prev_hash.hex(), entry.submission
            )
        except Exception as error:  # rfc8785 raises its own types for non-I-JSON values
            raise ValidationError({f"entries[{offset}].payload": f"not canonicalisable JSON: {error}"}) from error
        if len(leaf) > MAX_LEAF_BYTES:
            raise ValidationError(
                {
                    f"entries[{offset}]": f"the ledger entry would be {len(leaf)} bytes; at most {MAX_LEAF_BYTES} "
                    "(a C2SP tlog-tiles entry): send fewer chips, or a smaller body, per request"
                }
            )
        digest = merkle.leaf_hash(leaf)
        rows.append(_saved_entry(seq, when, entry.kind, entry.actor, entry.payload, leaf, digest))
        prev_hash = digest
    return rows


def _saved_entry(seq, when, kind, actor, payload, leaf, digest) -> Entry:
    """An Entry instance for a row we insert ourselves.

    Model.__init__ costs ~10 µs (signals, field defaults) — half the append
    budget — so set the attributes directly, as Model.from_db leaves them.
    """
    entry = Entry.__new__(Entry)
    entry.__dict__.update(seq=seq, time=when, kind=kind, actor=actor, payload=payload, leaf=leaf, hash=digest)
    entry._state = ModelState()
    entry._state.adding = False
    entry._state.db = connection.alias
    return entry


# --- Checkpoints ----------------------------------------------------------------


def checkpoint_sign() -> Checkpoint:
    """Sign a checkpoint of the current tree, unless the latest one already covers it."""
    with transaction.atomic():
        _lock_ledger()
        size, _, _ = _head()
        _refuse_if_behind_its_checkpoint(size)
        latest = Checkpoint.objects.order_by("-size").first()
        if latest is not None and latest.size == size:
            return latest
        root = merkle.root(frontier_hashes(size))
        origin = keys.origin()
        body = note.checkpoint_body(origin, size, root)
        text = note.sign_note(body, origin, keys.signing_key())
        return Checkpoint.objects.create(size=size, root=root, note=text)


def checkpoint_if_grown() -> Checkpoint | None:
    """Sign a new checkpoint only if entries were appended since the last one."""
    latest = Checkpoint.objects.order_by("-size").values_list("size", flat=True).first()
    size, _, _ = _head()
    if latest is not None and latest == size:
        return None
    return checkpoint_sign()


# --- Witnesses ------------------------------------------------------------------


def witness_register(vkey: str, actor: str) -> Witness:
    """Record (on the ledger) that the log accepts cosignatures from this witness key."""
    try:
        verifier = note.parse_verifier_key(vkey.strip())
    except note.NoteError as error:
        raise ValidationError({"verifier_key": str(error)}) from error
    if verifier.sig_type != note.COSIGNATURE_V1:
        raise ValidationError({"verifier_key": "must be a cosignature/v1 key (type 0x04)"})
    with transaction.atomic():
        _lock_ledger()  # a twin registered at the same moment is committed before the check: refused by name
        if Witness.objects.filter(verifier_key=vkey.strip()).exists():
            raise ValidationError({"verifier_key": "this witness key is already registered"})
        entry = append_entry("ledger.witness_registered", {"name": verifier.name, "verifier_key": vkey.strip()}, actor)
        return Witness.objects.create(
            name=verifier.name,
            verifier_key=vkey.strip(),
            key_id=verifier.key_id,
            public_key=verifier.public_key,
            registered_seq=entry.seq,
        )


def witness_revoke(vkey: str, actor: str) -> Witness:
    with transaction.atomic():
        witness = (
            Witness.objects.select_for_update(no_key=True).filter(verifier_key=vkey.strip(), revoked_seq=None).first()
        )
        if witness is None:
            raise ValidationError({"verifier_key": "no active witness with this key"})
        entry = append_entry(
            "ledger.witness_revoked", {"name": witness.name, "verifier_key": witness.verifier_key}, actor
        )
        witness.revoked_seq = entry.seq
        witness.save(update_fields=["revoked_seq"])
        return witness


def cosignature_add(checkpoint_text: str, cosignature_line: str) -> Cosignature:
    """Accept a registered witness's cosignature over one of our checkpoints (idempotent)."""
    body, our = _our_checkpoint(checkpoint_text)
    signature = _parse_signature_line(body, cosignature_line)
    witness = Witness.objects.filter(name=signature.name, key_id=signature.key_id, revoked_seq=None).first()
    if witness is None:
        raise ValidationError(
            {"cosignature": f"no registered witness named {signature.name!r} with key id {signature.key_id.hex()}"}
        )
    verifier = note.Verifier(witness.name, note.COSIGNATURE_V1, bytes(witness.public_key), bytes(witness.key_id))
    try:
        stamp = note.verify_cosignature(body, signature, verifier)
    except note.NoteError as error:
        raise ValidationError({"cosignature": f"signature does not verify: {error}"}) from error
    if stamp > time_module.time() + settings.LEDGER_COSIGNATURE_MAX_SKEW:
        raise ValidationError({"cosignature": "timestamp is in the future"})
    existing = Cosignature.objects.filter(checkpoint=our, witness=witness).first()
    if existing is not None:
        return existing
    return Cosignature.objects.create(
        checkpoint=our, witness=witness, timestamp=stamp, line=cosignature_line.strip("\n")
    )


def _our_checkpoint(checkpoint_text: str) -> tuple[str, Checkpoint]:
    try:
        body, parsed = note.open_checkpoint(checkpoint_text, note.parse_verifier_key(keys.verifier_key()))
    except note.NoteError as error:
        raise ValidationError({"checkpoint": f"not a checkpoint signed by this log: {error}"}) from error
    ours = Checkpoint.objects.filter(size=parsed.size).first()
    if ours is None:
        raise ValidationError({"checkpoint": f"this log signed no checkpoint of size {parsed.size}"})
    our_body, _ = note.split_note(ours.note)
    if our_body != body:
        # Someone showed a witness a different tree of the same size: evidence of a split view.
        log.error("cosignature offered for a foreign checkpoint of size %s", parsed.size)
        raise Conflict(f"checkpoint of size {parsed.size} differs from the one this log signed")
    return body, ours


def _parse_signature_line(body: str, line: str) -> note.Signature:
    try:
        _, signatures = note.split_note(body + "\n" + line.strip("\n") + "\n")
    except note.NoteError as error:
        raise ValidationError({"cosignature": f"not a signature line: {error}"}) from error
    if len(signatures) != 1:
        raise ValidationError({"cosignature": "must be exactly one signature line"})
    return signatures[0]


# --- Witnessing (C2SP tlog-witness, the log's side) ---------------------------------


@dataclass(frozen=True)
class WitnessAnswer:
    witness: str
    status: int | None  # the HTTP status of the last request; None: no answer
    detail: str


def witnesses_cosign_latest() -> list[WitnessAnswer]:
    """Ask every active witness that has not cosigned the latest checkpoint to cosign it (add-checkpoint).

    The old size sent is the largest checkpoint the witness cosigned for us; a 409 names the size the witness
    holds, and the request is sent once more from that size. Cosignatures returned are checked and kept
    (``cosignature_add``). Network calls run outside any transaction; a witness that fails is asked again
    on the next call (the beat's, after each checkpoint).
    """
    checkpoint = selectors.checkpoint_latest()
    if checkpoint is None:
        return []
    answers = []
    for witness in selectors.witnesses_to_ask(checkpoint):
        url = settings.LEDGER_WITNESS_URLS.get(witness.name)
        if not url:
            answers.append(WitnessAnswer(witness.name, None, "no URL configured (LEDGER_WITNESS_URLS)"))
            continue
        answers.append(_ask_witness(witness, url, checkpoint))
    return answers


def _ask_witness(witness: Witness, url: str, checkpoint: Checkpoint) -> WitnessAnswer:
    old = min(selectors.witness_cosigned_size(witness.id), checkpoint.size)
    for _attempt in range(2):
        status, body = _post_add_checkpoint(url, _add_checkpoint_body(old, checkpoint))
        if status == 409:
            held = _size_of(body)
            if held is None or held > checkpoint.size:
                log.error(
                    "witness %s holds size %r, beyond our checkpoint %s", witness.name, body[:40], checkpoint.size
                )
                return WitnessAnswer(witness.name, status, f"the witness holds size {body[:40]!r}")
            old = held  # its record is what counts: send the proof from there
            continue
        if status != 200:
            log.warning("witness %s answered %s: %s", witness.name, status, body[:200])
            return WitnessAnswer(witness.name, status, body[:200])
        kept = 0
        for line in body.splitlines():
            try:
                cosignature_add(checkpoint.note, line)
                kept += 1
            except (ValidationError, Conflict) as error:  # a line from another key, or a bad one: not kept
                log.warning("witness %s returned a cosignature we cannot use: %s", witness.name, error)
        return WitnessAnswer(witness.name, status, f"{kept} cosignature(s) kept")
    return WitnessAnswer(witness.name, 409, "the witness's size changed between two requests")


def _add_checkpoint_body(old: int, checkpoint: Checkpoint) -> bytes:
    proof = selectors.consistency_proof(old, checkpoint.size) if 0 < old < checkpoint.size else []
    lines = "".join(base64.b64encode(digest).decode() + "\n" for digest in proof)
    return f"old {old}\n{lines}\n{checkpoint.note}".encode()


def _size_of(body: str) -> int | None:
    text = body.removesuffix("\n")
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 20 else None


def _post_add_checkpoint(url: str, data: bytes) -> tuple[int | None, str]:
    request = urllib.request.Request(
        url.rstrip("/") + "/add-checkpoint", data=data, method="POST", headers={"Content-Type": "text/plain"}
    )
    try:
        with urllib.request.urlopen(request, timeout=settings.LEDGER_WITNESS_TIMEOUT) as answer:
            return answer.status, answer.read(64 * 1024).decode("utf-8", "replace")
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read(64 * 1024).decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError) as error:
        return None, f"cannot reach the witness: {getattr(error, 'reason', error)}"
