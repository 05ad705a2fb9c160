"""The one read API of the ledger: entries, leaves, tree nodes, roots, proofs, checkpoints.

Apps outside ``ledger`` read the ledger only through this module (docs/ARCHITECTURE.md, Parts): it
is the only place that names the ledger's tables. Proofs read O(log n) rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import connection
from django.db.models import Count, Q

from tlog import merkle
from tlog.extract import build_extract

from .models import Checkpoint, Entry

ENTRY_FIELDS = ("seq", "time", "kind", "actor", "payload")
PAGE_ROWS = 5000  # keyset page: bounded memory, one round trip per page


def node_hashes(ids: Sequence[merkle.NodeId]) -> dict[merkle.NodeId, bytes]:
    """Hashes of complete subtrees: level 0 from entries, higher levels from the node cache.

    One raw query per table: proofs and appends call this for O(log n) ids, and
    the ORM's compilation of a composite-key IN would cost more than the lookup.
    """
    leaves = sorted({index for level, index in ids if level == 0})
    inner = sorted({(level, index) for level, index in ids if level > 0})
    found: dict[merkle.NodeId, bytes] = {}
    with connection.cursor() as cursor:
        if leaves:
            marks = ", ".join(["%s"] * len(leaves))
            cursor.execute(f"SELECT seq, hash FROM ledger_entry WHERE seq IN ({marks})", leaves)
            found.update({(0, seq): bytes(digest) for seq, digest in cursor.fetchall()})
        if inner:
            where = " OR ".join(['(level = %s AND "index" = %s)'] * len(inner))
            cursor.execute(
                f'SELECT level, "index", hash FROM ledger_treenode WHERE {where}', [v for pair in inner for v in pair]
            )
            found.update({(level, index): bytes(digest) for level, index, digest in cursor.fetchall()})
    missing = set(ids) - found.keys()
    if missing:
        raise RuntimeError(f"ledger tree cache is missing nodes {sorted(missing)[:5]}: run verify_ledger")
    return found


def frontier_hashes(size: int) -> list[bytes]:
    """The roots of the complete subtrees of the first ``size`` leaves, left to right."""
    ids = merkle.frontier_nodes(size)
    found = node_hashes(ids)
    return [found[node] for node in ids]


def root_at(size: int) -> bytes:
    """The tree root of the first ``size`` entries, from the node cache (O(log n) rows)."""
    return merkle.root(frontier_hashes(size))


def keyset_rows(columns: str, start: int = 0, end: int | None = None, page: int = PAGE_ROWS) -> Iterator[tuple]:
    """Rows ``(seq, *columns)`` of entries with start <= seq < end, in seq order, one keyset page at a time.

    ``columns`` is SQL over ledger_entry's columns (callers in ``ledger`` pick stored text forms).
    """
    query = f"SELECT seq, {columns} FROM ledger_entry WHERE seq >= %s AND seq < %s ORDER BY seq LIMIT %s"
    stop = end if end is not None else 2**62
    while True:
        with connection.cursor() as cursor:
            cursor.execute(query, [start, stop, page])
            rows = cursor.fetchall()
        if not rows:
            return
        yield from rows
        start = rows[-1][0] + 1


def leaves(start: int = 0, end: int | None = None) -> Iterator[tuple[int, bytes]]:
    """``(seq, leaf bytes)`` for start <= seq < end, in order: what a rebuild or an audit replays."""
    for seq, leaf in keyset_rows("leaf", start, end):
        yield seq, bytes(leaf)


def first_entry(kind: str, **payload_match) -> dict | None:
    """The earliest entry of ``kind`` whose payload has these top-level values (seq, time, kind, actor, payload)."""
    lookups = {f"payload__{key}": value for key, value in payload_match.items()}
    return Entry.objects.filter(kind=kind, **lookups).order_by("seq").values(*ENTRY_FIELDS).first()


def entries_of(kind: str, limit: int = 100, **payload_match) -> list[dict]:
    """The earliest ``limit`` entries of ``kind`` whose payload has these top-level values, in seq order."""
    lookups = {f"payload__{key}": value for key, value in payload_match.items()}
    return list(Entry.objects.filter(kind=kind, **lookups).order_by("seq").values(*ENTRY_FIELDS)[:limit])


def entries_at(seqs: Iterable[int]) -> list[dict]:
    """The entries with these seqs (ints, or a query of a ``seq`` column), in seq order: seq, time, kind, actor, payload."""
    return list(Entry.objects.filter(seq__in=seqs).order_by("seq").values(*ENTRY_FIELDS))


def entry_times(seqs: Iterable[int]) -> dict[int, datetime]:
    """seq -> the ledger's time of each of these entries."""
    return dict(Entry.objects.filter(seq__in=seqs).values_list("seq", "time"))


