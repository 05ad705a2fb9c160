"""A claim's verification against a stub verifier that speaks the contract (tests/inspections/stub_verifier.py):
what the verifier is told, how its verdicts, crashes and coverage land on the ledger, retries and idempotence."""

import hashlib
import io
import json
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.utils import timezone

from inspections import queue, selectors, verification
from inspections.models import Alert, Claim, InspectionTask
from inspections.services import claims as claim_services
from inspections.services import inspectors
from ledger.models import Entry
from tests.inspections.factories import accepted

pytestmark = pytest.mark.django_db
STUB = Path(__file__).resolve().parents[1] / "stub_verifier.py"
MANIFEST_BYTES = b'{"checkpoints":{},"segments":{}}'  # the stub reads nothing; the copy needs a manifest
MANIFEST = hashlib.sha256(MANIFEST_BYTES).hexdigest()


@pytest.fixture
def stub(settings, tmp_path, monkeypatch):
    """The stub as the verifier; ``stub.set(...)`` says what it does; ``stub.runs()`` what it was given."""
    record = tmp_path / "runs.jsonl"
    settings.REPLAY_VERIFIER_COMMAND = [sys.executable, str(STUB)]
    settings.TRANSCRIPT_ROOTS = [str(tmp_path / "roots")]
    (tmp_path / "roots" / "run").mkdir(parents=True)
    (tmp_path / "roots" / "run" / "manifest.json").write_bytes(MANIFEST_BYTES)
    settings.CLAIM_MATERIAL_ROOT = str(tmp_path / "material")
    monkeypatch.setenv("STUB_RECORD", str(record))
    sent = []
    monkeypatch.setattr(
        queue,
        "current_app",
        type("App", (), {"send_task": lambda self, name, args, **kw: sent.append((name, args, kw))})(),
    )

    class Stub:
        location = str(tmp_path / "roots" / "run")
        enqueued = sent

        def set(self, **spec):
            monkeypatch.setenv("STUB_VERIFIER", json.dumps(spec))

        def runs(self):
            return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []

    return Stub()


@pytest.fixture
def snapshots(draw, django_capture_on_commit_callbacks):
    """Four authentic snapshots (counters 0-3, one hour apart) of one drawn chip of owner-a."""
    task = (
        InspectionTask.objects.exclude(inspection_body=None)
        .filter(prover__slug="owner-a")
        .select_related("chip", "inspection_body", "prover")
        .first()
    )
    with django_capture_on_commit_callbacks(execute=False):
        log = inspectors.snapshot_log_upload(accepted(task), task.inspection_body, "log\n")
        records = [{"counter": n, "time": f"2026-11-01T0{n}:00:00Z", "shard": 0, "hash": f"{n:064x}"} for n in range(4)]
        inspectors.snapshot_log_record(log, [], records)
    return task


def claim(task, stub, django_capture_on_commit_callbacks, counter=0, step=None, **change) -> Claim:
    item = {
        "serial": task.chip.serial,
        "counter": counter,
        "run": "run-1",
        "step": 10 * (counter + 1) if step is None else step,
        "manifest": MANIFEST,
        "location": stub.location,
        **change,
    }
    with django_capture_on_commit_callbacks(execute=True):
        return claim_services.claims_submit(prover=task.prover, claims=[item])[0]


def rebuild_ok() -> str:
    out = io.StringIO()
    try:
        call_command("rebuild_projections", "--check", stdout=out, stderr=out)
    except SystemExit as exit_:
        assert exit_.code == 0, out.getvalue()
    return out.getvalue()


# --- what the verifier is told ---------------------------------------------------------------------


def test_the_verifier_is_told_the_snapshot_time_history_chips_and_coverage(
    snapshots, stub, django_capture_on_commit_callbacks
):
    stub.set(verdict="verified", segments=[0, 3], total=10)
    first = claim(snapshots, stub, django_capture_on_commit_callbacks, counter=0)
    assert claim_services.claim_verify(first.pk) == "verified"
    second = claim(snapshots, stub, django_capture_on_commit_callbacks, counter=2, run="run-1b")
    stub.set(verdict="verified", segments=[7], total=10)
    assert claim_services.claim_verify(second.pk) == "verified"

    given = stub.runs()[1]["claims"]
    serial = snapshots.chip.serial
    assert given["manifest"] == MANIFEST
    assert given["claims"] == [
        {"serial": serial, "counter": 2, "shard": 0, "hash": f"{2:064x}", "step": 30, "time": "2026-11-01T02:00:00Z"}
    ]
    assert given["history"] == {
        serial: [{"counter": 0, "time": "2026-11-01T00:00:00Z", "step": 10, "run": "run-1", "manifest": MANIFEST}]
    }
    assert given["replayed_segments"] == [0, 3] and given["coverage_target"] == 0.9
    chips = given["prover_chips"]
    assert chips[serial] == {"model": "h100-sxm", "peak_flops_16bit": 989e12}
    assert set(chips) == set(snapshots.prover.owned_chips.values_list("serial", flat=True)) and len(chips) == 200
    argv = stub.runs()[1]["argv"]
    nonce = argv[argv.index("--nonce") + 1]
    assert len(bytes.fromhex(nonce)) == 16 and nonce != stub.runs()[0]["argv"][argv.index("--nonce") + 1]
    second.refresh_from_db()
    assert argv[0] == str(verification.material_dir(MANIFEST)) and second.material == MANIFEST  # the run's copy
    assert "--allow-host" not in argv


