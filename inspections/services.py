"""Writes of the inspections app: campaigns, commit–draw–reveal, task assignment. Each a ledger entry."""
from __future__ import annotations

import base64
import hashlib
import re
import secrets
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, timedelta

from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.db import connection, transaction
from django.db.models import Count, Max, Q
from django.utils import timezone
from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey

from ledger import services as ledger
from registry.lifecycle import ACTIVE, Status
from registry.models import Chip, Organisation

from . import draws, sampling
from .models import (
    Alert,
    Campaign,
    Claim,
    CampaignSeed,
    Draw,
    Finding,
    IdentityChallenge,
    InspectionBody,
    InspectionTask,
    Snapshot,
    SnapshotLog,
)

# Chips a prover holds for the purpose of a draw: anything it owns that could be training.
ELIGIBLE = sorted(s.value for s in ACTIVE | {Status.IN_TRANSIT})
TASK_DAYS = 14  # an inspection is due this many days after the draw


def _fail(field: str, reason: str) -> None:
    raise ValidationError({field: reason})


@transaction.atomic
def campaign_create(
    *, slug: str, rule_flops: float, starts_on: date, provers: list[str] = (), country: str = "",
    detection_probability: float = 0.9, snapshot_rate: float = 0.1, period_days: int = 30, run_days: int = 365,
    ends_on: date | None = None, actor: str = "regulator",
) -> Campaign:
    if Campaign.objects.filter(slug=slug).exists():
        _fail("slug", f"{slug!r} is taken")
    if bool(provers) == bool(country):
        _fail("provers", "name the provers, or a country whose chip holders are all targeted — one of the two")
    targets = list(Organisation.objects.filter(slug__in=provers))
    if len(targets) != len(set(provers)):
        _fail("provers", f"unknown: {sorted(set(provers) - {o.slug for o in targets})}")
    if not rule_flops > 0:
        _fail("rule_flops", "must be positive")
    if not 0 < detection_probability < 1:
        _fail("detection_probability", "must be between 0 and 1")
    if not 0 < period_days <= run_days:
        _fail("period_days", "must be positive and at most run_days")
    params = {
        "slug": slug, "provers": sorted(provers), "country": country, "rule_flops": rule_flops,
        "detection_probability": detection_probability, "snapshot_rate": snapshot_rate,
        "period_days": period_days, "run_days": run_days, "starts_on": starts_on.isoformat(),
        "ends_on": ends_on.isoformat() if ends_on else None,
    }
    entry = ledger.append_entry("campaign.created", params, actor)
    campaign = Campaign.objects.create(
        slug=slug, country=country, rule_flops=rule_flops, detection_probability=detection_probability,
        snapshot_rate=snapshot_rate, period_days=period_days, run_days=run_days, starts_on=starts_on,
        ends_on=ends_on, created_seq=entry.seq,
    )
    campaign.provers.set(targets)
    _commit_seed(campaign, campaign_period(campaign, timezone.now().date()) or 0, actor)
    return campaign


@transaction.atomic
def campaign_seed_commit(campaign: Campaign, period: int, actor: str = "regulator") -> CampaignSeed:
    if CampaignSeed.objects.filter(campaign=campaign, period=period).exists():
        _fail("period", f"period {period} already has a committed seed")
    return _commit_seed(campaign, period, actor)


def _commit_seed(campaign: Campaign, period: int, actor: str) -> CampaignSeed:
    seed = draws.new_seed()
    commitment = draws.commitment(seed)
    entry = ledger.append_entry(
        "campaign.seed_committed", {"campaign": campaign.slug, "period": period, "commitment": commitment}, actor
    )
    return CampaignSeed.objects.create(
        campaign=campaign, period=period, seed=seed, commitment=commitment, committed_seq=entry.seq
    )


def campaign_period(campaign: Campaign, on: date) -> int | None:
    if on < campaign.starts_on or (campaign.ends_on and on > campaign.ends_on):
        return None
    return (on - campaign.starts_on).days // campaign.period_days


