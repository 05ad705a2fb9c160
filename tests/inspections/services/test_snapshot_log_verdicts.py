"""Every snapshot log ends in a recorded verdict with an alert: forged out-of-range lines, a crashing checker."""

import base64

import pytest

from inspections import verification
from inspections.models import Alert, SnapshotLog
from inspections.services import inspectors
from inspections.tasks import check_snapshot_log
from ledger.models import Entry
from replay.protocol.firmware import canonical
from tests.inspections.factories import accepted
from tests.inspections.services.test_inspectors import a_task, firmware_log, with_chip_key

pytestmark = pytest.mark.django_db


def uploaded(task, text: str, capture) -> SnapshotLog:
    with capture(execute=False):
        return inspectors.snapshot_log_upload(accepted(task), task.inspection_body, text)


def signed(key, serial: str, **fields) -> str:
    record = {"serial": serial, "counter": 3, "time": "2026-11-09T00:00:00Z", "shard": 0}
    record |= {"hash": "0" * 64, "prev": "0" * 64, **fields}
    record["sig"] = base64.b64encode(key.sign(canonical(record)).signature).decode()
    return canonical(record).decode()


@pytest.mark.parametrize("fields", [{"counter": 2**60}, {"shard": 2**40}, {"counter": 2**64, "shard": 2**63}])
def test_a_forged_huge_number_is_a_recorded_problem_with_an_alert(draw, fields, django_capture_on_commit_callbacks):
    task = a_task("inspect-eu")
    key = with_chip_key(task)
    lines = [*firmware_log(key, task.chip.serial, 3), signed(key, task.chip.serial, **fields)]
    log = uploaded(task, "\n".join(lines), django_capture_on_commit_callbacks)
    assert check_snapshot_log(log.pk) == "problems"
    log.refresh_from_db()
    assert [p["kind"] for p in log.problems] == ["malformed"] and log.checked_seq is not None
    assert Alert.objects.filter(kind="log_problems", chip=task.chip).count() == 1


def test_a_check_that_crashes_is_a_recorded_verdict_with_an_alert(
    draw, monkeypatch, django_capture_on_commit_callbacks
):
    task = a_task("inspect-eu")
    key = with_chip_key(task)
    log = uploaded(task, "\n".join(firmware_log(key, task.chip.serial, 2)), django_capture_on_commit_callbacks)

    def crash(*args):
        raise OverflowError("the checker met something it cannot hold")

    monkeypatch.setattr(verification, "snapshot_log_check", crash)
    assert check_snapshot_log(log.pk) == "problems"
    assert check_snapshot_log(log.pk) == "problems"  # a redelivered task records nothing twice
    log.refresh_from_db()
    assert log.problems == [
        {"kind": "unchecked", "line": None, "counter": None, "detail": "the check failed (OverflowError)"}
    ]
    assert Entry.objects.filter(kind="inspection.snapshot_log", payload__task=task.pk).count() == 1
    assert Alert.objects.get(kind="log_problems", chip=task.chip).detail.endswith(
        "log: unchecked (the check failed (OverflowError))"
    )


@pytest.mark.parametrize("text", ["a\x00b\n", "\n \n"])
def test_a_log_with_nul_or_nothing_in_it_is_refused_naming_the_field(draw, text):
    from django.core.exceptions import ValidationError

    task = accepted(a_task("inspect-eu"))
    with pytest.raises(ValidationError) as refused:
        inspectors.snapshot_log_upload(task, task.inspection_body, text)
    assert "log" in refused.value.message_dict and not SnapshotLog.objects.exists()
