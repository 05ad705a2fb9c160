"""Inspector API (DESIGN §5): thin views over inspections.services, for inspection bodies only."""

from django.http import Http404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from config.bodies import StrictJSONParser
from registry.models import Role
from registry.selectors import organisation_of
from registry.throttles import OrganisationRateThrottle
from registry.views import SIGNED_PARAMETERS, SIGNED_WRITE_ERRORS, SignedWriteView

from . import selectors
from .models import InspectionTask
from .services import claims, inspectors


class TaskOut(serializers.ModelSerializer):
    chip = serializers.CharField(source="chip.serial")
    facility = serializers.CharField(source="chip.facility.slug", default=None)
    location = serializers.CharField(source="chip.facility.location", default=None)
    country = serializers.CharField(source="chip.country")
    prover = serializers.CharField(source="prover.slug")
    campaign = serializers.CharField(source="draw.campaign.slug")

    class Meta:
        model = InspectionTask
        fields = ["id", "chip", "facility", "location", "country", "prover", "campaign", "due_on", "status"]


class InspectorView(APIView):
    permission_classes = [IsAuthenticated]
    throttle_classes = [OrganisationRateThrottle]
    parser_classes = [StrictJSONParser]

    def body(self, request):
        organisation = organisation_of(request.user)
        if organisation is None or not organisation.has_role(Role.INSPECTION_BODY):
            raise PermissionDenied({"user": ["is not a member of an inspection body"]})
        return organisation

    def task(self, request, task_id: int) -> InspectionTask:
        task = selectors.task_of(self.body(request), task_id)
        if task is None:  # another body's task does not exist for this one
            raise Http404("no such task")
        return task


class TaskListView(InspectorView):
    @extend_schema(responses=TaskOut(many=True), summary="Your inspection body's tasks")
    def get(self, request):
        return Response(TaskOut(selectors.tasks_of(self.body(request)), many=True).data)


class TaskAcceptView(InspectorView):
    @extend_schema(request=None, responses={200: TaskOut, 400: OpenApiResponse(description="not an assigned task")})
    def post(self, request, task_id: int):
        task = self.task(request, task_id)
        return Response(TaskOut(inspectors.task_accept(task, task.inspection_body)).data)


class ChallengeOut(serializers.Serializer):
    nonce = serializers.CharField()
    message = serializers.CharField(help_text="the exact text the chip signs with its key")
    expires_at = serializers.DateTimeField()


class IdentityOut(serializers.Serializer):
    task = serializers.IntegerField()
    chip = serializers.CharField()
    nonce = serializers.CharField()
    passed = serializers.BooleanField()
    reason = serializers.CharField(allow_null=True)


class ChallengeView(InspectorView):
    @extend_schema(
        request=None,
        responses={201: ChallengeOut},
        summary="A fresh nonce for the chip to sign (valid 10 minutes, once)",
    )
    def post(self, request, task_id: int):
        task = self.task(request, task_id)
        challenge = inspectors.identity_challenge_issue(task, task.inspection_body)
        message = inspectors.identity_message(task.chip.serial, challenge.nonce).decode()
        return Response(
            {"nonce": challenge.nonce, "message": message, "expires_at": challenge.expires_at},
            status=status.HTTP_201_CREATED,
        )


class IdentityIn(serializers.Serializer):
    nonce = serializers.CharField(max_length=64)
    signature = serializers.CharField(max_length=200, help_text="base64 Ed25519 signature of the challenge message")


class IdentityView(InspectorView):
    @extend_schema(
        request=IdentityIn,
        responses={200: IdentityOut},
        summary="The chip's signed answer; a failed check raises an alert",
    )
    def post(self, request, task_id: int):
        task = self.task(request, task_id)
        answer = IdentityIn(data=request.data)
        answer.is_valid(raise_exception=True)
        return Response(inspectors.identity_answer_check(task, task.inspection_body, **answer.validated_data))


class LogIn(serializers.Serializer):
    log = serializers.CharField(trim_whitespace=False, help_text="the firmware log, JSON lines")


class SnapshotLogView(InspectorView):
    @extend_schema(
        request=LogIn, responses={202: dict}, summary="Upload the chip's firmware log; checked asynchronously"
    )
    def post(self, request, task_id: int):
        task = self.task(request, task_id)
        upload = LogIn(data=request.data)
        upload.is_valid(raise_exception=True)
        log = inspectors.snapshot_log_upload(task, task.inspection_body, upload.validated_data["log"])
        return Response({"id": log.pk, "status": log.status}, status=status.HTTP_202_ACCEPTED)


class SnapshotLogStatusView(InspectorView):
    @extend_schema(responses={200: dict}, summary="The checker's verdict on an uploaded log")
    def get(self, request, log_id: int):
        log = selectors.snapshot_log_of(self.body(request), log_id)
        if log is None:
            raise Http404("no such log")
        return Response({"id": log.pk, "status": log.status, "problems": log.problems, "checked_seq": log.checked_seq})


class FindingView(InspectorView):
    @extend_schema(
        request=dict, responses={201: dict}, summary="Physical findings: found, refused, seal, tamper, location, photos"
    )
    def post(self, request, task_id: int):
        task = self.task(request, task_id)
        finding = inspectors.finding_submit(task, task.inspection_body, request.data)
        return Response({"task": task.pk, "recorded_seq": finding.recorded_seq}, status=status.HTTP_201_CREATED)


class ClaimsView(SignedWriteView):
    """Provers answer their chips' logged snapshots (a signed write, like every prover write)."""

    @extend_schema(
        summary="Answer logged snapshots: run, step and transcript (manifest hash and location) for each",
        description="Body: `{timestamp, nonce, claims: [{serial, counter, run, step, manifest, location}]}`. Each "
        "claim is verified by the replay worker; the result lands on the ledger (`claim.verified`).",
        parameters=SIGNED_PARAMETERS,
        request={"application/json": dict},
        responses=SIGNED_WRITE_ERRORS,
    )
    def post(self, request):
        return super().post(request)

    def perform(self, organisation, data, submission) -> dict:
        rows = claims.claims_submit(prover=organisation, claims=data.get("claims"), submission=submission)
        return {"seq": rows[0].claimed_seq, "kind": "claim.submitted", "claims": [row.pk for row in rows]}


class ClaimStatusView(APIView):
    permission_classes = [IsAuthenticated]

    @extend_schema(responses={200: dict, 404: OpenApiResponse(description="not your claim")})
    def get(self, request, claim_id: int):
        claim = selectors.claim_of(organisation_of(request.user), claim_id)
        if claim is None:
            raise Http404("no such claim")
        return Response(
            {
                "id": claim.pk,
                "result": claim.result,
                "mismatch_step": claim.mismatch_step,
                "report": claim.report,
                "result_seq": claim.result_seq,
            }
        )
