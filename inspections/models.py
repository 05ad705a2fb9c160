"""Inspections: campaigns, their seeds and draws, and the inspection tasks they create.

Projections of ledger entries (``*_seq`` fields point at them), written only by
``inspections.services`` — except ``CampaignSeed``, the regulator's secret
until the draw reveals it on the ledger: no API or admin page shows it.
"""

from django.db import models
from django.utils import timezone

from registry.models import Chip, Organisation


class Campaign(models.Model):
    """A regulator's standing order to sample provers' chips against one rule (docs/draws.md)."""

    slug = models.SlugField(max_length=64, unique=True)
    provers = models.ManyToManyField(Organisation, blank=True, related_name="campaigns")
    country = models.CharField(max_length=2, blank=True, help_text="or: every holder of chips in this country")
    rule_flops = models.FloatField(help_text="H: the training compute the rule forbids")
    detection_probability = models.FloatField(default=0.9)
    snapshot_rate = models.FloatField(default=0.1, help_text="f: snapshots per chip per day")
    period_days = models.PositiveIntegerField(default=30)
    run_days = models.PositiveIntegerField(default=365)
    starts_on = models.DateField()
    ends_on = models.DateField(null=True, blank=True)
    model = models.CharField(
        max_length=8,
        choices=[("paper", "paper (with replacement)"), ("exact", "exact (without replacement)")],
        default="paper",
        help_text="the sampling model that sets each period's sample size",
    )
    holders = models.CharField(
        max_length=8, blank=True, default="", help_text='"owners": a country campaign targets owners/operators only'
    )
    created_seq = models.BigIntegerField()
    amended_seq = models.BigIntegerField(null=True, blank=True, help_text="the campaign.amended entry in force")
    stopped_seq = models.BigIntegerField(null=True, blank=True, help_text="the campaign.stopped entry")

    def __str__(self) -> str:
        return self.slug


class CampaignSeed(models.Model):
    """The secret seed of one period's draw. Its hash is on the ledger from the start."""

    campaign = models.ForeignKey(Campaign, on_delete=models.PROTECT, related_name="seeds")
    period = models.PositiveIntegerField()
    seed = models.BinaryField(max_length=32)
    commitment = models.CharField(max_length=64)
    committed_seq = models.BigIntegerField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["campaign", "period"], name="one_seed_per_period")]


class Draw(models.Model):
    campaign = models.ForeignKey(Campaign, on_delete=models.PROTECT, related_name="draws")
    period = models.PositiveIntegerField()
    checkpoint_size = models.BigIntegerField()
    checkpoint_root = models.BinaryField(max_length=32)
    drawn_seq = models.BigIntegerField()
    drawn_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["campaign", "period"], name="one_draw_per_period")]

    def __str__(self) -> str:
        return f"{self.campaign.slug} period {self.period}"


class InspectionTask(models.Model):
    class Status(models.TextChoices):
        ASSIGNED = "assigned"
        ACCEPTED = "accepted"
        DONE = "done"
        OVERDUE = "overdue"

    draw = models.ForeignKey(Draw, on_delete=models.PROTECT, related_name="tasks")
    chip = models.ForeignKey(Chip, on_delete=models.PROTECT, related_name="inspection_tasks")
    prover = models.ForeignKey(Organisation, on_delete=models.PROTECT, related_name="inspections_faced")
    inspection_body = models.ForeignKey(
        Organisation, null=True, blank=True, on_delete=models.PROTECT, related_name="inspection_tasks"
    )
    due_on = models.DateField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ASSIGNED)
    assigned_seq = models.BigIntegerField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["draw", "chip"], name="one_task_per_chip_and_draw")]

    def __str__(self) -> str:
        return f"inspect {self.chip.serial} (due {self.due_on})"


class InspectionBody(models.Model):
    """Where an inspection body works and how many chips it can inspect per period (``inspection_body.registered``)."""

    organisation = models.OneToOneField(Organisation, on_delete=models.PROTECT, related_name="inspection_profile")
    countries = models.JSONField(default=list, help_text="ISO 3166-1 alpha-2 codes it covers")
    capacity_per_period = models.PositiveIntegerField(default=100)
    registered_seq = models.BigIntegerField(null=True, blank=True, help_text="its latest registration's entry")

    class Meta:
        verbose_name_plural = "inspection bodies"

    def __str__(self) -> str:
        return self.organisation.slug


