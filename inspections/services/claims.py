"""The prover's claims: answer logged snapshots with run, step and transcript; record each verification's result."""

from __future__ import annotations

import difflib
import hashlib
import json
import logging
import re
import tempfile
import unicodedata
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from ledger import services as ledger
from ledger.services import format_time
from registry.models import Organisation

from .. import queue, selectors, transcript_location, verification
from ..models import Alert, Claim, CoverageReverification, Snapshot
from ..verification import Report  # replay's typed report, through the one module that imports replay
from .alerts import alert_raise
from .validation import fail as _fail

logger = logging.getLogger(__name__)
RETRY_GRACE = timedelta(hours=1)
CLAIM_FIELDS = ("serial", "counter", "run", "step", "manifest", "location")
RECORDER_FIELDS = {"shard", "hash", "time"}  # the recorder's claims.json (the verifier's input), not this body
RECORDER_HINT = (
    "this looks like the recorder's claims.json (the verifier's input): make the API's body with "
    "`python -m replay claim TRANSCRIPT_DIR --serials SERIALS` (docs/claims.md)"
)


BODY_MEMBERS = ("claims", "timestamp", "nonce")


def claims_body_submit(*, prover: Organisation, body: dict, submission: dict | None = None) -> list[Claim]:
    """``claims_submit`` for a whole signed body: a member besides ``claims`` is refused by name (the body is
    published on the ledger), unless the body is the recorder's claims.json, which ``claims_submit`` names as
    such with the command that makes the API's body."""
    claims = body.get("claims")
    unknown = sorted(str(name)[:64] for name in body if name not in BODY_MEMBERS)
    looks_recorded = isinstance(claims, list) and any(isinstance(c, dict) and set(c) >= RECORDER_FIELDS for c in claims)
    if unknown and not looks_recorded:
        hint = {
            name: "; did you mean 'claims'?" if difflib.get_close_matches(name, ["claims"]) else "" for name in unknown
        }
        raise ValidationError(
            {
                name: f"unknown field: the signed body is published on the ledger (this write takes claims){hint[name]}"
                for name in unknown
            }
        )
    return claims_submit(prover=prover, claims=claims, submission=submission)


@transaction.atomic
def claims_submit(*, prover: Organisation, claims: list, submission: dict | None = None) -> list[Claim]:
    """The prover answers logged snapshots of its chips, all or nothing; each claim is then verified by a worker."""
    if not isinstance(claims, list) or not 1 <= len(claims) <= 1000:
        _fail("claims", "a list of 1 to 1000 claims")
    shape_errors = _shape_errors(claims)
    if shape_errors:
        raise ValidationError(shape_errors)
    items, snapshots, errors = [], [], {}
    for position, item in enumerate(claims):
        try:
            clean = _claim_item(item)
            snapshot = (
                Snapshot.objects.select_related("chip__fab", "log")
                .filter(chip__serial=clean["serial"], counter=clean["counter"])
                .first()
            )
            if snapshot is None or selectors.snapshot_owner(snapshot) != prover.slug:
                raise ValidationError(
                    "no logged snapshot of your chip with this serial and counter (a snapshot is answered by "
                    "whoever owned the chip at the snapshot's time)"
                )
            if Claim.objects.filter(snapshot=snapshot).exists():
                raise ValidationError("this snapshot was already answered")
            if any(other.pk == snapshot.pk for other in snapshots):
                raise ValidationError("this snapshot appears twice in this request")
        except ValidationError as error:
            errors[f"claims[{position}]"] = error.messages
            continue
        items.append(clean)
        snapshots.append(snapshot)
    if errors:
        raise ValidationError(errors)
    entry = ledger.append_entry("claim.submitted", {"claims": items}, prover.slug, submission)
    rows = Claim.objects.bulk_create(
        [
            Claim(
                snapshot=snapshot,
                prover=prover,
                run=item["run"],
                step=item["step"],
                manifest=item["manifest"],
                location=item["location"],
                claimed_seq=entry.seq,
            )
            for item, snapshot in zip(items, snapshots)
        ]
    )
    for row in rows:
        queue.enqueue_claim_verification(row.pk)
    return rows