@transaction.atomic
def campaign_draw(campaign: Campaign, period: int, actor: str = "regulator") -> Draw:
    """Draw the period's sample against a fresh checkpoint, reveal the seed, commit the next one."""
    seed = CampaignSeed.objects.select_for_update().filter(campaign=campaign, period=period).first()
    if seed is None:
        _fail("period", f"no seed was committed for period {period}")
    if Draw.objects.filter(campaign=campaign, period=period).exists():
        _fail("period", f"period {period} was already drawn")
    # Signed under the ledger lock, held to the end of this transaction: the registry read
    # below is exactly the ledger's first checkpoint.size entries, which the audit replays.
    checkpoint = ledger.checkpoint_sign()
    root = bytes(checkpoint.root)
    provers = {}
    for prover, holdings in _targets_and_holdings(campaign):
        provers[prover.slug] = prover_sample(campaign, prover.slug, holdings, bytes(seed.seed), root)
    today = timezone.now().date()
    assignments = assign(provers)
    payload = {
        "campaign": campaign.slug, "period": period, "seed": bytes(seed.seed).hex(),
        "checkpoint": {"size": checkpoint.size, "root": base64.b64encode(root).decode()},
        "provers": provers, "assignments": assignments,
    }
    entry = ledger.append_entry("campaign.drawn", payload, actor)
    draw = Draw.objects.create(
        campaign=campaign, period=period, checkpoint_size=checkpoint.size, checkpoint_root=root, drawn_seq=entry.seq,
        drawn_at=entry.time,
    )
    _create_tasks(draw, provers, assignments, today, entry.seq)
    _commit_seed(campaign, period + 1, actor)
    return draw


@dataclass(frozen=True)
class Holdings:
    """What a draw needs to know of a prover's chips: how many, the fastest model, and a way to rank them."""

    count: int
    peak_flops: float | None
    draw: Callable[[bytes, bytes, str, int], list[str]]  # (seed, root, campaign, k) -> the k lowest-ranked serials


def _targets_and_holdings(campaign: Campaign) -> list[tuple[Organisation, Holdings]]:
    """The campaign's provers with their chip counts and fastest model, in one grouped scan.

    A country campaign targets every owner of eligible chips located there (a country may
    hold 10^7 chips: one pass over them, not one per prover); the plan counts all the prover's chips.
    """
    eligible = Chip.objects.filter(status__in=ELIGIBLE)
    if campaign.country:
        rows = (eligible.values("owner").annotate(count=Count("id"), peak=Max("model__peak_flops_16bit"),
                                                  here=Count("id", filter=Q(country=campaign.country)))
                .filter(here__gt=0))
        provers = list(Organisation.objects.filter(pk__in=[row["owner"] for row in rows]).order_by("slug"))
    else:
        provers = list(campaign.provers.order_by("slug"))
        rows = (eligible.filter(owner__in=provers).values("owner")
                .annotate(count=Count("id"), peak=Max("model__peak_flops_16bit")))
    found = {row["owner"]: row for row in rows}

    def holdings(prover: Organisation) -> Holdings:
        row = found.get(prover.pk, {"count": 0, "peak": None})
        return Holdings(row["count"], row["peak"],
                        lambda seed, root, slug, k: _ranked_in_database(prover, seed, root, slug, k))

    return [(prover, holdings(prover)) for prover in provers]


