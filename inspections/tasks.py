"""Celery tasks of the inspections app: thin wrappers over services."""
import json
import resource
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from . import services, transcripts
from .models import Campaign, CampaignSeed, Claim, Draw, SnapshotLog


@shared_task(name="inspections.tasks.draw_due_campaigns")
def draw_due_campaigns() -> list[str]:
    """Beat: draw every active campaign whose current period has not been drawn yet.

    A period whose seed was never committed (the service was down through a whole
    period) gets its commitment now and is drawn on the next run, never in the same one.
    """
    today = timezone.now().date()
    done = []
    for campaign in Campaign.objects.order_by("slug"):
        period = services.campaign_period(campaign, today)
        if period is None or Draw.objects.filter(campaign=campaign, period=period).exists():
            continue
        if not CampaignSeed.objects.filter(campaign=campaign, period=period).exists():
            services.campaign_seed_commit(campaign, period)
            continue
        services.campaign_draw(campaign, period)
        done.append(f"{campaign.slug}:{period}")
    return done


@shared_task(name="inspections.tasks.check_snapshot_log", acks_late=True)
def check_snapshot_log(log_id: int) -> str:
    """Check an uploaded firmware log with replay's pure checker; the verdict lands on the ledger."""
    from replay.firmware import parse_record, verify_log  # replay only in tasks (DESIGN §2)

    log = SnapshotLog.objects.select_related("task__chip").get(pk=log_id)
    chip = log.task.chip
    lines = [line for line in log.text.splitlines() if line.strip()]
    problems = verify_log(lines, bytes(chip.public_key), serial=chip.serial)
    flagged = {p["line"] for p in problems if p["kind"] in ("malformed", "forged")}
    records = [parse_record(line) for n, line in enumerate(lines) if n not in flagged]
    return services.snapshot_log_record(log, problems, records).status


@shared_task(name="inspections.tasks.sweep")
def sweep() -> dict:
    """Beat: overdue inspections and lost chips become alerts."""
    today = timezone.now().date()
    return {"overdue": services.overdue_sweep(today), "lost": services.lost_chip_sweep(),
            "unanswered": services.unanswered_sweep(today)}


@shared_task(name="inspections.tasks.verify_claim", acks_late=True)
def verify_claim(claim_id: int) -> str:
    """Replay the prover's transcript for one claim, in a bounded subprocess; the result lands on the ledger.

    The verifier runs as ``python -m replay verify`` with a wall-clock and address-space limit, so a
    hostile transcript can make it fail but never hang or exhaust the worker. Idempotent.
    """
    claim = Claim.objects.select_related("snapshot__chip").get(pk=claim_id)
    if claim.result != Claim.Result.PENDING:
        return claim.result
    with tempfile.TemporaryDirectory(prefix="claim-") as scratch:
        try:
            verdict, error = _run_verifier(claim, Path(scratch)), None
        except transcripts.TranscriptUnavailable as unavailable:
            verdict, error = None, str(unavailable)
        except subprocess.TimeoutExpired:
            verdict, error = None, "timeout"
    return services.claim_result_record(claim.pk, verdict, error).result


def _run_verifier(claim, scratch: Path) -> dict:
    if claim.location.startswith(("http://", "https://")):
        directory = transcripts.download(claim.location, scratch / "transcript")
    else:
        directory = transcripts.local_directory(claim.location)
    snapshot = claim.snapshot
    claims_file = scratch / "claims.json"
    claims_file.write_text(json.dumps({"manifest": claim.manifest, "claims": [{
        "serial": snapshot.chip.serial, "counter": snapshot.counter, "shard": snapshot.shard, "hash": snapshot.hash,
        "step": claim.step}]}))
    command = [sys.executable, "-m", "replay", "verify", str(directory), "--claims", str(claims_file), "--json",
               "--nonce", secrets.token_hex(16), "--max-seconds", str(settings.REPLAY_MAX_SECONDS),
               "--max-flops", repr(_rule_flops(snapshot.chip))]
    done = subprocess.run(command, capture_output=True, text=True, cwd=settings.BASE_DIR,
                          timeout=settings.REPLAY_MAX_SECONDS + 60, preexec_fn=_limit_memory)
    try:
        return json.loads(done.stdout)
    except ValueError:
        return {"verdict": "malformed", "reasons": [f"the verifier failed: {done.stderr[-500:]}"]}


def _rule_flops(chip) -> float:
    """The strictest rule of any campaign that drew this chip (what the claim is checked against)."""
    rules = Campaign.objects.filter(draws__tasks__chip=chip).values_list("rule_flops", flat=True)
    return min(rules, default=float("inf"))


def _limit_memory() -> None:
    limit = settings.REPLAY_MAX_MEMORY_BYTES
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
