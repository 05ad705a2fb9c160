"""The prover's claims: answer logged snapshots with run, step and transcript; record each verification's result."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from django.core.exceptions import ValidationError
from django.db import transaction

from ledger import services as ledger
from registry.models import Organisation

from .. import queue, selectors, verification
from ..models import Alert, Claim, Snapshot
from .alerts import alert_raise
from .validation import fail as _fail

CLAIM_FIELDS = ("serial", "counter", "run", "step", "manifest", "location")


@transaction.atomic
def claims_submit(*, prover: Organisation, claims: list, submission: dict | None = None) -> list[Claim]:
    """The prover answers logged snapshots of its chips, all or nothing; each claim is then verified by a worker."""
    if not isinstance(claims, list) or not 1 <= len(claims) <= 1000:
        _fail("claims", "a list of 1 to 1000 claims")
    items, snapshots, errors = [], [], {}
    for position, item in enumerate(claims):
        try:
            clean = _claim_item(item)
            snapshot = (
                Snapshot.objects.select_related("chip__owner")
                .filter(chip__serial=clean["serial"], counter=clean["counter"])
                .first()
            )
            if snapshot is None or snapshot.chip.owner_id != prover.pk:
                raise ValidationError("no logged snapshot of your chip with this serial and counter")
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


def _claim_item(item) -> dict:
    if not isinstance(item, dict) or set(item) != set(CLAIM_FIELDS):
        raise ValidationError(f"an object with exactly {list(CLAIM_FIELDS)}")
    if not isinstance(item["counter"], int) or not isinstance(item["step"], int) or item["step"] < 0:
        raise ValidationError("counter and step are non-negative integers")
    if not isinstance(item["manifest"], str) or not re.fullmatch(r"[0-9a-f]{64}", item["manifest"]):
        raise ValidationError("manifest is the transcript's hex SHA-256 manifest hash")
    location = item["location"]
    if not isinstance(location, str) or not location or len(location) > 1024:
        raise ValidationError("location is a path or an http(s) URL")
    if not isinstance(item["run"], str) or not 0 < len(item["run"]) <= 128:
        raise ValidationError("run names the training run (1-128 characters)")
    return item


def claim_outcome(verdict: dict | None, error: str | None) -> tuple[str, int | None]:
    """Map the replay verifier's verdict (or why it could not run) onto a claim result."""
    if verdict is None:
        return (Claim.Result.TIMED_OUT if error == "timeout" else Claim.Result.MALFORMED), None
    if verdict["verdict"] == "malformed":
        return Claim.Result.MALFORMED, None
    if verdict.get("budget_exhausted"):
        return Claim.Result.TIMED_OUT, None
    if verdict["verdict"] == "verified":
        return Claim.Result.VERIFIED, None
    rules = verdict.get("rules") or {}
    if any(not rule.get("ok", True) for rule in rules.values() if isinstance(rule, dict)):
        return Claim.Result.RULE_VIOLATED, None
    failing = [c["step"] for c in verdict.get("claims", []) if not c.get("ok", True)]
    dispute = verdict.get("dispute") or {}
    return Claim.Result.MISMATCH, dispute.get("step", min(failing, default=None))


@transaction.atomic
def claim_result_record(claim_id: int, verdict: dict | None, error: str | None = None) -> Claim:
    """Put the verification's result on the ledger, once: a retried task records nothing twice."""
    claim = Claim.objects.select_for_update().select_related("snapshot__chip", "prover").get(pk=claim_id)
    if claim.result != Claim.Result.PENDING:
        return claim
    result, step = claim_outcome(verdict, error)
    summary = (
        {
            "verdict": verdict.get("verdict"),
            "reasons": verdict.get("reasons", [])[:20],
            "flops": verdict.get("flops"),
            "steps": verdict.get("steps"),
            "rules": verdict.get("rules"),
        }
        if verdict
        else {"error": error}
    )
    entry = ledger.append_entry(
        "claim.verified",
        {
            "claim": claim.pk,
            "chip": claim.snapshot.chip.serial,
            "counter": claim.snapshot.counter,
            "result": result,
            "mismatch_step": step,
            **summary,
        },
        "system",
    )
    claim.result, claim.mismatch_step, claim.report, claim.result_seq = result, step, summary, entry.seq
    claim.save(update_fields=["result", "mismatch_step", "report", "result_seq"])
    if result != Claim.Result.VERIFIED:
        detail = f"claim for {claim.snapshot.chip.serial} #{claim.snapshot.counter}: {result}"
        alert_raise(
            Alert.Kind.CLAIM_FAILED,
            claim.prover,
            detail + (f" at step {step}" if step is not None else ""),
            claim.snapshot.chip,
        )
    return claim


def claim_verify(claim_id: int) -> str:
    """Replay the prover's transcript for one claim (``verification``) and record the result; idempotent."""
    claim = Claim.objects.select_related("snapshot__chip").get(pk=claim_id)
    if claim.result != Claim.Result.PENDING:
        return claim.result
    rule_flops = selectors.rule_flops_for_chip(claim.snapshot.chip)
    with tempfile.TemporaryDirectory(prefix="claim-") as scratch:
        verdict, error = verification.claim_check(claim, rule_flops, Path(scratch))
    return claim_result_record(claim.pk, verdict, error).result
