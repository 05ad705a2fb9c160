"""Vendor and owner API. Thin: authenticate, check the signature, call a service, render.

Writes need both a user token (who is calling) and a signature over the exact
body by a key of the caller's organisation (who vouches for it), docs/security.md, Signed writes.
"""

import base64

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.http import Http404
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import generics, status
from rest_framework.exceptions import PermissionDenied
from rest_framework.pagination import CursorPagination
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from config import bodies
from ledger import services as ledger_services

from . import selectors, services, signing
from . import serializers as out
from .filters import ChipFilter
from .models import Chip, ChipModel, Facility, Organisation
from .throttles import OrganisationRateThrottle

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
        "Idempotency-Key",
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


class SignedWriteView(APIView):
    """A write: signed body, idempotency, and the ledger entry in one transaction.

    Order (docs/security.md): signature and freshness first (nothing else is looked at for a bad one), then the
    Idempotency-Key's earlier answer, then the nonce is spent for good, then the write. A refused write (400,
    409) is answered like an accepted one: with a key, its answer is kept and a retry gets it again.
    """

    permission_classes = [IsAuthenticated]
    throttle_classes = [OrganisationRateThrottle]
    success_status = status.HTTP_201_CREATED

    def authorise(self, organisation) -> None:
        """Refuse callers whose organisation may not make this write at all (before any signature work)."""

    def post(self, request, **kwargs):
        organisation = caller_organisation(request)
        self.authorise(organisation)
        body = request.body
        data = _json_object(body)
        signed = services.signed_body_check(organisation, request.headers.get(signing.HEADER), body, data)
        key = request.headers.get("Idempotency-Key")
        earlier = services.idempotent_answer(organisation, key, body)
        if earlier is None:
            earlier = self._spend_nonce(organisation, signed, key, body)
        if earlier is not None:
            return Response(earlier[1], status=earlier[0])
        try:
            with transaction.atomic():
                answer = self.perform(organisation, data, signed.submission(), **kwargs)
                services.idempotent_answer_record(organisation, key, body, self.success_status, answer)
        except IntegrityError:
            earlier = services.idempotent_answer(organisation, key, body)  # the same key with another body won
            if earlier is None:
                raise
            return Response(earlier[1], status=earlier[0])
        except (ValidationError, ledger_services.Conflict) as error:
            refused = self.handle_exception(error)
            services.idempotent_answer_record(organisation, key, body, refused.status_code, refused.data)
            return refused
        return Response(answer, status=self.success_status)

    @staticmethod
    def _spend_nonce(organisation, signed, key, body) -> tuple[int, dict] | None:
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

    def perform(self, organisation, data, submission, **kwargs) -> dict:
        raise NotImplementedError


def _json_object(body: bytes) -> dict:
    try:
        data = bodies.loads(body)
    except bodies.BodyProblem as problem:
        raise ValidationError({problem.field: problem.reason}) from None
    if not isinstance(data, dict):
        raise ValidationError({"body": "must be a JSON object"})
    return data


def _written(entry, count: int | None = None) -> dict:
    answer = {"seq": entry.seq, "kind": entry.kind}
    if count is not None:
        answer["count"] = count
    return answer


class ChipEventView(SignedWriteView):
    @extend_schema(
        operation_id="chips_event",
        summary="Record a lifecycle event for up to 10,000 chips, all or nothing",
        description=(
            "`event` is `fabricate` (fab role; body `chips: [{serial, model, public_key, facility?}]`) or one of "
            + ", ".join(f"`{e}`" for e in services.CHIP_EVENTS)
            + " (body `chips: [serial, ...]` plus the event's fields: ship/export `consignee`, `reference`, "
            "`destination_country`, export `export_licence`; receive/package/install `facility`; transfer-offer "
            "`to_owner`). Every body carries `timestamp` (Unix seconds) and a fresh `nonce`."
        ),
        parameters=SIGNED_PARAMETERS,
        request={"application/json": dict},
        responses=SIGNED_WRITE_ERRORS,
        examples=[
            OpenApiExample(
                "ship",
                value={
                    "timestamp": 1795000000,
                    "nonce": "3f2b9c0e5a7d4e11",
                    "chips": ["H100-000001"],
                    "consignee": "owner-a",
                    "reference": "PO-2026-0042",
                },
            )
        ],
    )
    def post(self, request, event: str):
        return super().post(request, event=event)

    def perform(self, organisation, data, submission, event: str) -> dict:
        if event == "fabricate":
            entry = services.chips_fabricate(organisation=organisation, chips=data.get("chips"), submission=submission)
        elif event in services.CHIP_EVENTS:
            entry = services.chips_record_event(
                organisation=organisation, event=services.CHIP_EVENTS[event], payload=data, submission=submission
            )
        else:
            raise Http404(f"unknown chip event {event!r}")
        return _written(entry, len(entry.payload["chips"]))