class Alert(models.Model):
    """Something the regulator must look at; raised on the ledger (``alert.raised``)."""

    class Kind(models.TextChoices):
        OVERDUE = "overdue"
        NOT_FOUND = "not_found"
        REFUSED = "refused"
        LOST = "lost"
        IDENTITY_FAILED = "identity_failed"
        LOG_PROBLEMS = "log_problems"
        UNASSIGNED = "unassigned"
        UNANSWERED = "unanswered"
        CLAIM_FAILED = "claim_failed"
        VERIFIER_FAILED = "verifier_failed"
        DIVERTED = "diverted"  # chips received in another country than they were consigned to
        LIFECYCLE = "lifecycle"  # chips decommissioned or destroyed: the regulator checks reason and evidence
        UNRECORDED_USE = "unrecorded_use", "chip used off the record"
        DRAW_FAILED = "draw_failed", "campaign draw failed"
        CLOCK_AHEAD = "clock_ahead", "chip clock ahead"  # snapshots signed after they were read: a clock, no forgery

    kind = models.CharField(max_length=32, choices=Kind.choices)
    prover = models.ForeignKey(Organisation, on_delete=models.PROTECT, related_name="alerts")
    chip = models.ForeignKey(Chip, null=True, blank=True, on_delete=models.PROTECT, related_name="alerts")
    task = models.ForeignKey(InspectionTask, null=True, blank=True, on_delete=models.PROTECT, related_name="alerts")

    class State(models.TextChoices):
        OPEN = "open"
        ACKNOWLEDGED = "acknowledged"
        INVESTIGATING = "investigating", "under investigation"
        RESOLVED = "resolved"
        DISMISSED = "dismissed"
        FALSE_POSITIVE = "false_positive", "false positive"
        SUPERSEDED = "superseded"

    detail = models.TextField()
    raised_seq = models.BigIntegerField()
    raised_at = models.DateTimeField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.OPEN)
    assignee = models.CharField(max_length=150, blank=True, help_text="username of the regulator staff member on it")
    updated_seq = models.BigIntegerField(null=True, blank=True, help_text="the last alert.updated entry")

    class Meta:
        ordering = ["-raised_seq"]
        indexes = [models.Index(fields=["state", "-raised_seq"], name="alert_state_recent")]

    def __str__(self) -> str:
        return f"{self.get_kind_display()}: {self.prover.slug} (#{self.raised_seq}, {self.state})"


class AlertAction(models.Model):
    """One triage step on an alert (``alert.updated``): who did what and why, in ledger order."""

    alert = models.ForeignKey(Alert, on_delete=models.PROTECT, related_name="actions")
    action = models.CharField(max_length=16)
    by = models.CharField(max_length=150)
    reason = models.TextField(blank=True)
    assignee = models.CharField(max_length=150, blank=True)
    state = models.CharField(max_length=16, choices=Alert.State.choices)
    seq = models.BigIntegerField(unique=True)
    at = models.DateTimeField()

    class Meta:
        ordering = ["seq"]

    def __str__(self) -> str:
        return f"{self.action} by {self.by} (#{self.seq})"


class IdentityChallenge(models.Model):
    """A fresh nonce the chip must sign with its fabrication key. Used once, and only briefly valid."""

    task = models.ForeignKey(InspectionTask, on_delete=models.PROTECT, related_name="challenges")
    nonce = models.CharField(max_length=64, unique=True)
    issued_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    answered = models.BooleanField(default=False)


class IdentityCheck(models.Model):
    """The outcome of one identity check (``inspection.identity_checked``), projected so the portal and the desk read
    a task's checks by task instead of scanning the ledger for the kind. Rebuilt from the ledger."""

    task = models.ForeignKey(InspectionTask, on_delete=models.PROTECT, related_name="identity_checks")
    seq = models.BigIntegerField(unique=True)
    checked_at = models.DateTimeField()
    passed = models.BooleanField()
    reason = models.TextField(null=True, blank=True)

    def __str__(self) -> str:
        return f"identity check #{self.seq} ({'passed' if self.passed else 'failed'})"


