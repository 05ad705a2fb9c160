"""The inspector's workflow: own tasks only, chip identity by challenge, snapshot logs, findings, alerts."""

import base64
import json
from datetime import timedelta

import pytest
from django.utils import timezone
from nacl.signing import SigningKey

from inspections.models import (
    Alert,
    Campaign,
    CaseText,
    Finding,
    IdentityChallenge,
    InspectionTask,
    Snapshot,
    SnapshotLog,
)
from inspections.services import inspectors
from inspections.tasks import check_snapshot_log
from ledger.models import Entry
from registry import signing
from registry.models import Chip
from tests.registry.factories import SignedClient

pytestmark = pytest.mark.django_db


class Inspector(SignedClient):
    """An inspection body's client: its token, and its registered key signing every write."""

    def post(self, path, data=None, format=None, **options):
        return super().post(path, data, **options)


def inspector(slug: str) -> Inspector:
    from registry import services
    from registry.models import Organisation

    organisation, key = Organisation.objects.get(slug=slug), SigningKey.generate()
    services.organisation_key_register(organisation=organisation, public_key=bytes(key.verify_key), actor="regulator")
    return Inspector(organisation, key)


@pytest.mark.parametrize("action", ["accept", "challenge", "identity", "snapshot-log", "finding"])
def test_token_only_inspector_writes_are_refused_and_write_nothing(draw, action):
    task, client = a_task("inspect-eu"), inspector("inspect-eu")
    size, challenges = Entry.objects.count(), IdentityChallenge.objects.count()
    body = {"challenge": "0" * 64, "signature": "AA==", "log": "x", "chip_found": False}
    unsigned = client.api.post(f"/api/inspections/tasks/{task.pk}/{action}", body, format="json")
    assert unsigned.status_code == 403 and "signature" in unsigned.json()
    forged = client.post(f"/api/inspections/tasks/{task.pk}/{action}", body, key=SigningKey.generate())
    assert forged.status_code == 403 and "not registered" in forged.json()["signature"][0]
    assert (Entry.objects.count(), IdentityChallenge.objects.count()) == (size, challenges)
    assert not Alert.objects.exists()


def test_inspector_writes_are_on_the_ledger_with_the_bodys_signature(draw):
    task, client = a_task("inspect-eu"), inspector("inspect-eu")
    assert client.post(f"/api/inspections/tasks/{task.pk}/accept").status_code == 200
    entry = Entry.objects.get(kind="inspection.accepted")
    assert json.loads(bytes(entry.leaf))["submission"]["key"] == signing.key_id_for(bytes(client.key.verify_key))


def a_task(body: str) -> InspectionTask:
    return InspectionTask.objects.filter(inspection_body__slug=body).select_related("chip").first()


def with_chip_key(task: InspectionTask) -> SigningKey:
    """Give the task's chip a key we hold (the firmware's), as if fabricated with it."""
    key = SigningKey.generate()
    Chip.objects.filter(pk=task.chip_id).update(public_key=bytes(key.verify_key))
    task.chip.refresh_from_db()
    return key


def test_an_inspector_sees_and_acts_only_on_its_bodys_tasks(draw):
    eu, us = inspector("inspect-eu"), inspector("inspect-us")
    listed = eu.get("/api/inspections/tasks").json()
    assert listed and all(t["country"] == "NL" for t in listed)
    us_task = a_task("inspect-us")
    assert eu.post(f"/api/inspections/tasks/{us_task.pk}/accept").status_code == 404
    assert (
        eu.post(f"/api/inspections/tasks/{us_task.pk}/finding", {"chip_found": True}, format="json").status_code == 404
    )
    assert us.post(f"/api/inspections/tasks/{us_task.pk}/accept").status_code == 200
    assert inspector("owner-a").get("/api/inspections/tasks").status_code == 403  # a prover is no inspector


def accept(client, task) -> None:
    """The inspector accepts the task (once): the work at the chip comes after."""
    if InspectionTask.objects.filter(pk=task.pk, status=InspectionTask.Status.ASSIGNED).exists():
        assert client.post(f"/api/inspections/tasks/{task.pk}/accept").status_code == 200


