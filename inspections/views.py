"""Inspector API (docs/draws.md; the workflow in docs/scenarios.md, Inspector walkthrough): thin views over inspections.services, for inspection bodies only.

Reads need the body's API token; every write (accept, challenge, identity, snapshot log, finding) is also a
signed write by a key registered to the inspection body, like a vendor's (``api.signed_writes``): a token
alone, which an attacker could lift, writes nothing. The portal's writes are session-bound with CSRF.
"""

from functools import partial

from django.http import Http404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from api.endpoints import SIGNED_PARAMETERS, SIGNED_WRITE_ERRORS, caller_organisation, signed_write_response
from api.request_bodies import StrictJSONParser
from api.throttles import OrganisationRateThrottle
from registry.models import Organisation, Role
from registry.selectors import organisation_of

from . import claim_explanations, selectors
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


class InspectorWriteView(APIView):
    """A signed write of an inspection body about one of its tasks; the body's other fields go to ``act``."""

    permission_classes = [IsAuthenticated]
    throttle_classes = [OrganisationRateThrottle]
    parser_classes = [StrictJSONParser]
    success_status = status.HTTP_200_OK
    body_fields: tuple[str, ...] | None = ()  # what the body takes besides timestamp and nonce; None: ``act`` checks

    def write(self, request, task_id: int):
        organisation = caller_organisation(request)
        if not organisation.has_role(Role.INSPECTION_BODY):  # refused before any signature work
            raise PermissionDenied({"user": ["is not a member of an inspection body"]})
        perform = partial(self.task_act, organisation, task_id)
        return signed_write_response(request, organisation, perform, self.success_status, self.body_fields)

    def task_act(self, organisation: Organisation, task_id: int, data: dict, submission: dict) -> dict:
        task = selectors.task_of(organisation, task_id)
        if task is None:  # another body's task does not exist for this one
            raise Http404("no such task")
        fields = {k: v for k, v in data.items() if k not in ("timestamp", "nonce")}
        return self.act(task, fields, submission)

    def act(self, task: InspectionTask, fields: dict, submission: dict) -> dict:
        raise NotImplementedError


INSPECTOR_WRITE_NOTE = "Signed like every write: body with `timestamp` and `nonce`, X-Chipledger-Signature header."


class TaskAcceptView(InspectorWriteView):
    @extend_schema(
        request={"application/json": dict},
        parameters=SIGNED_PARAMETERS,
        responses={**SIGNED_WRITE_ERRORS, 200: TaskOut},
        description=INSPECTOR_WRITE_NOTE,
    )
    def post(self, request, task_id: int):
        return self.write(request, task_id)

    def act(self, task, fields, submission) -> dict:
        return TaskOut(inspectors.task_accept(task, task.inspection_body, submission)).data


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


class ChallengeView(InspectorWriteView):
    success_status = status.HTTP_201_CREATED

    @extend_schema(
        request={"application/json": dict},
        parameters=SIGNED_PARAMETERS,
        responses={**SIGNED_WRITE_ERRORS, 201: ChallengeOut},
        summary="A fresh nonce for the chip to sign (valid 10 minutes, once)",
        description=INSPECTOR_WRITE_NOTE,
    )
    def post(self, request, task_id: int):
        return self.write(request, task_id)

    def act(self, task, fields, submission) -> dict:
        challenge = inspectors.identity_challenge_issue(task, task.inspection_body)
        message = inspectors.identity_message(task.chip.serial, challenge.nonce).decode()
        return ChallengeOut({"nonce": challenge.nonce, "message": message, "expires_at": challenge.expires_at}).data


class IdentityIn(serializers.Serializer):
    # "nonce" is the signed request's own nonce; the challenge's is named "challenge" here
    challenge = serializers.CharField(max_length=64, help_text="the challenge's nonce")
    signature = serializers.CharField(max_length=200, help_text="base64 Ed25519 signature of the challenge message")


