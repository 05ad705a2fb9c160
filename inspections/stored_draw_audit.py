"""Recompute a past draw from the stored ledger (``manage.py audit_draw``). Read-only.

The check itself is pure (``rules.draw_recompute``), shared with the standalone
``python -m rules.draw_auditor`` (or ``inspections.drawaudit``) that anyone runs against the public API.
"""

from __future__ import annotations

from ledger import selectors as ledger
from registry.rebuild_registry import rebuild
from rules.draw_recompute import Audit, DrawRecords, check_draw, not_drawn


def audit_draw(campaign: str, period: int) -> Audit:
    records = DrawRecords(campaign, period)
    for kind, match in (
        ("campaign.created", {"slug": campaign}),
        ("campaign.seed_committed", {"campaign": campaign, "period": period}),
        ("campaign.drawn", {"campaign": campaign, "period": period}),
    ):
        entry = ledger.first_entry(kind, **match)
        if entry is not None:
            records.take(entry["seq"], kind, entry["payload"])
    for entry in ledger.entries_of("campaign.amended", limit=10_000, campaign=campaign):
        records.take(entry["seq"], "campaign.amended", entry["payload"])
    audit = not_drawn(records)
    if audit is not None:
        return audit
    size = records.checkpoint_size
    if size is None or not 0 < size <= ledger.ledger_size():
        audit = Audit(campaign, period)
        audit.fail(f"the draw names a checkpoint of size {size!r}, which this ledger does not have")
        return audit
    return check_draw(records, rebuild(size), ledger.root_at(size))