def _ranked_in_database(prover: Organisation, seed: bytes, root: bytes, campaign: str, count: int) -> list[str]:
    """The draw's ranking, computed where the chips are.

    PostgreSQL computes the HMAC from its built-in SHA-256 (RFC 2104 pads from draws.hmac_pads)
    and keeps the top N, so ten million chips never leave the database; elsewhere the serials are
    streamed through draws.draw. Both give the same order: bytea sorts like Python bytes
    (tests/inspections/test_campaigns.py checks it on PostgreSQL).
    """
    if connection.vendor == "postgresql":
        inner, outer = draws.hmac_pads(seed)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT serial FROM registry_chip WHERE owner_id = %s AND status = ANY(%s) "
                "ORDER BY sha256(%s::bytea || sha256(%s::bytea || convert_to(serial, 'UTF8'))) LIMIT %s",
                [prover.pk, ELIGIBLE, outer, inner + draws.rank_prefix(root, campaign), count],
            )
            return [serial for (serial,) in cursor.fetchall()]
    serials = Chip.objects.filter(owner=prover, status__in=ELIGIBLE).values_list("serial", flat=True)
    return draws.draw(seed, root, campaign, serials.iterator(chunk_size=20_000), count)


def prover_sample(campaign, prover: str, holdings: Holdings, seed: bytes, root: bytes) -> dict:
    """Plan and draw for one prover; the same function recomputes it in the audit."""
    sample = {"chips": holdings.count, "chips_needed": None, "samples": 0, "drawn": []}
    if not holdings.count:
        return sample
    try:
        plan = sampling.plan(
            campaign.rule_flops, holdings.count, p=campaign.detection_probability,
            snapshot_rate=campaign.snapshot_rate, period_days=campaign.period_days, run_days=campaign.run_days,
            flops_per_chip_second=holdings.peak_flops or 1e15,
        )
    except sampling.PlanError as error:
        sample["plan_error"] = str(error)  # recorded on the ledger; the regulator sees it in the draw
        return sample
    sample["chips_needed"] = plan.chips_needed
    if plan.impossible:
        return sample  # the prover cannot run it: nothing to look for
    # The paper's plan samples with replacement and may ask for more than C: inspect them all.
    sample["samples"] = min(plan.samples_per_period, holdings.count)
    sample["drawn"] = sorted(holdings.draw(seed, root, campaign.slug, sample["samples"]))
    return sample


def assign(provers: dict) -> dict[str, str | None]:
    """serial -> inspection body: by the chip's country, to the body with most capacity left."""
    countries = dict(Chip.objects.filter(serial__in=[s for p in provers.values() for s in p["drawn"]])
                     .values_list("serial", "country"))
    bodies = list(InspectionBody.objects.select_related("organisation").order_by("organisation__slug"))
    left = {body.organisation.slug: body.capacity_per_period for body in bodies}
    serves = defaultdict(list)
    for body in bodies:
        for country in body.countries:
            serves[country].append(body.organisation.slug)
    assignments = {}
    for serial in sorted(countries):
        candidates = [slug for slug in serves.get(countries[serial], []) if left[slug] > 0]
        chosen = max(candidates, key=lambda slug: (left[slug], slug), default=None)
        if chosen:
            left[chosen] -= 1
        assignments[serial] = chosen
    return assignments


def _create_tasks(draw: Draw, provers: dict, assignments: dict, today: date, seq: int) -> None:
    chips = {chip.serial: chip for chip in Chip.objects.filter(serial__in=assignments)}
    orgs = {org.slug: org for org in Organisation.objects.all()}
    due = today + timedelta(days=TASK_DAYS)
    tasks = InspectionTask.objects.bulk_create([
        InspectionTask(draw=draw, chip=chips[serial], prover=orgs[prover], inspection_body=orgs.get(assignments[serial]),
                       due_on=due, assigned_seq=seq)
        for prover, sample in provers.items() for serial in sample["drawn"]
    ])
    for task in tasks:
        if task.inspection_body is None:
            alert_raise(Alert.Kind.UNASSIGNED, task.prover, f"no inspection body with capacity covers {task.chip.country} "
                        f"for {task.chip.serial}", task.chip, task)
    transaction.on_commit(lambda: _notify_inspectors(draw))


