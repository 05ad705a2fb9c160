"""Issue #19: coverage accumulates with bounded work per claim. A beat task re-verifies one verified claim of each
run below its coverage target (``claim.reverified`` on the ledger) until the target is met; a spent budget is
never final and never held against the prover; the desk shows the progress."""

import hashlib
import shutil
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from inspections import queue, selectors, verification
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
        # each verification drew one of the segments never replayed: pools 4, 3, 2, ...
        assert given["claims"]["earlier_draws"] == [[4 - k, 1] for k in range(segment)]
        run = selectors.run_coverage(verified.prover, MANIFEST)
        assert run["segments_replayed"] == list(range(segment + 1)) and run["reverifications"] == segment
    assert run["target_met"] and beat() == 0  # met: no more work
    assert claim_services.claim_coverage_reverify(verified.pk) == "target met"
    entries = Entry.objects.filter(kind="claim.reverified").order_by("seq")
    assert [e.payload["segments_replayed"] for e in entries] == [[1], [2], [3]]
    # each re-verification drew with a fresh nonce (the claim's own is public), committed before it ran
    nonces = [e.payload["nonce"] for e in entries]
    used = [r["argv"][r["argv"].index("--nonce") + 1] for r in stub.runs()[-3:]]
    assert nonces == used and len(set(nonces) | {verified.nonce}) == 4
    commitments = Entry.objects.filter(kind="claim.reverification_drawn").order_by("seq")
    assert [c.payload["nonce_sha256"] for c in commitments] == [claim_services.nonce_commitment(n) for n in nonces]
    assert all(c.seq < e.seq for c, e in zip(commitments, entries))
    assert Claim.objects.get(pk=verified.pk).reverify_nonce == ""  # revealed: the next one draws afresh
    assert Claim.objects.get(pk=verified.pk).result == "verified" and not Alert.objects.exists()
    page = admin_client.get(f"/admin/desk/claim/{verified.pk}/").content.decode()
    assert (
        "4 of 4 segments replayed (4 drawn at random over 4 verification(s), the rest forced by claims) across 1 claim(s) and 3"
        in page
    )
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


@pytest.mark.parametrize("mode", ["crash", "signal"])
def test_our_failure_records_nothing_and_is_tried_again_with_the_same_nonce(verified, stub, mode, beat):  # noqa: F811
    stub.set(mode=mode)
    assert claim_services.claim_coverage_reverify(verified.pk) == "not recorded"
    [drawn] = Entry.objects.filter(kind="claim.reverification_drawn")  # committed before it ran
    seq = Entry.objects.latest("seq").seq
    assert not Entry.objects.filter(kind="claim.reverified").exists() and not Alert.objects.exists()
    assert Claim.objects.get(pk=verified.pk).result == "verified"
    # still below target, but not every interval: a run failing on our side must not starve the others
    assert beat() == 0
    later = timezone.now() + timedelta(seconds=settings.REPLAY_STALLED_RETRY_SECONDS + 1)
    assert selectors.coverage_reverifications_due(10, now=later) == [verified.pk]
    assert claim_services.claim_coverage_reverify(verified.pk) == "not recorded"
    assert Entry.objects.latest("seq").seq == seq  # no second commitment: a failure never redraws
    first, again = (r["argv"][r["argv"].index("--nonce") + 1] for r in stub.runs()[-2:])
    assert first == again != verified.nonce
    assert drawn.payload["nonce_sha256"] == claim_services.nonce_commitment(first)
    stub.set(verdict="verified", segments=[1], total=4)
    assert claim_services.claim_coverage_reverify(verified.pk) == "verified"
    assert Entry.objects.get(kind="claim.reverified").payload["nonce"] == first
    rebuild_ok()


def test_a_spent_budget_records_nothing_and_stalls_the_run_for_a_day(verified, stub, beat, admin_client):  # noqa: F811
    """Issue #19: a claim whose own replay fills the budget leaves none for draws. Its re-verification is never
    a verdict against anyone, and the beat does not spend the verifier on it every interval: it waits
    REPLAY_STALLED_RETRY_SECONDS, and the desk says why the run's coverage does not grow."""
    stub.set(verdict="incomplete", segments=[], total=4)
    seq = Entry.objects.latest("seq").seq
    assert claim_services.claim_coverage_reverify(verified.pk) == "not recorded"
    assert not Entry.objects.filter(seq__gt=seq).exclude(kind="claim.reverification_drawn").exists()
    assert not Alert.objects.exists() and Claim.objects.get(pk=verified.pk).result == "verified"
    run = selectors.run_coverage(verified.prover, MANIFEST)
    assert run["stalled_since"] is not None and not run["target_met"]
    assert beat() == 0  # stalled: not every interval
    later = timezone.now() + timedelta(seconds=settings.REPLAY_STALLED_RETRY_SECONDS + 1)
    assert selectors.coverage_reverifications_due(10, now=later) == [verified.pk]  # a day later, tried again
    page = admin_client.get(f"/admin/desk/claim/{verified.pk}/").content.decode()
    assert "stalled since" in page and "REPLAY_MAX_SECONDS" in page
    # a re-verification that draws clears it
    stub.set(verdict="verified", segments=[1], total=4)
    assert claim_services.claim_coverage_reverify(verified.pk) == "verified"
    assert selectors.run_coverage(verified.prover, MANIFEST)["stalled_since"] is None and beat() == 1


