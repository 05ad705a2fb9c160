"""DRF error wiring: service-layer errors become clear 4xx bodies naming the field."""

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from ledger.chain import LedgerFault
from ledger.services import Conflict
from registry.signing import SignatureProblem


def exception_handler(exc, context):
    if isinstance(exc, DjangoValidationError):
        detail = exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
        return Response(detail, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, SignatureProblem):
        return Response({exc.field: [exc.reason]}, status=status.HTTP_403_FORBIDDEN)
    if isinstance(exc, LedgerFault):  # the log does not extend its own signed checkpoint: no write is safe
        return Response({"detail": f"the ledger refuses writes: {exc}"}, status=status.HTTP_503_SERVICE_UNAVAILABLE)
    if isinstance(exc, Conflict):
        return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
    return drf_exception_handler(exc, context)
