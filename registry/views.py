"""Vendor and owner API. Thin: authenticate, hand the signed write to ``api.signed_writes``, render.

Writes need both a user token (who is calling) and a signature over the exact
body by a key of the caller's organisation (who vouches for it), docs/security.md, Signed writes.
"""

import base64
from functools import partial

from django.core.exceptions import ValidationError
from django.http import Http404
from drf_spectacular.utils import OpenApiExample, OpenApiResponse, PolymorphicProxySerializer, extend_schema
from rest_framework import generics
from rest_framework.exceptions import NotFound
from rest_framework.exceptions import ValidationError as BadRequest
from rest_framework.pagination import CursorPagination
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from api.endpoints import (
    SIGNED_PARAMETERS,
    SIGNED_WRITE_DESCRIPTION,
    SIGNED_WRITE_ERRORS,
    caller_organisation,
    signed_write_response,
)
from api.throttles import OrganisationRateThrottle

from . import selectors, services
from . import serializers as out
from .filters import ChipFilter
from .models import Chip, ChipModel, Facility, Organisation


def _written(entry, count: int | None = None) -> dict:
    answer = {"seq": entry.seq, "kind": entry.kind}
    if count is not None:
        answer["count"] = count
    return answer


class ChipEventView(APIView):
    permission_classes = [IsAuthenticated]
    throttle_classes = [OrganisationRateThrottle]

    @extend_schema(
        operation_id="chips_event",
        summary="Record a lifecycle event for up to 64 chips (one ledger entry), all or nothing",
        description=(
            "`event` is `fabricate` (fab role) or a lifecycle event; the body is `chips: [serial, ...]` plus the "
            "event's fields below (an unknown field is refused by name). Every body carries `timestamp` (Unix "
            "seconds) and a fresh `nonce`.\n\n" + services.event_fields_table()
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
        organisation = caller_organisation(request)
        return signed_write_response(request, organisation, partial(_chip_event, organisation, event))


def _chip_event(organisation: Organisation, event: str, data: dict, submission: dict) -> dict:
    if event == "fabricate":
        entry = services.chips_fabricate(organisation=organisation, chips=data.get("chips"), submission=submission)
    elif event in services.CHIP_EVENTS:
        entry = services.chips_record_event(
            organisation=organisation, event=services.CHIP_EVENTS[event], payload=data, submission=submission
        )
    else:
        raise Http404(f"unknown chip event {event!r}")
    return _written(entry, len(entry.payload["chips"]))


class KeyRegisterView(APIView):
    permission_classes = [IsAuthenticated]
    throttle_classes = [OrganisationRateThrottle]

    @extend_schema(
        summary="Register another signing key of your organisation (signed with a current key)",
        description=SIGNED_WRITE_DESCRIPTION,
        parameters=SIGNED_PARAMETERS,
        request={"application/json": dict},
        responses=SIGNED_WRITE_ERRORS,
    )
    def post(self, request):
        organisation = caller_organisation(request)
        return signed_write_response(request, organisation, partial(self.write, organisation), fields=("public_key",))

    @staticmethod
    def write(organisation: Organisation, data: dict, submission: dict) -> dict:
        public_key = _decode_key(data.get("public_key"))
        key = services.organisation_key_register(
            organisation=organisation, public_key=public_key, actor=organisation.slug, submission=submission
        )
        return {"seq": key.registered_seq, "kind": "org.key_registered", "key_id": key.key_id}


class KeyRevokeView(APIView):
    permission_classes = [IsAuthenticated]
    throttle_classes = [OrganisationRateThrottle]

    @extend_schema(
        summary="Revoke a key of your organisation; it signs nothing afterwards",
        description=SIGNED_WRITE_DESCRIPTION,
        parameters=SIGNED_PARAMETERS,
        request={"application/json": dict},
        responses=SIGNED_WRITE_ERRORS,
    )
    def post(self, request):
        organisation = caller_organisation(request)
        return signed_write_response(request, organisation, partial(self.write, organisation), fields=("key_id",))

    @staticmethod
    def write(organisation: Organisation, data: dict, submission: dict) -> dict:
        key = services.organisation_key_revoke(
            organisation=organisation,
            key_id=str(data.get("key_id", "")),
            actor=organisation.slug,
            submission=submission,
        )
        return {"seq": key.revoked_seq, "kind": "org.key_revoked", "key_id": key.key_id}


FACILITY_FIELDS = ("slug", "kind", "country", "location")


class FacilityRegisterView(APIView):
    permission_classes = [IsAuthenticated]
    throttle_classes = [OrganisationRateThrottle]

    @extend_schema(
        summary="Register a facility (data centre, warehouse, fab) your organisation owns",
        description=SIGNED_WRITE_DESCRIPTION,
        parameters=SIGNED_PARAMETERS,
        request={"application/json": dict},
        responses=SIGNED_WRITE_ERRORS,
    )
    def post(self, request):
        organisation = caller_organisation(request)
        return signed_write_response(request, organisation, partial(self.write, organisation), fields=FACILITY_FIELDS)

    @staticmethod
    def write(organisation: Organisation, data: dict, submission: dict) -> dict:
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

    def decode_cursor(self, request):
        """A cursor is opaque but not free: one that is not a cursor of this list is a 400 naming ``cursor``
        (DRF answers 404, as if the list were missing; a position that is not an id would reach the query)."""
        try:
            base64.b64decode(request.query_params.get(self.cursor_query_param, ""), validate=True)
            cursor = super().decode_cursor(request)
        except (NotFound, ValueError):  # DRF's decoder skips what is not base64: "%%%" would be the first page
            cursor = None
            position = "not a cursor"
        else:
            position = cursor and cursor.position
        if position is not None and not str(position).isdigit():
            raise BadRequest({"cursor": ["not a cursor of this list: follow the next and previous links"]})
        return cursor


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
        responses={
            200: PolymorphicProxySerializer(
                component_name="ChipOrSoldChip",
                serializers=[out.ChipDetailOut, out.ChipSoldOut],
                resource_type_field_name=None,
            ),
            404: OpenApiResponse(
                description="no such chip, or not yours (a chip you sold: its history up to the sale)"
            ),
        },
        summary="A chip with its full history, each event with its ledger inclusion proof",
    )
    def get(self, request, serial: str):
        organisation = caller_organisation(request)
        chip = selectors.chip_visible_to(organisation, serial)
        if chip is None:
            sold = selectors.chip_sold_by(organisation, serial)
            if sold is None:  # 404, not 403: others' chips do not exist for the caller
                raise Http404("no such chip")
            chip, sale = sold
            history = selectors.chip_history(chip, up_to_seq=sale["seq"])
            return Response(out.ChipSoldOut(chip, context={"history": history, "sale": sale}).data)
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