def identity(client, task, key, tamper=None):
    accept(client, task)
    challenge = client.post(f"/api/inspections/tasks/{task.pk}/challenge").json()
    signature = key.sign(challenge["message"].encode()).signature
    if tamper:
        challenge, signature = tamper(challenge, signature)
    return challenge, client.post(
        f"/api/inspections/tasks/{task.pk}/identity",
        {"challenge": challenge["nonce"], "signature": base64.b64encode(signature).decode()},
        format="json",
    ).json()


def test_chip_identity_passes_with_the_chips_key(draw):
    task, client = a_task("inspect-eu"), inspector("inspect-eu")
    key = with_chip_key(task)
    _, outcome = identity(client, task, key)
    assert outcome["passed"] is True and outcome["reason"] is None
    assert Entry.objects.filter(kind="inspection.identity_checked", payload__passed=True).exists()


@pytest.mark.parametrize("case", ["wrong_key", "replayed", "expired"])
def test_a_bad_identity_answer_is_a_failed_check_and_an_alert(draw, case):
    task, client = a_task("inspect-eu"), inspector("inspect-eu")
    key = with_chip_key(task)
    if case == "wrong_key":
        _, outcome = identity(client, task, SigningKey.generate())
    elif case == "replayed":
        challenge, first = identity(client, task, key)
        assert first["passed"]
        signature = key.sign(challenge["message"].encode()).signature
        outcome = client.post(
            f"/api/inspections/tasks/{task.pk}/identity",
            {"challenge": challenge["nonce"], "signature": base64.b64encode(signature).decode()},
            format="json",
        ).json()
    elif case == "expired":

        def expire(challenge, signature):
            IdentityChallenge.objects.filter(nonce=challenge["nonce"]).update(
                expires_at=timezone.now() - timedelta(seconds=1)
            )
            return challenge, signature

        _, outcome = identity(client, task, key, tamper=expire)
    assert outcome["passed"] is False and outcome["reason"]
    assert Alert.objects.filter(kind="identity_failed", chip=task.chip).exists()


def firmware_log(key: SigningKey, serial: str, count: int) -> list[str]:
    from replay.protocol.firmware import canonical, record_hash

    lines, prev = [], "0" * 64
    for counter in range(count):
        record = {
            "serial": serial,
            "counter": counter,
            "time": f"2026-11-0{counter + 1}T00:00:00Z",
            "shard": 0,
            "hash": f"{counter:064x}",
            "prev": prev,
        }
        record["sig"] = base64.b64encode(key.sign(canonical(record)).signature).decode()
        lines.append(canonical(record).decode())
        prev = record_hash(record)
    return lines


def upload(client, task, lines):
    accept(client, task)
    return client.post(
        f"/api/inspections/tasks/{task.pk}/snapshot-log", {"log": "\n".join(lines) + "\n"}, format="json"
    )


def test_an_intact_snapshot_log_records_its_snapshots_on_the_ledger(draw, django_capture_on_commit_callbacks):
    task, client = a_task("inspect-eu"), inspector("inspect-eu")
    key = with_chip_key(task)
    with django_capture_on_commit_callbacks(execute=False):
        response = upload(client, task, firmware_log(key, task.chip.serial, 3))
    assert response.status_code == 202 and response.json()["status"] == "pending"
    assert check_snapshot_log(response.json()["id"]) == "intact"  # what the worker runs after commit
    assert Snapshot.objects.filter(chip=task.chip).count() == 3
    entry = Entry.objects.get(kind="inspection.snapshot_log")
    assert [s["counter"] for s in entry.payload["snapshots"]] == [0, 1, 2] and entry.payload["problems"] == []
    assert check_snapshot_log(response.json()["id"]) == "intact"  # a retried task records nothing twice
    assert Entry.objects.filter(kind="inspection.snapshot_log").count() == 1


@pytest.mark.parametrize(
    "tamper, kind",
    [
        (lambda lines: lines[:1] + lines[2:], "gap"),
        (lambda lines: [lines[1], lines[0], *lines[2:]], "reordered"),
        (lambda lines: lines[:1] + [lines[1].replace('"hash":"', '"hash":"f')[:-2] + '"}'] + lines[2:], None),
    ],
)
def test_a_tampered_log_is_reported_and_alerted(draw, tamper, kind, django_capture_on_commit_callbacks):
    task, client = a_task("inspect-eu"), inspector("inspect-eu")
    key = with_chip_key(task)
    with django_capture_on_commit_callbacks(execute=False):
        log_id = upload(client, task, tamper(firmware_log(key, task.chip.serial, 4))).json()["id"]
    assert check_snapshot_log(log_id) == "problems"
    problems = client.get(f"/api/inspections/snapshot-logs/{log_id}").json()["problems"]
    assert problems and (kind is None or any(p["kind"] == kind for p in problems))
    assert Alert.objects.filter(kind="log_problems", chip=task.chip).exists()


