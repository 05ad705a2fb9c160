"""The ledger's public HTTP API (docs/ledger.md, Endpoints). Thin: parse, call a selector/service, render."""

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.permissions import AllowAny
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from . import keys, selectors, services
from . import serializers as s


class PlainTextRenderer(BaseRenderer):
    media_type = "text/plain"
    format = "txt"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        if isinstance(data, str):
            return data.encode("utf-8")
        return JSONRenderer().render(data)  # error bodies stay JSON


class PublicView(APIView):
    """Anyone may read the log; no session, so no CSRF."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

    def query(self, serializer_class):
        serializer = serializer_class(data=self.request.query_params)
        serializer.is_valid(raise_exception=True)
        return serializer.validated_data


class KeyView(PublicView):
    renderer_classes = [PlainTextRenderer]

    @extend_schema(responses={(200, "text/plain"): str}, summary="The log's verifier key (C2SP vkey)")
    def get(self, request):
        return Response(keys.verifier_key() + "\n")


class CheckpointView(PublicView):
    renderer_classes = [PlainTextRenderer]

    @extend_schema(
        responses={(200, "text/plain"): str, (503, "application/json"): s.Detail},
        summary="Latest signed checkpoint, with every witness cosignature for its size (503 while the log is empty)",
    )
    def get(self, request):
        checkpoint = (
            selectors.checkpoint_latest()
        )  # what pull-mode witnesses cosign; /tlog/checkpoint follows the policy
        if checkpoint is None:  # a GET never writes: the first checkpoint is signed with the first entry
            return Response(
                {"detail": "the log has no signed checkpoint yet: it is empty (run manage.py ledger_open)"},
                status=status.HTTP_503_SERVICE_UNAVAILABLE,
                content_type="application/json",
            )
        return Response(selectors.checkpoint_text(checkpoint))


class EntriesView(PublicView):
    @extend_schema(parameters=[s.EntriesQuery], responses={200: s.EntriesOut}, summary="Entries start <= seq < end")
    def get(self, request):
        params = self.query(s.EntriesQuery)
        start = params["start"]
        end = params.get("end")
        if end is None:
            end = max(start, min(start + settings.LEDGER_MAX_PAGE, selectors.ledger_size()))
        rows = selectors.entries_page(start, end)
        return Response(s.EntriesOut({"entries": rows}).data)


class InclusionProofView(PublicView):
    @extend_schema(parameters=[s.InclusionQuery], responses={200: s.InclusionOut}, summary="RFC 9162 inclusion proof")
    def get(self, request):
        params = self.query(s.InclusionQuery)
        hashes = selectors.inclusion_proof(params["index"], params["size"])
        return Response({"index": params["index"], "size": params["size"], "hashes": s.b64(hashes)})


class ConsistencyProofView(PublicView):
    @extend_schema(
        parameters=[s.ConsistencyQuery], responses={200: s.ConsistencyOut}, summary="RFC 9162 consistency proof"
    )
    def get(self, request):
        params = self.query(s.ConsistencyQuery)
        hashes = selectors.consistency_proof(params["first"], params["second"])
        return Response({"first": params["first"], "second": params["second"], "hashes": s.b64(hashes)})


class CosignatureView(PublicView):
    """Witnesses submit cosignatures; the witness's own signature is the authentication."""

    @extend_schema(
        request=s.CosignatureIn,
        responses={201: s.CosignatureOut, 400: dict, 409: dict},
        summary="Submit a witness cosignature (C2SP tlog-cosignature) over one of our checkpoints",
    )
    def post(self, request):
        payload = s.CosignatureIn(data=request.data)
        payload.is_valid(raise_exception=True)
        data = payload.validated_data
        cosignature = services.cosignature_add(data["checkpoint"], data["cosignature"])
        return Response(s.CosignatureOut(cosignature).data, status=status.HTTP_201_CREATED)
