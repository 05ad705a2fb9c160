"""Helpers the registry's services share."""

from __future__ import annotations

from django.core.exceptions import ValidationError

from ..models import Organisation


def fail(field: str, reason: str) -> None:
    raise ValidationError({field: reason})


def organisation_by_slug(slug: str, field: str) -> Organisation:
    organisation = Organisation.objects.filter(slug=slug).first()
    if organisation is None:
        fail(field, f"unknown organisation {slug!r}")
    return organisation
