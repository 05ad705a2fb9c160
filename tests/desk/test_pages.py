"""The desk's campaign, task and claim pages and the campaign preview: what each shows, who may act, what is written."""

import hashlib
import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse
from hypothesis import given, settings
from hypothesis import strategies as st

from desk.models import Job
from desk.selectors import achieved_detection
from desk.services.jobs import job_run
from inspections import queue
from inspections.models import Alert, Campaign, Claim, Draw, InspectionTask
from inspections.selectors import campaign_plan
from inspections.services import claims as claim_services
from inspections.services import inspectors
from inspections.services.alerts import alert_act
from ledger.models import Entry
from ledger.selectors import leaves, ledger_size

pytestmark = pytest.mark.django_db
STUB = Path(__file__).resolve().parents[1] / "inspections" / "stub_verifier.py"
MANIFEST_BYTES = b'{"checkpoints":{},"segments":{}}'  # the claim's material is copied (and hashed) first
MANIFEST = hashlib.sha256(MANIFEST_BYTES).hexdigest()
CAMPAIGN = "frontier-runs-2026"
SECRET_URL = "https://prover:hunter2@store.example/run-7?X-Amz-Signature=deadbeef"


@pytest.fixture
def staff(client, world):
    client.force_login(world["users"].get(username="regulator-staff"))
    return client


@pytest.fixture
def vendor(client, world):
    client.force_login(world["users"].get(username="vendor-a"))
    return client


@pytest.fixture
def inspected(world):
    """The world's task accepted, a failed identity check, a log with a problem and two snapshots, a finding."""
    task = InspectionTask.objects.select_related("chip", "inspection_body", "prover").get(pk=world["task"].pk)
    body = task.inspection_body
    inspectors.task_accept(task, body)
    challenge = inspectors.identity_challenge_issue(task, body)
    inspectors.identity_answer_check(task, body, challenge.nonce, "A" * 86 + "==")
    log = inspectors.snapshot_log_upload(task, body, "log\n")
    problem = {"kind": "gap", "line": 3, "counter": 2, "detail": "counter jumps from 1 to 3"}
    records = [{"counter": n, "time": f"2026-11-01T0{n}:00:00Z", "shard": 0, "hash": f"{n:064x}"} for n in (0, 1)]
    inspectors.snapshot_log_record(log, [problem], records)
    inspectors.finding_submit(task, body, {"chip_found": True, "seal_intact": True, "notes": "rack 4, slot 2"})
    return {"task": task, "nonce": challenge.nonce}


@pytest.fixture
def stub(settings, tmp_path, monkeypatch):
    """The contract-speaking stub as the verifier (tests/inspections/stub_verifier.py); no broker."""
    settings.REPLAY_VERIFIER_COMMAND = [sys.executable, str(STUB)]
    settings.TRANSCRIPT_ROOTS = [str(tmp_path / "roots")]
    (tmp_path / "roots" / "run").mkdir(parents=True)
    (tmp_path / "roots" / "run" / "manifest.json").write_bytes(MANIFEST_BYTES)
    settings.CLAIM_MATERIAL_ROOT = str(tmp_path / "material")
    monkeypatch.setenv("STUB_RECORD", str(tmp_path / "runs.jsonl"))
    sent = []
    fake = type("App", (), {"send_task": lambda self, name, args, **kw: sent.append((name, args))})()
    monkeypatch.setattr(queue, "current_app", fake)
    return SimpleNamespace(
        location=str(tmp_path / "roots" / "run"),
        set=lambda **spec: monkeypatch.setenv("STUB_VERIFIER", json.dumps(spec)),
        runs=lambda: (tmp_path / "runs.jsonl").read_text().splitlines() if (tmp_path / "runs.jsonl").exists() else [],
    )


def _claim(task, counter: int, location: str) -> Claim:
    """A claim at ``location``; SECRET_URL is refused on submission now, but claims recorded before that rule
    may carry one, and the desk must still not show its secrets: it is set on the row as such a claim's."""
    item = {"serial": task.chip.serial, "counter": counter, "run": "run-7", "step": 10 * (counter + 1)}
    item |= {"manifest": MANIFEST, "location": "https://store.example/run-7" if location == SECRET_URL else location}
    claim = claim_services.claims_submit(prover=task.prover, claims=[item])[0]
    Claim.objects.filter(pk=claim.pk).update(location=location)
    claim.location = location
    return claim


