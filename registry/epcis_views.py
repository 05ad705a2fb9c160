"""EPCIS 2.0 capture and query endpoints. Thin: the mapping lives in ``rules.epcis_format`` (pure), the write in
``registry.services.epcis``, the read in ``registry.selectors``."""

from django.http import Http404
from django.utils import timezone
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from api.endpoints import SIGNED_PARAMETERS, SIGNED_WRITE_ERRORS, caller_organisation, signed_write_response
from api.throttles import OrganisationRateThrottle
from rules import epcis_format

from . import selectors, services

SGTIN = "urn:epc:id:sgtin:0614141.812345.H100-0000001"
EXAMPLE_DOCUMENT = {
    "@context": epcis_format.CONTEXT,
    "type": "EPCISDocument",
    "schemaVersion": "2.0",
    "creationDate": "2026-03-01T12:00:00Z",
    "timestamp": 1772366400,
    "nonce": "3f2b9c0e5a7d4e11aa",
    "epcisBody": {
        "eventList": [
            {
                "type": "ObjectEvent",
                "eventTime": "2026-03-01T09:00:00Z",
                "eventTimeZoneOffset": "+08:00",
                "eventID": "urn:uuid:1f0b5b7e-2c43-4a8e-9c1e-7a3d52f0e001",
                "epcList": [SGTIN],
                "action": "ADD",
                "bizStep": "commissioning",
                "bizLocation": {"id": epcis_format.FACILITY_URI + "fab-tw-1"},
                "ilmd": {
                    "chipledger:model": "h100-sxm",
                    "chipledger:publicKeys": {SGTIN: "O2onvM62pC1io6jQKm8Nc2UyFXcd4kOmOsBIoYtZ2ik="},
                },
            },
            {
                "type": "ObjectEvent",
                "eventTime": "2026-03-01T11:00:00Z",
                "eventTimeZoneOffset": "+08:00",
                "epcList": ["https://id.gs1.org/01/09506000134352/21/H100-0000001"],
                "action": "OBSERVE",
                "bizStep": "https://ref.gs1.org/cbv/BizStep-shipping",
                "disposition": "in_transit",
                "readPoint": {"id": epcis_format.FACILITY_URI + "fab-tw-1"},
                "bizTransactionList": [{"type": "po", "bizTransaction": "urn:epcglobal:cbv:bt:0614141000005:PO-42"}],
                "sourceList": [{"type": "possessing_party", "source": epcis_format.ORG_URI + "fab-tw"}],
                "destinationList": [{"type": "possessing_party", "destination": epcis_format.ORG_URI + "vendor-a"}],
                "chipledger:exportLicence": "TW-EL-2026-0042",
            },
        ]
    },
}
CAPTURED_EXAMPLE = {
    "captured": 1,
    "duplicates": 1,
    "eventList": [
        {"eventID": "urn:uuid:1f0b5b7e-2c43-4a8e-9c1e-7a3d52f0e001", "status": "duplicate"},
        {
            "eventID": "ni:///sha-256;5d1f...?ver=chipledger-jcs-1",
            "status": "captured",
            "seq": 812,
            "kind": "chip.exported",
            "count": 1,
        },
    ],
}


