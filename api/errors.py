"""The API's errors: service-layer errors become clear 4xx bodies naming the field.

Also the safety net of the database's own refusals: a unique constraint lost to a concurrent request is a
409 naming the column (two fabrications of one serial, two registrations of one slug), a value a column
cannot hold is a 400 — never a 500.
"""

import re

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import DataError, IntegrityError
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from ledger.services import Conflict
from registry.signing import SignatureProblem
from tlog.chain import LedgerFault

# PostgreSQL: 'Key (serial)=(X) already exists.'; SQLite: 'UNIQUE constraint failed: registry_chip.serial'
_PG_KEY = re.compile(r"Key \(([^)]*)\)=")
_SQLITE_UNIQUE = re.compile(r"UNIQUE constraint failed: (.+)")


def unique_violation_fields(error: IntegrityError) -> list[str] | None:
    """The columns of the unique constraint an IntegrityError violated; None if it was another constraint."""
    text = str(error)
    if (match := _PG_KEY.search(text)) and "already exists" in text:
        columns = match.group(1).split(", ")
    elif match := _SQLITE_UNIQUE.search(text):
        columns = [column.strip().rsplit(".", 1)[-1] for column in match.group(1).split(",")]
    else:
        return None
    return [column.removesuffix("_id") for column in columns]


def refusal(exc: DjangoValidationError | Conflict) -> tuple[int, dict]:
    """The status and body of a write the services refused: a field's reasons (400) or a conflict (409).

    One mapping for the exception handler and for the refusals a signed write keeps for its Idempotency-Key.
    """
    if isinstance(exc, DjangoValidationError):
        detail = exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
        return status.HTTP_400_BAD_REQUEST, detail
    return status.HTTP_409_CONFLICT, {"detail": str(exc)}


def exception_handler(exc, context):
    if isinstance(exc, DjangoValidationError):
        code, detail = refusal(exc)
        return Response(detail, status=code)
    if isinstance(exc, SignatureProblem):
        return Response({exc.field: [exc.reason]}, status=status.HTTP_403_FORBIDDEN)
    if isinstance(exc, LedgerFault):  # the log does not extend its own signed checkpoint: no write is safe
        return Response({"detail": f"the ledger refuses writes: {exc}"}, status=status.HTTP_503_SERVICE_UNAVAILABLE)
    if isinstance(exc, Conflict):
        code, detail = refusal(exc)
        return Response(detail, status=code)
    if isinstance(exc, IntegrityError) and (fields := unique_violation_fields(exc)):
        reason = "already exists (taken by a concurrent request); nothing was written"
        return Response({field: [reason] for field in fields}, status=status.HTTP_409_CONFLICT)
    if isinstance(exc, DataError):
        reason = f"a value does not fit its field: {str(exc).splitlines()[0]}; nothing was written"
        return Response({"body": [reason]}, status=status.HTTP_400_BAD_REQUEST)
    return drf_exception_handler(exc, context)
