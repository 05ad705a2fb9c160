"""Facilities and chip models."""

from __future__ import annotations

import unicodedata

from django.db import transaction

from ledger import services as ledger
from rules.identifiers import SLUG

from ..models import ChipModel, Facility, Organisation
from .common import country_check, fail


@transaction.atomic
def facility_register(
    *,
    owner: Organisation,
    slug: str,
    kind: str,
    country: str,
    location: str = "",
    actor: str,
    submission: dict | None = None,
) -> Facility:
    if not SLUG.fullmatch(slug or ""):
        fail("slug", "lower-case letters, digits and hyphens, at most 64")
    if Facility.objects.filter(slug=slug).exists():
        fail("slug", f"{slug!r} is taken")
    if kind not in Facility.Kind.values:
        fail("kind", f"one of {Facility.Kind.values}")
    country_check(country)
    if any(unicodedata.category(ch) in ("Cc", "Cs") for ch in location or ""):  # as the chip events' fields
        fail("location", "must not contain control characters (newlines, tabs) or lone surrogates")
    payload = {"slug": slug, "owner": owner.slug, "kind": kind, "country": country, "location": location}
    entry = ledger.append_entry("facility.registered", payload, actor, submission)
    return Facility.objects.create(
        slug=slug, owner=owner, kind=kind, country=country, location=location, registered_seq=entry.seq
    )


@transaction.atomic
def chip_model_register(
    *,
    vendor: Organisation,
    slug: str,
    name: str,
    export_class: str,
    peak_flops_16bit: float,
    memory_bytes: int,
    actor: str,
) -> ChipModel:
    if not SLUG.fullmatch(slug or ""):
        fail("slug", "lower-case letters, digits and hyphens, at most 64")
    if ChipModel.objects.filter(slug=slug).exists():
        fail("slug", f"{slug!r} is taken")
    if not peak_flops_16bit > 0 or not memory_bytes > 0:
        fail("peak_flops_16bit", "peak FLOP/s and memory must be positive")
    payload = {
        "slug": slug,
        "name": name,
        "vendor": vendor.slug,
        "export_class": export_class,
        "peak_flops_16bit": peak_flops_16bit,
        "memory_bytes": memory_bytes,
    }
    entry = ledger.append_entry("chip_model.registered", payload, actor)
    return ChipModel.objects.create(
        slug=slug,
        name=name,
        vendor=vendor,
        export_class=export_class,
        peak_flops_16bit=peak_flops_16bit,
        memory_bytes=memory_bytes,
        registered_seq=entry.seq,
    )