def test_the_run_coverage_accumulates_across_claims_on_the_ledger(snapshots, stub, django_capture_on_commit_callbacks):
    for counter, segments in ((0, [0, 3]), (1, [5]), (2, [9])):  # 2 of 10, 1 of 8, 1 of 7: missed 6/10
        stub.set(verdict="verified", segments=segments, total=10)
        c = claim(snapshots, stub, django_capture_on_commit_callbacks, counter=counter)
        claim_services.claim_verify(c.pk)
    entry = Entry.objects.filter(kind="claim.verified").order_by("-seq").first()
    assert entry.payload["segments_replayed"] == [9] and entry.payload["segments_total"] == 10
    assert entry.payload["coverage"] == pytest.approx(0.4) and len(entry.payload["nonce"]) == 32
    run = selectors.run_coverage(snapshots.prover, MANIFEST)
    assert run["segments_replayed"] == [0, 3, 5, 9] and run["segments_total"] == 10
    assert run["coverage"] == pytest.approx(0.4) and run["target_met"] is False
    assert run["results"] == {"verified": 3} and run["names"] == ["run-1"]
    assert [r["manifest"] for r in selectors.runs()] == [MANIFEST]
    assert "3 claims" in rebuild_ok()


def test_segments_a_claim_forced_give_no_coverage(snapshots, stub, django_capture_on_commit_callbacks):
    """The prover knows which segments its claims force (the segment before each claim's checkpoint) and would
    fabricate another: only random draws cover, each verification's (pool, drawn) on the ledger, and the next
    claim's verifier is told them."""
    stub.set(verdict="verified", segments=[0, 9], drawn=[0], total=10)
    first = claim(snapshots, stub, django_capture_on_commit_callbacks, counter=0)
    claim_services.claim_verify(first.pk)
    entry = Entry.objects.filter(kind="claim.verified").order_by("-seq").first()
    assert entry.payload["segments_drawn"] == [0] and entry.payload["segments_replayed"] == [0, 9]
    assert entry.payload["draw_pool"] == 9  # 9 forced: the draw is from the other nine
    run = selectors.run_coverage(snapshots.prover, MANIFEST)
    assert run["segments_drawn"] == [0] and run["coverage"] == pytest.approx(1 / 9)  # 9 is out of the count
    stub.set(verdict="verified", segments=[3], total=10)
    second = claim(snapshots, stub, django_capture_on_commit_callbacks, counter=1)
    claim_services.claim_verify(second.pk)
    sent = stub.runs()[-1]["claims"]
    assert sent["replayed_segments"] == [0, 9] and sent["earlier_draws"] == [[9, 1]]
    assert selectors.run_coverage(snapshots.prover, MANIFEST)["coverage"] == pytest.approx(2 / 9)  # 1 - 8/9 x 7/8
    # a report from before pools were kept draws nothing: its segments are replayed, its draws no coverage
    Claim.objects.filter(pk=first.pk).update(report={"segments_replayed": [0, 9], "segments_total": 10})
    assert selectors.run_coverage(snapshots.prover, MANIFEST)["coverage"] == pytest.approx(1 / 8)
    # a draw counts for the pool it was drawn from, whatever a later claim forces
    stub.set(verdict="verified", segments=[3, 5], drawn=[5], total=10)
    third = claim(snapshots, stub, django_capture_on_commit_callbacks, counter=2)
    claim_services.claim_verify(third.pk)
    run = selectors.run_coverage(snapshots.prover, MANIFEST)
    assert run["segments_drawn"] == [3, 5] and run["coverage"] == pytest.approx(1 - 7 / 8 * 6 / 7)


def test_a_failed_claims_segments_do_not_count_as_covered(snapshots, stub, django_capture_on_commit_callbacks):
    stub.set(verdict="rejected", segments=[0, 1, 2, 3, 4, 5, 6, 7, 8], total=10, mismatch_step=13)
    c = claim(snapshots, stub, django_capture_on_commit_callbacks)
    assert claim_services.claim_verify(c.pk) == "mismatch"
    assert Claim.objects.get(pk=c.pk).mismatch_step == 13
    assert selectors.run_coverage(snapshots.prover, MANIFEST)["segments_replayed"] == []


def test_a_url_is_copied_first_then_verified_from_the_claims_copy(
    snapshots, stub, settings, django_capture_on_commit_callbacks
):
    """The copy runs in its own limited subprocess (the worker reads no prover bytes); the verifier gets the copy."""
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    settings.REPLAY_FETCH_ALLOWED_HOSTS = ["127.0.0.1"]
    settings.REPLAY_FETCH_MAX_FILES = 77
    stub.set(verdict="verified")
    handler = functools.partial(SimpleHTTPRequestHandler, directory=stub.location)
    handler.log_message = lambda *args: None
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        c = claim(snapshots, stub, django_capture_on_commit_callbacks, location=url)
        assert claim_services.claim_verify(c.pk) == "verified"
    finally:
        server.shutdown()
        server.server_close()
    run = stub.runs()[0]
    c.refresh_from_db()
    assert run["argv"][0] == str(verification.material_dir(c.material))
    assert (verification.material_dir(MANIFEST) / "manifest.json").read_bytes() == MANIFEST_BYTES
    assert run["env"]["REPLAY_FETCH_MAX_FILES"] == "77"
    assert Path(run["env"]["TMPDIR"]).name.startswith("claim-") and not Path(run["env"]["TMPDIR"]).exists()


