"""rebuild_projections --check covers the inspections tables: a world made by the real services equals its
rebuild from the ledger, and a row changed behind the ledger's back in any inspections table is reported."""

import base64
import io
from datetime import UTC, datetime, timedelta

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection
from django.test import TestCase
from django.utils import timezone
from nacl.signing import SigningKey

from inspections import rebuild_inspections as rebuild
from inspections.models import Alert, Claim, Finding, InspectionTask, Snapshot, SnapshotLog
from inspections.services import campaigns, inspectors, sweeps
from inspections.services import claims as claim_services
from inspections.services.alerts import alert_act
from inspections.services.bodies import inspection_body_register
from registry.models import Organisation
from replay.protocol import firmware
from tests.inspections.factories import H100, YEAR, accepted, make_provers
from tests.inspections.services import test_claim_results as claim_results
from tests.registry.factories import event
from tests.shared_world import seeded_once_per_module

pytestmark = pytest.mark.django_db


def register_body(slug: str, countries: list[str], capacity: int) -> None:
    inspection_body_register(organisation=slug, countries=countries, capacity_per_period=capacity)


def rebuild_world() -> dict:
    """Every inspections entry kind, written by the services (Celery and mail left out): the EU body's tasks' keys."""
    make_provers()  # registers its inspection bodies through the service, on the ledger
    register_body("inspect-eu", ["NL", "DE", "BE"], 40)  # a re-registration replaces the row
    today = timezone.now().date()
    with TestCase.captureOnCommitCallbacks(execute=False):
        # owner-b's 50 NL chips: 46 samples, 40 of them within the EU body's capacity
        c1 = campaigns.campaign_create(
            slug="c1",
            provers=["owner-b"],
            rule_flops=5 * H100 * 86_400 * 30,
            starts_on=today,
            detection_probability=0.99,
            period_days=30,
            run_days=30,
        )
        campaigns.campaign_create(
            slug="c-nl", country="NL", rule_flops=20 * H100 * YEAR, starts_on=today, ends_on=today + timedelta(days=365)
        )
        campaigns.campaign_seed_commit(c1, 3)
        campaigns.campaign_draw(c1, 0)
        eu = list(
            InspectionTask.objects.filter(inspection_body__slug="inspect-eu")
            .select_related("chip", "prover", "inspection_body")
            .order_by("id")
        )
        body = eu[0].inspection_body
        inspectors.task_accept(eu[0], body)
        inspectors.finding_submit(
            eu[0], body, {"chip_found": True, "seal_intact": True, "notes": "sealed", "photo_hashes": ["ab" * 32]}
        )
        inspectors.task_accept(eu[1], body)
        inspectors.finding_submit(eu[1], body, {"chip_found": False, "owner_refused": True})
        for task in eu[2:6]:
            inspectors.task_accept(task, body)
        challenge = inspectors.identity_challenge_issue(eu[2], body)
        inspectors.identity_answer_check(eu[2], body, challenge.nonce, base64.b64encode(bytes(64)).decode())
        log = inspectors.snapshot_log_upload(eu[3], body, "record 0\nrecord 1\n")
        records = [
            {"counter": n, "time": f"2026-11-0{n + 1}T00:00:00Z", "shard": 0, "hash": f"{n:064x}"} for n in (0, 1, 2)
        ]
        inspectors.snapshot_log_record(log, [], records)
        garbled = inspectors.snapshot_log_upload(eu[4], body, "garbled\n")
        problem = {"line": 1, "kind": "malformed", "counter": None, "detail": "not JSON"}
        inspectors.snapshot_log_record(garbled, [problem], [])
        inspectors.snapshot_log_upload(eu[5], body, "not checked yet\n")  # no entry until the check
        serial = eu[3].chip.serial
        claims = claim_services.claims_submit(
            prover=eu[3].prover,
            claims=[
                {
                    "serial": serial,
                    "counter": n,
                    "run": "run-1",
                    "step": 10 + n,
                    "manifest": "c" * 64,
                    "location": "/runs/1",
                }
                for n in (0, 1, 2)
            ],
        )
        claim_services.claim_result_record(
            claims[0].pk,
            {
                "verdict": "verified",
                "reasons": [],
                "flops": 1e9,
                "steps": 20,
                "rules": {},
                "nonce": "ab" * 16,
                "segments_replayed": [0, 4],
                "segments_total": 5,
                "coverage": 0.4,
            },
        )
        for attempt in range(settings.REPLAY_MAX_ATTEMPTS):  # the verifier keeps failing: an alert, no retry
            claim_services.claim_error_record(claims[1].pk, "the verifier failed (exit 3)", attempt)
        claim_services.claim_error_record(claims[2].pk, "the verifier was killed by signal 9", 0)
        claim_services.claim_result_record(claims[2].pk, {"verdict": "rejected", "budget_exhausted": True}, failures=1)
        sweeps.overdue_sweep(today + timedelta(days=campaigns.TASK_DAYS + 1))
        event(eu[6].prover, "reported_lost", [eu[6].chip.serial])
        sweeps.lost_chip_sweep()
        refused = Alert.objects.get(kind="refused")
        User.objects.create_superuser("ana", is_staff=True)
        alert_act(refused, action="assign", by="regulator", assignee="ana")
        alert_act(refused, action="resolve", by="ana", reason="owner let the inspector in on a second visit")
    return {"serial": serial, "tasks": [task.pk for task in eu]}