def _notify_inspectors(draw: Draw) -> None:
    """One email per inspection body member with the tasks assigned to the body (console backend by default)."""
    by_body = defaultdict(list)
    for task in draw.tasks.select_related("chip__facility", "inspection_body").exclude(inspection_body=None):
        by_body[task.inspection_body].append(task)
    for body, tasks in by_body.items():
        recipients = [m.user.email for m in body.members.select_related("user") if m.user.email]
        if recipients:
            lines = "\n".join(f"  {t.chip.serial} at {t.chip.facility.slug if t.chip.facility else 'no facility'}, "
                              f"due {t.due_on}" for t in tasks)
            send_mail(f"{len(tasks)} chip inspections assigned ({draw.campaign.slug}, period {draw.period})",
                      f"Inspections assigned to {body.slug}:\n{lines}\n", None, recipients)


# --- alerts ---------------------------------------------------------------------------


def alert_raise(kind: str, prover: Organisation, detail: str, chip: Chip | None = None,
                task: InspectionTask | None = None, actor: str = "system") -> Alert:
    payload = {"kind": kind, "prover": prover.slug, "chip": chip.serial if chip else None,
               "task": task.pk if task else None, "detail": detail}
    entry = ledger.append_entry("alert.raised", payload, actor)
    return Alert.objects.create(kind=kind, prover=prover, chip=chip, task=task, detail=detail, raised_seq=entry.seq,
                                raised_at=entry.time)


# --- the inspector's workflow ---------------------------------------------------------

CHALLENGE_SECONDS = 600
CLAIM_DAYS = 30  # the prover must answer a logged snapshot within this many days
MAX_LOG_BYTES = 5 * 2**20


def _own_task(task: InspectionTask, body: Organisation) -> None:
    if task.inspection_body_id != body.pk:
        raise InspectionTask.DoesNotExist  # another body's task does not exist for this one


@transaction.atomic
def task_accept(task: InspectionTask, body: Organisation) -> InspectionTask:
    _own_task(task, body)
    if task.status != InspectionTask.Status.ASSIGNED:
        _fail("status", f"a {task.status} task cannot be accepted")
    ledger.append_entry("inspection.accepted", {"task": task.pk, "chip": task.chip.serial}, body.slug)
    task.status = InspectionTask.Status.ACCEPTED
    task.save(update_fields=["status"])
    return task


def identity_message(serial: str, nonce: str) -> bytes:
    """What the chip signs: domain-separated, so no other signature of the chip key can pass."""
    return f"chipledger identity challenge v1\n{serial}\n{nonce}\n".encode()


@transaction.atomic
def identity_challenge_issue(task: InspectionTask, body: Organisation) -> IdentityChallenge:
    _own_task(task, body)
    now = timezone.now()
    return IdentityChallenge.objects.create(task=task, nonce=secrets.token_hex(32), issued_at=now,
                                            expires_at=now + timedelta(seconds=CHALLENGE_SECONDS))


@transaction.atomic
def identity_answer_check(task: InspectionTask, body: Organisation, nonce: str, signature: str) -> dict:
    """Verify the chip's answer against the key registered at fabrication; the outcome goes on the ledger.

    A wrong, replayed or expired answer is a failed identity check, never a pass.
    """
    _own_task(task, body)
    challenge = IdentityChallenge.objects.select_for_update().filter(task=task, nonce=nonce).first()
    reason = _identity_problem(task, challenge, signature)
    if challenge is not None:
        challenge.answered = True
        challenge.save(update_fields=["answered"])
    outcome = {"task": task.pk, "chip": task.chip.serial, "nonce": nonce, "passed": reason is None, "reason": reason}
    ledger.append_entry("inspection.identity_checked", outcome, body.slug)
    if reason is not None:
        alert_raise(Alert.Kind.IDENTITY_FAILED, task.prover, f"{task.chip.serial}: {reason}", task.chip, task)
    return outcome


def _identity_problem(task: InspectionTask, challenge: IdentityChallenge | None, signature: str) -> str | None:
    if challenge is None:
        return "no such challenge was issued for this task"
    if challenge.answered:
        return "the challenge was already answered (replayed)"
    if timezone.now() > challenge.expires_at:
        return "the challenge expired"
    try:
        VerifyKey(bytes(task.chip.public_key)).verify(
            identity_message(task.chip.serial, challenge.nonce), base64.b64decode(signature, validate=True)
        )
    except (BadSignatureError, ValueError, TypeError):
        return "the signature does not verify under the chip's registered key"
    return None


