"""Full integrity check of the stored ledger (``manage.py verify_ledger``). Read-only.

Recomputes, from the stored leaf bytes alone: every leaf hash, the ``prev``
chain, contiguous ``seq``, the tree root at every checkpoint, each
checkpoint's signature, and that the queryable columns agree with the leaves.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import orjson
from django.db import connection

from tlog import chain, note
from tlog.chain import LedgerFault

from . import keys, selectors
from .models import Checkpoint

CHUNK = 10_000


@dataclass(frozen=True)
class Report:
    entries: int
    root: bytes
    checkpoints: int


def verify_stored_ledger(progress: Callable[[int], None] | None = None) -> Report:
    verifier = chain.ChainVerifier()
    checkpoints = selectors.checkpoints_by_size()
    _check_checkpoint_at(verifier, checkpoints)
    for seq, leaf, stored_hash, kind, actor, when, payload in _stored_rows():
        digest, parsed = verifier.feed(seq, bytes(leaf))
        if bytes(stored_hash) != digest:
            raise LedgerFault(seq, "stored hash does not match SHA-256(0x00 || leaf)")
        _check_columns(seq, parsed, kind, actor, when, payload)
        _check_checkpoint_at(verifier, checkpoints)
        if progress is not None and verifier.size % CHUNK == 0:
            progress(verifier.size)
    if checkpoints:
        size = min(checkpoints)
        raise LedgerFault(size - 1, f"checkpoint of size {size} is beyond the log's {verifier.size} entries")
    root = verifier.root()
    _check_tree_cache(verifier.size, root)
    return Report(entries=verifier.size, root=root, checkpoints=selectors.checkpoint_count())


def _stored_rows():
    """Every entry in seq order, keyset-paged, time and payload as stored text.

    Raw SQL, because the ORM's per-row datetime and JSON conversion would cost
    more than all the verification itself.
    """
    if connection.vendor == "postgresql":
        time_sql, payload_sql = """to_char(time AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')""", "payload::text"
    else:
        time_sql, payload_sql = "time || ''", "payload"  # an expression: no datetime converter
    return selectors.keyset_rows(f"leaf, hash, kind, actor, {time_sql}, {payload_sql}", page=CHUNK)


def _rfc3339(stored: str) -> str:
    """PostgreSQL already gives RFC 3339; SQLite keeps 'YYYY-MM-DD HH:MM:SS[.ffffff]' (naive UTC)."""
    if stored.endswith("Z"):
        return stored
    text = stored.replace(" ", "T")
    return (text if "." in text else text + ".000000") + "Z"


def _load_json(text: str):
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:  # e.g. an integer beyond 64 bits
        return json.loads(text)


def _check_columns(seq: int, parsed: dict, kind: str, actor: str, when: str, payload: str) -> None:
    if parsed["kind"] != kind:
        raise LedgerFault(seq, "stored kind column differs from the leaf")
    if parsed["actor"] != actor:
        raise LedgerFault(seq, "stored actor column differs from the leaf")
    if parsed["time"] != _rfc3339(when):
        raise LedgerFault(seq, "stored time column differs from the leaf")
    if parsed["payload"] != _load_json(payload):
        raise LedgerFault(seq, "stored payload column differs from the leaf")


def _check_checkpoint_at(verifier: chain.ChainVerifier, pending: dict[int, Checkpoint]) -> None:
    """If a checkpoint was signed at the verifier's current size, check it against the recomputed root."""
    checkpoint = pending.pop(verifier.size, None)
    if checkpoint is None:
        return
    seq = verifier.size - 1
    root = verifier.root()
    if bytes(checkpoint.root) != root:
        raise LedgerFault(seq, f"checkpoint of size {checkpoint.size}: root does not match the entries")
    try:
        _, signed = note.open_checkpoint(checkpoint.note, note.parse_verifier_key(keys.verifier_key()))
    except note.NoteError as error:
        raise LedgerFault(seq, f"checkpoint of size {checkpoint.size}: signature does not verify ({error})") from error
    if (signed.size, signed.root, signed.extensions) != (checkpoint.size, root, ()):
        raise LedgerFault(seq, f"checkpoint of size {checkpoint.size}: signed body does not match the entries")


def _check_tree_cache(size: int, root: bytes) -> None:
    """Proofs are served from the node cache, so its frontier must fold to the recomputed root."""
    try:
        cached = selectors.root_at(size)
    except RuntimeError as error:
        raise LedgerFault(max(size - 1, 0), str(error)) from error
    if cached != root:
        raise LedgerFault(max(size - 1, 0), "tree node cache does not fold to the recomputed root")