@pytest.fixture
def mismatch(inspected):
    """A claim whose verification found a mismatch at step 20, after replaying segments 0 and 3 of 10."""
    claim = _claim(inspected["task"], 0, SECRET_URL)
    verdict = {"verdict": "rejected", "reasons": ["weights diverge at step 20"], "mismatch_step": 20}
    claim_services.claim_result_record(claim.pk, verdict | {"segments_replayed": [0, 3], "segments_total": 10})
    claim.refresh_from_db()
    return claim


# --- campaign page -------------------------------------------------------------------------------


def test_the_campaign_page_shows_plan_progress_achieved_detection_and_draws(staff):
    campaign = Campaign.objects.get(slug=CAMPAIGN)
    html = staff.get(reverse("desk:campaign", args=[CAMPAIGN])).content.decode()
    plan = campaign_plan(campaign)["owner-a"]
    row = html[html.index('data-prover="owner-a"') :].split("</tr>")[0]
    assert f"<td>{plan['paper']['samples_per_period']} (" in row and plan["chips"] == 23
    draw = Draw.objects.get(campaign=campaign)
    assert reverse("desk:draw", args=[draw.pk]) in html and 'id="chips-covered">1<' in html
    assert "1 open" in html and "0 overdue" in html
    # One period, one chip drawn of 23, K of them used: the sample catches the run with probability
    # (K/23)·(1 − e^(−f·T_m)); the page states it (the weakest prover is owner-a, the only one that can run it).
    expected = plan["chips_needed"] / 23 * -math.expm1(-campaign.snapshot_rate * campaign.period_days)
    assert f'id="achieved">{expected:.3f}<' in html


def test_the_campaign_list_and_draw_page_link_to_the_campaign_and_task_pages(staff, world):
    campaign = Campaign.objects.get(slug=CAMPAIGN)
    assert reverse("desk:campaign", args=[CAMPAIGN]) in staff.get("/admin/inspections/campaign/").content.decode()
    assert staff.get(f"/admin/inspections/campaign/{campaign.pk}/change/").url == reverse(
        "desk:campaign", args=[CAMPAIGN]
    )
    task = world["task"]
    assert reverse("desk:task", args=[task.pk]) in staff.get("/admin/inspections/inspectiontask/").content.decode()
    draw_page = staff.get(reverse("desk:draw", args=[task.draw_id])).content.decode()
    assert reverse("desk:task", args=[task.pk]) in draw_page and reverse("desk:campaign", args=[CAMPAIGN]) in draw_page
    assert staff.get(f"/admin/inspections/inspectiontask/{task.pk}/change/").url == reverse("desk:task", args=[task.pk])
    assert staff.get(reverse("desk:campaign", args=["no-such"])).status_code == 404


@settings(max_examples=60, deadline=None)
@given(
    chips=st.integers(1, 400),
    used=st.integers(1, 400),
    samples=st.integers(0, 400),
    periods=st.integers(1, 6),
)
def test_achieved_detection_combines_periods_as_independent_misses(chips, used, samples, periods):
    used, samples = min(used, chips), min(samples, chips)
    peak = 2.0**40  # a power of two: the rule's FLOPs are exactly ``used`` chips for a year
    campaign = SimpleNamespace(
        rule_flops=used * peak * 86_400 * 365, snapshot_rate=0.1, period_days=30, run_days=365, slug="c"
    )
    row = {"chips": chips, "drawn": [f"S{i}" for i in range(samples)]}
    plans = {"p": {"peak": peak}}
    one = achieved_detection(campaign, plans, [{"p": row}])["p"]
    many = achieved_detection(campaign, plans, [{"p": row}] * periods)["p"]
    assert 0.0 <= one <= many <= 1.0
    assert many == pytest.approx(1 - (1 - one) ** periods, abs=1e-9)
    if samples == chips:  # every chip inspected: only a used chip that never logged escapes
        assert one == pytest.approx(1 - math.exp(-3.0 * used), abs=1e-9)
    if samples == 0:
        assert one == 0.0
    assert achieved_detection(campaign, plans, [{"p": {"chips": chips, "plan_error": "x"}}])["p"] is None