def _shape_problem(item) -> str | None:
    """What is wrong with an item's keys, naming each unknown and each missing key; None if they are right."""
    if not isinstance(item, dict):
        return f"must be an object with the keys {', '.join(CLAIM_FIELDS)}"
    unknown = [str(k)[:64] for k in item if k not in CLAIM_FIELDS]
    missing = [k for k in CLAIM_FIELDS if k not in item]
    parts = [f"unknown key{'s' * (len(unknown) > 1)} {', '.join(unknown)}"] if unknown else []
    parts += [f"missing {', '.join(missing)}"] if missing else []
    return "; ".join(parts) or None


def _shape_errors(claims: list) -> dict:
    """Key errors, each said once: items that share one problem are named together (``claims[0-24]``), so a
    whole file in the wrong format is one line, not one per item."""
    by_problem: dict[str, list[int]] = {}
    for position, item in enumerate(claims):
        problem = _shape_problem(item)
        if problem is not None:
            by_problem.setdefault(problem, []).append(position)
    errors = {}
    for problem, positions in by_problem.items():
        looks_recorded = any(isinstance(claims[i], dict) and set(claims[i]) >= RECORDER_FIELDS for i in positions)
        errors[_positions(positions)] = [problem] + ([RECORDER_HINT] if looks_recorded else [])
    return errors


def _positions(positions: list[int]) -> str:
    """claims[3], claims[0-24] (every item in a run), or claims[1,4,7]."""
    if len(positions) == 1:
        return f"claims[{positions[0]}]"
    if positions == list(range(positions[0], positions[-1] + 1)):
        return f"claims[{positions[0]}-{positions[-1]}]"
    shown = ",".join(map(str, positions[:20])) + (",..." if len(positions) > 20 else "")
    return f"claims[{shown}]"


def _claim_item(item) -> dict:
    if not isinstance(item["serial"], str) or not 0 < len(item["serial"]) <= 64:
        raise ValidationError(f"serial is the chip's serial (1-64 characters), not {json.dumps(item['serial'])[:32]}")
    for name in ("counter", "step"):
        value = item[name]
        if type(value) is not int or value < 0:
            raise ValidationError(f"{name} must be a non-negative integer, not {json.dumps(value)[:32]}")
    if not isinstance(item["manifest"], str) or not re.fullmatch(r"[0-9a-f]{64}", item["manifest"]):
        raise ValidationError("manifest is the transcript's hex SHA-256 manifest hash")
    problem = transcript_location.location_problem(item["location"])
    if problem:
        raise ValidationError(problem)
    if not isinstance(item["run"], str) or not 0 < len(item["run"]) <= 128:
        raise ValidationError("run names the training run (1-128 characters)")
    if any(unicodedata.category(ch) in ("Cc", "Cs") for ch in item["run"]):  # "run-1\n" is not run-1
        raise ValidationError("run must not contain control characters (newlines, tabs) or lone surrogates")
    return item


def as_report(verdict: dict | Report) -> Report:
    """The verifier's typed report (replay.protocol.report): its JSON is parsed once, never read key by key."""
    return verdict if isinstance(verdict, Report) else Report.from_json(verdict)


def claim_outcome(verdict: dict | Report) -> tuple[str, int | None]:
    """Map the replay verifier's report (contract of docs/claims.md) onto a final claim result."""
    report = as_report(verdict)
    if report.verdict == "malformed":
        return Claim.Result.MALFORMED, None
    if report.verdict == "unavailable":
        return Claim.Result.UNAVAILABLE, None
    if report.verdict == "rejected" and report.budget_exhausted and not report.reasons:
        return Claim.Result.TIMED_OUT, None  # legacy verdicts only: a spent budget is now "incomplete", retried
    if report.verdict == "verified":
        return Claim.Result.VERIFIED, None
    if report.rule_broken:  # a broken rule (compute, the registry's chips, the firmware's work): not a replay
        return Claim.Result.RULE_VIOLATED, None
    return Claim.Result.MISMATCH, report.failing_step