@transaction.atomic
def snapshot_log_upload(task: InspectionTask, body: Organisation, text: str) -> SnapshotLog:
    """Store the log; a Celery task checks it after commit (the checker lives in replay)."""
    _own_task(task, body)
    if len(text.encode()) > MAX_LOG_BYTES:
        _fail("log", f"at most {MAX_LOG_BYTES} bytes")
    if not text.strip():
        _fail("log", "is empty")
    log = SnapshotLog.objects.create(task=task, text=text, sha256=hashlib.sha256(text.encode()).hexdigest())
    from .tasks import check_snapshot_log  # the task module imports this one

    transaction.on_commit(lambda: check_snapshot_log.delay(log.pk))
    return log


@transaction.atomic
def snapshot_log_record(log: SnapshotLog, problems: list[dict], records: list[dict]) -> SnapshotLog:
    """Record the checker's verdict on the ledger; keep the authentic snapshots for the prover's claims."""
    log = SnapshotLog.objects.select_for_update().select_related("task__chip", "task__prover").get(pk=log.pk)
    if log.status != SnapshotLog.Status.PENDING:
        return log  # a retried task records nothing twice
    task, chip = log.task, log.task.chip
    entry = ledger.append_entry("inspection.snapshot_log", {
        "task": task.pk, "chip": chip.serial, "log_sha256": log.sha256, "problems": problems,
        "snapshots": [{k: r[k] for k in ("counter", "time", "shard", "hash")} for r in records],
    }, task.inspection_body.slug if task.inspection_body else "system")
    due = timezone.now().date() + timedelta(days=CLAIM_DAYS)
    Snapshot.objects.bulk_create([
        Snapshot(chip=chip, log=log, counter=r["counter"], time=r["time"], shard=r["shard"], hash=r["hash"], claim_due_on=due)
        for r in records
    ], ignore_conflicts=True)
    log.status = SnapshotLog.Status.PROBLEMS if problems else SnapshotLog.Status.INTACT
    log.problems, log.checked_seq = problems, entry.seq
    log.save(update_fields=["status", "problems", "checked_seq"])
    if problems:
        summary = "; ".join(f"line {p['line']}: {p['kind']} ({p['detail']})" for p in problems[:5])
        alert_raise(Alert.Kind.LOG_PROBLEMS, task.prover, f"{chip.serial}: {summary}", chip, task)
    return log


FINDING_FIELDS = {"chip_found": bool, "owner_refused": bool, "seal_intact": bool, "tamper_evidence": bool,
                  "location_matches": bool, "notes": str}


@transaction.atomic
def finding_submit(task: InspectionTask, body: Organisation, data: dict) -> Finding:
    _own_task(task, body)
    if task.status not in (InspectionTask.Status.ACCEPTED, InspectionTask.Status.OVERDUE):
        _fail("status", f"a {task.status} task takes no finding (accept it first)")
    finding = _finding_fields(data)
    entry = ledger.append_entry("inspection.finding", {"task": task.pk, "chip": task.chip.serial, **finding}, body.slug)
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
    if not isinstance(hashes, list) or not all(isinstance(h, str) and len(h) == 64 for h in hashes):
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
                slug=f"unscheduled-{prover.slug}-{finding.recorded_seq}", provers=[prover.slug],
                rule_flops=campaign.rule_flops, starts_on=timezone.now().date(),
                detection_probability=campaign.detection_probability, snapshot_rate=campaign.snapshot_rate,
                period_days=campaign.period_days, run_days=campaign.run_days, actor="system",
            )


# --- sweeps (beat) --------------------------------------------------------------------


