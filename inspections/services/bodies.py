"""Inspection bodies: the countries each covers and its capacity per period, registered on the ledger.

Draws assign chips by them, so they are world state: ``inspection_body.registered`` with payload
``{"organisation": slug, "countries": [sorted codes], "capacity_per_period": N}``; registering an
organisation again replaces its coverage and capacity (same kind).
"""

from __future__ import annotations

from django.db import transaction

from ledger import services as ledger
from registry.models import Organisation, Role

from ..models import InspectionBody
from .validation import country_clean, fail

MAX_CAPACITY = 10**6


def inspection_body_clean(*, organisation: str, countries: list[str], capacity_per_period: int) -> dict:
    """The payload of a registration, normalised (codes stripped, upper case, sorted); raises ValidationError."""
    org = Organisation.objects.filter(slug=organisation).first() if isinstance(organisation, str) else None
    if org is None:
        fail("organisation", f"no organisation {organisation!r}")
    if not org.has_role(Role.INSPECTION_BODY):
        fail("organisation", f"{org.slug} does not have the {Role.INSPECTION_BODY} role")
    if not isinstance(countries, (list, tuple)):
        fail("countries", "a list of ISO 3166-1 alpha-2 country codes")
    codes = sorted(country_clean(code, "countries") for code in countries)
    if len(set(codes)) != len(codes):
        fail("countries", f"{codes} names a country twice")
    if (
        isinstance(capacity_per_period, bool)
        or not isinstance(capacity_per_period, int)
        or not 0 < capacity_per_period <= MAX_CAPACITY
    ):
        fail("capacity_per_period", f"a whole number of chips from 1 to {MAX_CAPACITY}")
    return {"organisation": org.slug, "countries": codes, "capacity_per_period": capacity_per_period}


@transaction.atomic
def inspection_body_register(
    *, organisation: str, countries: list[str], capacity_per_period: int, actor: str = "regulator"
) -> InspectionBody:
    """Register (or re-register, replacing coverage and capacity) an inspection body."""
    payload = inspection_body_clean(
        organisation=organisation, countries=countries, capacity_per_period=capacity_per_period
    )
    entry = ledger.append_entry("inspection_body.registered", payload, actor)
    body, _ = InspectionBody.objects.update_or_create(
        organisation=Organisation.objects.get(slug=payload["organisation"]),
        defaults={
            "countries": payload["countries"],
            "capacity_per_period": payload["capacity_per_period"],
            "registered_seq": entry.seq,
        },
    )
    return body