def claim_summary(verdict: dict | Report) -> dict:
    """What of the report goes on the ledger (and to the prover): bounded, and the run's coverage."""
    return as_report(verdict).summary()


def _open_claim(claim_id: int, failures: int) -> Claim | None:
    """The claim, locked, if this run of the verifier may still record its outcome (idempotent on redelivery):
    no final result yet, and no other delivery recorded a failure meanwhile."""
    claim = (
        Claim.objects.select_for_update(of=("self",), no_key=True)
        .select_related("snapshot__chip", "prover")
        .get(pk=claim_id)
    )
    if claim.result in Claim.FINAL or claim.failures != failures:
        return None
    return claim


@transaction.atomic
def claim_result_record(claim_id: int, verdict: dict | None, error: str | None = None, *, failures: int = 0) -> Claim:
    """Put the verification's final result on the ledger, once: a redelivered task records nothing twice.
    ``failures``: the claim's verifier failures when this run started. No verdict (``error`` says why) is
    the verifier's failure, recorded by ``claim_error_record``."""
    if verdict is None:
        return claim_error_record(claim_id, error or "the verifier gave no verdict", failures)
    claim = _open_claim(claim_id, failures)
    if claim is None:
        return Claim.objects.get(pk=claim_id)
    verdict = as_report(verdict)
    result, step = claim_outcome(verdict)
    summary = claim_summary(verdict)
    payload = {
        "claim": claim.pk,
        "chip": claim.snapshot.chip.serial,
        "counter": claim.snapshot.counter,
        "result": result,
        "mismatch_step": step,
        **summary,
        **_copy_failures(claim),
    }
    try:
        with transaction.atomic():
            entry = ledger.append_entry("claim.verified", payload, "system")
    except ValidationError as refused:
        # a report the ledger cannot hold (the summary is bounded, so a bug of ours): the verifier's failure, counted,
        # retried and at last alerted like any other, where the task had raised and left the claim without a result
        return claim_error_record(claim_id, f"the verdict could not be put on the ledger: {refused}", failures)
    claim.result, claim.mismatch_step, claim.report, claim.result_seq = result, step, summary, entry.seq
    claim.retry_at = None
    claim.save(update_fields=["result", "mismatch_step", "report", "result_seq", "retry_at"])
    if result != Claim.Result.VERIFIED:
        detail = f"claim for {claim.snapshot.chip.serial} #{claim.snapshot.counter}: {result}"
        dispute = summary["dispute"] or {}
        if dispute.get("step") is not None:
            detail += f"; first divergent step {dispute['step']}, operation {dispute.get('op')}"
        elif step is not None:
            detail += f" at step {step}"
        alert_raise(Alert.Kind.CLAIM_FAILED, claim.prover, detail, claim.snapshot.chip)
    _conflicts_record(claim, list(verdict.conflicts))  # every one (the summary's may be shed to its size)
    return claim


def _copy_failures(claim: Claim) -> dict:
    """The failed copies of the prover's material so far, on the entry that follows one (a projection like any
    other: the rebuild restores ``Claim.copy_failures`` from it); absent while there was none."""
    return {"copy_failures": claim.copy_failures} if claim.copy_failures else {}