# --- creating a campaign: preview, then create ----------------------------------------------------

FORM = {
    "slug": "fleet-2027",
    "provers": ["owner-a", "owner-b"],
    "rule_flops": "1e24",
    "detection_probability": "0.9",
    "snapshot_rate": "0.1",
    "period_days": "30",
    "run_days": "365",
    "starts_on": "2027-01-01",
    "model": "exact",
}
ADD = "/admin/inspections/campaign/add/"


def test_the_preview_shows_samples_and_cost_and_writes_nothing(staff):
    size, campaigns = ledger_size(), Campaign.objects.count()
    html = staff.post(ADD, FORM).content.decode()
    assert ledger_size() == size and Campaign.objects.count() == campaigns
    assert 'id="preview-plan"' in html and 'data-prover="owner-a"' in html and 'data-prover="owner-b"' in html
    cost = html[html.index('id="preview-cost"') :].split("</table>")[0]
    plan = campaign_plan(Campaign.objects.get(slug=CAMPAIGN))["owner-a"]  # same rule, same chips
    per_period = min(plan["exact"]["samples_per_period"], plan["chips"])  # owner-b cannot run it
    assert f"<td>{per_period}</td><td>{round(per_period * 365 / 30)}</td>" in cost
    assert 'value="create"' in html and 'type="hidden" name="slug" value="fleet-2027"' in html


def test_create_writes_the_campaign_exactly_once(staff):
    size = ledger_size()
    response = staff.post(ADD, {**FORM, "step": "create"})
    assert response.status_code == 302 and response.url == reverse("desk:campaign", args=["fleet-2027"])
    assert Entry.objects.filter(kind="campaign.created", payload__slug="fleet-2027").count() == 1
    kinds = list(Entry.objects.filter(seq__gte=size).order_by("seq").values_list("kind", flat=True))
    assert kinds == ["campaign.created", "campaign.seed_committed"]
    again = staff.post(ADD, {**FORM, "step": "create"})
    assert again.status_code == 200 and "is taken" in again.content.decode() and ledger_size() == size + 2
    assert staff.get(response.url).status_code == 200


def test_the_provers_field_lists_only_organisations_holding_chips_as_owners(staff):
    html = staff.get(ADD).content.decode()
    field = html[html.index('name="provers"') :].split("</select>")[0]
    assert 'value="owner-a"' in field and 'value="owner-b"' in field
    for slug in ("vendor-a", "fab-tw", "regulator", "inspect-eu", "owner-c"):  # owner-c holds no chip
        assert f'value="{slug}"' not in field, slug
    size = ledger_size()
    refused = staff.post(ADD, {**FORM, "provers": ["vendor-a"], "step": "create"})
    assert refused.status_code == 200 and "Select a valid choice" in refused.content.decode()
    assert ledger_size() == size


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"rule_flops": "nan"}, "rule_flops"),
        ({"rule_flops": "1e400"}, "rule_flops"),
        ({"period_days": "400"}, "at most run_days"),
        ({"detection_probability": "1"}, "between 0 and 1"),
        ({"provers": [], "country": ""}, "name the provers"),
        ({"slug": CAMPAIGN}, "is taken"),
        ({"model": "magic"}, "model"),
    ],
)
def test_bad_input_is_refused_on_the_form_in_preview_and_create(staff, change, reason):
    size = ledger_size()
    for step in ("preview", "create"):
        response = staff.post(ADD, {**FORM, **change, "step": step})
        html = response.content.decode()
        assert response.status_code == 200 and 'id="preview-plan"' not in html
        assert reason in html or "errorlist" in html
    assert ledger_size() == size


# --- task page -----------------------------------------------------------------------------------


