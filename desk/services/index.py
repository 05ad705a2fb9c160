"""The desk's index of ledger entries, written in the same transaction as each append.

Which organisations and business references an entry concerns is read from its actor and its
payload's top-level fields alone (a pure function), and its leaf hash from the leaf (a campaign amendment
also reads the entry it supersedes, for the provers it drops), so the rebuild
(``desk.rebuild_index``) derives the same rows from the ledger: the search finds entries by
organisation, reference and hash through them. Per-day counts by kind feed the dashboard's time series.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime

from django.db import connection

from ledger import selectors as ledger

from ..models import EntrySubject, KindDay

# Payload fields that name an organisation (a slug, or a list/dict of slugs for "provers").
ORG_FIELDS = ("org", "organisation", "owner", "to_owner", "consignee", "prover", "vendor", "parent", "owner_org")
NOT_ORGANISATIONS = {"system", ""}
# Payload fields that carry a business reference (an order, invoice or shipment number, an export licence).
REFERENCE_FIELDS = ("reference", "export_licence")
MAX_SUBJECT = 80
HASH_PREFIX_HEX = 16  # the index keeps 64 bits of each leaf hash; a match is confirmed against the full hash


def subjects(kind: str, actor: str, payload: dict) -> set[str]:
    """``org:<slug>`` for every organisation this entry is about, ``ref:<reference>`` for each business reference;
    ``task:<pk>`` for the inspection task and ``campaign:<slug>`` for the campaign it names (a task's and a draw's
    page read their entries through these, not by scanning the ledger for a kind)."""
    found = {actor}
    if kind == "org.registered":
        found.add(payload.get("slug"))
    for name in ORG_FIELDS:
        found.add(payload.get(name))
    provers = payload.get("provers")
    if kind == "campaign.amended" and isinstance(payload.get("params"), dict):
        provers = payload["params"].get("provers")  # the provers in force from the amendment on
    if isinstance(provers, list | dict):
        found.update(provers)
    about = {f"org:{slug}" for slug in found if isinstance(slug, str) and slug not in NOT_ORGANISATIONS}
    about |= {
        f"ref:{payload[name]}" for name in REFERENCE_FIELDS if isinstance(payload.get(name), str) and payload[name]
    }
    task, campaign = payload.get("task"), payload.get("campaign")
    if isinstance(task, int) and not isinstance(task, bool):
        about.add(f"task:{task}")
    if isinstance(campaign, str) and campaign:
        about.add(f"campaign:{campaign}"[:80])
    return {subject for subject in about if len(subject) <= MAX_SUBJECT}


def dropped_provers(kind: str, payload: dict) -> set[str]:
    """``org:`` rows for the provers of the entry a ``campaign.amended`` supersedes: an amendment that drops a prover
    concerns it too, so the dropped organisation's history (its page, the search) still shows it. The one place the
    index reads beyond the entry itself: the superseded entry, by the seq the payload names."""
    seq = payload.get("supersedes")
    if kind != "campaign.amended" or not isinstance(seq, int) or isinstance(seq, bool):
        return set()
    before = [e["payload"] for e in ledger.entries_at([seq]) if e["kind"] in ("campaign.created", "campaign.amended")]
    if not before:
        return set()
    params = before[0].get("params")
    provers = params.get("provers") if isinstance(params, dict) else before[0].get("provers")
    if not isinstance(provers, list):
        return set()
    return {f"org:{slug}" for slug in provers if isinstance(slug, str) and slug and len(slug) + 4 <= MAX_SUBJECT}


def hash_subject(leaf_hash: bytes) -> str:
    """The index row that finds an entry by (the first 64 bits of) its leaf hash."""
    return "hash:" + bytes(leaf_hash).hex()[:HASH_PREFIX_HEX]


def rows_for(entries: Iterable) -> tuple[list[tuple], Counter]:
    """(subject rows, counts by (day, kind)) for appended entries (objects with seq, time, kind, actor, payload,
    hash)."""
    rows, counts = [], Counter()
    for entry in entries:
        found = subjects(entry.kind, entry.actor, entry.payload) | {hash_subject(entry.hash)}
        found |= dropped_provers(entry.kind, entry.payload)
        rows.extend((subject, entry.seq, entry.kind) for subject in found)
        counts[(_day(entry.time), entry.kind)] += 1
    return rows, counts


def entries_indexed(entries: list) -> None:
    """Listener of ``ledger.services.append_entries``: index the batch (runs inside its transaction)."""
    rows, counts = rows_for(entries)
    if rows:
        EntrySubject.objects.bulk_create([EntrySubject(subject=s, seq=q, kind=k) for s, q, k in rows])
    counts_add(counts)


def counts_add(counts: Counter) -> None:
    """Upsert per-day counts: one statement (appends are serialised by the ledger's lock)."""
    if not counts:
        return
    table = KindDay._meta.db_table
    marks = ", ".join(["(%s, %s, %s)"] * len(counts))
    values = [v for (day, kind), n in sorted(counts.items()) for v in (day, kind, n)]
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (day, kind, count) VALUES {marks} "
            f"ON CONFLICT (day, kind) DO UPDATE SET count = {table}.count + excluded.count",
            values,
        )


def _day(when) -> str:
    if isinstance(when, str):
        when = datetime.fromisoformat(when.replace("Z", "+00:00"))
    return when.astimezone(UTC).date().isoformat()
