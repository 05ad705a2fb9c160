"""Idempotency-Key: the first answer to a retried write."""

from __future__ import annotations

import hashlib

from ledger import services as ledger

from ..models import IdempotencyRecord, Organisation
from .common import fail


class IdempotencyConflict(ledger.Conflict):
    """The Idempotency-Key was used before with a different body, or its first request is still running (HTTP 409)."""


def idempotent_in_progress(key: str) -> IdempotencyConflict:
    """A concurrent retry whose first request holds the nonce but has no answer yet."""
    return IdempotencyConflict(
        f"a request with Idempotency-Key {key!r} is in progress: retry later (if this persists, the first request "
        "was interrupted before answering: re-sign the body with a fresh nonce)"
    )


def idempotent_answer(organisation: Organisation, key: str | None, body: bytes) -> tuple[int, dict] | None:
    """The first answer to this (organisation, key), if the same body was sent before."""
    if not key:
        return None
    if len(key) > 255:
        fail("Idempotency-Key", "at most 255 characters")
    record = IdempotencyRecord.objects.filter(organisation=organisation, key=key).first()
    if record is None:
        return None
    if bytes(record.request_hash) != hashlib.sha256(body).digest():
        raise IdempotencyConflict(f"Idempotency-Key {key!r} was already used with a different request body")
    return record.status_code, record.response


def idempotent_answer_record(
    organisation: Organisation, key: str | None, body: bytes, status: int, answer: dict
) -> None:
    if key:
        IdempotencyRecord.objects.create(
            organisation=organisation,
            key=key,
            request_hash=hashlib.sha256(body).digest(),
            status_code=status,
            response=answer,
        )
