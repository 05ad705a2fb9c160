"""Row locks and the ledger lock taken in one order (PostgreSQL): a writer locks its own row, then the ledger.

Seen in CI: the worker recorded a snapshot log's verdict holding a lock on the log *and* (through a join) on its
task, then waited for the ledger; the inspector's finding held the ledger and waited to update the task: a deadlock,
one of the two lost. Each test here runs the two writers against each other with the first paused inside its
transaction, and asserts both land.
"""

import base64
import threading

import pytest
from django.db import connection
from nacl.signing import SigningKey

from inspections.models import Alert, Finding, InspectionTask, SnapshotLog
from inspections.services import inspectors, sweeps
from inspections.services.alerts import alert_act
from ledger import services as ledger
from registry import services as registry
from tests.helpers import requires_postgres
from tests.inspections.factories import accepted
from tests.inspections.services.test_inspectors import a_task, firmware_log, with_chip_key

pytestmark = [pytest.mark.postgres, requires_postgres, pytest.mark.django_db(transaction=True)]


class Paused:
    """Pause the thread that appends ``kind`` to the ledger, just before the append, until ``go``."""

    def __init__(self, monkeypatch, kind: str):
        self.reached, self.go = threading.Event(), threading.Event()
        append = ledger.append_entry

        def append_when_told(entry_kind, *args, **kwargs):
            if entry_kind == kind and threading.current_thread() is not threading.main_thread():
                self.reached.set()
                self.go.wait(30)
            return append(entry_kind, *args, **kwargs)

        monkeypatch.setattr(ledger, "append_entry", append_when_told)


def in_thread(work) -> tuple[threading.Thread, dict]:
    outcome = {}

    def run():
        try:
            outcome["value"] = work()
        except Exception as error:  # the test reports what the writer raised
            outcome["error"] = error
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def against(monkeypatch, paused_kind: str, first, second, wait: float = 0.5) -> tuple[dict, dict, bool]:
    """Run ``first`` until it is about to append ``paused_kind``; run ``second`` to its end (or ``wait`` s);
    then let ``first`` go. (first's outcome, second's outcome, whether second finished while first was paused)."""
    pause = Paused(monkeypatch, paused_kind)
    one, first_outcome = in_thread(first)
    assert pause.reached.wait(30), "the first writer never reached its append"
    two, second_outcome = in_thread(second)
    two.join(timeout=wait)
    finished_meanwhile = not two.is_alive()
    pause.go.set()
    one.join(timeout=60)
    two.join(timeout=60)
    return first_outcome, second_outcome, finished_meanwhile


def uploaded(task, lines, capture) -> SnapshotLog:
    with capture(execute=False):
        return inspectors.snapshot_log_upload(task, task.inspection_body, "\n".join(lines) + "\n")


def finding_on(task, chip_found: bool = True):
    """The inspector's finding on the task, as a writer for ``against``."""
    return lambda: inspectors.finding_submit(task, task.inspection_body, {"chip_found": chip_found})


def both_landed(first: dict, second: dict) -> None:
    assert "error" not in first and "error" not in second, (first, second)


@pytest.fixture
def log(draw, django_capture_on_commit_callbacks):
    task = accepted(a_task("inspect-eu"))
    return uploaded(task, firmware_log(with_chip_key(task), task.chip.serial, 3), django_capture_on_commit_callbacks)


@pytest.fixture
def forged_log(draw, django_capture_on_commit_callbacks):
    """A log whose every line is signed by a key that is not the chip's: no authentic snapshot, an alert."""
    task = accepted(a_task("inspect-eu"))
    with_chip_key(task)
    return uploaded(task, firmware_log(SigningKey.generate(), task.chip.serial, 3), django_capture_on_commit_callbacks)


def test_a_log_verdict_does_not_hold_its_task_against_the_finding(monkeypatch, log):
    task = log.task
    verdict, finding, meanwhile = against(
        monkeypatch,
        "inspection.snapshot_log",
        lambda: inspectors.snapshot_log_check(log.pk),
        finding_on(task),
        wait=10,
    )
    both_landed(verdict, finding)
    assert meanwhile, "the finding waited for the log's verdict: the verdict held the task's row"
    assert verdict["value"] == SnapshotLog.Status.INTACT
    assert InspectionTask.objects.get(pk=task.pk).status == InspectionTask.Status.DONE
    assert Finding.objects.filter(task=task).count() == 1


def test_the_overdue_sweep_and_a_late_finding_both_land(monkeypatch, draw):
    task = accepted(a_task("inspect-eu"))
    late = task.due_on.replace(year=task.due_on.year + 1)
    swept, finding, _ = against(
        monkeypatch,
        "alert.raised",
        lambda: sweeps.overdue_sweep(late),
        finding_on(task),
    )
    both_landed(swept, finding)
    assert Alert.objects.filter(kind=Alert.Kind.OVERDUE, task=task).count() == 1
    assert InspectionTask.objects.get(pk=task.pk).status == InspectionTask.Status.DONE
    assert Finding.objects.filter(task=task).count() == 1


def test_two_findings_at_once_record_one(monkeypatch, draw):
    task = accepted(a_task("inspect-eu"))
    body = task.inspection_body
    first, second, _ = against(
        monkeypatch,
        "inspection.finding",
        lambda: inspectors.finding_submit(task, body, {"chip_found": True}),
        lambda: inspectors.finding_submit(InspectionTask.objects.get(pk=task.pk), body, {"chip_found": False}),
    )
    assert "error" not in first, first
    assert "status" in getattr(second.get("error"), "message_dict", {}), second
    assert Finding.objects.filter(task=task).count() == 1