class SnapshotLog(models.Model):
    """A chip's firmware log as the inspector uploaded it; checked by a Celery task."""

    class Status(models.TextChoices):
        PENDING = "pending"
        INTACT = "intact"
        PROBLEMS = "problems"

    task = models.ForeignKey(InspectionTask, on_delete=models.PROTECT, related_name="snapshot_logs")
    text = models.TextField()
    sha256 = models.CharField(max_length=64)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    problems = models.JSONField(default=list)
    checked_seq = models.BigIntegerField(null=True, blank=True)
    uploaded_at = models.DateTimeField(auto_now_add=True)
    queued_at = models.DateTimeField(default=timezone.now, help_text="last sent to the worker (the pending sweep)")
    attempts = models.PositiveSmallIntegerField(default=0, help_text="times a worker started on it")

    def __str__(self) -> str:
        return f"log {self.sha256[:12]} ({self.status})"


class Snapshot(models.Model):
    """An authentic snapshot hash read off a chip: the prover must answer it with a claim."""

    chip = models.ForeignKey(Chip, on_delete=models.PROTECT, related_name="snapshots")
    log = models.ForeignKey(SnapshotLog, on_delete=models.PROTECT, related_name="snapshots")
    counter = models.BigIntegerField()
    time = models.CharField(max_length=40)
    shard = models.PositiveIntegerField()
    hash = models.CharField(max_length=64)
    claim_due_on = models.DateField()
    work = models.JSONField(
        null=True,
        blank=True,
        help_text="the firmware's signed work counters {busy_ns, flops} (decimal strings), when it counts",
    )

    class Meta:
        constraints = [models.UniqueConstraint(fields=["chip", "counter"], name="one_snapshot_per_chip_counter")]

    def __str__(self) -> str:
        return f"{self.chip.serial} snapshot {self.counter}"


class Finding(models.Model):
    """What the inspector found at the chip (recorded on the ledger as ``inspection.finding``)."""

    task = models.OneToOneField(InspectionTask, on_delete=models.PROTECT, related_name="finding")
    chip_found = models.BooleanField()
    owner_refused = models.BooleanField(default=False)
    seal_intact = models.BooleanField(null=True)
    tamper_evidence = models.BooleanField(null=True)
    location_matches = models.BooleanField(null=True)
    photo_hashes = models.JSONField(default=list)
    notes = models.TextField(blank=True)
    recorded_seq = models.BigIntegerField()

    def __str__(self) -> str:
        return f"finding on {self.task.chip.serial} (#{self.recorded_seq})"


class Claim(models.Model):
    """The prover's answer to a logged snapshot: which run and step produced it, and where its transcript is.

    The transcript stays on the prover's side; only its location and manifest hash are kept here.
    """

    class Result(models.TextChoices):
        PENDING = "pending"
        VERIFIED = "verified"
        MISMATCH = "mismatch"
        RULE_VIOLATED = "rule_violated"
        MALFORMED = "malformed"
        TIMED_OUT = "timed_out"  # legacy: a spent replay budget is now retried (incomplete), never final
        UNAVAILABLE = "unavailable"  # the prover's material could not be copied as committed, within bounded retries
        ERROR = "error"  # the verifier itself failed (never the prover's fault): retried, not final

    FINAL = (
        Result.VERIFIED,
        Result.MISMATCH,
        Result.RULE_VIOLATED,
        Result.MALFORMED,
        Result.TIMED_OUT,
        Result.UNAVAILABLE,
    )

    snapshot = models.OneToOneField(Snapshot, on_delete=models.PROTECT, related_name="claim")
    prover = models.ForeignKey(Organisation, on_delete=models.PROTECT, related_name="claims")
    run = models.CharField(max_length=128)
    step = models.PositiveBigIntegerField()
    manifest = models.CharField(max_length=64, help_text="hex SHA-256 of the transcript's manifest")
    location = models.CharField(max_length=1024, help_text="a path under an allowed root, or an http(s) URL")
    claimed_seq = models.BigIntegerField()
    result = models.CharField(max_length=16, choices=Result.choices, default=Result.PENDING)
    mismatch_step = models.BigIntegerField(null=True, blank=True)
    report = models.JSONField(default=dict)
    result_seq = models.BigIntegerField(null=True, blank=True)
    failures = models.PositiveSmallIntegerField(default=0, help_text="verifier runs that failed (result error)")
    retry_at = models.DateTimeField(null=True, blank=True, help_text="when an errored claim is verified again")
    queued_at = models.DateTimeField(default=timezone.now, help_text="last sent to the worker (the pending sweep)")
    attempts = models.PositiveSmallIntegerField(default=0, help_text="times a worker started on it")
    nonce = models.CharField(
        max_length=32,
        blank=True,
        default="",
        help_text="the claim's one verifier nonce: drawn after its material was copied, reused on every retry",
    )
    material = models.CharField(
        max_length=64, blank=True, default="", help_text="the claim's copy of the prover's material (a folder name)"
    )
    copy_failures = models.PositiveSmallIntegerField(
        default=0, help_text="attempts to copy the prover's material that failed (the prover's share)"
    )
    reverify_nonce = models.CharField(
        max_length=32,
        blank=True,
        default="",
        help_text="the next coverage re-verification's nonce: fresh, committed on the ledger before it runs "
        "(claim.reverification_drawn), reused on retries, revealed and cleared when one is recorded",
    )
    coverage_stalled_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="when a coverage re-verification of this claim last drew nothing new: its own replays filled the "
        "budget (REPLAY_MAX_SECONDS). The beat waits REPLAY_STALLED_RETRY_SECONDS before trying again",
    )

    def __str__(self) -> str:
        return f"{self.prover.slug} {self.run} step {self.step} ({self.result})"