class IdentityView(InspectorWriteView):
    body_fields = ("challenge", "signature")

    @extend_schema(
        request=IdentityIn,
        parameters=SIGNED_PARAMETERS,
        responses={**SIGNED_WRITE_ERRORS, 200: IdentityOut},
        summary="The chip's signed answer; a failed check raises an alert",
        description=INSPECTOR_WRITE_NOTE,
    )
    def post(self, request, task_id: int):
        return self.write(request, task_id)

    def act(self, task, fields, submission) -> dict:
        answer = IdentityIn(data=fields)
        answer.is_valid(raise_exception=True)
        return inspectors.identity_answer_check(
            task,
            task.inspection_body,
            nonce=answer.validated_data["challenge"],
            signature=answer.validated_data["signature"],
            submission=submission,
        )


class LogIn(serializers.Serializer):
    log = serializers.CharField(trim_whitespace=False, help_text="the firmware log, JSON lines")


class SnapshotLogView(InspectorWriteView):
    success_status = status.HTTP_202_ACCEPTED
    body_fields = ("log",)

    @extend_schema(
        request=LogIn,
        parameters=SIGNED_PARAMETERS,
        responses={**SIGNED_WRITE_ERRORS, 202: dict},
        summary="Upload the chip's firmware log; checked asynchronously",
        description=INSPECTOR_WRITE_NOTE,
    )
    def post(self, request, task_id: int):
        return self.write(request, task_id)

    def act(self, task, fields, submission) -> dict:
        upload = LogIn(data=fields)
        upload.is_valid(raise_exception=True)
        log = inspectors.snapshot_log_upload(task, task.inspection_body, upload.validated_data["log"])
        return {"id": log.pk, "status": log.status}


class SnapshotLogStatusView(InspectorView):
    @extend_schema(responses={200: dict}, summary="The checker's verdict on an uploaded log")
    def get(self, request, log_id: int):
        log = selectors.snapshot_log_of(self.body(request), log_id)
        if log is None:
            raise Http404("no such log")
        return Response({"id": log.pk, "status": log.status, "problems": log.problems, "checked_seq": log.checked_seq})


class FindingView(InspectorWriteView):
    success_status = status.HTTP_201_CREATED
    body_fields = None  # inspectors.finding_submit names each unknown field

    @extend_schema(
        request={"application/json": dict},
        parameters=SIGNED_PARAMETERS,
        responses={**SIGNED_WRITE_ERRORS, 201: dict},
        summary="Physical findings: found, refused, seal, tamper, location, photos",
        description=INSPECTOR_WRITE_NOTE,
    )
    def post(self, request, task_id: int):
        return self.write(request, task_id)

    def act(self, task, fields, submission) -> dict:
        finding = inspectors.finding_submit(task, task.inspection_body, fields, submission)
        return {"task": task.pk, "recorded_seq": finding.recorded_seq}


class ClaimsView(APIView):
    """Provers answer their chips' logged snapshots (a signed write, like every prover write)."""

    permission_classes = [IsAuthenticated]
    throttle_classes = [OrganisationRateThrottle]

    @extend_schema(
        summary="Answer logged snapshots: run, step and transcript (manifest hash and location) for each",
        description="Body: `{timestamp, nonce, claims: [{serial, counter, run, step, manifest, location}]}`. Each "
        "claim is verified by the replay worker; the result lands on the ledger (`claim.verified`).",
        parameters=SIGNED_PARAMETERS,
        request={"application/json": dict},
        responses=SIGNED_WRITE_ERRORS,
    )
    def post(self, request):
        organisation = caller_organisation(request)
        return signed_write_response(request, organisation, partial(_claims_submit, organisation))


def _claims_submit(prover: Organisation, data: dict, submission: dict) -> dict:
    rows = claims.claims_body_submit(prover=prover, body=data, submission=submission)
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
                "run": claim.run,
                "explanation": claim_explanations.result_explained(claim.result),
                "findings": claim_explanations.findings_explained(claim.report),
            }
        )