rebuild_world_fixture = seeded_once_per_module(rebuild_world)


@pytest.fixture
def world(rebuild_world):
    """The rebuild world (seeded once per module), its EU tasks read afresh for each test."""
    related = InspectionTask.objects.select_related("chip", "prover", "inspection_body")
    tasks = related.in_bulk(rebuild_world["tasks"])
    return {"serial": rebuild_world["serial"], "tasks": [tasks[pk] for pk in rebuild_world["tasks"]]}


def check() -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("rebuild_projections", "--check", stdout=out, stderr=err)
    except SystemExit as exit_:
        return exit_.code, out.getvalue() + err.getvalue()
    return 0, out.getvalue() + err.getvalue()


def test_the_world_covers_every_kind_and_equals_its_rebuild(world):
    kinds = set(Alert.objects.values_list("kind", flat=True))
    assert kinds == {
        "refused",
        "not_found",
        "identity_failed",
        "log_problems",
        "claim_failed",
        "verifier_failed",
        "overdue",
        "lost",
        "unassigned",
    }
    assert set(InspectionTask.objects.values_list("status", flat=True)) >= {"done", "overdue"}
    assert set(SnapshotLog.objects.values_list("status", flat=True)) == {"intact", "problems", "pending"}
    assert set(Claim.objects.values_list("result", flat=True)) == {"verified", "error", "timed_out"}
    code, output = check()
    assert code == 0, output
    assert "OK projections match the ledger" in output and "2 campaigns" in output and "3 claims" in output


def sql(statement: str, *params) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def _task(world, n: int) -> tuple[int, str]:
    task = world["tasks"][n]
    return task.pk, f"c1/0/{task.chip.serial}"


def tamper_campaign(world):
    sql("UPDATE inspections_campaign SET rule_flops = rule_flops * 2 WHERE slug = 'c1'")
    return "campaign c1:"


def tamper_campaign_provers(world):
    fab = Organisation.objects.get(slug="fab-tw").pk
    owner_b = Organisation.objects.get(slug="owner-b").pk
    sql("UPDATE inspections_campaign_provers SET organisation_id = %s WHERE organisation_id = %s", fab, owner_b)
    return "campaign provers c1:"


def tamper_seed_commitment(world):
    sql("UPDATE inspections_campaignseed SET commitment = %s WHERE period = 3", "0" * 64)
    return "campaign seed c1/3:"