def _retry(c: Claim) -> str:
    c.refresh_from_db()
    return claim_services.claim_verify(c.pk, now=c.retry_at)


def test_one_nonce_per_claim_drawn_after_the_copy_and_reused_on_every_retry(
    snapshots, stub, django_capture_on_commit_callbacks
):
    """Issue #19 case 1, our side: a verifier failure after the copy is retried with the SAME nonce (a fresh
    nonce per retry let a prover veto unlucky draws); the nonce is recorded with the claim."""
    stub.set(mode="crash")
    c = claim(snapshots, stub, django_capture_on_commit_callbacks)
    assert claim_services.claim_verify(c.pk) == "error"
    c.refresh_from_db()
    first = stub.runs()[0]["argv"]
    assert len(c.nonce) == 32 and first[first.index("--nonce") + 1] == c.nonce
    stub.set(mode="signal")
    assert _retry(c) == "error"
    stub.set(verdict="verified")
    assert _retry(c) == "verified"
    nonces = {run["argv"][run["argv"].index("--nonce") + 1] for run in stub.runs()}
    assert nonces == {c.nonce}
    entry = Entry.objects.filter(kind="claim.verified").latest("seq")
    assert entry.payload["nonce"] == c.nonce
    copied = Entry.objects.get(kind="claim.material_copied")  # one commitment, made before the first run
    assert copied.payload["nonce_sha256"] == hashlib.sha256(bytes.fromhex(c.nonce)).hexdigest()
    assert copied.seq < Entry.objects.filter(kind="claim.verification_failed").earliest("seq").seq


def test_a_share_that_fails_reads_is_unavailable_never_redrawn(
    snapshots, stub, settings, django_capture_on_commit_callbacks
):
    """Issue #19 case 1, the cheat: the prover's share fails the read of its fabricated segment. The copy is
    made before any nonce exists, so the share learns nothing; after bounded retries the claim is
    ``unavailable`` (final, an alert), and no verifier ever ran with a nonce."""
    root = Path(stub.location)
    x = hashlib.sha256(b"x").hexdigest()
    manifest = json.dumps({"checkpoints": {"0": x}, "segments": {"0": "ef" * 32}}, separators=(",", ":"))
    (root / "manifest.json").write_text(manifest)
    (root / "checkpoints").mkdir()
    (root / "checkpoints" / "00000000.safetensors").write_bytes(b"x")
    (root / "segments").mkdir()  # the fabricated segment's read fails (the share withholds it)
    c = claim(
        snapshots, stub, django_capture_on_commit_callbacks, manifest=hashlib.sha256(manifest.encode()).hexdigest()
    )
    settings.REPLAY_COPY_ATTEMPTS = 3
    assert claim_services.claim_verify(c.pk) == "error"
    assert _retry(c) == "error"
    assert _retry(c) == "unavailable"
    c.refresh_from_db()
    assert c.result == Claim.Result.UNAVAILABLE and c.copy_failures == 3 and c.nonce == ""
    assert stub.runs() == []  # the verifier never ran: no draw existed for the share to veto
    assert not Entry.objects.filter(kind="claim.material_copied").exists()
    entry = Entry.objects.filter(kind="claim.verified").latest("seq")
    assert entry.payload["result"] == "unavailable" and "could not be copied" in entry.payload["reasons"][0]
    assert Alert.objects.filter(kind=Alert.Kind.CLAIM_FAILED, detail__contains="unavailable").exists()


def test_a_copied_file_must_match_its_commitment(snapshots, stub, settings, django_capture_on_commit_callbacks):
    root = Path(stub.location)
    manifest = json.dumps({"checkpoints": {"0": "cd" * 32}, "segments": {}}, separators=(",", ":"))
    (root / "manifest.json").write_text(manifest)
    (root / "checkpoints").mkdir()
    (root / "checkpoints" / "00000000.safetensors").write_bytes(b"not what was committed")
    c = claim(
        snapshots, stub, django_capture_on_commit_callbacks, manifest=hashlib.sha256(manifest.encode()).hexdigest()
    )
    assert claim_services.claim_verify(c.pk) == "mismatch"  # final at once: no retry can change the bytes' hash
    c.refresh_from_db()
    assert "checkpoints/00000000.safetensors does not match the manifest's commitment" in c.report["reasons"][0]
    assert c.nonce == "" and stub.runs() == []


@pytest.mark.parametrize("location", ["/etc", "{root}/../../etc"])  # a relative path is refused on submission
def test_a_location_outside_the_roots_is_malformed_without_running(
    snapshots, stub, django_capture_on_commit_callbacks, location
):
    c = claim(snapshots, stub, django_capture_on_commit_callbacks, location=location.format(root=stub.location))
    assert claim_services.claim_verify(c.pk) == "malformed"
    assert "allowed transcript root" in Claim.objects.get(pk=c.pk).report["reasons"][0]
    assert stub.runs() == []