class CoverageReverification(models.Model):
    """A scheduled replay of more of a verified claim's run (``claim.reverified``): coverage grows over a run's
    claims and these, a bounded amount each, until the target is met. The claim's verdict stands; a replay that
    disagrees is exact evidence and raises an alert."""

    claim = models.ForeignKey(Claim, on_delete=models.PROTECT, related_name="reverifications")
    seq = models.BigIntegerField(unique=True)
    result = models.CharField(max_length=16, choices=Claim.Result.choices)
    mismatch_step = models.BigIntegerField(null=True, blank=True)
    report = models.JSONField(default=dict)

    def __str__(self) -> str:
        return f"re-verification #{self.seq} of {self.claim_id} ({self.result})"


class CaseText(models.Model):
    """Private case text: triage reasons and assignees, finding notes, identity-challenge nonces.

    Never on the public ledger: an entry carries ``commitment`` = ``sha256:`` + hex SHA-256(salt ‖ UTF-8 text)
    instead, so the record is tamper-evident without being readable (the salt is private: a guessable text such
    as a username cannot be confirmed from the commitment). Only regulator staff read these rows
    (``view_casetext``); they are not a projection (``rebuild_projections`` rebuilds what points at them, the
    commitments, from the ledger), so a backup carries this table as rows of its own.
    """

    commitment = models.CharField(max_length=71, primary_key=True)
    salt = models.BinaryField(max_length=32)
    text = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.commitment


class AlertNotification(models.Model):
    """One outgoing notice of a high-severity alert (an email, or a signed webhook), or an email to an inspection
    body's members of the tasks a draw assigned it (``draw`` and ``inspection_body`` set, no alert): operational,
    not a projection.

    The worker delivers it, retrying with backoff; each try's outcome stays here, so a failure shows on the alert's
    page and in the admin instead of vanishing in a log. It carries only what the ledger already shows publicly.
    """

    class Channel(models.TextChoices):
        EMAIL = "email"
        WEBHOOK = "webhook"

    class State(models.TextChoices):
        QUEUED = "queued"
        SENDING = "sending"  # a worker holds it until next_try_at (its lease); past that the sweep re-sends it
        RETRYING = "retrying", "failed, retrying"
        SENT = "sent"
        FAILED = "failed", "failed, gave up"

    alert = models.ForeignKey(Alert, on_delete=models.PROTECT, related_name="notifications", null=True, blank=True)
    draw = models.ForeignKey(Draw, on_delete=models.PROTECT, related_name="notices", null=True, blank=True)
    inspection_body = models.ForeignKey(Organisation, on_delete=models.PROTECT, related_name="+", null=True, blank=True)
    channel = models.CharField(max_length=8, choices=Channel.choices)
    target = models.CharField(max_length=500, help_text="the recipients, or the webhook's URL")
    state = models.CharField(max_length=8, choices=State.choices, default=State.QUEUED)
    attempts = models.PositiveSmallIntegerField(default=0)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    next_try_at = models.DateTimeField(
        null=True, blank=True, help_text="when the next try is due (sending: when the worker's hold lapses)"
    )

    class Meta:
        ordering = ["-pk"]
        indexes = [models.Index(fields=["state"], name="alert_notice_state")]

    def __str__(self) -> str:
        about = f"alert #{self.alert_id}" if self.alert_id else f"draw #{self.draw_id}'s tasks"
        return f"{self.channel} notice of {about} ({self.state})"