def test_a_draw_the_budget_cut_is_pending_until_replayed(verified, stub, beat, admin_client):  # noqa: F811
    """The draw being replayed when the budget ran out was revealed (a slow segment could be the fabricated
    one): the run's target is not met while it is pending, and the next verification is told to replay it first."""
    stub.set(verdict="verified", segments=[1, 2], drawn=[1, 2], total=4, pool=3)
    assert claim_services.claim_coverage_reverify(verified.pk) == "verified"
    stub.set(verdict="verified", segments=[], drawn=[], total=4, pool=1, cut=3)  # drew 3, the budget ran out
    assert claim_services.claim_coverage_reverify(verified.pk) == "verified"
    run = selectors.run_coverage(verified.prover, MANIFEST)
    assert run["segments_pending"] == [3] and not run["target_met"]
    page = admin_client.get(f"/admin/desk/claim/{verified.pk}/").content.decode()
    assert "segments 3 were drawn but the replay budget ran out while they replayed" in page
    runs = admin_client.get("/admin/inspections/claim/runs/").content.decode()
    assert "pending: 3" in runs
    assert beat() == 1
    stub.set(verdict="verified", segments=[3], drawn=[], total=4, pool=0)
    assert claim_services.claim_coverage_reverify(verified.pk) == "verified"
    assert stub.runs()[-1]["claims"]["pending_segments"] == [3]
    run = selectors.run_coverage(verified.prover, MANIFEST)
    assert run["segments_pending"] == [] and run["target_met"] and run["coverage"] == 1.0
    rebuild_ok()


def test_claims_forcing_segments_after_the_draws_do_not_meet_the_target(
    verified,
    snapshots,  # noqa: F811
    stub,  # noqa: F811
    django_capture_on_commit_callbacks,
):
    """The prover sees the draws (the nonce is revealed with the verdict) and files claims that force every other
    never-replayed segment but its fabrication (9). Each verification's (pool, drawn) stays on the ledger, so the
    coverage is what the draws gave, 1/3, not the 2 / (2 + 1) the count drawn / (drawn + never replayed) gives."""
    stub.set(verdict="verified", segments=[1], drawn=[1], total=10, pool=9)  # the claim replayed 0 (forced)
    assert claim_services.claim_coverage_reverify(verified.pk) == "verified"
    for counter, forced in ((1, [2, 3, 4]), (2, [5, 6, 7]), (3, [8])):  # claims forcing 2..8
        stub.set(verdict="verified", segments=forced, drawn=[], total=10, pool=0)
        forcing = claim(snapshots, stub, django_capture_on_commit_callbacks, counter=counter)
        assert claim_services.claim_verify(forcing.pk) == "verified"
    run = selectors.run_coverage(verified.prover, MANIFEST)
    assert run["segments_replayed"] == list(range(9)) and run["segments_drawn"] == [0, 1]
    # the claim drew 1 of 4 (as it then knew the run), the re-verification 1 of 9: 9 escaped with 3/4 x 8/9
    assert run["coverage"] == pytest.approx(1 - 3 / 4 * 8 / 9) and not run["target_met"]


def test_a_malformed_drawn_segment_is_recorded_and_the_run_disputed(verified, stub, beat):  # noqa: F811
    """A drawn segment whose material is malformed is evidence like a mismatch: dropping it would let a later
    draw with a fresh nonce pass the segment by and the run meet its target."""
    stub.set(verdict="malformed", reasons=["segment 2..3: the file is not a segment"], segments=[], total=4)
    assert claim_services.claim_coverage_reverify(verified.pk) == "malformed"
    row = CoverageReverification.objects.get()
    assert row.result == "malformed" and Entry.objects.get(kind="claim.reverified").payload["result"] == "malformed"
    assert "coverage re-verification" in Alert.objects.get(kind=Alert.Kind.CLAIM_FAILED).detail
    run = selectors.run_coverage(verified.prover, MANIFEST)
    assert run["disputed"] == 1 and not run["target_met"] and beat() == 0  # the regulator decides
    assert Claim.objects.get(pk=verified.pk).result == "verified"
    rebuild_ok()


