"""The desk's own tables: an index of ledger entries by what they concern, counters, cached figures, jobs.

``EntrySubject`` and ``KindDay`` are derived from the ledger (written in the append's transaction by
``services.index``, rebuilt by ``rebuild_projections --reindex``); ``Figure`` is a cache with a
stated age; ``Job`` records long work started from the admin and its result.
"""

from django.db import models


class EntrySubject(models.Model):
    """A ledger entry concerns an organisation (``org:<slug>``), an inspection task (``task:<pk>``) or a campaign
    (``campaign:<slug>``): the index behind "entries about X" and the task and draw pages."""

    subject = models.CharField(max_length=80)
    seq = models.BigIntegerField()
    kind = models.CharField(max_length=64)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["subject", "seq"], name="one_subject_row_per_entry")]

    def __str__(self) -> str:
        return f"{self.subject} @ #{self.seq}"


class KindDay(models.Model):
    """How many entries of a kind were appended on a day (UTC): the dashboard's time series."""

    day = models.DateField()
    kind = models.CharField(max_length=64)
    count = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["day", "kind"], name="one_count_per_day_and_kind")]


class Figure(models.Model):
    """A dashboard aggregate over large projections, recomputed by a beat task (never per request)."""

    name = models.CharField(max_length=64, unique=True)
    data = models.JSONField()
    computed_at = models.DateTimeField()

    def __str__(self) -> str:
        return self.name


class Job(models.Model):
    """Long work started from the admin (draw audit, integrity sweep, claim re-verification) run by Celery, with progress and result."""

    class Kind(models.TextChoices):
        DRAW_AUDIT = "draw_audit", "draw audit"
        INTEGRITY_SWEEP = "integrity_sweep", "ledger integrity sweep"
        CLAIM_REVERIFY = "claim_reverify", "claim re-verification"

    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    kind = models.CharField(max_length=32, choices=Kind.choices)
    params = models.JSONField(default=dict)
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED)
    progress = models.FloatField(default=0.0, help_text="0 to 1")
    message = models.CharField(max_length=255, blank=True)
    result = models.JSONField(default=dict)
    started_by = models.CharField(max_length=150)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["kind", "-created_at"], name="job_kind_recent")]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} #{self.pk} ({self.state})"

    @property
    def title(self) -> str:
        """As a person reads it: "Ledger integrity sweep #4, done 2026-11-25 16:40 UTC" (no stale state)."""
        return f"{self.get_kind_display().capitalize()} #{self.pk}"


class Heartbeat(models.Model):
    """When a periodic (beat) task last ran to its end on a worker: /healthz says which ones are stale."""

    task = models.CharField(max_length=128, unique=True)
    last_run_at = models.DateTimeField()
    last_state = models.CharField(max_length=16, help_text="SUCCESS or FAILURE of the last run")

    def __str__(self) -> str:
        return f"{self.task} at {self.last_run_at:%Y-%m-%d %H:%M:%S}"
