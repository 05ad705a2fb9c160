"""Celery tasks of the desk: thin wrappers over its services."""

from celery import shared_task

from .services import charts, figures, jobs


@shared_task(name="desk.tasks.run_job", acks_late=True)
def run_job(job_id: int) -> str:
    return jobs.job_run(job_id)


@shared_task(name="desk.tasks.sweep_jobs")
def sweep_jobs() -> list[int]:
    """Beat: fail the jobs no worker finished by their deadline."""
    return jobs.jobs_sweep()


@shared_task(name="desk.tasks.refresh_figures")
def refresh_figures() -> list[str]:
    """Beat: recompute the dashboard's aggregates over the big tables, then draw its plots."""
    return [*figures.figures_refresh(), charts.charts_refresh()]


@shared_task(name="desk.tasks.sweep_integrity")
def sweep_integrity() -> int | None:
    """Beat: start a full integrity sweep (a desk job, shown in the header's badge) unless one is under way."""
    job = jobs.integrity_sweep_scheduled()
    return job.pk if job else None
