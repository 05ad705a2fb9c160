"""Issue #19: coverage accumulates with bounded work per claim. A beat task re-verifies one verified claim of each
run below its coverage target (``claim.reverified`` on the ledger) until the target is met; a spent budget is
never final and never held against the prover; the desk shows the progress."""

import hashlib
from pathlib import Path

import pytest

from inspections import queue, selectors
from inspections.models import Alert, Claim, CoverageReverification
from inspections.services import claims as claim_services
from inspections.tasks import reverify_coverage
from ledger.models import Entry
from tests.inspections.services.test_claim_results import MANIFEST, claim, rebuild_ok, snapshots, stub  # noqa: F401

pytestmark = pytest.mark.django_db


def enqueued(verifier) -> list[int]:
    return [args[0] for name, args, _ in verifier.enqueued if name == queue.REVERIFY_COVERAGE_CLAIM]


@pytest.fixture
def beat(django_capture_on_commit_callbacks):
    """The beat task, its messages sent (they leave after commit)."""

    def run(limit=None) -> int:
        with django_capture_on_commit_callbacks(execute=True):
            return claim_services.coverage_reverifications_enqueue(limit) if limit else reverify_coverage()

    return run


@pytest.fixture
def verified(snapshots, stub, django_capture_on_commit_callbacks) -> Claim:  # noqa: F811
    """A verified claim whose replay covered 1 of the run's 4 segments (target 0.9)."""
    stub.set(verdict="verified", segments=[0], total=4)
    c = claim(snapshots, stub, django_capture_on_commit_callbacks, counter=0)
    assert claim_services.claim_verify(c.pk) == "verified"
    return Claim.objects.get(pk=c.pk)


def test_a_run_below_target_is_reverified_until_the_target_is_met(
    verified,
    stub,  # noqa: F811
    admin_client,
    beat,
):
    for segment in (1, 2, 3):
        assert beat() == 1 and enqueued(stub)[-1] == verified.pk
        stub.set(verdict="verified", segments=[segment], total=4)
        assert claim_services.claim_coverage_reverify(verified.pk) == "verified"
        given = stub.runs()[-1]
        assert given["claims"]["replayed_segments"] == list(range(segment))  # its own segments count: fresh draws
        assert given["argv"][given["argv"].index("--nonce") + 1] == verified.nonce  # the committed nonce
        run = selectors.run_coverage(verified.prover, MANIFEST)
        assert run["segments_replayed"] == list(range(segment + 1)) and run["reverifications"] == segment
    assert run["target_met"] and beat() == 0  # met: no more work
    assert claim_services.claim_coverage_reverify(verified.pk) == "target met"
    entries = Entry.objects.filter(kind="claim.reverified").order_by("seq")
    assert [e.payload["segments_replayed"] for e in entries] == [[1], [2], [3]]
    assert {e.payload["nonce"] for e in entries} == {verified.nonce}
    assert Claim.objects.get(pk=verified.pk).result == "verified" and not Alert.objects.exists()
    page = admin_client.get(f"/admin/desk/claim/{verified.pk}/").content.decode()
    assert "4 of 4 segments replayed (4 drawn at random, the rest forced by claims) across 1 claim(s) and 3" in page
    rebuild_ok()


def test_a_newer_claim_does_not_redirect_the_reverification(
    verified,
    snapshots,  # noqa: F811
    stub,  # noqa: F811
    beat,
    django_capture_on_commit_callbacks,
):
    """The re-verification's draw is computable from its claim's published nonce: were the beat to take the run's
    latest claim, a prover could file a newer one whenever the next draw would hit its fabricated segment."""
    stub.set(verdict="verified", segments=[1], total=4)
    newer = claim(snapshots, stub, django_capture_on_commit_callbacks, counter=1)
    assert claim_services.claim_verify(newer.pk) == "verified"
    assert beat() == 1 and enqueued(stub)[-1] == verified.pk != newer.pk