class KeyRegisterView(SignedWriteView):
    @extend_schema(
        summary="Register another signing key of your organisation (signed with a current key)",
        parameters=SIGNED_PARAMETERS,
        request={"application/json": dict},
        responses=SIGNED_WRITE_ERRORS,
    )
    def post(self, request):
        return super().post(request)

    def perform(self, organisation, data, submission) -> dict:
        public_key = _decode_key(data.get("public_key"))
        key = services.organisation_key_register(
            organisation=organisation, public_key=public_key, actor=organisation.slug, submission=submission
        )
        return {"seq": key.registered_seq, "kind": "org.key_registered", "key_id": key.key_id}


class KeyRevokeView(SignedWriteView):
    @extend_schema(
        summary="Revoke a key of your organisation; it signs nothing afterwards",
        parameters=SIGNED_PARAMETERS,
        request={"application/json": dict},
        responses=SIGNED_WRITE_ERRORS,
    )
    def post(self, request):
        return super().post(request)

    def perform(self, organisation, data, submission) -> dict:
        key = services.organisation_key_revoke(
            organisation=organisation,
            key_id=str(data.get("key_id", "")),
            actor=organisation.slug,
            submission=submission,
        )
        return {"seq": key.revoked_seq, "kind": "org.key_revoked", "key_id": key.key_id}


class FacilityRegisterView(SignedWriteView):
    @extend_schema(
        summary="Register a facility (data centre, warehouse, fab) your organisation owns",
        parameters=SIGNED_PARAMETERS,
        request={"application/json": dict},
        responses=SIGNED_WRITE_ERRORS,
    )
    def post(self, request):
        return super().post(request)

    def perform(self, organisation, data, submission) -> dict:
        facility = services.facility_register(
            owner=organisation,
            slug=_text(data, "slug", 64),
            kind=_text(data, "kind", 32),
            country=_text(data, "country", 2),
            location=_text(data, "location", Facility._meta.get_field("location").max_length, default=""),
            actor=organisation.slug,
            submission=submission,
        )
        return {"seq": facility.registered_seq, "kind": "facility.registered", "slug": facility.slug}


def _text(data: dict, name: str, max_length: int, default: str | None = None) -> str | None:
    """A string field of a JSON body, or a 400 naming it: a number, list or over-long text never reaches a column."""
    value = data.get(name, default)
    if value is not None and (not isinstance(value, str) or len(value) > max_length):
        raise ValidationError({name: f"a string of at most {max_length} characters"})
    return value


def _decode_key(value) -> bytes:
    try:
        return base64.b64decode(value or "", validate=True)
    except (ValueError, TypeError):  # binascii.Error, or a non-ASCII string
        raise ValidationError({"public_key": "base64 of a 32-byte Ed25519 public key"}) from None


class ChipCursor(CursorPagination):
    ordering = "id"
    page_size = 100
    max_page_size = 1000
    page_size_query_param = "page_size"


class ChipListView(generics.ListAPIView):
    """Chips the caller may see, filtered by owner, possessor, model, status, facility, country."""

    serializer_class = out.ChipOut
    filterset_class = ChipFilter
    pagination_class = ChipCursor
    throttle_classes = [OrganisationRateThrottle]
    queryset = Chip.objects.none()  # for the schema; requests use get_queryset

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return self.queryset
        return selectors.chips_visible_to(caller_organisation(self.request))


class ChipDetailView(APIView):
    throttle_classes = [OrganisationRateThrottle]

    @extend_schema(
        responses={200: out.ChipDetailOut, 404: OpenApiResponse(description="no such chip, or not yours")},
        summary="A chip with its full history, each event with its ledger inclusion proof",
    )
    def get(self, request, serial: str):
        chip = selectors.chip_visible_to(caller_organisation(request), serial)
        if chip is None:  # 404, not 403: others' chips do not exist for the caller
            raise Http404("no such chip")
        history = selectors.chip_history(chip)
        return Response(out.ChipDetailOut(chip, context={"history": history}).data)


class OrganisationListView(generics.ListAPIView):
    serializer_class = out.OrganisationOut
    queryset = Organisation.objects.select_related("parent").order_by("slug")
    pagination_class = None


class ChipModelListView(generics.ListAPIView):
    serializer_class = out.ChipModelOut
    queryset = ChipModel.objects.select_related("vendor").order_by("slug")
    pagination_class = None
