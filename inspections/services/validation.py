"""Input checks the services share; a failure is a ValidationError naming the field, and nothing is written."""

from __future__ import annotations

import re

from django.core.exceptions import ValidationError

from rules.countries import COUNTRIES

COUNTRY = re.compile(r"[A-Z]{2}")  # ISO 3166-1 alpha-2, matched whole (no trailing newline)


def fail(field: str, reason: str) -> None:
    raise ValidationError({field: reason})


def country_clean(value, field: str = "country") -> str:
    """An ISO 3166-1 alpha-2 code as the ledger keeps it: stripped, upper case, one of the assigned codes
    (``rules.countries``, the list the forms offer): "XX" has the shape of a code but names no country."""
    # ASCII first: "ﬀ".upper() is "FF", and a look-alike must not become a code
    clean = value.strip().upper() if isinstance(value, str) and value.isascii() else None
    if clean is None or not COUNTRY.fullmatch(clean):
        fail(field, f"an ISO 3166-1 alpha-2 country code, not {value!r}")
    if clean not in COUNTRIES:
        fail(field, f"{clean!r} is not an ISO 3166-1 country code")
    return clean
