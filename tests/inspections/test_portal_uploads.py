"""Portal log uploads: a binary file, an empty or a missing one is a message naming the field; nothing is stored."""

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from inspections.models import InspectionTask, SnapshotLog
from inspections.services import inspectors
from tests.inspections.factories import accepted
from tests.inspections.test_portal import inspector  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "upload, reason",
    [
        (SimpleUploadedFile("log.bin", bytes(range(256)) * 64), "log: is not UTF-8 text"),
        (SimpleUploadedFile("log.jsonl", b"{}\x00{}\n"), "log: contains NUL characters"),
        (SimpleUploadedFile("log.jsonl", b""), "log: The submitted file is empty."),
        (None, "log: This field is required."),
    ],
)
def test_a_bad_upload_is_refused_naming_the_field(inspector, upload, reason):  # noqa: F811
    task = accepted(InspectionTask.objects.select_related("inspection_body").first())
    data = {"action": "log"} | ({"log": upload} if upload else {})
    page = inspector.post(f"/portal/tasks/{task.pk}/", data, follow=True)
    assert page.status_code == 200 and reason in page.content.decode()
    assert not SnapshotLog.objects.exists()


def test_an_oversized_upload_is_refused_by_its_size(inspector, monkeypatch):  # noqa: F811
    monkeypatch.setattr(inspectors, "MAX_LOG_BYTES", 100)
    upload = SimpleUploadedFile("log.jsonl", b"x" * 101)
    task = accepted(InspectionTask.objects.select_related("inspection_body").first())
    page = inspector.post(f"/portal/tasks/{task.pk}/", {"action": "log", "log": upload}, follow=True)
    assert "log: at most 100 bytes" in page.content.decode() and not SnapshotLog.objects.exists()


def test_no_log_before_the_task_is_accepted(inspector):  # noqa: F811
    task = InspectionTask.objects.first()
    html = inspector.get(f"/portal/tasks/{task.pk}/").content.decode()
    assert 'value="log"' not in html and 'value="challenge"' not in html and "Accept the task first" in html
    upload = SimpleUploadedFile("log.jsonl", b'{"serial": "x"}\n')
    page = inspector.post(f"/portal/tasks/{task.pk}/", {"action": "log", "log": upload}, follow=True)
    assert "accept it first" in page.content.decode() and not SnapshotLog.objects.exists()
