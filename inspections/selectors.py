"""Reads for inspectors: only their own body's tasks exist for them."""
from django.db.models import QuerySet

from registry.models import Organisation

from .models import InspectionTask, SnapshotLog


def tasks_of(body: Organisation) -> QuerySet[InspectionTask]:
    return (InspectionTask.objects.filter(inspection_body=body)
            .select_related("chip__facility", "prover", "draw__campaign").order_by("due_on", "id"))


def task_of(body: Organisation, task_id: int) -> InspectionTask | None:
    return tasks_of(body).filter(pk=task_id).first()


def snapshot_log_of(body: Organisation, log_id: int) -> SnapshotLog | None:
    return SnapshotLog.objects.filter(pk=log_id, task__inspection_body=body).first()
