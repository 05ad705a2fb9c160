"""Reads from the ledger: proofs, pages, the latest checkpoint. O(log n) rows per proof."""
from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import connection

from . import merkle
from .models import Checkpoint, Entry
from .services import node_hashes


def ledger_size() -> int:
    with connection.cursor() as cursor:  # raw: every proof request asks this
        cursor.execute("SELECT MAX(seq) FROM ledger_entry")
        (last,) = cursor.fetchone()
    return 0 if last is None else last + 1


def entries_page(start: int, end: int) -> list[dict]:
    """Entries with start <= seq < end, as stored (the caller bounds the page)."""
    size = ledger_size()
    if end > size:
        raise ValidationError({"end": f"must be at most the log size ({size})"})
    if start > end:
        raise ValidationError({"start": "must not exceed end"})
    fields = ("seq", "leaf", "hash", "kind", "actor", "time")
    return list(Entry.objects.filter(seq__gte=start, seq__lt=end).order_by("seq").values(*fields))


def inclusion_proof(index: int, size: int) -> list[bytes]:
    _check_size("size", size)
    if index >= size:
        raise ValidationError({"index": f"must be less than size ({size})"})
    return _proof(merkle.inclusion_ranges(index, size))


def inclusion_proofs(indices: list[int], size: int, size_is_signed: bool = False) -> dict[int, list[bytes]]:
    """Several inclusion proofs in one tree, their nodes read in one round trip (chip histories).

    size_is_signed: the size comes from one of our checkpoints, so it cannot exceed the log.
    """
    if not size_is_signed:
        _check_size("size", size)
    if any(index >= size for index in indices):
        raise ValidationError({"index": f"must be less than size ({size})"})
    ranges = {index: merkle.inclusion_ranges(index, size) for index in indices}
    nodes = node_hashes(sorted({node for r in ranges.values() for node in merkle.nodes_for_ranges(r)}))
    return {index: merkle.hashes_for_ranges(r, nodes) for index, r in ranges.items()}


def consistency_proof(first: int, second: int) -> list[bytes]:
    _check_size("second", second)
    if first > second:
        raise ValidationError({"first": f"must not exceed second ({second})"})
    return _proof(merkle.consistency_ranges(first, second))


def _check_size(field: str, size: int) -> None:
    current = ledger_size()
    if size > current:
        raise ValidationError({field: f"exceeds the log size ({current})"})


def _proof(ranges) -> list[bytes]:
    return merkle.hashes_for_ranges(ranges, node_hashes(merkle.nodes_for_ranges(ranges)))


def checkpoint_latest() -> Checkpoint | None:
    return Checkpoint.objects.order_by("-size").first()


def checkpoint_text(checkpoint: Checkpoint) -> str:
    """The signed checkpoint with every witness cosignature we hold for its size appended."""
    lines = checkpoint.cosignatures.order_by("witness__name").values_list("line", flat=True)
    return checkpoint.note + "".join(line + "\n" for line in lines)


def entry_leaf_hash(seq: int) -> bytes | None:
    found = Entry.objects.filter(seq=seq).values_list("hash", flat=True).first()
    return None if found is None else bytes(found)