def test_findings_not_found_twice_starts_an_unscheduled_campaign(draw):
    client = inspector("inspect-us")
    tasks = list(InspectionTask.objects.filter(inspection_body__slug="inspect-us", prover__slug="owner-a")[:2])
    assert len(tasks) == 2
    for task in tasks:
        assert client.post(f"/api/inspections/tasks/{task.pk}/accept").status_code == 200
        response = client.post(
            f"/api/inspections/tasks/{task.pk}/finding",
            {"chip_found": False, "photo_hashes": ["ab" * 32]},
            format="json",
        )
        assert response.status_code == 201, response.content
    assert Alert.objects.filter(kind="not_found", prover__slug="owner-a").count() == 2
    assert Campaign.objects.filter(slug__startswith="unscheduled-owner-a").count() == 1
    assert Finding.objects.filter(chip_found=False).count() == 2


def test_a_finding_needs_an_accepted_task_and_valid_fields(draw):
    task, client = a_task("inspect-eu"), inspector("inspect-eu")
    assert (
        client.post(f"/api/inspections/tasks/{task.pk}/finding", {"chip_found": True}, format="json").status_code == 400
    )
    client.post(f"/api/inspections/tasks/{task.pk}/accept")
    for bad, field in (
        ({}, "chip_found"),
        ({"chip_found": True, "seal_intact": "yes"}, "seal_intact"),
        ({"chip_found": True, "photo_hashes": ["x"]}, "photo_hashes"),
        ({"chip_found": True, "colour": "red"}, "body"),
    ):
        response = client.post(f"/api/inspections/tasks/{task.pk}/finding", bad, format="json")
        assert response.status_code == 400 and field in response.json()
    refused = client.post(
        f"/api/inspections/tasks/{task.pk}/finding",
        {"chip_found": True, "owner_refused": True, "seal_intact": True},
        format="json",
    )
    assert refused.status_code == 201 and Alert.objects.filter(kind="refused").exists()


def test_the_task_status_refusals_say_what_to_do(draw):
    task, client = a_task("inspect-eu"), inspector("inspect-eu")
    early = client.post(f"/api/inspections/tasks/{task.pk}/finding", {"chip_found": True})
    assert early.json() == {"status": ["the task is not accepted yet: accept it first"]}
    assert client.post(f"/api/inspections/tasks/{task.pk}/accept").status_code == 200
    again = client.post(f"/api/inspections/tasks/{task.pk}/accept")
    assert again.json() == {"status": ["the task is accepted: only an assigned task can be accepted"]}
    assert client.post(f"/api/inspections/tasks/{task.pk}/finding", {"chip_found": True}).status_code == 201
    late = client.post(f"/api/inspections/tasks/{task.pk}/finding", {"chip_found": True})
    assert late.json() == {"status": ["the task is done: its findings are already recorded"]}


@pytest.mark.parametrize(
    "action, body, field",
    [
        ("accept", {"colour": "red"}, "colour"),
        ("identity", {"challenge": "x", "signature": "AA==", "note": "n"}, "note"),
    ],
)
def test_an_inspector_write_refuses_a_member_it_does_not_take_by_name(draw, action, body, field):
    """The signed body is published on the ledger: an unknown member is refused, not carried there unread."""
    task, client = a_task("inspect-eu"), inspector("inspect-eu")
    size = Entry.objects.count()
    answer = client.post(f"/api/inspections/tasks/{task.pk}/{action}", body)
    assert answer.status_code == 400 and list(answer.json()) == [field], answer.json()
    assert "unknown field" in answer.json()[field][0]
    assert Entry.objects.count() == size and InspectionTask.objects.get(pk=task.pk).status == "assigned"


