"""Sweeps the beat runs: overdue inspections, lost chips and unanswered snapshots become alerts (once each)."""

from __future__ import annotations

from datetime import date

from django.db import transaction

from ledger import services as ledger
from registry.models import Chip, Organisation
from rules.chip_lifecycle import Status

from .. import selectors
from ..models import Alert, InspectionTask, Snapshot
from .alerts import alert_raise


@transaction.atomic
def overdue_sweep(today: date) -> int:
    late = (
        InspectionTask.objects.select_for_update(of=("self",), no_key=True)  # the tasks, not their chips and provers
        .filter(due_on__lt=today, status__in=[InspectionTask.Status.ASSIGNED, InspectionTask.Status.ACCEPTED])
        .select_related("chip", "prover")
        .order_by("pk")  # locked in one order: two sweeps at once wait, never deadlock
    )
    count = 0
    for task in late:
        task.status = InspectionTask.Status.OVERDUE
        task.save(update_fields=["status"])
        alert_raise(
            Alert.Kind.OVERDUE, task.prover, f"inspection of {task.chip.serial} was due {task.due_on}", task.chip, task
        )
        count += 1
    return count


@transaction.atomic
def lost_chip_sweep() -> int:
    """Chips reported lost or stolen get one alert each against their owner."""
    if not _lost_unalerted().exists():
        return 0  # most runs: nothing to raise, and no ledger lock taken
    ledger.ledger_write_lock()  # then "already alerted?" again: two overlapping runs must not both raise
    count = 0
    for chip in _lost_unalerted():
        alert_raise(Alert.Kind.LOST, chip.owner, f"{chip.serial} was reported {chip.status}", chip)
        count += 1
    return count


def _lost_unalerted():
    """Chips reported lost or stolen that have no alert yet."""
    alerted = Alert.objects.filter(kind=Alert.Kind.LOST).values("chip")
    return Chip.objects.filter(status__in=[Status.LOST, Status.STOLEN]).exclude(pk__in=alerted).select_related("owner")


@transaction.atomic
def unanswered_sweep(today: date) -> int:
    """Snapshots past their claim deadline with no claim: one alert each, against whoever owed the answer (the
    chip's owner at the snapshot's time: a chip sold since is still the seller's for that snapshot)."""
    if not _unanswered(today):
        return 0  # as in lost_chip_sweep
    ledger.ledger_write_lock()
    count = 0
    for snapshot, detail in _unanswered(today):
        owed_by = Organisation.objects.get(slug=selectors.snapshot_owner(snapshot))
        alert_raise(Alert.Kind.UNANSWERED, owed_by, detail, snapshot.chip)
        count += 1
    return count


def _unanswered(today: date) -> list[tuple[Snapshot, str]]:
    """(snapshot, its alert's detail) for each snapshot past its deadline with no claim and no alert yet."""
    alerted = set(Alert.objects.filter(kind=Alert.Kind.UNANSWERED).values_list("detail", flat=True))
    due = Snapshot.objects.filter(claim_due_on__lt=today, claim__isnull=True).select_related("chip__fab", "log")
    found = []
    for snapshot in due:
        detail = f"snapshot {snapshot.chip.serial} #{snapshot.counter} ({snapshot.hash[:16]}…) was not answered"
        if detail not in alerted:
            found.append((snapshot, detail))
    return found
