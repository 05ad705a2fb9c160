"""Long work started from the admin: recorded as a ``Job``, run by a Celery worker, progress on the row."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.utils import timezone

from inspections.models import Claim, Draw
from inspections.queue import enqueue_after_commit
from inspections.services.claims import claim_reverify
from inspections.stored_draw_audit import audit_draw
from ledger.integrity import verify_stored_ledger
from ledger.selectors import ledger_size
from tlog.chain import LedgerFault

from ..models import Job

RUN_JOB = "desk.tasks.run_job"  # by name: desk.tasks imports this module, not the other way round


def job_start(kind: str, params: dict, by: str) -> Job:
    """Record the job and hand it to a worker once the row is committed."""
    if kind not in Job.Kind.values:
        raise ValidationError({"kind": f"must be one of {Job.Kind.values}"})
    if kind == Job.Kind.DRAW_AUDIT and not Draw.objects.filter(pk=params.get("draw")).exists():
        raise ValidationError({"draw": "no such draw"})
    if kind == Job.Kind.CLAIM_REVERIFY and not Claim.objects.filter(pk=params.get("claim")).exists():
        raise ValidationError({"claim": "no such claim"})
    job = Job.objects.create(kind=kind, params=params, started_by=by)
    enqueue_after_commit(RUN_JOB, job.pk, queue=settings.DESK_JOB_QUEUE, on_failure=lambda error: _unqueued(job, error))
    return job


def integrity_sweep_scheduled() -> Job | None:
    """Beat's sweep: a new integrity sweep job, or None while one is queued or running (sweeps never pile up
    behind a slow worker; the jobs sweep fails one no worker finished, so a lost one does not block the next)."""
    busy = Job.objects.filter(kind=Job.Kind.INTEGRITY_SWEEP, state__in=[Job.State.QUEUED, Job.State.RUNNING])
    if busy.exists():
        return None
    return job_start(Job.Kind.INTEGRITY_SWEEP, {}, "beat (scheduled)")


def _unqueued(job: Job, error: Exception) -> None:
    """A broker that refuses the job fails it with the reason (never a 500, never a job queued for ever)."""
    reason = f"could not be queued (the broker is unreachable: {type(error).__name__}: {error}); start it again"
    Job.objects.filter(pk=job.pk).update(state=Job.State.FAILED, message=reason[:255], finished_at=timezone.now())


def jobs_sweep(now=None) -> list[int]:
    """Fail every queued or running job older than ``DESK_JOB_DEADLINE``: its worker died or its message was lost."""
    now = now or timezone.now()
    late = Job.objects.filter(
        state__in=(Job.State.QUEUED, Job.State.RUNNING),
        created_at__lt=now - timedelta(seconds=settings.DESK_JOB_DEADLINE),
    )
    ids = list(late.values_list("pk", flat=True))
    reason = (
        f"no worker finished it within {settings.DESK_JOB_DEADLINE} s (worker killed or message lost); start it again"
    )
    Job.objects.filter(pk__in=ids, state__in=(Job.State.QUEUED, Job.State.RUNNING)).update(
        state=Job.State.FAILED, message=reason[:255], finished_at=now
    )
    return ids


def _progress(job: Job, progress: float, message: str) -> None:
    Job.objects.filter(pk=job.pk).update(progress=min(max(progress, 0.0), 1.0), message=message[:255])


def job_run(job_id: int) -> str:
    """Run a queued job to its end; its outcome (or the error) is kept on the row."""
    job = Job.objects.get(pk=job_id)
    if job.state in (Job.State.DONE, Job.State.FAILED):
        return job.state  # a redelivered message (acks_late) does not run it twice
    Job.objects.filter(pk=job.pk).update(state=Job.State.RUNNING, message="started")
    try:
        result = RUNNERS[job.kind](job)
    except Exception as error:  # the job's failure is its result; the worker stays up
        Job.objects.filter(pk=job.pk).update(
            state=Job.State.FAILED, message=f"{type(error).__name__}: {error}"[:255], finished_at=timezone.now()
        )
        return Job.State.FAILED
    Job.objects.filter(pk=job.pk).update(
        state=Job.State.DONE,
        progress=1.0,
        result=result,
        message=result.get("summary", "")[:255],
        finished_at=timezone.now(),
    )
    return Job.State.DONE


def _draw_audit(job: Job) -> dict:
    draw = Draw.objects.select_related("campaign").get(pk=job.params["draw"])
    _progress(job, 0.1, f"replaying the ledger up to the draw of {draw.campaign.slug} period {draw.period}")
    audit = audit_draw(draw.campaign.slug, draw.period)
    summary = "the draw matches its recomputation from the ledger" if audit.matches else "; ".join(audit.problems)
    return {"matches": audit.matches, "problems": audit.problems, "provers": audit.provers, "summary": summary}


def _integrity_sweep(job: Job) -> dict:
    total = max(ledger_size(), 1)
    try:
        report = verify_stored_ledger(progress=lambda done: _progress(job, done / total, f"{done:,} entries checked"))
    except LedgerFault as fault:
        return {"intact": False, "seq": fault.seq, "summary": f"ledger fault at seq {fault.seq}: {fault}"}
    return {
        "intact": True,
        "entries": report.entries,
        "root": report.root.hex(),
        "checkpoints": report.checkpoints,
        "summary": f"OK entries={report.entries} root={report.root.hex()}",
    }


def _claim_reverify(job: Job) -> dict:
    _progress(job, 0.1, f"replaying the transcript of claim {job.params['claim']}")
    outcome = claim_reverify(job.params["claim"])
    if outcome["recorded"]:
        summary = f"verified again: {outcome['result']}, recorded on the ledger (entry #{outcome['result_seq']})"
    elif outcome.get("agrees") is None:
        summary = f"not recorded: {outcome['result']} ({'; '.join(outcome['reasons'])[:150]})"
    else:
        agrees = "agrees with" if outcome["agrees"] else "DIFFERS from"
        summary = f"replayed again: {outcome['result']}, {agrees} the recorded {outcome['recorded_result']}"
    return {**outcome, "summary": summary}


RUNNERS = {
    Job.Kind.DRAW_AUDIT: _draw_audit,
    Job.Kind.INTEGRITY_SWEEP: _integrity_sweep,
    Job.Kind.CLAIM_REVERIFY: _claim_reverify,
}