def test_a_failed_identity_check_can_be_retried_and_its_alert_is_superseded(draw):
    task, client = a_task("inspect-eu"), inspector("inspect-eu")
    key = with_chip_key(task)
    _, mistyped = identity(client, task, SigningKey.generate())
    assert mistyped["passed"] is False
    _, retried = identity(client, task, key)
    assert retried["passed"] is True
    alert = Alert.objects.get(kind="identity_failed", task=task)
    assert alert.state == Alert.State.SUPERSEDED
    action = alert.actions.get()
    reason = CaseText.objects.get(commitment=action.reason).text  # private case text, a commitment on the ledger
    assert action.action == "supersede" and "retried within the deadline" in reason
    assert Entry.objects.filter(kind="alert.updated", payload__alert=alert.raised_seq).exists()


@pytest.mark.parametrize("closed", ["past_due", "done"])
def test_no_identity_retry_after_the_deadline_or_the_findings(draw, closed):
    task, client = a_task("inspect-eu"), inspector("inspect-eu")
    accept(client, task)
    if closed == "past_due":
        InspectionTask.objects.filter(pk=task.pk).update(due_on=timezone.now().date() - timedelta(days=1))
    else:
        client.post(f"/api/inspections/tasks/{task.pk}/finding", {"chip_found": True}, format="json")
    response = client.post(f"/api/inspections/tasks/{task.pk}/challenge")
    assert response.status_code == 400 and "status" in response.json()
    assert not IdentityChallenge.objects.filter(task=task).exists()


def test_a_log_of_another_chip_is_named_as_such_and_not_stored(draw):
    task, client = a_task("inspect-eu"), inspector("inspect-eu")
    other = InspectionTask.objects.exclude(chip=task.chip).first().chip
    response = upload(client, task, firmware_log(SigningKey.generate(), other.serial, 2))
    assert response.status_code == 400
    assert f"log belongs to chip {other.serial}" in str(response.json()["log"])
    assert not task.snapshot_logs.exists() and not Alert.objects.filter(kind="log_problems").exists()


def test_training_on_a_chip_the_registry_has_in_transit_is_alerted(draw, django_capture_on_commit_callbacks):
    task, client = a_task("inspect-eu"), inspector("inspect-eu")
    key = with_chip_key(task)
    Chip.objects.filter(pk=task.chip_id).update(status="in_transit")
    with django_capture_on_commit_callbacks(execute=False):
        log_id = upload(client, task, firmware_log(key, task.chip.serial, 2)).json()["id"]
    assert check_snapshot_log(log_id) == "intact"
    alert = Alert.objects.get(kind="unrecorded_use", chip=task.chip)
    assert "in transit" in alert.detail and "receipt was never recorded" in alert.detail


def test_finding_notes_are_private_case_text_never_in_a_signed_body(draw):
    task, client = a_task("inspect-eu"), inspector("inspect-eu")
    client.post(f"/api/inspections/tasks/{task.pk}/accept")
    size = Entry.objects.count()
    body = {"chip_found": True, "notes": "lab manager J. Doe present"}
    refused = client.post(f"/api/inspections/tasks/{task.pk}/finding", body, format="json")
    assert refused.status_code == 400 and "notes" in refused.json(), refused.content
    assert Entry.objects.count() == size
    task.refresh_from_db()
    finding = inspectors.finding_submit(task, task.inspection_body, body)  # the portal's path: no signed body
    entry = Entry.objects.get(seq=finding.recorded_seq)
    assert "J. Doe" not in bytes(entry.leaf).decode() and entry.payload["notes"] == finding.notes
    assert CaseText.objects.get(commitment=finding.notes).text == "lab manager J. Doe present"


def test_the_identity_entry_carries_a_commitment_not_the_challenge_nonce(draw):
    task, client = a_task("inspect-eu"), inspector("inspect-eu")
    key = with_chip_key(task)
    challenge, outcome = identity(client, task, key)
    assert outcome["passed"] is True
    entry = Entry.objects.filter(kind="inspection.identity_checked").get()
    assert challenge["nonce"] not in json.dumps(entry.payload)
    assert CaseText.objects.get(commitment=entry.payload["challenge"]).text == challenge["nonce"]