@transaction.atomic
def overdue_sweep(today: date) -> int:
    late = InspectionTask.objects.select_for_update().filter(
        due_on__lt=today, status__in=[InspectionTask.Status.ASSIGNED, InspectionTask.Status.ACCEPTED]
    ).select_related("chip", "prover")
    count = 0
    for task in late:
        task.status = InspectionTask.Status.OVERDUE
        task.save(update_fields=["status"])
        alert_raise(Alert.Kind.OVERDUE, task.prover, f"inspection of {task.chip.serial} was due {task.due_on}", task.chip, task)
        count += 1
    return count


@transaction.atomic
def lost_chip_sweep() -> int:
    """Chips reported lost or stolen get one alert each against their owner."""
    alerted = Alert.objects.filter(kind=Alert.Kind.LOST).values("chip")
    missing = Chip.objects.filter(status__in=[Status.LOST, Status.STOLEN]).exclude(pk__in=alerted).select_related("owner")
    count = 0
    for chip in missing:
        alert_raise(Alert.Kind.LOST, chip.owner, f"{chip.serial} was reported {chip.status}", chip)
        count += 1
    return count


# --- the prover's claims and their verification ---------------------------------------

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
            snapshot = (Snapshot.objects.select_related("chip__owner").filter(
                chip__serial=clean["serial"], counter=clean["counter"]).first())
            if snapshot is None or snapshot.chip.owner_id != prover.pk:
                raise ValidationError("no logged snapshot of your chip with this serial and counter")
            if Claim.objects.filter(snapshot=snapshot).exists():
                raise ValidationError("this snapshot was already answered")
        except ValidationError as error:
            errors[f"claims[{position}]"] = error.messages
            continue
        items.append(clean)
        snapshots.append(snapshot)
    if errors:
        raise ValidationError(errors)
    entry = ledger.append_entry("claim.submitted", {"claims": items}, prover.slug, submission)
    rows = Claim.objects.bulk_create([
        Claim(snapshot=snapshot, prover=prover, run=item["run"], step=item["step"], manifest=item["manifest"],
              location=item["location"], claimed_seq=entry.seq)
        for item, snapshot in zip(items, snapshots)
    ])
    from .tasks import verify_claim  # the task module imports this one

    for row in rows:
        transaction.on_commit(lambda pk=row.pk: verify_claim.delay(pk))
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
    summary = {"verdict": verdict.get("verdict"), "reasons": verdict.get("reasons", [])[:20],
               "flops": verdict.get("flops"), "steps": verdict.get("steps"), "rules": verdict.get("rules")} \
        if verdict else {"error": error}
    entry = ledger.append_entry("claim.verified", {
        "claim": claim.pk, "chip": claim.snapshot.chip.serial, "counter": claim.snapshot.counter,
        "result": result, "mismatch_step": step, **summary,
    }, "system")
    claim.result, claim.mismatch_step, claim.report, claim.result_seq = result, step, summary, entry.seq
    claim.save(update_fields=["result", "mismatch_step", "report", "result_seq"])
    if result != Claim.Result.VERIFIED:
        detail = f"claim for {claim.snapshot.chip.serial} #{claim.snapshot.counter}: {result}"
        alert_raise(Alert.Kind.CLAIM_FAILED, claim.prover, detail + (f" at step {step}" if step is not None else ""),
                    claim.snapshot.chip)
    return claim


@transaction.atomic
def unanswered_sweep(today: date) -> int:
    """Snapshots past their claim deadline with no claim: one alert each."""
    alerted = Alert.objects.filter(kind=Alert.Kind.UNANSWERED).values_list("detail", flat=True)
    count = 0
    for snapshot in Snapshot.objects.filter(claim_due_on__lt=today, claim__isnull=True).select_related("chip__owner"):
        detail = f"snapshot {snapshot.chip.serial} #{snapshot.counter} ({snapshot.hash[:16]}…) was not answered"
        if detail not in alerted:
            alert_raise(Alert.Kind.UNANSWERED, snapshot.chip.owner, detail, snapshot.chip)
            count += 1
    return count