@pytest.mark.parametrize("mode", ["incomplete", "crash", "signal"])
def test_a_spent_budget_or_our_failure_records_nothing_and_is_tried_again(verified, stub, mode, beat):  # noqa: F811
    stub.set(verdict="incomplete", segments=[], total=4) if mode == "incomplete" else stub.set(mode=mode)
    seq = Entry.objects.latest("seq").seq
    assert claim_services.claim_coverage_reverify(verified.pk) == "not recorded"
    assert Entry.objects.latest("seq").seq == seq and not Alert.objects.exists()  # nothing against the prover
    assert Claim.objects.get(pk=verified.pk).result == "verified"
    assert beat() == 1 and enqueued(stub) == [verified.pk]  # still below target: the next interval tries again


def test_a_reverification_that_disagrees_is_recorded_with_an_alert_and_covers_nothing(verified, stub):  # noqa: F811
    stub.set(verdict="rejected", reasons=["replay from checkpoint 2 failed"], segments=[2], total=4, mismatch_step=7)
    assert claim_services.claim_coverage_reverify(verified.pk) == "mismatch"
    row = CoverageReverification.objects.get()
    assert row.result == "mismatch" and row.mismatch_step == 7
    alert = Alert.objects.get(kind=Alert.Kind.CLAIM_FAILED)
    assert "coverage re-verification" in alert.detail and "at step 7" in alert.detail
    assert Claim.objects.get(pk=verified.pk).result == "verified"  # the recorded verdict stands
    assert selectors.run_coverage(verified.prover, MANIFEST)["segments_replayed"] == [0]
    rebuild_ok()


def test_work_per_beat_is_bounded_and_no_run_starves(
    verified,
    snapshots,  # noqa: F811
    stub,  # noqa: F811
    django_capture_on_commit_callbacks,
    beat,
):
    second = Path(stub.location).parent / "run-2"  # a second run (another transcript) of the prover
    second.mkdir()
    (second / "manifest.json").write_bytes(b'{"checkpoints": {}, "segments": {}}')
    manifest = hashlib.sha256((second / "manifest.json").read_bytes()).hexdigest()
    other = claim(
        snapshots, stub, django_capture_on_commit_callbacks, counter=1, manifest=manifest, location=str(second)
    )
    stub.set(verdict="verified", segments=[0], total=4)
    assert claim_services.claim_verify(other.pk) == "verified"
    assert beat(limit=1) == 1
    first = enqueued(stub)[-1]
    stub.set(verdict="verified", segments=[1], total=4)
    assert claim_services.claim_coverage_reverify(first) == "verified"
    assert beat(limit=1) == 1
    assert enqueued(stub)[-1] == ({verified.pk, other.pk} - {first}).pop()  # the run that waited longest


def test_a_rebuilt_reverification_changed_behind_the_ledger_is_reported(verified, stub):  # noqa: F811
    stub.set(verdict="verified", segments=[1], total=4)
    claim_services.claim_coverage_reverify(verified.pk)
    CoverageReverification.objects.update(report={"segments_replayed": [0, 1, 2, 3]})
    with pytest.raises(AssertionError, match="claim reverification"):
        rebuild_ok()


def _run_two_claim(snapshots, stub, django_capture_on_commit_callbacks) -> Claim:  # noqa: F811
    """The chip's next snapshot (counter 1) answered for another run of the prover (another transcript)."""
    second = Path(stub.location).parent / "run-2"
    second.mkdir()
    (second / "manifest.json").write_bytes(b'{"checkpoints": {}, "segments": {}, "run": 2}')
    manifest = hashlib.sha256((second / "manifest.json").read_bytes()).hexdigest()
    return claim(
        snapshots,
        stub,
        django_capture_on_commit_callbacks,
        counter=1,
        step=5,
        run="run-2",
        manifest=manifest,
        location=str(second),
    )


