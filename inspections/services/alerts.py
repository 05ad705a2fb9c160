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
