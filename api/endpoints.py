"""What the organisations' endpoints of both apps share: the caller's organisation, the signed write as an HTTP
answer, and the OpenAPI description of a signed write."""

from __future__ import annotations

from collections.abc import Collection

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework import status
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response

from registry import selectors, signing
from registry import serializers as out
from registry.models import Organisation

from .signed_writes import IDEMPOTENCY_HEADER, Perform, signed_write_handle

SIGNED_WRITE_DESCRIPTION = """A write: signed body, idempotency, and the ledger entry in one transaction.

Order (docs/security.md): signature and freshness first (nothing else is looked at for a bad one), then the
Idempotency-Key's earlier answer, then the nonce is spent for good, then the write. A refused write (400,
409) is answered like an accepted one: with a key, its answer is kept and a retry gets it again."""
SIGNED_WRITE_ERRORS = {
    201: out.WriteOut,
    400: OpenApiResponse(description="invalid body: {field or chips[i]: [reason]}; nothing was written"),
    403: OpenApiResponse(description="bad signature, stale timestamp or replayed nonce: {field: [reason]}"),
    409: OpenApiResponse(description="Idempotency-Key reused with a different body"),
    429: OpenApiResponse(description="organisation over its request rate"),
}
SIGNED_PARAMETERS = [
    OpenApiParameter(
        signing.HEADER,
        str,
        OpenApiParameter.HEADER,
        required=True,
        description="<key id>:<base64 Ed25519 signature over the exact body bytes>",
    ),
    OpenApiParameter(
        IDEMPOTENCY_HEADER,
        str,
        OpenApiParameter.HEADER,
        description="retrying with the same key and body returns the first answer",
    ),
]


def caller_organisation(request) -> Organisation:
    organisation = selectors.organisation_of(request.user)
    if organisation is None:
        raise PermissionDenied({"user": ["is not a member of any organisation"]})
    return organisation


def signed_write_response(
    request,
    organisation: Organisation,
    perform: Perform,
    success_status: int = status.HTTP_201_CREATED,
    fields: Collection[str] | None = None,
) -> Response:
    """``signed_writes.signed_write_handle`` over a DRF request: the exact body bytes and the headers; ``fields``
    the members the write takes (any other is refused by name)."""
    answer = signed_write_handle(organisation, request.body, request.headers, perform, success_status, fields)
    return Response(answer.data, status=answer.status)