def latest_actor_by(seqs, when: datetime) -> str | None:
    """The actor of the latest of these entries (ints, or a query of a ``seq`` column) made at or before ``when``."""
    return Entry.objects.filter(seq__in=seqs, time__lte=when).order_by("-seq").values_list("actor", flat=True).first()


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


GENESIS_KIND = "ledger.opened"


def genesis_origin() -> str | None:
    """The origin the log's genesis entry (entry 0) recorded; None before the log is opened."""
    payload = Entry.objects.filter(seq=0, kind=GENESIS_KIND).values_list("payload", flat=True).first()
    origin = payload.get("origin") if isinstance(payload, dict) else None
    return origin if isinstance(origin, str) else None


def checkpoint_problem(size: int, checkpoint: Checkpoint, check_root: bool = True) -> str | None:
    """Why a log of ``size`` entries does not extend ``checkpoint``, or None (O(log n) rows)."""
    if size < checkpoint.size:
        return f"the log has {size} entries, fewer than its signed checkpoint of size {checkpoint.size}"
    if not check_root:
        return None
    try:
        root = root_at(checkpoint.size)
    except RuntimeError as error:
        return str(error)
    if root != bytes(checkpoint.root):
        return f"the log's first {checkpoint.size} entries do not match its signed checkpoint"
    return None


def checkpoint_served(quorum: int) -> Checkpoint | None:
    """The checkpoint the log publishes: the newest with at least ``quorum`` cosignatures from active witnesses.

    Until one reaches the quorum (a new log, witnesses down), the newest checkpoint: verifiers apply their own
    witness policy to what they are served (``--witness``/``--quorum``).
    """
    if quorum > 0:
        cosigned = (
            Checkpoint.objects.annotate(
                cosigners=Count("cosignatures", filter=Q(cosignatures__witness__revoked_seq=None))
            )
            .filter(cosigners__gte=quorum)
            .order_by("-size")
            .first()
        )
        if cosigned is not None:
            return cosigned
    return checkpoint_latest()


def checkpoint_text(checkpoint: Checkpoint) -> str:
    """The signed checkpoint with every witness cosignature we hold for its size appended."""
    lines = checkpoint.cosignatures.order_by("witness__name").values_list("line", flat=True)
    return checkpoint.note + "".join(line + "\n" for line in lines)


def checkpoints_by_size() -> dict[int, Checkpoint]:
    return {checkpoint.size: checkpoint for checkpoint in Checkpoint.objects.all()}


def checkpoint_count() -> int:
    return Checkpoint.objects.count()


def entry_leaf_hash(seq: int) -> bytes | None:
    found = Entry.objects.filter(seq=seq).values_list("hash", flat=True).first()
    return None if found is None else bytes(found)


def witness_cosigned_size(witness_id: int) -> int:
    """The largest of our checkpoints this witness cosigned (0 if none): the old size it expects next."""
    sizes = Checkpoint.objects.filter(cosignatures__witness_id=witness_id).order_by("-size")
    return sizes.values_list("size", flat=True).first() or 0


def witnesses_to_ask(checkpoint: Checkpoint) -> list:
    """Active witnesses that have not cosigned ``checkpoint`` yet."""
    from .models import Witness

    return list(Witness.objects.filter(revoked_seq=None).exclude(cosignatures__checkpoint=checkpoint))


def checkpoint_cosigners(checkpoint: Checkpoint) -> list[str]:
    """Names of the witnesses that cosigned this checkpoint."""
    return list(checkpoint.cosignatures.order_by("witness__name").values_list("witness__name", flat=True))


# --- extracts: some entries with their proofs, checked offline (tlog.extract) -------------------------

MAX_EXTRACT = 10_000  # entries in one extract (the latest ones; the document counts those left out)


def extract_of(subject: dict, seqs: list[int], verifier_key: str) -> dict:
    """A ``tlog.extract`` document: the entries at ``seqs`` (the latest MAX_EXTRACT) with their inclusion proofs
    against the checkpoint this log serves, signed by ``verifier_key``'s log (``ledger.keys``, which reads the
    genesis origin from here: passed in, not imported); entries newer than it are counted, not listed."""
    checkpoint = checkpoint_served(settings.LEDGER_WITNESS_QUORUM)
    if checkpoint is None:
        raise ValidationError({"checkpoint": "the log has no signed checkpoint yet"})
    wanted = sorted(set(seqs))
    proved = [seq for seq in wanted if seq < checkpoint.size]
    older = max(0, len(proved) - MAX_EXTRACT)
    proved = proved[older:]
    proofs = inclusion_proofs(proved, checkpoint.size, size_is_signed=True) if proved else {}
    leaves_by_seq = dict(Entry.objects.filter(seq__in=proved).values_list("seq", "leaf"))
    entries = [(seq, bytes(leaves_by_seq[seq]), proofs[seq]) for seq in proved]
    text = checkpoint_text(checkpoint)
    return build_extract(subject, verifier_key, text, entries, newer=len(wanted) - len(proved) - older, older=older)