def tamper_revealed_seed(world):
    sql(
        "UPDATE inspections_campaignseed SET seed = %s WHERE period = 0 AND campaign_id = "
        "(SELECT id FROM inspections_campaign WHERE slug = 'c1')",
        bytes(32),
    )
    return "campaign seed c1/0:"


def tamper_draw(world):
    sql("UPDATE inspections_draw SET checkpoint_size = checkpoint_size + 1")
    return "draw c1/0:"


def tamper_task(world):
    pk, key = _task(world, 0)
    sql("UPDATE inspections_inspectiontask SET status = 'accepted' WHERE id = %s", pk)
    return f"inspection task {key}:"


def tamper_task_body(world):
    pk, key = _task(world, 7)
    sql("UPDATE inspections_inspectiontask SET inspection_body_id = NULL WHERE id = %s", pk)
    return f"inspection task {key}:"


def tamper_body(world):
    sql(
        "UPDATE inspections_inspectionbody SET capacity_per_period = 41 WHERE organisation_id = %s",
        Organisation.objects.get(slug="inspect-eu").pk,
    )
    return "inspection body inspect-eu:"


def tamper_finding(world):
    pk, key = _task(world, 0)
    sql("UPDATE inspections_finding SET notes = 'broken seal' WHERE task_id = %s", pk)
    return f"finding {key}:"


def tamper_alert(world):
    seq = Alert.objects.get(kind="refused").raised_seq
    sql("UPDATE inspections_alert SET detail = 'nothing to see' WHERE raised_seq = %s", seq)
    return f"alert {seq}:"


def tamper_alert_state(world):
    seq = Alert.objects.get(kind="refused").raised_seq
    sql("UPDATE inspections_alert SET state = 'false_positive' WHERE raised_seq = %s", seq)
    return f"alert {seq}:"


def tamper_alert_action(world):
    seq = Alert.objects.get(kind="refused").raised_seq
    sql("UPDATE inspections_alertaction SET reason = 'nothing happened' WHERE action = 'resolve'")
    return f"alert {seq}:"


def tamper_log(world):
    seq = SnapshotLog.objects.get(status="problems").checked_seq
    sql("UPDATE inspections_snapshotlog SET status = 'intact' WHERE checked_seq = %s", seq)
    return f"snapshot log {seq}:"


def tamper_log_text(world):
    log = SnapshotLog.objects.get(status="intact")
    sql("UPDATE inspections_snapshotlog SET text = 'record 9\n' WHERE id = %s", log.pk)
    return f"snapshot log text id={log.pk}:"


def tamper_snapshot(world):
    sql("UPDATE inspections_snapshot SET hash = %s WHERE counter = 1", "f" * 64)
    return f"snapshot {world['serial']}/1:"


def tamper_claim(world):
    pk = Claim.objects.get(snapshot__counter=1).pk
    sql("UPDATE inspections_claim SET result = 'verified' WHERE id = %s", pk)
    return f"claim {world['serial']}/1:"


def tamper_claim_retry(world):
    pk = Claim.objects.get(snapshot__counter=1).pk
    sql("UPDATE inspections_claim SET failures = 0, retry_at = NULL WHERE id = %s", pk)
    return f"claim {world['serial']}/1:"


@pytest.mark.parametrize(
    "tamper",
    [
        tamper_campaign,
        tamper_campaign_provers,
        tamper_seed_commitment,
        tamper_revealed_seed,
        tamper_draw,
        tamper_task,
        tamper_task_body,
        tamper_body,
        tamper_finding,
        tamper_alert,
        tamper_alert_state,
        tamper_alert_action,
        tamper_log,
        tamper_log_text,
        tamper_snapshot,
        tamper_claim,
        tamper_claim_retry,
    ],
    ids=lambda tamper: tamper.__name__.removeprefix("tamper_"),
)
def test_a_row_changed_behind_the_ledger_is_reported(world, tamper):
    expected = tamper(world)
    code, output = check()
    assert code == 1, output
    assert any(line.startswith(expected) for line in output.splitlines()), output