def test_a_symlink_out_of_the_transcript_is_malformed(snapshots, stub, django_capture_on_commit_callbacks):
    (Path(stub.location) / "checkpoints").mkdir()
    (Path(stub.location) / "checkpoints" / "00000000.safetensors").symlink_to("/etc/passwd")
    c = claim(snapshots, stub, django_capture_on_commit_callbacks)
    assert claim_services.claim_verify(c.pk) == "malformed"
    assert "symlink" in Claim.objects.get(pk=c.pk).report["reasons"][0] and stub.runs() == []


# --- the verifier's failures are never the prover's -------------------------------------------------


FAILURES = {
    "crash": "exit 3",
    "signal": "signal 9",
    "garbage": "not JSON",
    "memory": "not JSON",
    "inconsistent": "does not state the verdict",
    "other-nonce": "not a well-formed verdict",
}


@pytest.mark.parametrize("mode", sorted(FAILURES))
def test_a_verifier_failure_is_an_error_retried_later(
    snapshots, stub, settings, django_capture_on_commit_callbacks, mode
):
    settings.REPLAY_MAX_MEMORY_BYTES = 1 << 30
    stub.set(mode=mode, verdict="rejected", bytes=4 << 30)
    c = claim(snapshots, stub, django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        assert claim_services.claim_verify(c.pk) == "error"
    c.refresh_from_db()
    assert c.failures == 1 and c.retry_at > timezone.now() and FAILURES[mode] in c.report["error"]
    failed = Entry.objects.get(kind="claim.verification_failed")
    assert failed.payload["attempt"] == 1 and failed.payload["retry_at"]
    assert not Entry.objects.filter(kind="claim.verified").exists()
    assert not Alert.objects.exists(), "no alert against the prover"
    assert stub.enqueued[-1] == (queue.VERIFY_CLAIM, (c.pk,), {"countdown": settings.REPLAY_RETRY_SECONDS})
    rebuild_ok()


def test_the_verifiers_own_reason_for_its_error_reaches_the_ledger(snapshots, stub, django_capture_on_commit_callbacks):
    """A step beyond this worker's budget: the regulator reads why (a larger worker can take it), not a bare crash."""
    why = "the verifier cannot replay this transcript on this machine: batch.x.shape [8, 1024] ... (REPLAY_MEMORY_BUDGET_BYTES)"
    stub.set(mode="crash", reasons=[why + "\n\x1b[2J"])
    c = claim(snapshots, stub, django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        assert claim_services.claim_verify(c.pk) == "error"
    c.refresh_from_db()
    assert c.report["error"] == f"the verifier failed (exit 3): {why}[2J"  # printable characters only
    assert why in Entry.objects.get(kind="claim.verification_failed").payload["error"]
    assert not Alert.objects.exists(), "no alert against the prover"


@pytest.mark.parametrize("large_queue", ["replay-large", ""])
def test_a_claim_beyond_this_workers_budget_is_retried_on_the_large_queue_where_there_is_one(
    snapshots, stub, settings, django_capture_on_commit_callbacks, large_queue
):
    """Only a worker with larger budgets could verify it: its retry goes where only such workers listen."""
    settings.REPLAY_LARGE_QUEUE = large_queue
    stub.set(
        mode="crash",
        reasons=["the verifier cannot replay this transcript on this machine: ..."],
        extra={"beyond_budget": True},
    )
    c = claim(snapshots, stub, django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        assert claim_services.claim_verify(c.pk) == "error"
    retry = {"countdown": settings.REPLAY_RETRY_SECONDS, **({"queue": large_queue} if large_queue else {})}
    assert stub.enqueued[-1] == (queue.VERIFY_CLAIM, (c.pk,), retry)
    stub.set(mode="crash", reasons=["the verifier hit a bug"])  # any other failure: back to the replay queue
    with django_capture_on_commit_callbacks(execute=True):
        assert _retry(c) == "error"
    assert stub.enqueued[-1] == (queue.VERIFY_CLAIM, (c.pk,), {"countdown": 2 * settings.REPLAY_RETRY_SECONDS})


def test_an_exit_3_for_another_request_keeps_its_reason_out(snapshots, stub, django_capture_on_commit_callbacks):
    stub.set(mode="crash", reasons=["anything at all"], extra={"nonce": "00" * 16})
    c = claim(snapshots, stub, django_capture_on_commit_callbacks)
    assert claim_services.claim_verify(c.pk) == "error"
    assert Claim.objects.get(pk=c.pk).report["error"] == "the verifier failed (exit 3)"


def test_a_verifier_that_hangs_is_an_error(snapshots, stub, monkeypatch, django_capture_on_commit_callbacks):
    monkeypatch.setattr(verification, "time_limit", lambda: 1)
    stub.set(mode="hang")
    c = claim(snapshots, stub, django_capture_on_commit_callbacks)
    assert claim_services.claim_verify(c.pk) == "error"
    assert "ran longer than 1 s" in Claim.objects.get(pk=c.pk).report["error"]


def test_retries_back_off_then_verify_once(snapshots, stub, settings, django_capture_on_commit_callbacks):
    stub.set(mode="crash")
    c = claim(snapshots, stub, django_capture_on_commit_callbacks)
    now = timezone.now()
    assert claim_services.claim_verify(c.pk, now) == "error"
    assert claim_services.claim_verify(c.pk, now) == "error" and len(stub.runs()) == 1, "not due: not run again"
    first_retry = Claim.objects.get(pk=c.pk).retry_at
    later = first_retry + timedelta(seconds=1)
    assert claim_services.claim_verify(c.pk, later) == "error"
    second = Claim.objects.get(pk=c.pk)
    assert second.failures == 2 and second.retry_at - later >= timedelta(seconds=2 * settings.REPLAY_RETRY_SECONDS - 5)
    stub.set(verdict="verified")
    assert claim_services.claim_verify(c.pk, second.retry_at) == "verified"
    assert claim_services.claim_verify(c.pk, second.retry_at + timedelta(days=9)) == "verified"
    assert Entry.objects.filter(kind="claim.verified").count() == 1 and len(stub.runs()) == 3
    assert Claim.objects.get(pk=c.pk).retry_at is None
    rebuild_ok()


def test_after_the_last_attempt_the_regulator_is_alerted(snapshots, stub, settings, django_capture_on_commit_callbacks):
    settings.REPLAY_MAX_ATTEMPTS = 2
    stub.set(mode="signal")
    c = claim(snapshots, stub, django_capture_on_commit_callbacks)
    claim_services.claim_verify(c.pk)
    claim_services.claim_verify(c.pk, Claim.objects.get(pk=c.pk).retry_at)
    c.refresh_from_db()
    assert c.result == "error" and c.failures == 2 and c.retry_at is None
    alert = Alert.objects.get()
    assert alert.kind == "verifier_failed" and "2 times" in alert.detail
    assert claim_services.claim_verify(c.pk, timezone.now() + timedelta(days=30)) == "error"
    assert len(stub.runs()) == 2 and Entry.objects.filter(kind="claim.verification_failed").count() == 2
    rebuild_ok()


def test_a_stale_delivery_records_nothing(snapshots, stub, django_capture_on_commit_callbacks):
    """Two deliveries of one attempt: the first to finish records; the other's outcome is dropped."""
    c = claim(snapshots, stub, django_capture_on_commit_callbacks)
    claim_services.claim_error_record(c.pk, "the verifier failed (exit 3)", failures=0)
    claim_services.claim_error_record(c.pk, "the verifier failed (exit 3)", failures=0)
    claim_services.claim_result_record(c.pk, {"verdict": "verified"}, failures=0)
    c.refresh_from_db()
    assert c.failures == 1 and c.result == "error"
    assert Entry.objects.filter(kind__startswith="claim.verif").count() == 1
    claim_services.claim_result_record(c.pk, {"verdict": "verified"}, failures=1)
    claim_services.claim_result_record(c.pk, {"verdict": "rejected"}, failures=1)
    assert Claim.objects.get(pk=c.pk).result == "verified"
    assert Entry.objects.filter(kind="claim.verified").count() == 1


def test_lost_retry_messages_are_resent_by_the_sweep(snapshots, stub, django_capture_on_commit_callbacks):
    stub.set(mode="crash")
    c = claim(snapshots, stub, django_capture_on_commit_callbacks)
    claim_services.claim_verify(c.pk)
    retry_at = Claim.objects.get(pk=c.pk).retry_at
    stub.enqueued.clear()
    assert claim_services.claim_retries_enqueue(retry_at) == 0, "the delayed message has its turn"
    with django_capture_on_commit_callbacks(execute=True):
        assert claim_services.claim_retries_enqueue(retry_at + claim_services.RETRY_GRACE) == 1
    assert stub.enqueued == [(queue.VERIFY_CLAIM, (c.pk,), {})]


def test_the_admin_lists_runs_with_their_coverage(snapshots, stub, admin_client, django_capture_on_commit_callbacks):
    stub.set(verdict="verified", segments=[0, 1, 2, 3, 4, 5, 6, 7, 8], total=10)
    c = claim(snapshots, stub, django_capture_on_commit_callbacks)
    claim_services.claim_verify(c.pk)
    page = admin_client.get("/admin/inspections/claim/runs/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "owner-a" in text and "9 / 10" in text and "0.900" in text and "met" in text
    listing = admin_client.get("/admin/inspections/claim/").content.decode()
    assert "9/10 segments (9 drawn), 0.900 (target met)" in listing


def test_no_verdict_at_all_is_the_verifiers_failure_not_the_provers(
    snapshots, stub, django_capture_on_commit_callbacks
):
    """A caller with no verdict (e.g. a sweep giving up on a claim whose worker keeps dying) records an error."""
    c = claim(snapshots, stub, django_capture_on_commit_callbacks)
    assert claim_services.claim_result_record(c.pk, None, "timeout").result == "error"
    assert Claim.objects.get(pk=c.pk).report["error"] == "timeout"
    assert not Alert.objects.filter(kind="claim_failed").exists()


# --- issue #19: order against all of a chip's claims; the registry as it was -------------------------------


def test_a_later_snapshot_filed_first_is_in_the_earlier_ones_history_and_a_conflict_lands_on_both(
    snapshots, stub, django_capture_on_commit_callbacks
):
    """Issue #19 case 2: the client files counter 2 (step 30) first, verified; an hour later counter 0. The
    verifier is told about counter 2 (today: only lower counters, so the order check never met it), and its
    contradiction becomes a ``claim.conflict`` entry and an alert on each claim."""
    stub.set(verdict="verified")
    later = claim(snapshots, stub, django_capture_on_commit_callbacks, counter=2, step=30)
    assert claim_services.claim_verify(later.pk) == "verified"
    earlier = claim(snapshots, stub, django_capture_on_commit_callbacks, counter=0, step=40)
    conflict = {"counter": 2, "kind": "order", "detail": "step 30 at 02:00 comes after step 40 at 00:00"}
    stub.set(verdict="rejected", reasons=["chip: step 30 comes after step 40"], extra={"conflicts": [conflict]})
    assert claim_services.claim_verify(earlier.pk) == "mismatch"
    history = stub.runs()[1]["claims"]["history"][snapshots.chip.serial]
    assert [h["counter"] for h in history] == [2]
    entry = Entry.objects.get(kind="claim.conflict")
    assert entry.payload["claim"] == earlier.pk and entry.payload["with"] == later.pk
    assert entry.payload["counters"] == [0, 2] and entry.payload["kind"] == "order"
    alerts = Alert.objects.filter(kind=Alert.Kind.CLAIM_FAILED, detail__contains="conflicts with")
    assert {a.detail.split(" conflicts")[0][-2:] for a in alerts} == {"#0", "#2"}
    assert Claim.objects.get(pk=later.pk).result == "verified"  # the ledger's verdict stands; the alert asks
    rebuild_ok()


def test_a_chip_sold_after_the_run_still_counts_as_the_provers_then(
    snapshots, stub, django_capture_on_commit_callbacks
):
    """Issue #19 case 8: the chip is decommissioned after its snapshots were answered; the registry's view the
    verifier gets still lists it (the prover answered its snapshots), with the run's snapshot times."""
    from registry.models import Chip

    stub.set(verdict="verified")
    first = claim(snapshots, stub, django_capture_on_commit_callbacks, counter=0)
    assert claim_services.claim_verify(first.pk) == "verified"
    Chip.objects.filter(pk=snapshots.chip.pk).update(status="decommissioned")
    second = claim(snapshots, stub, django_capture_on_commit_callbacks, counter=1)
    assert claim_services.claim_verify(second.pk) == "verified"
    given = stub.runs()[1]["claims"]
    assert snapshots.chip.serial in given["prover_chips"]
    assert sorted(given["run_snapshots"][snapshots.chip.serial]) == ["2026-11-01T00:00:00Z", "2026-11-01T01:00:00Z"]


def test_an_incomplete_replay_is_retried_with_the_same_nonce_and_no_alert_against_the_prover(
    snapshots, stub, django_capture_on_commit_callbacks
):
    """Issue #19 case 7: a spent replay budget is ours: not final, retried, never a claim_failed alert."""
    stub.set(verdict="incomplete", reasons=["the replay budget was spent"])
    c = claim(snapshots, stub, django_capture_on_commit_callbacks)
    assert claim_services.claim_verify(c.pk) == "error"
    c.refresh_from_db()
    assert c.result not in Claim.FINAL and c.retry_at is not None and "budget" in c.report["error"]
    assert not Alert.objects.filter(kind=Alert.Kind.CLAIM_FAILED).exists()
    stub.set(verdict="verified")
    assert _retry(c) == "verified"
    assert len({run["argv"][run["argv"].index("--nonce") + 1] for run in stub.runs()}) == 1


def test_the_firmware_work_counters_reach_the_verifier(draw, stub, django_capture_on_commit_callbacks):
    """Issue #19 case 4: the signed work counters of each snapshot (kept off the public ledger) go to the
    verifier with the claim and the chip's history, exactly (FLOP counts beyond 2^53 included)."""
    task = (
        InspectionTask.objects.exclude(inspection_body=None)
        .filter(prover__slug="owner-a")
        .select_related("chip", "inspection_body", "prover")
        .first()
    )
    big = 2**70 + 1
    with django_capture_on_commit_callbacks(execute=False):
        log = inspectors.snapshot_log_upload(accepted(task), task.inspection_body, "log\n")
        records = [
            {
                "counter": n,
                "time": f"2026-11-01T0{n}:00:00Z",
                "shard": 0,
                "hash": f"{n:064x}",
                "busy_ns": n,
                "flops": big + n,
            }
            for n in range(2)
        ]
        inspectors.snapshot_log_record(log, [], records)
    assert "flops" not in json.dumps(Entry.objects.filter(kind="inspection.snapshot_log").latest("seq").payload)
    stub.set(verdict="verified")
    first = claim(task, stub, django_capture_on_commit_callbacks, counter=0)
    second = claim(task, stub, django_capture_on_commit_callbacks, counter=1)
    assert claim_services.claim_verify(second.pk) == "verified"
    given = stub.runs()[0]["claims"]
    assert given["claims"][0]["flops"] == big + 1 and given["claims"][0]["busy_ns"] == 1
    assert given["history"][task.chip.serial][0]["flops"] == big and first.pk != second.pk


def test_a_runs_claims_share_one_copy_so_a_later_failing_share_changes_nothing(
    snapshots, stub, django_capture_on_commit_callbacks
):
    """Once a run's material is copied (hashed against its manifest), later claims of the run read that copy:
    the prover's share failing reads afterwards can neither veto a draw nor make the claim unavailable."""
    stub.set(verdict="verified")
    first = claim(snapshots, stub, django_capture_on_commit_callbacks, counter=0)
    assert claim_services.claim_verify(first.pk) == "verified"
    (Path(stub.location) / "manifest.json").unlink()  # the share now fails every read
    second = claim(snapshots, stub, django_capture_on_commit_callbacks, counter=1)
    assert claim_services.claim_verify(second.pk) == "verified"
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.nonce != second.nonce and first.material == second.material == MANIFEST


def test_another_runs_figures_reach_the_verifier_from_the_ledger(
    snapshots, stub, django_capture_on_commit_callbacks, tmp_path
):
    """Issue #19 (hidden work between two runs): the verifier's count of a run's length and of the FLOPs a step
    costs the chip goes on the ledger with the verdict; a claim of another run on the same chip is sent the chip's
    earlier claim with those figures (ours, never the prover's), so the work between the two runs is accounted."""
    serial = snapshots.chip.serial
    stub.set(verdict="verified", extra={"chip_step_flops": {serial: 5.0e7}})
    first = claim(snapshots, stub, django_capture_on_commit_callbacks, counter=0)
    assert claim_services.claim_verify(first.pk) == "verified"
    entry = Entry.objects.filter(kind="claim.verified").latest("seq")
    assert entry.payload["chip_step_flops"] == {serial: 5.0e7} and entry.payload["steps"] == 20
    other_bytes = b'{"checkpoints":{},"segments":{},"x":1}'
    (tmp_path / "roots" / "run2").mkdir()
    (tmp_path / "roots" / "run2" / "manifest.json").write_bytes(other_bytes)
    stub.set(verdict="verified")
    second = claim(
        snapshots,
        stub,
        django_capture_on_commit_callbacks,
        counter=1,
        step=3,
        run="run-2",
        manifest=hashlib.sha256(other_bytes).hexdigest(),
        location=str(tmp_path / "roots" / "run2"),
    )
    assert claim_services.claim_verify(second.pk) == "verified"
    [row] = stub.runs()[1]["claims"]["history"][serial]
    assert row["counter"] == 0 and row["manifest"] == MANIFEST
    assert row["run_steps"] == 20 and row["chip_step_flops"] == 5.0e7
    rebuild_ok()


def test_a_run_not_replayed_yet_sends_no_figures(snapshots, stub, django_capture_on_commit_callbacks):
    """A claim still pending (or malformed: no count of ours) gives its run no figures: the verifier leaves the pair
    across the two runs to that run's own verification."""
    stub.set(verdict="verified")
    claim(snapshots, stub, django_capture_on_commit_callbacks, counter=0)  # pending: never verified here
    second = claim(snapshots, stub, django_capture_on_commit_callbacks, counter=1)
    assert claim_services.claim_verify(second.pk) == "verified"
    [row] = stub.runs()[0]["claims"]["history"][snapshots.chip.serial]
    assert "run_steps" not in row and "chip_step_flops" not in row


@pytest.mark.parametrize("status", [0, 1, 3])
def test_output_nested_past_the_parser_is_the_verifiers_failure_not_a_crash(status):
    """No verdict in it: VerifierFailed (retried), never a RecursionError out of the task."""
    with pytest.raises(verification.VerifierFailed) as failed:
        verification.verdict_of(status, b"[" * 100_000, "ab" * 16)
    assert not failed.value.larger_worker


# --- what the ledger can hold ------------------------------------------------------------------------


def test_a_report_the_ledger_could_not_hold_goes_on_it_bounded_and_printable(
    snapshots, stub, django_capture_on_commit_callbacks
):
    """A screen's NaN (the z of a constant sample), reasons of control characters and a page of findings had each been
    refused by the ledger: the task raised, the claim was left without a result and resent every hour, its prover's
    mismatch never recorded."""
    hostile = "\x00\x1b[2J\u202e\udcff" * 100  # (the stub takes its spec in one variable: under 128 KB)
    stub.set(
        verdict="rejected",
        reasons=[hostile] * 20,
        extra={
            "screen": {"z": {"10": float("nan"), "20": float("inf")}, "flagged": list(range(0, 30_000, 10))},
            "findings": [{"kind": "trend", "detail": "d" * 500, "evidence": "x" * 1000}] * 20,
            "flops": float("inf"),
        },
    )
    c = claim(snapshots, stub, django_capture_on_commit_callbacks)
    got = claim_services.claim_verify(c.pk)
    c.refresh_from_db()
    assert got == "mismatch", c.report
    payload = Entry.objects.get(kind="claim.verified").payload
    assert c.result == Claim.Result.MISMATCH and c.report == {k: v for k, v in payload.items() if k in c.report}
    assert payload["reasons"] and all(r.isprintable() for r in payload["reasons"])
    assert payload["reasons"][0].startswith("\\x00\\x1b[2J\\u202e\\udcff")  # escaped, not dropped
    assert payload["flops"] is None and payload["trimmed"]  # the ledger's copy says what it left out
    assert len(json.dumps(payload)) < 65_535
    assert not Alert.objects.filter(kind=Alert.Kind.VERIFIER_FAILED).exists()
    rebuild_ok()


def test_a_summary_the_ledger_still_refuses_is_the_verifiers_error_counted_not_a_stall(
    snapshots, stub, django_capture_on_commit_callbacks, monkeypatch
):
    """Were a summary ever past the ledger's rules (a bug of ours), the claim gets the verifier's error, retried and
    at last alerted, where the task had raised and left it pending."""
    real = claim_services.claim_summary
    monkeypatch.setattr(claim_services, "claim_summary", lambda verdict: {**real(verdict), "flops": float("nan")})
    stub.set(verdict="verified")
    c = claim(snapshots, stub, django_capture_on_commit_callbacks)
    assert claim_services.claim_verify(c.pk) == "error"
    c.refresh_from_db()
    assert c.result == Claim.Result.ERROR and c.failures == 1 and c.retry_at is not None
    assert "the verdict could not be put on the ledger" in c.report["error"]
    assert not Entry.objects.filter(kind="claim.verified").exists()
    assert Entry.objects.filter(kind="claim.verification_failed").count() == 1


def test_material_over_this_workers_copy_caps_is_its_error_for_a_larger_worker_not_malformed(
    snapshots, stub, django_capture_on_commit_callbacks, settings
):
    """An honest transcript over REPLAY_FETCH_MAX_BYTES (8 GiB: GPT-2 small's is tens of GB) was final "malformed"
    against its prover; it is this worker's limit, retried (on REPLAY_LARGE_QUEUE where one is set)."""
    settings.REPLAY_FETCH_MAX_BYTES = 10  # the stub's manifest is 32 bytes
    stub.set(verdict="verified")
    c = claim(snapshots, stub, django_capture_on_commit_callbacks)
    assert claim_services.claim_verify(c.pk) == "error"
    c.refresh_from_db()
    assert c.result == Claim.Result.ERROR and c.failures == 1 and c.retry_at is not None
    assert c.report["error"].startswith(
        "the material is beyond this worker's copy caps: manifest.json: 32 bytes, more than the 10"
    )
    assert not stub.runs() and not Alert.objects.filter(kind=Alert.Kind.CLAIM_FAILED).exists()
    settings.REPLAY_FETCH_MAX_BYTES = 1 << 20  # a worker with room verifies it
    assert _retry(c) == "verified"


def test_a_location_swapped_for_a_link_after_its_check_is_refused_not_followed(
    snapshots, stub, django_capture_on_commit_callbacks, monkeypatch, tmp_path
):
    """The worker checks a location inside TRANSCRIPT_ROOTS, then the copy opens it: a prover that swapped its folder
    for a link in between had the copy read a folder outside the roots (and the claim verified)."""
    import os
    import shutil

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "manifest.json").write_bytes(MANIFEST_BYTES)
    real = verification._copy_into

    def swapped_first(source, manifest, staging, scratch):
        shutil.rmtree(source)
        os.symlink(outside, source)
        return real(source, manifest, staging, scratch)

    monkeypatch.setattr(verification, "_copy_into", swapped_first)
    stub.set(verdict="verified")
    c = claim(snapshots, stub, django_capture_on_commit_callbacks)
    assert claim_services.claim_verify(c.pk) == "malformed"
    c.refresh_from_db()
    assert c.report["reasons"] == ["the transcript directory is reached through a symbolic link or a file"]
    assert not stub.runs()  # nothing was verified from outside the roots


def test_every_conflict_gets_its_entry_though_the_summary_sheds_some(
    snapshots, stub, django_capture_on_commit_callbacks
):
    """The claim.conflict entries had been written from the summary, which sheds conflicts past 10 to keep under its
    size: the rest, evidence against a cheat, were never recorded."""
    stub.set(verdict="verified")
    others = [claim(snapshots, stub, django_capture_on_commit_callbacks, counter=n) for n in (1, 2, 3)]
    for other in others:
        assert claim_services.claim_verify(other.pk) == "verified"
    conflicts = [{"counter": 1 + n % 3, "kind": "work", "detail": f"{n}: " + "w" * 1900} for n in range(30)]
    stub.set(verdict="rejected", reasons=["r" * 1000] * 20, extra={"conflicts": conflicts})
    c = claim(snapshots, stub, django_capture_on_commit_callbacks, counter=0)
    assert claim_services.claim_verify(c.pk) == "mismatch"
    payload = Entry.objects.get(kind="claim.verified", payload__claim=c.pk).payload
    assert "conflicts" in payload["trimmed"] and len(payload["conflicts"]) == 10
    recorded = Entry.objects.filter(kind="claim.conflict", payload__claim=c.pk)
    assert sorted(e.payload["detail"].split(":")[0] for e in recorded) == sorted(str(n) for n in range(30))