def _conflicts_record(claim: Claim, conflicts: list[dict]) -> None:
    """A later answer that contradicts another claim of the same chip (order, overlap, one counter twice):
    one ``claim.conflict`` entry per pair and an alert on each of the two claims, whatever order they were
    filed and answered in."""
    counters = {c.get("counter") for c in conflicts if type(c.get("counter")) is int}
    others = {
        other.snapshot.counter: other
        for other in Claim.objects.filter(snapshot__chip=claim.snapshot.chip_id, snapshot__counter__in=counters)
        .exclude(pk=claim.pk)
        .select_related("snapshot")
    }
    chip = claim.snapshot.chip
    for item in conflicts:
        other = others.get(item.get("counter"))
        if other is None:
            continue
        kind, detail = str(item.get("kind", "conflict"))[:64], str(item.get("detail", ""))[:500]
        ledger.append_entry(
            "claim.conflict",
            {
                "claim": claim.pk,
                "with": other.pk,
                "chip": chip.serial,
                "counters": [claim.snapshot.counter, other.snapshot.counter],
                "kind": kind,
                "detail": detail,
            },
            "system",
        )
        for one, two in ((claim, other), (other, claim)):
            alert_raise(
                Alert.Kind.CLAIM_FAILED,
                claim.prover,
                f"claim for {chip.serial} #{one.snapshot.counter} conflicts with the claim for "
                f"#{two.snapshot.counter} ({kind}): {detail}"[:1000],
                chip,
            )


@transaction.atomic
def claim_unavailable_record(claim_id: int, reason: str, failures: int = 0, now: datetime | None = None) -> Claim:
    """The prover's material could not be copied (its share failed a read, a file is missing, over a cap or
    another hash). Retried (no nonce exists yet, so a failing share learns nothing) up to
    ``REPLAY_COPY_ATTEMPTS``; then the final verdict ``unavailable``, with an alert: never a silent redraw."""
    claim = _open_claim(claim_id, failures)
    if claim is None:
        return Claim.objects.get(pk=claim_id)
    claim.copy_failures += 1
    claim.save(update_fields=["copy_failures"])
    attempts = getattr(settings, "REPLAY_COPY_ATTEMPTS", 3)
    if claim.copy_failures >= attempts:
        reasons = [f"the material could not be copied in {attempts} attempts: {reason[:500]}"]
        return claim_result_record(claim_id, {"verdict": "unavailable", "reasons": reasons}, failures=failures)
    return claim_error_record(
        claim_id, f"material not copied (attempt {claim.copy_failures} of {attempts}): {reason}", failures, now
    )


def retry_delay(count: int) -> int:
    """Seconds before verifying again after the ``count``-th failure: doubling, at most a day."""
    return min(settings.REPLAY_RETRY_SECONDS * 2 ** min(count - 1, 30), 86_400)


@transaction.atomic
def claim_error_record(
    claim_id: int, reason: str, failures: int = 0, now: datetime | None = None, larger_worker: bool = False
) -> Claim:
    """The verifier failed (not the prover): result ``error`` on the ledger, retried with backoff until
    ``REPLAY_MAX_ATTEMPTS`` (on REPLAY_LARGE_QUEUE where one is set and a larger worker could verify it); then an
    alert asks the regulator to look. Never a final verdict on the claim."""
    claim = _open_claim(claim_id, failures)
    if claim is None:
        return Claim.objects.get(pk=claim_id)
    count = failures + 1
    retry_at = None
    if count < settings.REPLAY_MAX_ATTEMPTS:
        retry_at = (now or timezone.now()) + timedelta(seconds=retry_delay(count))
    entry = ledger.append_entry(
        "claim.verification_failed",
        {
            "claim": claim.pk,
            "chip": claim.snapshot.chip.serial,
            "counter": claim.snapshot.counter,
            "attempt": count,
            "error": reason[:500],
            "retry_at": format_time(retry_at) if retry_at else None,
            **_copy_failures(claim),
        },
        "system",
    )
    claim.result, claim.failures, claim.result_seq = Claim.Result.ERROR, count, entry.seq
    claim.retry_at = retry_at
    claim.report = error_report(reason, count, claim.retry_at)
    claim.save(update_fields=["result", "failures", "retry_at", "report", "result_seq"])
    if retry_at is not None:
        queue.enqueue_claim_verification(claim.pk, countdown=retry_delay(count), larger_worker=larger_worker)
    else:
        alert_raise(
            Alert.Kind.VERIFIER_FAILED,
            claim.prover,
            f"claim for {claim.snapshot.chip.serial} #{claim.snapshot.counter}: the verifier failed "
            f"{count} times ({reason[:200]}); not retried again",
            claim.snapshot.chip,
        )
    return claim


