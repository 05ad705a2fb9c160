"""The ledger's tables. ``Entry`` is the source of truth; the rest is derived.

Only ``ledger.services`` writes these rows. Entries and tree nodes are
append-only at the database: UPDATE and DELETE fail (pgtrigger on PostgreSQL,
a migration-installed trigger on SQLite).
"""

import pgtrigger
from django.db import models

APPEND_ONLY = pgtrigger.Protect(name="append_only", operation=pgtrigger.Update | pgtrigger.Delete)
# TRUNCATE is a statement, unseen by row triggers: refused by a statement-level trigger of its own.
NO_TRUNCATE = pgtrigger.Trigger(
    name="no_truncate",
    operation=pgtrigger.Truncate,
    level=pgtrigger.Statement,
    when=pgtrigger.Before,
    func="RAISE EXCEPTION 'append-only: TRUNCATE of % refused', TG_TABLE_NAME;",
)


class Entry(models.Model):
    """One leaf of the log. ``leaf`` holds the exact bytes that are hashed and served."""

    seq = models.BigIntegerField(primary_key=True)
    time = models.DateTimeField()
    # No secondary indexes: every one costs each append; the projections serve queries.
    kind = models.CharField(max_length=64)
    actor = models.CharField(max_length=128)
    # A queryable copy of the leaf's payload; verify_ledger checks it against the leaf.
    payload = models.JSONField()
    leaf = models.BinaryField()
    hash = models.BinaryField(max_length=32)

    class Meta:
        ordering = ["seq"]
        verbose_name_plural = "entries"
        triggers = [APPEND_ONLY, NO_TRUNCATE]

    def __str__(self) -> str:
        return f"#{self.seq} {self.kind} by {self.actor}"


class TreeNode(models.Model):
    """Hash of a complete subtree (level >= 1) covering leaves [index<<level, (index+1)<<level).

    Stored as the log grows so a proof reads O(log n) rows, never the whole log.
    """

    pk = models.CompositePrimaryKey("level", "index")
    level = models.SmallIntegerField()
    index = models.BigIntegerField()
    hash = models.BinaryField(max_length=32)

    class Meta:
        triggers = [APPEND_ONLY, NO_TRUNCATE]


class Checkpoint(models.Model):
    """A signed tree head: C2SP tlog-checkpoint in a signed note, signed by the log's key."""

    size = models.BigIntegerField(unique=True)
    root = models.BinaryField(max_length=32)
    note = models.TextField(help_text="Checkpoint body and the log's signature line.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-size"]
        get_latest_by = "size"
        triggers = [APPEND_ONLY, NO_TRUNCATE]

    def __str__(self) -> str:
        return f"checkpoint size={self.size}"


class Witness(models.Model):
    """A witness whose cosignatures the log accepts. Projection of ledger entries."""

    name = models.CharField(max_length=255)
    verifier_key = models.CharField(max_length=512, unique=True)
    key_id = models.BinaryField(max_length=4)
    public_key = models.BinaryField(max_length=32)
    registered_seq = models.BigIntegerField(help_text="Ledger entry that registered this witness.")
    revoked_seq = models.BigIntegerField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "witnesses"

    def __str__(self) -> str:
        return self.name

    @property
    def active(self) -> bool:
        return self.revoked_seq is None


class Cosignature(models.Model):
    """A witness's C2SP cosignature/v1 over one of our checkpoints."""

    checkpoint = models.ForeignKey(Checkpoint, on_delete=models.PROTECT, related_name="cosignatures")
    witness = models.ForeignKey(Witness, on_delete=models.PROTECT, related_name="cosignatures")
    timestamp = models.BigIntegerField()
    line = models.TextField(help_text="The signature line exactly as the witness produced it.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["checkpoint", "witness"], name="one_cosignature_per_witness")]
        triggers = [APPEND_ONLY, NO_TRUNCATE]
