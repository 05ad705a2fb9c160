"""Services hand work to the worker by task name, after commit (no import of the task module)."""

import pytest

from inspections import queue, tasks
from inspections.models import InspectionTask
from inspections.services import inspectors
from tests.inspections.factories import accepted

pytestmark = pytest.mark.django_db


def test_the_queued_names_are_the_tasks():
    assert tasks.check_snapshot_log.name == queue.CHECK_SNAPSHOT_LOG
    assert tasks.verify_claim.name == queue.VERIFY_CLAIM


def test_an_upload_is_checked_after_commit(draw, monkeypatch, django_capture_on_commit_callbacks):
    sent = []
    monkeypatch.setattr(
        queue, "current_app", type("App", (), {"send_task": lambda self, name, args: sent.append((name, args))})()
    )
    task = InspectionTask.objects.exclude(inspection_body=None).select_related("inspection_body").first()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        log = inspectors.snapshot_log_upload(accepted(task), task.inspection_body, "{}\n")
    assert sent == [] and len(callbacks) == 1
    callbacks[0]()
    assert sent == [(queue.CHECK_SNAPSHOT_LOG, (log.pk,))]