def error_report(reason: str, count: int, retry_at) -> dict:
    """``Claim.report`` of an errored claim (also rebuilt from the ledger)."""
    return {
        "verdict": "error",
        "error": reason[:500],
        "failures": count,
        "retry_at": format_time(retry_at) if retry_at else None,
    }


def claim_due(claim: Claim, now: datetime) -> bool:
    """A claim is verified while pending, and again once its retry after a verifier failure is due."""
    if claim.result == Claim.Result.PENDING:
        return True
    return claim.result == Claim.Result.ERROR and claim.retry_at is not None and claim.retry_at <= now


def claim_verify(claim_id: int, now: datetime | None = None) -> str:
    """Replay the prover's transcript for one claim (``verification``) and record the result; idempotent."""
    now = now or timezone.now()
    claim = Claim.objects.select_related("snapshot__chip", "prover").get(pk=claim_id)
    if not claim_due(claim, now):
        return claim.result
    return _verify_and_record(claim, now)


def _verify_and_record(claim: Claim, now: datetime) -> str:
    failures = claim.failures
    try:
        verdict = claim_replay(claim)
    except verification.MaterialUnavailable as unavailable:
        return claim_unavailable_record(claim.pk, str(unavailable), failures, now).result
    except verification.VerifierFailed as failed:
        return claim_error_record(claim.pk, str(failed), failures, now, larger_worker=failed.larger_worker).result
    if verdict.verdict == "incomplete":  # our budget, not the prover's fault: retried with the same nonce
        why = "; ".join(verdict.reasons)[:400]
        return claim_error_record(
            claim.pk, f"the replay did not finish within its budget ({why})", failures, now
        ).result
    return claim_result_record(claim.pk, verdict, failures=failures).result


def claim_replay(claim: Claim, *, reverification: bool = False) -> Report:
    """The verifier's verdict on one claim, recording nothing but the nonce's commitment; raises
    ``verification.VerifierFailed`` (ours) or ``verification.MaterialUnavailable`` (the prover's share).
    ``reverification``: a coverage re-verification: the claim's own segments count as replayed (fresh ones are
    drawn), with a fresh nonce of its own (``reverification_nonce``)."""
    rule_flops = selectors.rule_flops_for_chip(claim.snapshot.chip)
    request = selectors.claim_request(claim, own_covered=reverification)
    with tempfile.TemporaryDirectory(prefix="claim-") as scratch:
        try:
            material, nonce = claim_material(claim, Path(scratch))
            if reverification:
                nonce = reverification_nonce(claim)
        except transcript_location.TranscriptUnavailable as refused:  # outside the roots, a link: the prover's, final
            return Report("malformed", (str(refused),))
        except verification.MaterialRefused as refused:  # a forbidden address, a file not as committed: final
            return Report.from_json(refused.verdict)
        return verification.claim_check(material, request, rule_flops, Path(scratch), nonce)