def test_the_task_page_shows_identity_log_verdict_snapshots_finding_and_alerts(staff, inspected):
    task = inspected["task"]
    html = staff.get(reverse("desk:task", args=[task.pk])).content.decode()
    identity = html[html.index('id="task-identity"') :].split("</table>")[0]
    assert "FAILED: the signature does not verify" in identity
    logs = html[html.index('id="task-logs"') :].split("</table>")[0]
    assert "problems" in logs and "line 3: gap (counter jumps from 1 to 3)" in logs
    snapshots = html[html.index('id="task-snapshots"') :].split("</table>")[0]
    assert snapshots.count("<tr>") == 3 and "not answered" in snapshots
    assert "rack 4, slot 2" in html and 'id="task-status">done' in html
    alerts = html[html.index('id="task-alerts"') :].split("</table>")[0]
    assert "identity_failed" in alerts and "log_problems" in alerts and "overdue" in alerts
    assert inspected["nonce"] not in html  # a challenge nonce is no one's business in the admin
    assert staff.get(reverse("desk:task", args=[10**9])).status_code == 404


def test_private_case_text_is_shown_to_regulator_staff_only(client, world, inspected):
    """Finding notes, triage reasons and assignees: staff read them; the auditor sees "(private)"; the public
    ledger carries only salted commitments."""
    task = inspected["task"]
    alert = Alert.objects.filter(task=task).first()
    alert_act(alert, action="assign", by="regulator-staff", assignee="regulator-staff")
    alert_act(alert, action="comment", by="regulator-staff", reason="Asked lab-cheat for the original transcript")
    pages = (reverse("desk:task", args=[task.pk]), reverse("desk:alert", args=[alert.pk]))
    secrets = ("rack 4, slot 2", "Asked lab-cheat for the original transcript")
    client.force_login(world["users"].get(username="regulator-staff"))
    staff_html = "".join(client.get(page).content.decode() for page in pages)
    assert all(secret in staff_html for secret in secrets)
    client.force_login(world["users"].get(username="auditor"))
    auditor_html = "".join(client.get(page).content.decode() for page in pages)
    assert not any(secret in auditor_html for secret in secrets) and "(private)" in auditor_html
    public = b"".join(leaf for _, leaf in leaves())
    assert not any(secret.encode() in public for secret in secrets)


# --- claim page and re-verification ----------------------------------------------------------------


def test_the_claim_page_shows_verdict_reasons_segments_and_coverage(staff, mismatch):
    html = staff.get(reverse("desk:claim", args=[mismatch.pk])).content.decode()
    assert 'id="claim-result">mismatch at step 20' in html and "weights diverge at step 20" in html
    assert 'id="claim-segments">2 / 10' in html
    assert "No verified claim of this run has replayed a segment yet" in html  # a mismatch replays nothing good
    assert "mismatch 1" in html and 'id="start-reverify"' in html
    assert "hunter2" not in html and "deadbeef" not in html and "https://store.example/run-7" in html
    assert reverse("desk:claim", args=[mismatch.pk]) in staff.get("/admin/inspections/claim/").content.decode()


def test_re_verify_a_final_claim_replays_it_and_keeps_the_verdict(
    staff, stub, mismatch, django_capture_on_commit_callbacks
):
    Claim.objects.filter(pk=mismatch.pk).update(location=stub.location)
    stub.set(verdict="verified", segments=[1], total=10)
    with django_capture_on_commit_callbacks(execute=False):
        response = staff.post(reverse("desk:claim", args=[mismatch.pk]))
    assert response.status_code == 302
    job = Job.objects.get()
    assert job.kind == Job.Kind.CLAIM_REVERIFY and job.started_by == "regulator-staff" and job.state == "queued"
    size = ledger_size()
    assert job_run(job.pk) == Job.State.DONE
    job.refresh_from_db()
    assert job.result["recorded"] is False and job.result["result"] == "verified" and job.result["agrees"] is False
    assert "DIFFERS from the recorded mismatch" in job.message and ledger_size() == size
    mismatch.refresh_from_db()
    assert mismatch.result == "mismatch" and len(stub.runs()) == 1
    html = staff.get(reverse("desk:claim", args=[mismatch.pk])).content.decode()
    assert f'href="{reverse("desk:job", args=[job.pk])}"' in html and "DIFFERS" in html


