"""Alerts: something the regulator must look at, raised on the ledger (``alert.raised``)."""

from __future__ import annotations

from ledger import services as ledger
from registry.models import Chip, Organisation

from ..models import Alert, InspectionTask


def alert_raise(
    kind: str,
    prover: Organisation,
    detail: str,
    chip: Chip | None = None,
    task: InspectionTask | None = None,
    actor: str = "system",
) -> Alert:
    payload = {
        "kind": kind,
        "prover": prover.slug,
        "chip": chip.serial if chip else None,
        "task": task.pk if task else None,
        "detail": detail,
    }
    entry = ledger.append_entry("alert.raised", payload, actor)
    return Alert.objects.create(
        kind=kind, prover=prover, chip=chip, task=task, detail=detail, raised_seq=entry.seq, raised_at=entry.time
    )


def alert_from_chip_notice(sender, *, kind: str, prover: str, serials: list[str], detail: str, **_signal) -> Alert:
    """The registry's ``chip_notice`` (received abroad, taken out of use) as an alert, in the registry's transaction."""
    chip = Chip.objects.filter(serial=serials[0]).first() if len(serials) == 1 else None
    return alert_raise(kind, Organisation.objects.get(slug=prover), detail, chip)