def claim_material(claim: Claim, scratch: Path) -> tuple[Path, str]:
    """(the claim's copy of the prover's material, the claim's nonce). The copy is made first, every file
    hashed against the manifest; only then is the nonce drawn, once, and kept with the claim: every retry
    replays the same copy with the same nonce, so neither a failing read nor a failure of ours redraws.
    The copy is content-addressed (its manifest hash): a run's claims share it."""
    material = verification.material_dir(claim.manifest)
    if not material.is_dir():
        verification.material_copy(claim.location, claim.manifest, material, scratch)
    with transaction.atomic():
        locked = (
            Claim.objects.select_for_update(of=("self",), no_key=True).select_related("snapshot__chip").get(pk=claim.pk)
        )
        if not locked.nonce and locked.result in Claim.FINAL:
            # a verdict that predates nonces: a re-verification replays with a nonce of its own, kept nowhere
            # (the recorded verdict stands; only a kept nonce is a projection, committed on the ledger)
            return material, verification.new_nonce()
        if not locked.nonce:
            # drawn now, after the copy, and committed on the ledger by its hash: the nonce a verdict entry
            # reveals can be checked against a commitment made only once the material was in our hands; every
            # nonce kept is committed, so the rebuild checks each live nonce against the ledger (docs/claims.md §6)
            locked.nonce, locked.material = verification.new_nonce(), claim.manifest
            _nonce_committed("claim.material_copied", locked, locked.nonce, manifest=locked.manifest)
            locked.save(update_fields=["nonce", "material"])
    claim.nonce, claim.material = locked.nonce, locked.material
    return material, locked.nonce


def reverification_nonce(claim: Claim) -> str:
    """The nonce of the claim's next coverage re-verification. Not the claim's own: that one is public once the
    claim's verdict is, and every draw it orders could be computed, so a prover could file claims that force the
    segments it would draw next. Drawn fresh once the material is in our hands, committed on the ledger by its
    hash before the replay reads anything (``claim.reverification_drawn``), reused by every retry until a
    re-verification is recorded (which reveals it and clears it): a failure never redraws."""
    with transaction.atomic():
        locked = (
            Claim.objects.select_for_update(of=("self",), no_key=True).select_related("snapshot__chip").get(pk=claim.pk)
        )
        if not locked.reverify_nonce:
            locked.reverify_nonce = verification.new_nonce()
            _nonce_committed("claim.reverification_drawn", locked, locked.reverify_nonce)
            locked.save(update_fields=["reverify_nonce"])
    claim.reverify_nonce = locked.reverify_nonce
    return locked.reverify_nonce


def _nonce_committed(kind: str, claim: Claim, nonce: str, **fields) -> None:
    """Put a nonce's commitment (its SHA-256) on the ledger, naming the claim: the verdict that uses the nonce
    reveals it later, and the rebuild checks it against this entry."""
    ledger.append_entry(
        kind,
        {
            "claim": claim.pk,
            "chip": claim.snapshot.chip.serial,
            "counter": claim.snapshot.counter,
            **fields,
            "nonce_sha256": nonce_commitment(nonce),
        },
        "system",
    )


def nonce_commitment(nonce: str) -> str:
    """What ``claim.material_copied`` puts on the ledger for the claim's nonce: its SHA-256 (hex)."""
    return hashlib.sha256(bytes.fromhex(nonce)).hexdigest()


def claim_reverify(claim_id: int, now: datetime | None = None) -> dict:
    """The regulator asks for the claim to be verified again, now.

    A claim without a final result (pending, or errored — also once its retries are spent) is verified as a
    retry is (``claim_verify``'s path) and the result recorded on the ledger as usual. A final result is never
    replaced (the ledger records one verdict per claim): the replay runs again and is compared with it, and the
    comparison is the job's result only.
    """
    now = now or timezone.now()
    claim = Claim.objects.select_related("snapshot__chip", "prover").get(pk=claim_id)
    if claim.result not in Claim.FINAL:
        seq_before = claim.result_seq
        result = _verify_and_record(claim, now)
        claim.refresh_from_db()
        return {  # not recorded: a worker's delivery recorded its own outcome meanwhile (it wins, once)
            "recorded": claim.result_seq != seq_before,
            "result": result,
            "mismatch_step": claim.mismatch_step,
            "result_seq": claim.result_seq,
            "reasons": claim.report.get("reasons") or [r for r in [claim.report.get("error")] if r],
        }
    try:
        verdict = claim_replay(claim)
    except (verification.VerifierFailed, verification.MaterialUnavailable) as failed:
        return {"recorded": False, "result": Claim.Result.ERROR, "agrees": None, "reasons": [str(failed)[:500]]}
    result, step = claim_outcome(verdict)
    summary = claim_summary(verdict)
    return {
        "recorded": False,
        "result": result,
        "mismatch_step": step,
        "agrees": result == claim.result and step == claim.mismatch_step,
        "recorded_result": claim.result,
        "reasons": summary["reasons"],
        "segments_replayed": summary["segments_replayed"][:1000],
        "segments_drawn": summary["segments_drawn"][:1000],
        "segments_total": summary["segments_total"],
    }


