"""Dashboard aggregates over the big projections (10^6 chips), recomputed by a beat task.

A request reads the stored ``Figure`` rows and shows their age; it never groups 10^6 rows
itself. The only exception is a cold start (no row yet), computed once.
"""

from __future__ import annotations

from django.db.models import Count
from django.utils import timezone

from inspections.models import Campaign
from inspections.selectors import campaign_targets
from registry.models import Chip
from rules.inspection_planning import prover_plan

from ..models import Figure

TOP = 12  # bars per chart; the rest is summed as "other"


def _grouped(field: str) -> list[list]:
    rows = Chip.objects.values_list(field).annotate(n=Count("id")).order_by("-n")
    ranked = [[key or "-", n] for key, n in rows]
    if len(ranked) > TOP:
        ranked = ranked[: TOP - 1] + [["other", sum(n for _, n in ranked[TOP - 1 :])]]
    return ranked


def _campaigns() -> list[dict]:
    today = timezone.now().date()
    found = []
    for campaign in Campaign.objects.order_by("slug"):
        if campaign.ends_on and campaign.ends_on < today:
            continue
        plans = {
            prover.slug: {**prover_plan(campaign, count, peak), "peak": peak}
            for prover, count, peak in campaign_targets(campaign)
        }
        found.append(
            {"slug": campaign.slug, "pk": campaign.pk, "target": campaign.detection_probability, "provers": plans}
        )
    return found


def _prover_country() -> dict[str, dict[str, int]]:
    table: dict[str, dict[str, int]] = {}
    for owner, country, n in Chip.objects.values_list("owner__slug", "country").annotate(n=Count("id")).order_by():
        table.setdefault(owner, {})[country or "-"] = n
    return table


def _owner_facility_status() -> dict[str, list[list]]:
    """Owner slug -> [facility slug, status, chips] rows: the organisation page of an owner of many chips."""
    table: dict[str, list[list]] = {}
    rows = Chip.objects.values_list("owner__slug", "facility__slug", "status").annotate(n=Count("id")).order_by()
    for owner, facility, status, n in rows:
        table.setdefault(owner, []).append([facility or "", status, n])
    return table


COMPUTERS = {
    "prover_country": _prover_country,
    "chips_by_country": lambda: _grouped("country"),
    "chips_by_owner": lambda: _grouped("owner__slug"),
    "chips_by_model": lambda: _grouped("model__name"),
    "chips_by_status": lambda: _grouped("status"),
    "open_campaigns": _campaigns,
    "owner_facility_status": _owner_facility_status,
}


def figures_refresh(names=None) -> list[str]:
    """Recompute the named figures (all by default) and store them with the time."""
    done = []
    for name in names or COMPUTERS:
        Figure.objects.update_or_create(name=name, defaults={"data": COMPUTERS[name](), "computed_at": timezone.now()})
        done.append(name)
    return done
