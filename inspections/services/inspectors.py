"""The inspector's workflow: accept a task, check the chip's identity, upload its snapshot log, record findings.

Each step is a ledger entry made by the inspection body (``inspection.accepted``,
``inspection.identity_checked``, ``inspection.snapshot_log``, ``inspection.finding``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import re
import secrets
from datetime import datetime, timedelta

from django.db import InterfaceError, OperationalError, transaction
from django.utils import timezone
from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey

from ledger import services as ledger
from registry.models import Organisation
from rules.chip_lifecycle import Status

from .. import queue, verification
from ..models import Alert, Finding, IdentityChallenge, IdentityCheck, InspectionTask, Snapshot, SnapshotLog
from .alerts import CLOSED, alert_act, alert_raise
from .campaigns import campaign_create
from .casefiles import case_text_commit
from .validation import fail as _fail

CHALLENGE_SECONDS = 600
# A chip's clock may run this far ahead of ours before its snapshots' times are reported as in the future.
CLOCK_SKEW = timedelta(minutes=15)
CLAIM_DAYS = 30  # the prover must answer a logged snapshot within this many days
MAX_LOG_BYTES = 5 * 2**20
PHOTO_HASH = re.compile(r"[0-9a-f]{64}")
NONCE = re.compile(r"[0-9a-f]{64}")  # what identity_challenge_issue makes: secrets.token_hex(32)
SIGNATURE_BYTES = 64  # Ed25519
logger = logging.getLogger(__name__)


def _own_task(task: InspectionTask, body: Organisation) -> None:
    """The body's task, its row locked and its status read under the lock. Every writer of a task locks its row
    before it appends to the ledger (one order of the two locks, so none deadlocks with another), and a status
    checked under the lock stays true until commit (two findings sent at once: one lands, one is refused). FOR NO KEY
    UPDATE, as every row lock here: a row naming the task (an alert) inserted by a writer that holds the ledger does
    not wait for it."""
    if task.inspection_body_id != body.pk:
        raise InspectionTask.DoesNotExist  # another body's task does not exist for this one
    locked = InspectionTask.objects.select_for_update(of=("self",), no_key=True).filter(pk=task.pk)
    task.status = locked.values_list("status", flat=True).get()


def _task_open(task: InspectionTask, body: Organisation) -> None:
    """The body's task, accepted and not done: the work at the chip (challenge, identity answer, log) happens
    between accepting a task and recording its finding. The portal and the API refuse alike (400, ``status``)."""
    _own_task(task, body)
    if task.status == InspectionTask.Status.DONE:
        _fail("status", "the task is done: its findings are recorded, nothing more is taken")
    if task.status == InspectionTask.Status.ASSIGNED:
        _fail("status", "the task is not accepted yet: accept it first")


@transaction.atomic
def task_accept(task: InspectionTask, body: Organisation, submission: dict | None = None) -> InspectionTask:
    _own_task(task, body)
    if task.status != InspectionTask.Status.ASSIGNED:
        _fail("status", f"the task is {task.status}: only an assigned task can be accepted")
    ledger.append_entry("inspection.accepted", {"task": task.pk, "chip": task.chip.serial}, body.slug, submission)
    task.status = InspectionTask.Status.ACCEPTED
    task.save(update_fields=["status"])
    return task


def identity_message(serial: str, nonce: str) -> bytes:
    """What the chip signs: domain-separated, so no other signature of the chip key can pass."""
    return f"chipledger identity challenge v1\n{serial}\n{nonce}\n".encode()


@transaction.atomic
def identity_challenge_issue(task: InspectionTask, body: Organisation) -> IdentityChallenge:
    """A fresh challenge; an inspector may ask again (a mistyped answer) until the task is done or past due."""
    _task_open(task, body)
    now = timezone.now()
    if now.date() > task.due_on:
        _fail("status", f"the task was due {task.due_on}: identity checks are closed")
    return IdentityChallenge.objects.create(
        task=task, nonce=secrets.token_hex(32), issued_at=now, expires_at=now + timedelta(seconds=CHALLENGE_SECONDS)
    )


@transaction.atomic
def identity_answer_check(
    task: InspectionTask, body: Organisation, nonce: str, signature: str, submission: dict | None = None
) -> dict:
    """Verify the chip's answer against the key registered at fabrication; the outcome goes on the ledger.

    A well-formed answer whose signature does not verify, or one to a replayed or expired challenge, is a failed
    identity check (an alert against the prover), never a pass. A malformed answer (a challenge this task was
    never issued, a signature that is no base64 Ed25519 signature) says nothing of the chip: it is the
    inspector's typo, refused naming the field, and changes nothing.
    """
    _task_open(task, body)
    challenge, raw = _identity_answer_clean(task, nonce, signature)
    reason = _identity_problem(task, challenge, raw)
    superseded = _open_identity_alerts(task) if reason is None else []
    challenge.answered = True
    challenge.save(update_fields=["answered"])
    # The challenge's nonce is private case text: the entry carries its salted commitment.
    outcome = {
        "task": task.pk,
        "chip": task.chip.serial,
        "challenge": case_text_commit(nonce),
        "passed": reason is None,
        "reason": reason,
    }
    entry = ledger.append_entry("inspection.identity_checked", outcome, body.slug, submission)
    IdentityCheck.objects.create(task=task, seq=entry.seq, checked_at=entry.time, passed=reason is None, reason=reason)
    if reason is not None:
        alert_raise(Alert.Kind.IDENTITY_FAILED, task.prover, f"{task.chip.serial}: {reason}", task.chip, task)
    else:
        _supersede_identity_alerts(superseded, task, body)
    return outcome


def _open_identity_alerts(task: InspectionTask) -> list[Alert]:
    """The task's open identity alerts, locked (in one order) before the retry's ledger entry: a regulator acting
    on one of them at the same moment holds it while waiting for the ledger."""
    alerts = Alert.objects.select_for_update(no_key=True).filter(task=task, kind=Alert.Kind.IDENTITY_FAILED)
    return list(alerts.exclude(state__in=CLOSED).order_by("pk"))


def _supersede_identity_alerts(alerts: list[Alert], task: InspectionTask, body: Organisation) -> None:
    """A retry that passes closes the task's open identity alerts: the failure was the inspector's mistake."""
    for alert in alerts:
        reason = f"the identity check of {task.chip.serial} was retried within the deadline and passed"
        alert_act(alert, action="supersede", by=body.slug, reason=reason, actor=body.slug)


def _identity_answer_clean(task: InspectionTask, nonce, signature) -> tuple[IdentityChallenge, bytes]:
    """The task's challenge (locked) and the signature's bytes, or a ValidationError naming the field."""
    if not isinstance(nonce, str) or not NONCE.fullmatch(nonce):
        _fail("challenge", "the challenge's nonce as issued: 64 lowercase hex digits")
    try:
        raw = base64.b64decode(signature, validate=True) if isinstance(signature, str) else b""
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != SIGNATURE_BYTES:
        _fail("signature", f"the chip's Ed25519 signature in base64 ({SIGNATURE_BYTES} bytes)")
    challenge = IdentityChallenge.objects.select_for_update(no_key=True).filter(task=task, nonce=nonce).first()
    if challenge is None:
        _fail("challenge", "no such challenge was issued for this task (issue one with challenge)")
    return challenge, raw


def _identity_problem(task: InspectionTask, challenge: IdentityChallenge, signature: bytes) -> str | None:
    if challenge.answered:
        return "the challenge was already answered (replayed)"
    if timezone.now() > challenge.expires_at:
        return "the challenge expired"
    try:
        VerifyKey(bytes(task.chip.public_key)).verify(identity_message(task.chip.serial, challenge.nonce), signature)
    except (BadSignatureError, ValueError, TypeError):
        return "the signature does not verify under the chip's registered key"
    return None


@transaction.atomic
def snapshot_log_upload(task: InspectionTask, body: Organisation, text: str) -> SnapshotLog:
    """Store the log; a Celery task checks it after commit (the checker lives in replay)."""
    _task_open(task, body)
    try:
        size = len(text.encode())
    except UnicodeEncodeError:  # a lone surrogate: no UTF-8 text, and PostgreSQL cannot store it
        _fail("log", "is not UTF-8 text (it contains a lone surrogate)")
    if size > MAX_LOG_BYTES:
        _fail("log", f"at most {MAX_LOG_BYTES} bytes")
    if not text.strip():
        _fail("log", "is empty")
    if "\x00" in text:
        _fail("log", "contains NUL characters (a firmware log is JSON lines text)")
    named = verification.log_serials(text)
    if len(named) == 1 and task.chip.serial not in named:  # the wrong file, not forged lines: say whose it is
        _fail("log", f"log belongs to chip {named.pop()}, not {task.chip.serial}: upload {task.chip.serial}'s log")
    log = SnapshotLog.objects.create(task=task, text=text, sha256=hashlib.sha256(text.encode()).hexdigest())
    queue.enqueue_log_check(log.pk)
    return log


def snapshot_log_check(log_id: int) -> str:
    """Check an uploaded firmware log against the chip's registered key and record the verdict (the worker's job).

    Every failure of the check is itself a verdict with an alert: a log that crashes the checker or cannot be
    recorded must not stay "pending" (a forger would like that). Only a lost database connection is re-raised,
    so the broker redelivers and the pending sweep retries.
    """
    log = SnapshotLog.objects.select_related("task__chip").get(pk=log_id)
    if log.status != SnapshotLog.Status.PENDING:
        return log.status
    chip = log.task.chip
    try:
        problems, records = verification.snapshot_log_check(log.text, bytes(chip.public_key), chip.serial)
        return snapshot_log_record(log, problems, records).status
    except (OperationalError, InterfaceError):
        raise
    except Exception as error:
        logger.exception("snapshot log %s could not be checked or recorded", log_id)
        return snapshot_log_record(log, [unchecked_problem(f"the check failed ({type(error).__name__})")], []).status


def unchecked_problem(detail: str) -> dict:
    """The verdict of a log the checker could not judge: a problem of the whole log, not of a line."""
    return {"kind": "unchecked", "line": None, "counter": None, "detail": detail}


@transaction.atomic
def snapshot_log_record(log: SnapshotLog, problems: list[dict], records: list[dict]) -> SnapshotLog:
    """Record the checker's verdict on the ledger; keep the authentic snapshots for the prover's claims."""
    # of=self: the verdict locks its log, not the task, chip and prover it joins (a finding updates the task
    # after its ledger append; holding the task here while waiting for the ledger would deadlock with it)
    log = (
        SnapshotLog.objects.select_for_update(of=("self",), no_key=True)
        .select_related("task__chip", "task__prover")
        .get(pk=log.pk)
    )
    if log.status != SnapshotLog.Status.PENDING:
        return log  # a retried task records nothing twice
    task, chip = log.task, log.task.chip
    entry = ledger.append_entry(
        "inspection.snapshot_log",
        {
            "task": task.pk,
            "chip": chip.serial,
            "log_sha256": log.sha256,
            "problems": problems,
            "snapshots": [{k: r[k] for k in ("counter", "time", "shard", "hash")} for r in records],
        },
        task.inspection_body.slug if task.inspection_body else "system",
    )
    due = timezone.now().date() + timedelta(days=CLAIM_DAYS)
    Snapshot.objects.bulk_create(
        [
            Snapshot(
                chip=chip,
                log=log,
                counter=r["counter"],
                time=r["time"],
                shard=r["shard"],
                hash=r["hash"],
                claim_due_on=due,
                work={k: str(r[k]) for k in ("busy_ns", "flops")} if "flops" in r else None,
            )
            for r in records
        ],
        ignore_conflicts=True,
    )
    log.status = SnapshotLog.Status.PROBLEMS if problems else SnapshotLog.Status.INTACT
    log.problems, log.checked_seq = problems, entry.seq
    log.save(update_fields=["status", "problems", "checked_seq"])
    if problems:
        summary = "; ".join(f"{_where(p)}: {p['kind']} ({p['detail']})" for p in problems[:5])
        alert_raise(Alert.Kind.LOG_PROBLEMS, task.prover, f"{chip.serial}: {summary}", chip, task)
    _clock_ahead_alert(task, records, entry.time)
    if records and chip.status == Status.IN_TRANSIT:
        detail = (
            f"{chip.serial} logged {len(records)} training snapshot(s) while the registry has it in transit to "
            f"{chip.consignee.slug if chip.consignee else 'nobody'}: its receipt was never recorded"
        )
        alert_raise(Alert.Kind.UNRECORDED_USE, task.prover, detail, chip, task)
    return log


def _clock_ahead_alert(task: InspectionTask, records: list[dict], read_at) -> None:
    """Snapshots the chip signed at times after the log was read (beyond CLOCK_SKEW): a low alert naming them.
    The log stays intact (signatures and chain are authentic, and the chip's times are only its word): an honest
    chip with a wrong clock must not be accused of tampering, but the regulator sees the times and may ask."""
    limit = read_at + CLOCK_SKEW
    ahead = [r for r in records if datetime.fromisoformat(r["time"].replace("Z", "+00:00")) > limit]
    if not ahead:
        return
    shown = ", ".join(f"#{r['counter']} at {r['time']}" for r in ahead[:5]) + (" …" if len(ahead) > 5 else "")
    detail = (
        f"{task.chip.serial}: {len(ahead)} snapshot(s) signed after the log was read at "
        f"{read_at:%Y-%m-%dT%H:%M:%SZ} (its clock is ahead): {shown}"
    )
    alert_raise(Alert.Kind.CLOCK_AHEAD, task.prover, detail, task.chip, task)


def _where(problem: dict) -> str:
    return "log" if problem["line"] is None else f"line {problem['line']}"


def _no_finding_reason(status: str) -> str:
    if status == InspectionTask.Status.ASSIGNED:
        return "the task is not accepted yet: accept it first"
    return f"the task is {status}: its findings are already recorded"


FINDING_FIELDS = {
    "chip_found": bool,
    "owner_refused": bool,
    "seal_intact": bool,
    "tamper_evidence": bool,
    "location_matches": bool,
    "notes": str,
}


@transaction.atomic
def finding_submit(task: InspectionTask, body: Organisation, data: dict, submission: dict | None = None) -> Finding:
    _own_task(task, body)
    if task.status not in (InspectionTask.Status.ACCEPTED, InspectionTask.Status.OVERDUE):
        _fail("status", _no_finding_reason(task.status))
    finding = _finding_fields(data)
    if finding.get("notes") and submission is not None:
        _fail("notes", "are private, and a signed body is published whole on the ledger: record them in the portal")
    # Notes are private case text: the entry (and the projection) carry their salted commitment.
    notes = finding.pop("notes", "").strip()
    if notes:
        finding["notes"] = case_text_commit(notes)
    entry = ledger.append_entry(
        "inspection.finding", {"task": task.pk, "chip": task.chip.serial, **finding}, body.slug, submission
    )
    row = Finding.objects.create(task=task, recorded_seq=entry.seq, **finding)
    task.status = InspectionTask.Status.DONE
    task.save(update_fields=["status"])
    _escalate(task, row)
    return row


def _finding_fields(data: dict) -> dict:
    if not isinstance(data, dict) or not isinstance(data.get("chip_found"), bool):
        _fail("chip_found", "required: true or false")
    finding = {}
    for name, kind in FINDING_FIELDS.items():
        value = data.get(name)
        if value is not None and not isinstance(value, kind):
            _fail(name, f"must be {kind.__name__}")
        if value is not None:
            finding[name] = value
    hashes = data.get("photo_hashes", [])
    if isinstance(hashes, list) and all(isinstance(h, str) for h in hashes):
        hashes = [h.strip().lower() for h in hashes]
    if not isinstance(hashes, list) or not all(isinstance(h, str) and PHOTO_HASH.fullmatch(h) for h in hashes):
        _fail("photo_hashes", "a list of hex SHA-256 digests of the photographs")
    finding["photo_hashes"] = hashes
    unknown = set(data) - set(FINDING_FIELDS) - {"photo_hashes"}
    if unknown:
        _fail("body", f"unknown fields {sorted(unknown)}")
    return finding


def _escalate(task: InspectionTask, finding: Finding) -> None:
    """Not found, refused or tampered: alert and escalate; not found twice: an unscheduled campaign."""
    chip, prover = task.chip, task.prover
    if finding.owner_refused:
        alert_raise(Alert.Kind.REFUSED, prover, f"{prover.slug} refused the inspection of {chip.serial}", chip, task)
    if not finding.chip_found:
        alert_raise(Alert.Kind.NOT_FOUND, prover, f"{chip.serial} was not where the registry says", chip, task)
        misses = Finding.objects.filter(task__prover=prover, chip_found=False).count()
        if misses == 2:
            campaign = task.draw.campaign
            campaign_create(
                slug=f"unscheduled-{prover.slug}-{finding.recorded_seq}",
                provers=[prover.slug],
                rule_flops=campaign.rule_flops,
                starts_on=timezone.now().date(),
                detection_probability=campaign.detection_probability,
                snapshot_rate=campaign.snapshot_rate,
                period_days=campaign.period_days,
                run_days=campaign.run_days,
                model=campaign.model,
                actor="system",
            )