def claim_retries_enqueue(now: datetime) -> int:
    """Re-send every errored claim whose retry is an hour overdue (a backstop for a retry message the broker
    lost; the hour leaves the delayed message its turn, and a duplicate records nothing twice anyway)."""
    late = now - RETRY_GRACE
    due = Claim.objects.filter(result=Claim.Result.ERROR, retry_at__lte=late).values_list("pk", flat=True)
    count = 0
    for claim_id in due:
        queue.enqueue_claim_verification(claim_id)
        count += 1
    return count


# --- coverage accumulates: scheduled re-verifications of runs below their target ----------------------------

REPLAYED = (Claim.Result.VERIFIED, Claim.Result.MISMATCH, Claim.Result.RULE_VIOLATED)  # a replay's own outcomes
# a re-verification's outcomes that go on the ledger: a drawn segment whose material is malformed is evidence too
# (dropped, the next draw with a fresh nonce could pass it by and the run meet its target)
RECORDED = (*REPLAYED, Claim.Result.MALFORMED)
MAX_PAIRS_DUE = 100_000  # a chip's claims with a pair across runs to re-check (bounded by its snapshots anyway)


def coverage_reverifications_enqueue(limit: int | None = None) -> int:
    """The beat's share of coverage work: one verified claim of each run below its target (at most
    ``REPLAY_COVERAGE_RUNS`` runs, longest-waiting first) is sent to be re-verified; so is each claim whose pair of
    snapshots across two runs no verification judged (both verified at the same moment: at most as many again)."""
    limit = limit or settings.REPLAY_COVERAGE_RUNS
    due = selectors.coverage_reverifications_due(limit)
    due += [c for c in selectors.cross_run_rechecks_due(limit) if c not in due]
    for claim_id in due:
        queue.enqueue_coverage_reverification(claim_id)
    return len(due)


def claim_coverage_reverify(claim_id: int) -> str:
    """Replay a bounded amount more of a verified claim's run: its mandatory segment and at most ``--segments``
    segments not yet replayed (drawn with the claim's nonce, committed before the copy was read), recorded as
    ``claim.reverified``. The claim's verdict stands. A replay that disagrees is exact evidence (an alert); a
    budget spent, a failure of ours or of the prover's share records nothing and is never final: the next
    interval tries again, and nothing is held against the prover."""
    claim = Claim.objects.select_related("snapshot__chip", "prover").get(pk=claim_id)
    if claim.result != Claim.Result.VERIFIED:
        return "not verified"
    run = selectors.run_coverage(claim.prover, claim.manifest)
    if (run["target_met"] or run["disputed"]) and claim.pk not in (
        selectors.cross_run_rechecks_due(MAX_PAIRS_DUE, chip=claim.snapshot.chip)
    ):
        return "target met" if run["target_met"] else "disputed"  # disputed: the regulator decides
    try:
        verdict = claim_replay(claim, reverification=True)
    except (verification.VerifierFailed, verification.MaterialUnavailable) as failed:
        _coverage_stalled(claim_id, True)  # not every beat: a run failing on our side must not starve the others
        logger.warning("coverage re-verification of claim %s: %s", claim_id, failed)
        return "not recorded"
    if not verdict.nonce or verdict.nonce != claim.reverify_nonce:  # claim_replay set it to the committed one
        # no replay with the committed nonce ran (our copy of the material is gone and could not be made
        # again): nothing was drawn, so nothing is evidence either way
        _coverage_stalled(claim_id, True)
        logger.warning("coverage re-verification of claim %s: no replay ran (%s)", claim_id, verdict.reasons[:1])
        return "not recorded"
    result, _ = claim_outcome(verdict)
    if verdict.verdict == "incomplete":  # the claim's own replays filled the budget: no draw could run
        _coverage_stalled(claim_id, True)
        logger.warning("coverage re-verification of claim %s: incomplete, not recorded", claim_id)
        return "not recorded"
    if result not in RECORDED:
        logger.warning("coverage re-verification of claim %s: %s, not recorded", claim_id, verdict.verdict)
        return "not recorded"
    try:
        row = claim_reverification_record(claim_id, verdict)
    except ValidationError as refused:  # (a summary the ledger refuses: a bug of ours, as in claim_result_record)
        _coverage_stalled(claim_id, True)
        logger.warning("coverage re-verification of claim %s: not put on the ledger (%s)", claim_id, refused)
        return "not recorded"
    if row is None:
        logger.warning("coverage re-verification of claim %s: its draw was recorded by another delivery", claim_id)
        return "not recorded"
    _coverage_stalled(claim_id, not _progressed(verdict, run["segments_pending"]))
    return row.result