@pytest.mark.parametrize("hidden", [False, True])
def test_two_runs_verified_at_the_same_moment_have_their_pair_across_runs_rechecked(
    snapshots,  # noqa: F811
    stub,  # noqa: F811
    django_capture_on_commit_callbacks,
    beat,
    hidden,
):
    """Issue #19: the last snapshot of one run and the chip's next, of another run, verified by two workers at the
    same moment: each replay saw the other claim unreplayed (no figures of ours for its run) and left the pair to
    it, so no verification judged the work between the two runs. The beat re-checks the later claim once both runs
    have figures; its replay judges the pair (hidden work there: a conflict and an alert on both claims), and then
    nothing more is due. Both runs' coverage is met, so nothing else would replay them."""
    figures = {"chip_step_flops": {snapshots.chip.serial: 5.0e7}}  # the verifier's count, on the ledger
    stub.set(verdict="verified", segments=[0], total=1, pairs=True, extra=figures)
    first = claim(snapshots, stub, django_capture_on_commit_callbacks, counter=0)
    second = _run_two_claim(snapshots, stub, django_capture_on_commit_callbacks)
    replays = [claim_services.claim_replay(Claim.objects.get(pk=c.pk)) for c in (first, second)]
    for c, verdict in zip((first, second), replays):  # recorded only after both replays ran
        assert claim_services.claim_result_record(c.pk, verdict).result == "verified"
    pair = {"serial": snapshots.chip.serial, "counters": [0, 1]}
    for c in (first, second):
        assert Claim.objects.get(pk=c.pk).report["across_runs_unchecked"] == [pair]
    assert beat() == 1 and enqueued(stub) == [second.pk]
    if hidden:
        detail = "unaccounted work: chip counted more between counter 0 and counter 1 than the two runs need"
        stub.set(
            verdict="rejected",
            reasons=[detail],
            segments=[0],
            total=1,
            pairs=True,
            extra={
                "rules": {"work_accounted": {"ok": False}},
                "conflicts": [{"counter": 0, "kind": "work", "detail": detail}],
            },
        )
    assert claim_services.claim_coverage_reverify(second.pk) == ("rule_violated" if hidden else "verified")
    [row] = stub.runs()[-1]["claims"]["history"][snapshots.chip.serial]
    assert row["counter"] == 0 and row["run_steps"] == 20  # the other run's figures: the pair is judged now
    assert CoverageReverification.objects.get(claim=second.pk).report["across_runs_unchecked"] == []
    assert beat() == 0 and claim_services.claim_coverage_reverify(second.pk) == "target met"
    if hidden:
        conflict = Entry.objects.get(kind="claim.conflict")
        assert conflict.payload["counters"] == [1, 0] and conflict.payload["kind"] == "work"
        alerts = Alert.objects.filter(kind=Alert.Kind.CLAIM_FAILED).values_list("detail", flat=True)
        assert any("#0 conflicts with" in a for a in alerts) and any("#1 conflicts with" in a for a in alerts)
    else:
        assert not Alert.objects.exists()
    rebuild_ok()


def test_a_pair_judged_by_the_later_replay_is_not_rechecked(
    snapshots,  # noqa: F811
    stub,  # noqa: F811
    django_capture_on_commit_callbacks,
    beat,
):
    """One after the other: the first claim left the pair (the other run was not replayed yet), the second judged
    it with the first run's figures. Nothing is due: only a pair left by both replays is re-checked."""
    figures = {"chip_step_flops": {snapshots.chip.serial: 5.0e7}}  # the verifier's count, on the ledger
    stub.set(verdict="verified", segments=[0], total=1, pairs=True, extra=figures)
    first = claim(snapshots, stub, django_capture_on_commit_callbacks, counter=0)
    second = _run_two_claim(snapshots, stub, django_capture_on_commit_callbacks)
    assert claim_services.claim_verify(first.pk) == "verified"
    assert claim_services.claim_verify(second.pk) == "verified"
    assert Claim.objects.get(pk=first.pk).report["across_runs_unchecked"]  # left to the other claim
    assert Claim.objects.get(pk=second.pk).report["across_runs_unchecked"] == []  # which judged it
    assert beat() == 0 and not selectors.cross_run_rechecks_due(10)
