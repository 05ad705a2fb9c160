"""Rebuild the desk's entry index (``EntrySubject``, ``KindDay``) from the ledger alone.

``differences`` compares the live index with a replay; ``reindex`` replaces it (the index is
derived data, so replacing it loses nothing). Both run from ``manage.py rebuild_projections``.
"""

from __future__ import annotations

import json
from collections import Counter
from types import SimpleNamespace

from django.db import transaction

from ledger import selectors as ledger
from ledger import services as ledger_services
from tlog import merkle

from .models import EntrySubject, KindDay
from .services import index


def replay(size: int | None = None) -> tuple[set[tuple], Counter]:
    rows, counts = set(), Counter()
    for seq, leaf in ledger.leaves(0, size):
        entry = json.loads(leaf)
        found, counted = index.rows_for(
            [
                SimpleNamespace(
                    seq=seq, hash=merkle.leaf_hash(leaf), **{k: entry[k] for k in ("time", "kind", "actor", "payload")}
                )
            ]
        )
        rows.update(found)
        counts.update(counted)
    return rows, counts


def differences(limit: int = 50) -> list[str]:
    rows, counts = replay()
    live_rows = set(EntrySubject.objects.values_list("subject", "seq", "kind").iterator(chunk_size=10_000))
    live_counts = Counter({(d.isoformat(), k): n for d, k, n in KindDay.objects.values_list("day", "kind", "count")})
    found = [f"entry index {row}: missing" for row in sorted(rows - live_rows)[:limit]]
    found += [f"entry index {row}: not on the ledger" for row in sorted(live_rows - rows)[:limit]]
    for key in sorted(counts.keys() | live_counts.keys()):
        if counts[key] != live_counts[key]:
            found.append(f"entry count {key[0]} {key[1]}: live={live_counts[key]} rebuilt={counts[key]}")
    return found[:limit]


@transaction.atomic
def reindex() -> int:
    ledger_services.ledger_write_lock()  # no entry lands between the replay and the swap: its index rows would be lost
    rows, counts = replay()
    EntrySubject.objects.all().delete()
    KindDay.objects.all().delete()
    EntrySubject.objects.bulk_create([EntrySubject(subject=s, seq=q, kind=k) for s, q, k in rows], batch_size=5000)
    index.counts_add(counts)
    return len(rows)