def _progressed(verdict: Report, pending: list[int]) -> bool:
    """A re-verification moved the run's coverage if it completed a draw, revealed a new one, or was not cut;
    one whose budget ran out on a draw that was already pending did not."""
    return bool(verdict.segments_drawn) or verdict.draw_cut is None or verdict.draw_cut not in pending


def _coverage_stalled(claim_id: int, stalled: bool) -> None:
    """Note (off the ledger: an operational fact, not evidence) whether the run's re-verifications stall."""
    Claim.objects.filter(pk=claim_id).update(coverage_stalled_at=timezone.now() if stalled else None)


@transaction.atomic
def claim_reverification_record(claim_id: int, verdict: dict | Report) -> CoverageReverification | None:
    """Put one coverage re-verification on the ledger (``claim.reverified``: the claim, its result and the
    bounded report, as ``claim.verified``) and its projection; a disagreeing replay raises ``claim_failed``.
    None when another delivery already recorded the draw of this nonce: the same draw counted twice would
    count its segments as two independent chances to catch a fabrication."""
    claim = (
        Claim.objects.select_for_update(of=("self",), no_key=True)
        .select_related("snapshot__chip", "prover")
        .get(pk=claim_id)
    )
    verdict = as_report(verdict)
    result, step = claim_outcome(verdict)
    summary = claim_summary(verdict)
    if not summary["nonce"] or summary["nonce"] != claim.reverify_nonce:
        return None
    chip = claim.snapshot.chip
    entry = ledger.append_entry(
        "claim.reverified",
        {
            "claim": claim.pk,
            "chip": chip.serial,
            "counter": claim.snapshot.counter,
            "result": result,
            "mismatch_step": step,
            **summary,
        },
        "system",
    )
    row = CoverageReverification.objects.create(
        claim=claim, seq=entry.seq, result=result, mismatch_step=step, report=summary
    )
    claim.reverify_nonce = ""  # revealed by the entry: the next re-verification draws a fresh one
    claim.save(update_fields=["reverify_nonce"])
    # every conflict (the summary's may be shed to its size): e.g. work across two runs, found by a re-check of the pair
    _conflicts_record(claim, list(verdict.conflicts))
    if result != Claim.Result.VERIFIED:
        where = f" at step {step}" if step is not None else ""
        alert_raise(
            Alert.Kind.CLAIM_FAILED,
            claim.prover,
            f"claim for {chip.serial} #{claim.snapshot.counter}: a coverage re-verification of its verified run "
            f"found {result}{where}; the recorded verdict stands, the regulator decides",
            chip,
        )
    return row