def test_a_forged_logs_alert_and_the_finding_on_its_task_both_land(monkeypatch, forged_log):
    """The verdict holds the ledger while it raises its alert (a row naming the task); the finding holds the
    task's row while it waits for the ledger: the task's lock must not stop the alert from naming the task."""
    task = forged_log.task
    verdict, finding, _ = against(
        monkeypatch,
        "alert.raised",
        lambda: inspectors.snapshot_log_check(forged_log.pk),
        finding_on(task),
    )
    both_landed(verdict, finding)
    assert verdict["value"] == SnapshotLog.Status.PROBLEMS
    assert Alert.objects.filter(kind=Alert.Kind.LOG_PROBLEMS, task=task).count() == 1
    assert Finding.objects.filter(task=task).count() == 1


def test_a_forged_logs_alert_and_an_event_of_its_chip_both_land(monkeypatch, forged_log):
    """As above with the chip: its owner's event locks the chip's row while it waits for the ledger."""
    chip = forged_log.task.chip
    other = "owner-a" if chip.owner.slug == "owner-b" else "owner-b"
    verdict, event, _ = against(
        monkeypatch,
        "alert.raised",
        lambda: inspectors.snapshot_log_check(forged_log.pk),
        lambda: registry.chips_record_event(
            organisation=chip.owner, event="transfer_offered", payload={"chips": [chip.serial], "to_owner": other}
        ),
    )
    both_landed(verdict, event)
    assert verdict["value"] == SnapshotLog.Status.PROBLEMS
    chip.refresh_from_db()
    assert chip.pending_owner.slug == other


def test_a_passing_identity_retry_and_the_regulator_acting_on_its_alert_both_land(monkeypatch, draw):
    """A retry that passes closes the task's open identity alert after its own entry (holding the ledger); the
    regulator, acting on that alert at the same moment, holds the alert while it waits for the ledger."""
    task = accepted(a_task("inspect-eu"))
    key, body = with_chip_key(task), task.inspection_body
    failed = inspectors.identity_challenge_issue(task, body)
    inspectors.identity_answer_check(task, body, failed.nonce, base64.b64encode(b"\0" * 64).decode())
    alert = Alert.objects.get(kind=Alert.Kind.IDENTITY_FAILED, task=task)
    retry = inspectors.identity_challenge_issue(task, body)
    signature = base64.b64encode(key.sign(inspectors.identity_message(task.chip.serial, retry.nonce)).signature)
    reached, go = threading.Event(), threading.Event()
    supersede = inspectors._supersede_identity_alerts

    def supersede_when_told(*args):  # the retry paused after its own entry, before it touches the alert
        reached.set()
        go.wait(30)
        return supersede(*args)

    monkeypatch.setattr(inspectors, "_supersede_identity_alerts", supersede_when_told)
    one, passed = in_thread(lambda: inspectors.identity_answer_check(task, body, retry.nonce, signature.decode()))
    # the regulator's step runs either way: paused or not, the retry never reaches the alert before it
    reached.wait(5)
    two, acted = in_thread(lambda: alert_act(alert, action="comment", by="regulator", reason="looking"))
    two.join(timeout=1)
    go.set()
    one.join(timeout=60)
    two.join(timeout=60)
    both_landed(passed, acted)
    assert passed["value"]["passed"] is True
    assert Alert.objects.get(pk=alert.pk).state == "superseded"


def test_two_overlapping_lost_chip_sweeps_raise_one_alert(monkeypatch, draw):
    """Two beat runs of a sweep at once (a slow run overtaken by the next): each chip's alert is raised once."""
    from registry.models import Chip
    from rules.chip_lifecycle import Status

    chip = a_task("inspect-eu").chip
    Chip.objects.filter(pk=chip.pk).update(status=Status.LOST)  # as a reported loss leaves the projection
    first, second, _ = against(monkeypatch, "alert.raised", sweeps.lost_chip_sweep, sweeps.lost_chip_sweep)
    both_landed(first, second)
    assert sorted([first["value"], second["value"]]) == [0, 1]
    assert Alert.objects.filter(kind=Alert.Kind.LOST, chip=chip).count() == 1


def test_an_entry_appended_while_the_index_is_rebuilt_stays_indexed(monkeypatch, draw):
    """`reindex` replays the ledger, then swaps the index: an entry committed in between (the live service does not
    stop for an operator's command) must not lose its index rows."""
    from desk import rebuild_index

    reached, go, replay = threading.Event(), threading.Event(), rebuild_index.replay

    def replay_then_wait():  # the rebuild paused between its replay and its swap
        rows = replay()
        reached.set()
        go.wait(30)
        return rows

    task = accepted(a_task("inspect-eu"))
    monkeypatch.setattr(rebuild_index, "replay", replay_then_wait)
    one, rebuilt = in_thread(rebuild_index.reindex)
    assert reached.wait(30)
    two, finding = in_thread(finding_on(task))
    two.join(timeout=1)
    go.set()
    one.join(timeout=60)
    two.join(timeout=60)
    both_landed(rebuilt, finding)
    monkeypatch.setattr(rebuild_index, "replay", replay)
    assert rebuild_index.differences() == []
