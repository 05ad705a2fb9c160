"""Helpers the registry's services share."""
from __future__ import annotations

from django.core.exceptions import ValidationError

from ..models import Organisation


def _fail(field: str, reason: str) -> None:
    raise ValidationError({field: reason})


def _organisation(slug: str, field: str) -> Organisation:
    organisation = Organisation.objects.filter(slug=slug).first()
    if organisation is None:
        _fail(field, f"unknown organisation {slug!r}")
    return organisation
