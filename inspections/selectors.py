"""Reads of the inspections app: inspectors see only their own body's tasks; campaigns' targets and plans."""

from django.db.models import Count, Max, Q, QuerySet

from registry.models import Chip, Organisation
from registry.selectors import SEES_EVERYTHING

from .models import Campaign, Claim, InspectionTask, SnapshotLog
from .planning import ELIGIBLE, prover_plan


def tasks_of(body: Organisation) -> QuerySet[InspectionTask]:
    return (
        InspectionTask.objects.filter(inspection_body=body)
        .select_related("chip__facility", "prover", "draw__campaign")
        .order_by("due_on", "id")
    )


def task_of(body: Organisation, task_id: int) -> InspectionTask | None:
    return tasks_of(body).filter(pk=task_id).first()


def snapshot_log_of(body: Organisation, log_id: int) -> SnapshotLog | None:
    return SnapshotLog.objects.filter(pk=log_id, task__inspection_body=body).first()


def claim_of(organisation: Organisation | None, claim_id: int) -> Claim | None:
    """The prover sees its own claims; the regulator and inspection bodies see all."""
    if organisation is None:
        return None
    claims = Claim.objects.filter(pk=claim_id)
    if not SEES_EVERYTHING & set(organisation.roles):
        claims = claims.filter(prover=organisation)
    return claims.first()


def campaign_targets(campaign: Campaign) -> list[tuple[Organisation, int, float | None]]:
    """The campaign's provers with their eligible chip counts and fastest model, in one grouped scan.

    A country campaign targets every owner of eligible chips located there (a country may
    hold 10^7 chips: one pass over them, not one per prover); the plan counts all the prover's chips.
    """
    eligible = Chip.objects.filter(status__in=ELIGIBLE)
    if campaign.country:
        rows = (
            eligible.values("owner")
            .annotate(
                count=Count("id"),
                peak=Max("model__peak_flops_16bit"),
                here=Count("id", filter=Q(country=campaign.country)),
            )
            .filter(here__gt=0)
        )
        provers = list(Organisation.objects.filter(pk__in=[row["owner"] for row in rows]).order_by("slug"))
    else:
        provers = list(campaign.provers.order_by("slug"))
        rows = (
            eligible.filter(owner__in=provers)
            .values("owner")
            .annotate(count=Count("id"), peak=Max("model__peak_flops_16bit"))
        )
    found = {row["owner"]: row for row in rows}
    return [
        (prover, found.get(prover.pk, {}).get("count", 0), found.get(prover.pk, {}).get("peak")) for prover in provers
    ]


def campaign_plan(campaign: Campaign) -> dict[str, dict]:
    """prover slug -> both plans (paper and exact) for its chips today, and what the campaign's model draws."""
    return {prover.slug: prover_plan(campaign, count, peak) for prover, count, peak in campaign_targets(campaign)}


def rule_flops_for_chip(chip: Chip) -> float:
    """The strictest rule of any campaign that drew this chip (what a claim for it is checked against)."""
    rules = Campaign.objects.filter(draws__tasks__chip=chip).values_list("rule_flops", flat=True)
    return min(rules, default=float("inf"))