def test_a_deleted_projection_row_is_reported(world):
    Finding.objects.filter(task=world["tasks"][1]).delete()
    code, output = check()
    assert code == 1 and f"finding c1/0/{world['tasks'][1].chip.serial}: live=None" in output, output


def test_campaign_model_defaults_to_the_paper_plan():
    world = rebuild.World()
    params = {
        "provers": ["p"],
        "country": "",
        "rule_flops": 1e24,
        "detection_probability": 0.9,
        "snapshot_rate": 0.1,
        "period_days": 30,
        "run_days": 365,
        "starts_on": "2026-01-01",
        "ends_on": None,
    }
    rebuild.apply(world, 1, "2026-01-01T00:00:00.000000Z", "campaign.created", "regulator", {"slug": "a", **params})
    rebuild.apply(
        world,
        2,
        "2026-01-01T00:00:00.000000Z",
        "campaign.created",
        "regulator",
        {"slug": "b", **params, "model": "exact"},
    )
    assert (world.campaigns["a"]["model"], world.campaigns["b"]["model"]) == ("paper", "exact")
    rebuild.apply(
        world,
        3,
        "2026-01-01T00:00:00.000000Z",
        "inspection_body.registered",
        "regulator",
        {"organisation": "x", "countries": ["US"], "capacity_per_period": 5},
    )
    rebuild.apply(
        world,
        4,
        "2026-01-01T00:00:00.000000Z",
        "inspection_body.registered",
        "regulator",
        {"organisation": "x", "countries": ["DE", "NL"], "capacity_per_period": 7},
    )
    assert world.bodies == {"x": {"countries": ["DE", "NL"], "capacity_per_period": 7}}


# --- claims' nonces, copies, copy failures, conflicts and the firmware's work counters (issue #19) ------------

CHIP_KEY = SigningKey(bytes(range(32)))  # the drawn chips' firmware key (the ledger registers its public half)


@pytest.fixture
def claim_world(monkeypatch, settings, tmp_path, django_capture_on_commit_callbacks):
    """A signed firmware log with work counters, and claims through the stub verifier: one verified (its nonce
    revealed), one copied and failing (its nonce committed, still secret), one whose copies failed, one in
    conflict with the verified one."""
    from tests.registry import factories

    public = base64.b64encode(bytes(CHIP_KEY.verify_key)).decode()
    monkeypatch.setattr(factories, "chip_public_key", lambda: public)
    make_provers()
    campaign = campaigns.campaign_create(
        slug="c1", provers=["owner-a"], rule_flops=20 * H100 * YEAR, starts_on=timezone.now().date()
    )
    campaigns.campaign_draw(campaign, 0)
    task = InspectionTask.objects.exclude(inspection_body=None).select_related("chip", "inspection_body").first()
    chip = firmware.Chip(task.chip.serial, 0, CHIP_KEY)
    lines = []
    for n in range(4):
        chip.work(3600.0, 10**18 + n)
        lines.append(chip.snapshot(datetime(2026, 11, 1, n, tzinfo=UTC), f"{n:064x}"))
    stub = claim_results.stub.__wrapped__(settings, tmp_path, monkeypatch)
    with django_capture_on_commit_callbacks(execute=False):
        log = inspectors.snapshot_log_upload(accepted(task), task.inspection_body, "\n".join(lines) + "\n")
    assert inspectors.snapshot_log_check(log.pk) == "intact"

    def file(counter: int, step: int) -> Claim:
        return claim_results.claim(task, stub, django_capture_on_commit_callbacks, counter=counter, step=step)

    verified, failing, uncopied, conflicting = file(0, 10), file(1, 20), file(2, 30), file(3, 5)
    stub.set(verdict="verified", segments=[0], total=4)
    assert claim_services.claim_verify(verified.pk) == "verified"
    stub.set(mode="crash")
    assert claim_services.claim_verify(failing.pk) == "error"
    claim_services.claim_unavailable_record(uncopied.pk, "the share failed a read", 0)
    conflict = {"counter": 0, "kind": "order", "detail": "step 5 at 03:00 comes after step 10 at 00:00"}
    stub.set(verdict="rejected", reasons=["chip: step 5 comes after step 10"], extra={"conflicts": [conflict]})
    assert claim_services.claim_verify(conflicting.pk) == "mismatch"
    return {"serial": task.chip.serial, "claims": (verified, failing, uncopied, conflicting)}