def test_re_verify_an_errored_claim_records_its_result_on_the_ledger(stub, inspected):
    claim = _claim(inspected["task"], 1, stub.location)
    claim_services.claim_error_record(claim.pk, "worker lost")  # retry scheduled an hour or more ahead
    stub.set(verdict="verified", segments=[2], total=10)
    outcome = claim_services.claim_reverify(claim.pk)
    claim.refresh_from_db()
    assert outcome["recorded"] is True and claim.result == "verified" and outcome["result_seq"] == claim.result_seq
    assert Entry.objects.get(seq=claim.result_seq).kind == "claim.verified"


# --- who sees what ------------------------------------------------------------------------------


def test_the_auditor_reads_every_page_without_actions_or_secrets(auditor, mismatch, inspected):
    pages = [
        reverse("desk:campaign", args=[CAMPAIGN]),
        reverse("desk:task", args=[inspected["task"].pk]),
        reverse("desk:claim", args=[mismatch.pk]),
    ]
    for page in pages:
        response = auditor.get(page)
        html = response.content.decode()
        assert response.status_code == 200, page
        assert 'type="submit"' not in html.split('id="content"')[1], page
        assert "hunter2" not in html and "deadbeef" not in html and inspected["nonce"] not in html
    assert auditor.post(reverse("desk:claim", args=[mismatch.pk])).status_code == 403
    assert auditor.get(ADD).status_code == 403 and auditor.post(ADD, {**FORM, "step": "create"}).status_code == 403
    assert not Job.objects.exists() and not Campaign.objects.filter(slug="fleet-2027").exists()


def test_a_vendor_is_refused_every_desk_page(vendor, mismatch, inspected):
    size = ledger_size()
    for page in (
        reverse("desk:campaign", args=[CAMPAIGN]),
        reverse("desk:task", args=[inspected["task"].pk]),
        reverse("desk:claim", args=[mismatch.pk]),
        ADD,
    ):
        assert vendor.get(page).status_code == 302, page
        assert vendor.post(page, {**FORM, "step": "create"}).status_code == 302, page
    assert not Job.objects.exists() and ledger_size() == size


def test_regulator_staff_may_start_jobs_and_triage_and_the_auditor_may_not(world):
    staff, auditor = (get_user_model().objects.get(username=name) for name in ("regulator-staff", "auditor"))
    assert staff.has_perm("desk.add_job") and staff.has_perm("inspections.change_alert")
    assert auditor.has_perm("desk.view_job") and not auditor.has_perm("desk.add_job")
    assert not auditor.has_perm("inspections.change_alert") and not auditor.has_perm("inspections.add_campaign")


def test_the_claim_page_names_the_dispute_and_shows_findings_with_evidence(staff, inspected):
    """Issue #19: the first divergent step and operation of a disputed replay, and the heuristics' findings."""
    claim = _claim(inspected["task"], 1, SECRET_URL)
    verdict = {
        "verdict": "rejected",
        "reasons": ["segment 4..8: step 6: replayed loss differs"],
        "mismatch_step": 6,
        "dispute": {"step": 6, "op": "layers.1#3", "detail": "rounding point layers.1#3", "source": "commitments"},
        "findings": [{"kind": "straight_line", "detail": "checkpoints around 8", "evidence": {"collinear_at": [8]}}],
    }
    claim_services.claim_result_record(claim.pk, verdict)
    html = staff.get(reverse("desk:claim", args=[claim.pk])).content.decode()
    assert "First divergent step <strong>6</strong>, first divergent operation <strong>layers.1#3</strong>" in html
    # each finding in words first (what was measured, what it would mean), then the verifier's detail and evidence
    assert "<strong>straight_line</strong>: Checkpoints around steps 8 lie nearly on a straight line" in html
    assert "It decided nothing." in html and "checkpoints around 8" in html
    alert = Alert.objects.filter(kind=Alert.Kind.CLAIM_FAILED).latest("raised_seq")
    assert "first divergent step 6, operation layers.1#3" in alert.detail