def test_the_chip_simulators_identity_message_is_the_one_the_server_checks():
    # Lives here, not in tests/replay: the replay tests run without Django (on a GPU machine too).
    from inspections.services.inspectors import identity_message
    from replay.prover import chipsim

    assert chipsim.identity_message("A000001", "00ff") == identity_message("A000001", "00ff")
    assert chipsim.identity_message("A000001", "00ff") != identity_message("A000002", "00ff")


# --- malformed identity answers are the inspector's typos, not failed checks (probe #4) --------------------


@pytest.mark.parametrize(
    "answer, field",
    [
        ({"challenge": "x"}, "challenge"),
        ({"challenge": 5}, "challenge"),
        ({"challenge": "0" * 64}, "challenge"),  # well formed, but never issued for this task
        ({"signature": "!!!"}, "signature"),
        ({"signature": "AAAA"}, "signature"),  # base64, but 3 bytes: no Ed25519 signature
        ({"signature": "A" * 87 + "="}, "signature"),  # 65 bytes
    ],
)
def test_a_malformed_identity_answer_is_refused_naming_the_field_and_changes_nothing(draw, answer, field):
    task, client = a_task("inspect-eu"), inspector("inspect-eu")
    key = with_chip_key(task)
    accept(client, task)
    challenge = client.post(f"/api/inspections/tasks/{task.pk}/challenge").json()
    signature = base64.b64encode(key.sign(challenge["message"].encode()).signature).decode()
    size = Entry.objects.count()
    body = {"challenge": challenge["nonce"], "signature": signature, **answer}
    refused = client.post(f"/api/inspections/tasks/{task.pk}/identity", body, format="json")
    assert refused.status_code == 400 and field in refused.json(), refused.content
    assert Entry.objects.count() == size and not Alert.objects.exists()
    assert not IdentityChallenge.objects.get(nonce=challenge["nonce"]).answered  # the real answer still counts
    passed = client.post(
        f"/api/inspections/tasks/{task.pk}/identity",
        {"challenge": challenge["nonce"], "signature": signature},
        format="json",
    )
    assert passed.status_code == 200 and passed.json()["passed"] is True


def test_a_well_formed_signature_that_does_not_verify_is_a_failed_check(draw):
    task, client = a_task("inspect-eu"), inspector("inspect-eu")
    with_chip_key(task)
    accept(client, task)
    challenge = client.post(f"/api/inspections/tasks/{task.pk}/challenge").json()
    body = {"challenge": challenge["nonce"], "signature": base64.b64encode(bytes(64)).decode()}
    outcome = client.post(f"/api/inspections/tasks/{task.pk}/identity", body, format="json").json()
    assert outcome["passed"] is False and "does not verify" in outcome["reason"]
    assert Alert.objects.filter(kind="identity_failed", task=task).exists()


# --- the work at the chip happens between accept and finding, on the API as in the portal (probe #5) ------


@pytest.mark.parametrize("action", ["challenge", "identity", "snapshot-log"])
@pytest.mark.parametrize("state", ["assigned", "done"])
def test_no_work_at_the_chip_before_accept_or_after_the_finding(
    draw, django_capture_on_commit_callbacks, action, state
):
    task, client = a_task("inspect-eu"), inspector("inspect-eu")
    key = with_chip_key(task)
    path = f"/api/inspections/tasks/{task.pk}"
    challenge = None
    if state == "done":
        accept(client, task)
        challenge = client.post(f"{path}/challenge").json()
        assert client.post(f"{path}/finding", {"chip_found": True}, format="json").status_code == 201
    else:
        challenge = {"nonce": "0" * 64, "message": "x"}
    signature = base64.b64encode(key.sign(challenge["message"].encode()).signature).decode()
    bodies = {
        "challenge": {},
        "identity": {"challenge": challenge["nonce"], "signature": signature},
        "snapshot-log": {"log": "\n".join(firmware_log(key, task.chip.serial, 2)) + "\n"},
    }
    size, logs = Entry.objects.count(), SnapshotLog.objects.count()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        refused = client.post(f"{path}/{action}", bodies[action], format="json")
    assert refused.status_code == 400 and "status" in refused.json(), refused.content
    expected = "accept it first" if state == "assigned" else "the task is done"
    assert expected in str(refused.json()["status"])
    assert (Entry.objects.count(), SnapshotLog.objects.count()) == (size, logs) and not callbacks
    assert not Alert.objects.exists() and not Snapshot.objects.exists()