def test_claims_nonces_copies_conflicts_and_work_counters_equal_their_rebuild(claim_world):
    verified, failing, uncopied, _ = (Claim.objects.get(pk=c.pk) for c in claim_world["claims"])
    assert verified.nonce and failing.nonce and not uncopied.nonce and uncopied.copy_failures == 1
    assert Snapshot.objects.get(counter=2).work == {"busy_ns": str(3 * 3600 * 10**9), "flops": str(3 * 10**18 + 3)}
    code, output = check()
    assert code == 0, output
    world = rebuild.rebuild()
    serial = claim_world["serial"]
    assert world.claims[(serial, 0)]["nonce"] == verified.nonce  # revealed by its verdict
    assert world.claims[(serial, 1)]["nonce"] is None  # still secret: only its commitment is on the ledger
    assert world.claims[(serial, 1)]["nonce_sha256"] == claim_services.nonce_commitment(failing.nonce)
    assert world.claims[(serial, 2)]["copy_failures"] == 1 and world.claims[(serial, 1)]["material"]
    assert world.snapshots[(serial, 2)]["work"] == Snapshot.objects.get(counter=2).work
    assert [c["counters"] for c in world.conflicts.values()] == [(3, 0)]


def _claim_sql(world, counter: int, assignment: str, *params) -> str:
    pk = Claim.objects.get(snapshot__counter=counter).pk
    sql(f"UPDATE inspections_claim SET {assignment} WHERE id = %s", *params, pk)
    return f"claim {world['serial']}/{counter}:"


@pytest.mark.parametrize(
    "tamper",
    [
        lambda w: _claim_sql(w, 1, "nonce = %s", "cd" * 16),  # a secret nonce swapped: its hash no longer matches
        lambda w: _claim_sql(w, 2, "nonce = %s", "cd" * 16),  # a nonce the ledger never committed
        lambda w: _claim_sql(w, 0, "nonce = %s", "cd" * 16),  # a revealed nonce
        lambda w: _claim_sql(w, 1, "material = ''"),
        lambda w: _claim_sql(w, 2, "copy_failures = 0"),
        lambda w: (
            sql("UPDATE inspections_snapshot SET work = %s WHERE counter = 2", '{"busy_ns": "0", "flops": "0"}'),
            f"snapshot {w['serial']}/2:",
        )[1],
        lambda w: (
            sql("UPDATE inspections_alert SET detail = 'no conflict' WHERE detail LIKE %s", "%conflicts with%"),
            "alert ",
        )[1],
    ],
    ids=["secret_nonce", "uncommitted_nonce", "revealed_nonce", "material", "copy_failures", "work", "conflict"],
)
def test_a_claims_nonce_copy_or_conflict_changed_behind_the_ledger_is_reported(claim_world, tamper):
    expected = tamper(claim_world)
    code, output = check()
    assert code == 1, output
    assert any(line.startswith(expected) for line in output.splitlines()), output


def test_a_log_text_changed_behind_the_ledger_leaves_its_work_counters_unrebuilt(claim_world):
    log = SnapshotLog.objects.get(status="intact")
    sql(
        "UPDATE inspections_snapshotlog SET text = %s WHERE id = %s", log.text.replace('"flops":1', '"flops":2'), log.pk
    )
    code, output = check()
    assert code == 1 and f"snapshot log text id={log.pk}:" in output
    assert f"snapshot {claim_world['serial']}/0:" in output  # the counters cannot be rebuilt from a changed text
