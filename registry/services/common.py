"""Helpers the registry's services share."""

from __future__ import annotations

import unicodedata

from django.core.exceptions import ValidationError

from rules.countries import COUNTRIES
from rules.identifiers import COUNTRY

from ..models import Organisation


def fail(field: str, reason: str) -> None:
    raise ValidationError({field: reason})


def organisation_by_slug(slug: str, field: str) -> Organisation:
    organisation = Organisation.objects.filter(slug=slug).first()
    if organisation is None:
        fail(field, f"unknown organisation {slug!r}")
    return organisation


def country_check(country, field: str = "country") -> None:
    """An assigned ISO 3166-1 alpha-2 code (``rules.countries``): "ZZ" has the shape of a code but names no
    country, and a chip's country decides which border a move crosses."""
    if not isinstance(country, str) or not COUNTRY.fullmatch(country):
        fail(field, "ISO 3166-1 alpha-2 code, e.g. 'NL'")
    if country not in COUNTRIES:
        fail(field, f"{country!r} is not an ISO 3166-1 country code")


def storable(value: str) -> bool:
    """Text a field may hold: no control character (NUL, newlines) and no lone surrogate (no UTF-8 for it, and no
    database driver can send it)."""
    return not any(unicodedata.category(ch) in ("Cc", "Cs") for ch in value)
