"""Registry projections: organisations, keys, facilities, chip models, chips and their history.

Every row here is derived from ledger entries (``*_seq`` fields point at them) and
is rebuilt from the ledger by ``manage.py rebuild_projections``. Only
``registry.services`` writes them. ``Member``, ``ApiNonce`` and
``IdempotencyRecord`` are access-control bookkeeping, not world state.
"""

from django.conf import settings
from django.db import models

from rules.chip_lifecycle import Status

CHIP_STATUS_CHOICES = [(status.value, status.value) for status in Status]


class Role(models.TextChoices):
    FAB = "fab", "fab"
    PACKAGER = "packager", "packager"
    VENDOR = "vendor", "vendor / distributor"
    OWNER = "owner", "owner / operator (prover)"
    REGULATOR = "regulator", "regulator"
    INSPECTION_BODY = "inspection_body", "inspection body"


class Organisation(models.Model):
    slug = models.SlugField(max_length=64, unique=True, help_text="Its name on the ledger (the actor).")
    legal_name = models.CharField(max_length=255)
    country = models.CharField(max_length=2, help_text="ISO 3166-1 alpha-2")
    roles = models.JSONField(default=list)
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="subsidiaries")
    registered_seq = models.BigIntegerField()

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug

    def has_role(self, role: str) -> bool:
        return role in self.roles


class OrganisationKey(models.Model):
    """An Ed25519 public key an organisation signs its submissions with."""

    organisation = models.ForeignKey(Organisation, on_delete=models.PROTECT, related_name="keys")
    key_id = models.CharField(max_length=16, unique=True, help_text="hex of SHA-256(public key)[:8]")
    public_key = models.BinaryField(max_length=32)
    registered_seq = models.BigIntegerField()
    revoked_seq = models.BigIntegerField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.organisation.slug}/{self.key_id}"


class Member(models.Model):
    """Which organisation a user acts for."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="membership")
    organisation = models.ForeignKey(Organisation, on_delete=models.PROTECT, related_name="members")

    def __str__(self) -> str:
        return f"{self.user} @ {self.organisation}"


class Facility(models.Model):
    class Kind(models.TextChoices):
        FAB = "fab"
        PACKAGING = "packaging"
        WAREHOUSE = "warehouse"
        DATACENTRE = "datacentre"

    slug = models.SlugField(max_length=64, unique=True)
    owner = models.ForeignKey(Organisation, on_delete=models.PROTECT, related_name="facilities")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    country = models.CharField(max_length=2)
    location = models.CharField(max_length=255, blank=True)
    registered_seq = models.BigIntegerField()

    class Meta:
        verbose_name_plural = "facilities"

    def __str__(self) -> str:
        return self.slug


class ChipModel(models.Model):
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=128)
    vendor = models.ForeignKey(Organisation, on_delete=models.PROTECT, related_name="chip_models")
    export_class = models.CharField(max_length=32, help_text="e.g. ECCN 3A090.a")
    peak_flops_16bit = models.FloatField(help_text="peak dense 16-bit FLOP/s")
    memory_bytes = models.BigIntegerField()
    registered_seq = models.BigIntegerField()

    def __str__(self) -> str:
        return self.name


class Chip(models.Model):
    serial = models.CharField(max_length=64, unique=True)
    model = models.ForeignKey(ChipModel, on_delete=models.PROTECT, related_name="chips")
    fab = models.ForeignKey(Organisation, on_delete=models.PROTECT, related_name="fabricated_chips")
    public_key = models.BinaryField(max_length=32, help_text="the chip's own Ed25519 key, made at fabrication")
    owner = models.ForeignKey(Organisation, on_delete=models.PROTECT, related_name="owned_chips")
    possessor = models.ForeignKey(Organisation, on_delete=models.PROTECT, related_name="held_chips")
    consignee = models.ForeignKey(
        Organisation, null=True, blank=True, on_delete=models.PROTECT, related_name="incoming_chips"
    )
    pending_owner = models.ForeignKey(
        Organisation, null=True, blank=True, on_delete=models.PROTECT, related_name="offered_chips"
    )
    facility = models.ForeignKey(Facility, null=True, blank=True, on_delete=models.PROTECT, related_name="chips")
    country = models.CharField(max_length=2, blank=True, help_text="where the chip is (or is headed)")
    status = models.CharField(max_length=16, choices=CHIP_STATUS_CHOICES, db_index=True)
    status_before_missing = models.CharField(max_length=16, blank=True, default="")
    packaged = models.BooleanField(default=False)
    fabricated_seq = models.BigIntegerField()
    updated_seq = models.BigIntegerField()

    class Meta:
        indexes = [
            models.Index(fields=["owner", "status"]),
            models.Index(fields=["possessor"]),
            # serial LIKE 'prefix%' on PostgreSQL needs pattern ops (the unique index is collation-ordered)
            models.Index(fields=["serial"], name="chip_serial_prefix", opclasses=["varchar_pattern_ops"]),
        ]

    def __str__(self) -> str:
        return self.serial


class ChipEvent(models.Model):
    """One line of a chip's history: the ledger entry that changed it."""

    chip = models.ForeignKey(Chip, on_delete=models.PROTECT, related_name="events")
    seq = models.BigIntegerField()
    kind = models.CharField(max_length=64)
    actor = models.CharField(max_length=64)

    class Meta:
        ordering = ["seq"]
        constraints = [models.UniqueConstraint(fields=["chip", "seq"], name="one_event_per_chip_and_entry")]

    def __str__(self) -> str:
        return f"{self.kind} by {self.actor} (#{self.seq})"


class ApiNonce(models.Model):
    """Nonces of signed requests already accepted: a captured request cannot be replayed."""

    organisation = models.ForeignKey(Organisation, on_delete=models.CASCADE)
    nonce = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["organisation", "nonce"], name="nonce_once_per_org")]


class IdempotencyRecord(models.Model):
    """The first answer to a request with an Idempotency-Key, returned again on retry."""

    organisation = models.ForeignKey(Organisation, on_delete=models.CASCADE)
    key = models.CharField(max_length=255)
    request_hash = models.BinaryField(max_length=32)
    status_code = models.PositiveSmallIntegerField()
    response = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["organisation", "key"], name="idempotency_key_once_per_org")]


class ApiToken(models.Model):
    """An API token, kept only as its SHA-256: the token itself is shown once, when it is issued."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    digest = models.CharField(max_length=64, unique=True, help_text="hex SHA-256 of the token")
    prefix = models.CharField(max_length=12, help_text="the token's first characters, to tell tokens apart")
    label = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"


class ExportLicence(models.Model):
    """An export licence the regulator recorded (``export_licence.granted``); exports cite it by id."""

    licence_id = models.CharField(max_length=64, unique=True)
    exporter = models.ForeignKey(Organisation, on_delete=models.PROTECT, related_name="export_licences")
    consignee = models.ForeignKey(Organisation, on_delete=models.PROTECT, related_name="import_licences")
    from_country = models.CharField(max_length=2)
    to_country = models.CharField(max_length=2)
    quantity = models.PositiveIntegerField(help_text="chips it covers, in all its exports")
    used = models.PositiveIntegerField(default=0)
    expires_on = models.DateField()
    granted_seq = models.BigIntegerField()

    def __str__(self) -> str:
        return self.licence_id
