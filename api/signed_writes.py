"""The signed-write protocol (docs/security.md): one service that every signed write of every app goes through.

Order: signature and freshness first (nothing else is looked at for a bad one), then the Idempotency-Key's
earlier answer, then the nonce is spent for good, then the write and its answer in one transaction. A refused
write (400, 409) is answered like an accepted one: with a key, its answer is kept and a retry gets it again.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from ledger import services as ledger_services
from registry import services, signing
from registry.models import Organisation

from . import errors, request_bodies

IDEMPOTENCY_HEADER = "Idempotency-Key"
ENVELOPE = ("timestamp", "nonce")  # every signed body's own fields (registry.signing)
# The write itself: (the body's JSON object, the submission the ledger keeps) -> the answer's JSON object.
Perform = Callable[[dict, dict], dict]


@dataclass(frozen=True)
class Answer:
    status: int
    data: dict


def signed_write_handle(
    organisation: Organisation,
    body: bytes,
    headers: Mapping[str, str],
    perform: Perform,
    success_status: int = 201,
    fields: Collection[str] | None = None,
) -> Answer:
    """Check ``body`` (the exact bytes signed) and its headers, then ``perform`` the write once.

    ``fields``: the members the write takes besides ``timestamp`` and ``nonce``; any other is refused by name
    (a 400 kept like any refusal), since the signed body goes onto the public ledger as it is. ``None`` where
    ``perform`` checks its members itself (chip events, EPCIS documents).

    Raises what the API answers without keeping it: a body that is not a JSON object (400), a bad signature,
    stale timestamp or spent nonce (403), and whatever ``perform`` raises besides a refusal (404, 403, ...).
    """
    data = json_object(body)
    signed = services.signed_body_check(organisation, headers.get(signing.HEADER), body, data)
    key = headers.get(IDEMPOTENCY_HEADER)
    earlier = services.idempotent_answer(organisation, key, body)
    if earlier is None:
        earlier = _nonce_spend(organisation, signed, key, body)
    if earlier is not None:
        return Answer(*earlier)
    try:
        with transaction.atomic():
            services.signed_key_current(organisation, signed)
            if fields is not None:
                unknown_fields_refuse(data, fields)
            answer = perform(data, signed.submission())
            services.idempotent_answer_record(organisation, key, body, success_status, answer)
    except IntegrityError:
        earlier = services.idempotent_answer(organisation, key, body)  # the same key with another body won
        if earlier is None:
            raise
        return Answer(*earlier)
    except (ValidationError, ledger_services.Conflict) as error:
        refused = Answer(*errors.refusal(error))
        services.idempotent_answer_record(organisation, key, body, refused.status, refused.data)
        return refused
    return Answer(success_status, answer)


def unknown_fields_refuse(data: dict, fields: Collection[str]) -> None:
    """A 400 naming every member of ``data`` that is neither in ``fields`` nor the envelope, with the field it
    probably meant (``claim`` -> ``claims``)."""
    unknown = sorted(name for name in data if name not in fields and name not in ENVELOPE)
    if not unknown:
        return
    takes = ", ".join(sorted(fields)) or "nothing besides timestamp and nonce"
    errors = {}
    for name in unknown:
        guess = difflib.get_close_matches(name, list(fields), n=1, cutoff=0.6)
        hint = f"; did you mean {guess[0]!r}?" if guess else ""
        errors[name[:64]] = (
            f"unknown field: the signed body is published on the ledger (this write takes {takes}){hint}"
        )
    raise ValidationError(errors)


def _nonce_spend(organisation: Organisation, signed, key: str | None, body: bytes) -> tuple[int, dict] | None:
    """Spend the nonce; a concurrent retry of the same body (same nonce) gets the first answer or a 409."""
    try:
        services.signed_nonce_consume(organisation, signed)
    except signing.SignatureProblem:
        if not key:
            raise
        earlier = services.idempotent_answer(organisation, key, body)
        if earlier is None:
            raise services.idempotent_in_progress(key) from None
        return earlier
    return None


def json_object(body: bytes) -> dict:
    """The body as a JSON object, parsed strictly (``request_bodies.loads``), or a 400 naming the field."""
    try:
        data = request_bodies.loads(body)
    except request_bodies.BodyProblem as problem:
        raise ValidationError({problem.field: problem.reason}) from None
    if not isinstance(data, dict):
        raise ValidationError({"body": "must be a JSON object"})
    return data
