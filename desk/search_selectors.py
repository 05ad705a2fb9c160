"""The desk's search across everything (as Rekor's search finds log entries by hash, index or key): one query
string, every kind of thing it may name, each section bounded (chips paged).

What a query finds:
  an entry by its seq (``123`` or ``#123``) or by its leaf hash (at least 16 hex digits: the desk's index keeps
  64 bits of each hash, and a match is confirmed against the whole prefix given); an organisation key by its id
  prefix; chips by serial prefix, or every chip of an owner, at a facility or in a country (paged); organisations
  and facilities by slug or name, facilities by city (their location), both by country code; campaigns by slug or
  country; entries that carry an order, invoice, shipment or licence reference; alerts by kind; and the latest
  entries about the organisations found.
"""

from __future__ import annotations

import re
from urllib.parse import urlencode

from django.core.paginator import Paginator
from django.db.models import Count, Q
from django.urls import reverse

from inspections.models import Alert, Campaign
from ledger import selectors as ledger
from registry.models import Chip, Facility, Organisation, OrganisationKey

from .models import EntrySubject
from .services.index import HASH_PREFIX_HEX, MAX_SUBJECT, hash_subject

LIMIT = 20
CHIP_PAGE = 50
ENTRY_ROWS = 50
SEQ = re.compile(r"#?(\d{1,18})")
HEX = re.compile(r"[0-9a-fA-F]+")
COUNTRY = re.compile(r"[A-Za-z]{2}")
EMPTY = {
    "entries": [],
    "keys": [],
    "chips": None,
    "organisations": [],
    "facilities": [],
    "campaigns": [],
    "alerts": None,
    "references": [],
    "about": [],
}


def search(query: str, page: int = 1) -> dict:
    """Everything ``query`` names, section by section; ``page`` pages the chips."""
    query = query.strip()
    if not query or "\x00" in query:
        return dict(EMPTY)
    organisations = organisations_found(query)
    facilities = facilities_found(query)
    return {
        "entries": entries_found(query),
        "keys": keys_found(query),
        "chips": chips_found(query, organisations, facilities, page),
        "organisations": organisations,
        "facilities": facilities,
        "campaigns": campaigns_found(query),
        "alerts": alerts_found(query),
        "references": entries_with_subject(f"ref:{query}") if len(query) + 4 <= MAX_SUBJECT else [],
        "about": entries_about(organisations),
    }


def entries_found(query: str) -> list[dict]:
    """The entry with this seq, and the entries whose leaf hash starts with these hex digits."""
    found = []
    seq = SEQ.fullmatch(query)
    if seq:
        found += ledger.entries_at([int(seq.group(1))])
    if HEX.fullmatch(query) and HASH_PREFIX_HEX <= len(query) <= 64:
        wanted = query.lower()
        candidates = EntrySubject.objects.filter(subject=hash_subject(bytes.fromhex(wanted[:HASH_PREFIX_HEX])))
        seqs = [s for s in candidates.values_list("seq", flat=True)[:LIMIT] if _hash_starts(s, wanted)]
        found += ledger.entries_at(seqs)
    return [_entry_row(entry) for entry in found]


def _hash_starts(seq: int, wanted: str) -> bool:
    leaf_hash = ledger.entry_leaf_hash(seq)
    return leaf_hash is not None and leaf_hash.hex().startswith(wanted)


def keys_found(query: str) -> list[OrganisationKey]:
    """Organisation keys whose id (hex) starts with the query (at least 6 digits: fewer name too many)."""
    if not HEX.fullmatch(query) or len(query) < 6:
        return []
    return list(OrganisationKey.objects.filter(key_id__startswith=query.lower()).select_related("organisation")[:LIMIT])


def organisations_found(query: str) -> list[Organisation]:
    by_name = Q(slug__startswith=query.lower()) | Q(legal_name__istartswith=query)
    if COUNTRY.fullmatch(query):
        by_name |= Q(country=query.upper())
    return list(Organisation.objects.filter(by_name).order_by("slug")[:LIMIT])


def facilities_found(query: str) -> list[Facility]:
    """Facilities by slug prefix, by city (anywhere in the location) or by country code."""
    wanted = Q(slug__startswith=query.lower()) | Q(location__icontains=query)
    if COUNTRY.fullmatch(query):
        wanted |= Q(country=query.upper())
    return list(Facility.objects.filter(wanted).select_related("owner").order_by("slug")[:LIMIT])