class CaptureView(APIView):
    permission_classes = [IsAuthenticated]
    throttle_classes = [OrganisationRateThrottle]

    @extend_schema(
        operation_id="epcis_capture",
        summary="Capture a GS1 EPCIS 2.0 EPCISDocument onto the chip lifecycle, all or nothing",
        description=(
            "ObjectEvents with bizStep commissioning (ADD), shipping, receiving (OBSERVE), decommissioning, "
            "destroying (DELETE) become one ledger entry each, in order. The document is the signed body: it "
            "carries top-level `timestamp` (Unix seconds) and `nonce`. Chips: SGTIN EPC URI or GS1 Digital Link "
            "(the serial component is the chip serial); organisations and facilities: "
            f"`{epcis_format.ORG_URI}<slug>` / `{epcis_format.FACILITY_URI}<slug>` or bare slugs. Commissioning needs "
            "`ilmd.chipledger:model` and `ilmd.chipledger:publicKeys` {epc: base64 Ed25519 key}; a cross-border "
            "shipment needs `chipledger:exportLicence`; receiving needs the facility (`bizLocation` or `readPoint`). Events whose `eventID` (or, without one, the SHA-256 of "
            "the event's RFC 8785 canonical JSON) was captured before are skipped and reported as `duplicate`. "
            "Full mapping: rules/epcis_format.py."
        ),
        parameters=SIGNED_PARAMETERS,
        request={"application/ld+json": dict, "application/json": dict},
        responses={
            **SIGNED_WRITE_ERRORS,
            201: OpenApiResponse(
                description="per event, in order: captured (seq, kind, count) or duplicate",
                examples=[OpenApiExample("captured", value=CAPTURED_EXAMPLE)],
            ),
            400: OpenApiResponse(
                description='the document path of each problem, e.g. {"epcisBody.eventList[2].bizStep": '
                '["unsupported: ..."]}; nothing was written',
                examples=[
                    OpenApiExample(
                        "unsupported event",
                        value={
                            "epcisBody.eventList[1].type": [
                                "unsupported: 'AggregationEvent'; only ObjectEvent maps onto the chip lifecycle"
                            ]
                        },
                    )
                ],
            ),
        },
        examples=[OpenApiExample("commission and export", value=EXAMPLE_DOCUMENT, request_only=True)],
    )
    def post(self, request):
        organisation = caller_organisation(request)

        def capture(data: dict, submission: dict) -> dict:
            events = services.epcis_document_parse(data)
            return services.epcis_capture(organisation=organisation, events=events, submission=submission)

        return signed_write_response(request, organisation, capture)


class EventQueryView(APIView):
    throttle_classes = [OrganisationRateThrottle]

    @extend_schema(
        operation_id="epcis_events",
        summary="A chip's history as an EPCIS 2.0 EPCISQueryDocument of ObjectEvents",
        description=(
            "One ObjectEvent per ledger entry of the chip: eventTime is the ledger time, bizStep follows the "
            "lifecycle event, `chipledger:seq` is the ledger entry (its inclusion proof: /api/registry/chips/<serial>)."
        ),
        parameters=[
            OpenApiParameter(
                "epc", str, required=True, description="SGTIN EPC URI, GS1 Digital Link URI or bare chip serial"
            )
        ],
        responses={
            200: OpenApiResponse(
                description="EPCISQueryDocument",
                examples=[
                    OpenApiExample(
                        "history",
                        value={
                            "@context": epcis_format.CONTEXT,
                            "type": "EPCISQueryDocument",
                            "schemaVersion": "2.0",
                            "creationDate": "2026-03-02T08:00:00.000000Z",
                            "epcisBody": {
                                "queryResults": {
                                    "queryName": "SimpleEventQuery",
                                    "resultsBody": {
                                        "eventList": [
                                            {
                                                "type": "ObjectEvent",
                                                "eventTime": "2026-03-01T12:00:01.123456Z",
                                                "eventTimeZoneOffset": "+00:00",
                                                "recordTime": "2026-03-01T12:00:01.123456Z",
                                                "epcList": [SGTIN],
                                                "action": "ADD",
                                                "bizStep": "commissioning",
                                                "disposition": "active",
                                                "bizLocation": {"id": epcis_format.FACILITY_URI + "fab-tw-1"},
                                                "chipledger:seq": 811,
                                                "chipledger:kind": "chip.fabricated",
                                                "chipledger:actor": "fab-tw",
                                            }
                                        ]
                                    },
                                }
                            },
                        },
                    )
                ],
            ),
            400: OpenApiResponse(description='{"epc": [reason]}: not an SGTIN, Digital Link or serial'),
            404: OpenApiResponse(description="no such chip, or not one the caller may see"),
        },
    )
    def get(self, request):
        epc = request.query_params.get("epc")
        serial = services.epcis_query_serial(epc)
        chip = selectors.chips_visible_to(caller_organisation(request)).filter(serial=serial).first()
        if chip is None:  # 404, not 403: others' chips do not exist for the caller
            raise Http404("no such chip")
        return Response(epcis_format.query_document(selectors.chip_object_events(chip, epc), timezone.now()))