def test_a_reverification_nonce_changed_behind_the_ledger_is_reported(verified, stub):  # noqa: F811
    stub.set(mode="crash")
    claim_services.claim_coverage_reverify(verified.pk)
    rebuild_ok()
    Claim.objects.filter(pk=verified.pk).update(reverify_nonce="11" * 16)
    with pytest.raises(AssertionError, match="claim"):
        rebuild_ok()


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
    assert beat() == 0
    assert claim_services.claim_coverage_reverify(second.pk) == ("disputed" if hidden else "target met")
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


def test_two_deliveries_of_one_reverification_record_its_draw_once(verified, stub):  # noqa: F811
    """The beat sent the run twice (a slow queue) and two workers ran it at once: one nonce, one draw. Recorded
    twice, the run's product would count the same draw as two independent chances to catch a fabrication."""
    stub.set(verdict="verified", segments=[1], total=4)
    replays = [claim_services.claim_replay(Claim.objects.get(pk=verified.pk), reverification=True) for _ in "ab"]
    assert replays[0].nonce == replays[1].nonce != verified.nonce
    assert claim_services.claim_reverification_record(verified.pk, replays[0]).result == "verified"
    assert claim_services.claim_reverification_record(verified.pk, replays[1]) is None
    assert CoverageReverification.objects.count() == 1
    assert selectors.run_coverage(verified.prover, MANIFEST)["draws"] == 2  # the claim's and this one
    rebuild_ok()


def test_a_claim_whose_verification_did_not_verify_disputes_its_run(
    verified,
    snapshots,  # noqa: F811
    stub,  # noqa: F811
    django_capture_on_commit_callbacks,
    beat,
):
    """A verification that ends malformed (a segment whose material parses only when it is replayed) drew its
    segments for nothing, and one may have been the fabrication: were the run still to meet its target, the
    prover could file claims until the draws passed it by."""
    stub.set(verdict="malformed", reasons=["segment 3..4: the rounding log does not parse"], segments=[], total=4)
    bad = claim(snapshots, stub, django_capture_on_commit_callbacks, counter=1)
    assert claim_services.claim_verify(bad.pk) == "malformed"
    stub.set(verdict="verified", segments=[1, 2, 3], drawn=[1, 2, 3], total=4)
    good = claim(snapshots, stub, django_capture_on_commit_callbacks, counter=2)
    assert claim_services.claim_verify(good.pk) == "verified"
    run = selectors.run_coverage(verified.prover, MANIFEST)
    assert run["coverage"] == 1.0 and run["disputed"] == 1 and not run["target_met"]
    assert beat() == 0  # the regulator decides
    assert claim_services.claim_coverage_reverify(verified.pk) == "disputed"


def test_claims_that_draw_nothing_send_no_pairs(verified, snapshots, stub, django_capture_on_commit_callbacks):  # noqa: F811
    """A verification that drew nothing (the target was met) changes no product: sending it would only lengthen
    the list toward the verifier's cap, past which an honest claim's file would be malformed."""
    stub.set(verdict="verified", segments=[3], drawn=[], total=4)
    second = claim(snapshots, stub, django_capture_on_commit_callbacks, counter=1)
    assert claim_services.claim_verify(second.pk) == "verified"
    assert selectors.claim_request(Claim.objects.get(pk=second.pk), own_covered=True)["earlier_draws"] == [[4, 1]]
    many = [(10, 1)] * (selectors.MAX_DRAWS - 1) + [(10, 9), (10, 5)]
    kept = selectors.informative(many)
    assert len(kept) == selectors.MAX_DRAWS and kept[:2] == [(10, 9), (10, 5)]


def test_a_reverification_with_no_replay_behind_it_records_nothing(verified, stub, settings, tmp_path):  # noqa: F811
    """Our copy of the material is gone and the prover's location is no longer allowed: the copy is refused
    before any nonce or replay. Nothing was drawn, so nothing is evidence: not recorded, no alert, stalled."""
    shutil.rmtree(verification.material_dir(verified.manifest))
    settings.TRANSCRIPT_ROOTS = [str(tmp_path / "elsewhere")]
    assert claim_services.claim_coverage_reverify(verified.pk) == "not recorded"
    assert not CoverageReverification.objects.exists() and not Alert.objects.exists()
    assert selectors.run_coverage(verified.prover, MANIFEST)["stalled_since"] is not None


def test_a_verdict_without_the_committed_nonce_is_not_recorded(verified, stub):  # noqa: F811
    stub.set(verdict="verified", segments=[1], total=4)
    verdict = claim_services.claim_replay(Claim.objects.get(pk=verified.pk), reverification=True)
    assert claim_services.claim_reverification_record(verified.pk, {**verdict.summary(), "nonce": ""}) is None
    assert claim_services.claim_reverification_record(verified.pk, verdict).result == "verified"
    assert claim_services.claim_reverification_record(verified.pk, verdict) is None  # once


def test_the_cap_on_pairs_sent_is_the_verifiers():
    from replay.protocol import claims_file

    assert selectors.MAX_DRAWS == claims_file.MAX_DRAWS