def chips_found(query: str, organisations: list, facilities: list, page: int) -> dict | None:
    """A page of chips and what they are: those an organisation named exactly owns, those at a facility named
    exactly, those in a country, or those whose serial starts with the query. ``total`` is counted on an index
    (owner, facility); a country's chips are not counted (no index), only paged."""
    owner = next((org for org in organisations if org.slug == query.lower()), None)
    facility = next((f for f in facilities if f.slug == query.lower()), None)
    if owner is not None:
        chips, why, on_list, counted = (
            Chip.objects.filter(owner=owner),
            f"owned by {owner.slug}",
            ("owner", owner.slug),
            True,
        )
    elif facility is not None:
        chips, why, on_list, counted = facility.chips.all(), f"at {facility.slug}", ("facility", facility.slug), True
    elif COUNTRY.fullmatch(query) and Chip.objects.filter(country=query.upper()).exists():
        chips, why, on_list, counted = Chip.objects.filter(country=query.upper()), f"in {query.upper()}", None, False
        on_list = ("country", query.upper())
    else:
        chips, why, on_list, counted = (
            Chip.objects.filter(serial__startswith=query, serial__gte=query),  # >=: the index walk starts there
            "serial starts with it",
            None,
            False,
        )
        on_list = ("q", query)
    list_url = reverse("admin:registry_chip_changelist") + "?" + urlencode([on_list])
    return _chip_page(chips, why, list_url, counted, page)


def _chip_page(chips, why: str, list_url: str, counted: bool, page: int) -> dict:
    ordered = chips.select_related("owner", "model", "facility").order_by("serial")
    start = (max(page, 1) - 1) * CHIP_PAGE
    rows = list(ordered[start : start + CHIP_PAGE + 1])  # one more than shown: is there a next page?
    total = Paginator(ordered, CHIP_PAGE).count if counted else None
    return {
        "why": why,
        "rows": rows[:CHIP_PAGE],
        "page": max(page, 1),
        "first": start + 1,
        "last": start + min(len(rows), CHIP_PAGE),
        "has_next": len(rows) > CHIP_PAGE,
        "total": total,
        "list_url": list_url,
    }


def campaigns_found(query: str) -> list[Campaign]:
    wanted = Q(slug__icontains=query)
    if COUNTRY.fullmatch(query):
        wanted |= Q(country=query.upper())
    return list(Campaign.objects.filter(wanted).order_by("-pk")[:LIMIT])


def alerts_found(query: str) -> dict | None:
    """Alerts of the kind the query names (its code, ``not_found``, or its label, "not found"): counts by state
    and the latest."""
    wanted = query.lower().replace(" ", "_")
    kind = next((k for k, label in Alert.Kind.choices if wanted in (k, label.lower().replace(" ", "_"))), None)
    if kind is None:
        return None
    alerts = Alert.objects.filter(kind=kind)
    by_state = dict(alerts.values_list("state").annotate(n=Count("id")).order_by())
    latest = list(alerts.select_related("prover", "chip").order_by("-raised_seq")[:LIMIT])
    list_url = reverse("admin:inspections_alert_changelist") + f"?kind={kind}"
    return {"kind": kind, "label": Alert.Kind(kind).label, "by_state": by_state, "latest": latest, "list_url": list_url}


def entries_with_subject(subject: str) -> list[dict]:
    seqs = EntrySubject.objects.filter(subject=subject).order_by("-seq").values_list("seq", flat=True)[:ENTRY_ROWS]
    return [_entry_row(entry) for entry in ledger.entries_at(list(seqs))][::-1]


def entries_about(organisations: list) -> list[dict]:
    """The latest entries about the first organisations found (the index's ``org:`` rows)."""
    if not organisations:
        return []
    subjects = [f"org:{org.slug}" for org in organisations[:3]]
    seqs = EntrySubject.objects.filter(subject__in=subjects).order_by("-seq").values_list("seq", flat=True)
    return [_entry_row(entry) for entry in ledger.entries_at(list(seqs[:ENTRY_ROWS]))][::-1]


def _entry_row(entry: dict) -> dict:
    return {key: entry[key] for key in ("seq", "time", "kind", "actor")}
