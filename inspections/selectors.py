"""Reads for inspectors: only their own body's tasks exist for them."""
from django.db.models import QuerySet

from registry.models import Organisation

from registry.selectors import SEES_EVERYTHING

from .models import Claim, InspectionTask, SnapshotLog


def tasks_of(body: Organisation) -> QuerySet[InspectionTask]:
    return (InspectionTask.objects.filter(inspection_body=body)
            .select_related("chip__facility", "prover", "draw__campaign").order_by("due_on", "id"))


def task_of(body: Organisation, task_id: int) -> InspectionTask | None:
    return tasks_of(body).filter(pk=task_id).first()


def snapshot_log_of(body: Organisation, log_id: int) -> SnapshotLog | None:
    return SnapshotLog.objects.filter(pk=log_id, task__inspection_body=body).first()


def claim_of(organisation: Organisation | None, claim_id: int) -> Claim | None:
    """The prover sees its own claims; the regulator and inspection bodies see all."""
    if organisation is None:
        return None
    claims = Claim.objects.filter(pk=claim_id)
    if not SEES_EVERYTHING & set(organisation.roles):
        claims = claims.filter(prover=organisation)
    return claims.first()
