"""Writes of the inspections app: campaigns, commit–draw–reveal, task assignment. Each a ledger entry."""
from __future__ import annotations

import base64
from collections import defaultdict
from datetime import date, timedelta

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from ledger import services as ledger
from registry.lifecycle import ACTIVE, Status
from registry.models import Chip, Organisation

from . import draws, sampling
from .models import Campaign, CampaignSeed, Draw, InspectionBody, InspectionTask

# Chips a prover holds for the purpose of a draw: anything it owns that could be training.
ELIGIBLE = sorted(s.value for s in ACTIVE | {Status.IN_TRANSIT})
TASK_DAYS = 14  # an inspection is due this many days after the draw


def _fail(field: str, reason: str) -> None:
    raise ValidationError({field: reason})


@transaction.atomic
def campaign_create(
    *, slug: str, rule_flops: float, starts_on: date, provers: list[str] = (), country: str = "",
    detection_probability: float = 0.9, snapshot_rate: float = 0.1, period_days: int = 30, run_days: int = 365,
    ends_on: date | None = None, actor: str = "regulator",
) -> Campaign:
    if Campaign.objects.filter(slug=slug).exists():
        _fail("slug", f"{slug!r} is taken")
    if bool(provers) == bool(country):
        _fail("provers", "name the provers, or a country whose chip holders are all targeted — one of the two")
    targets = list(Organisation.objects.filter(slug__in=provers))
    if len(targets) != len(set(provers)):
        _fail("provers", f"unknown: {sorted(set(provers) - {o.slug for o in targets})}")
    if not rule_flops > 0:
        _fail("rule_flops", "must be positive")
    if not 0 < detection_probability < 1:
        _fail("detection_probability", "must be between 0 and 1")
    if not 0 < period_days <= run_days:
        _fail("period_days", "must be positive and at most run_days")
    params = {
        "slug": slug, "provers": sorted(provers), "country": country, "rule_flops": rule_flops,
        "detection_probability": detection_probability, "snapshot_rate": snapshot_rate,
        "period_days": period_days, "run_days": run_days, "starts_on": starts_on.isoformat(),
        "ends_on": ends_on.isoformat() if ends_on else None,
    }
    entry = ledger.append_entry("campaign.created", params, actor)
    campaign = Campaign.objects.create(
        slug=slug, country=country, rule_flops=rule_flops, detection_probability=detection_probability,
        snapshot_rate=snapshot_rate, period_days=period_days, run_days=run_days, starts_on=starts_on,
        ends_on=ends_on, created_seq=entry.seq,
    )
    campaign.provers.set(targets)
    _commit_seed(campaign, campaign_period(campaign, timezone.now().date()) or 0, actor)
    return campaign


@transaction.atomic
def campaign_seed_commit(campaign: Campaign, period: int, actor: str = "regulator") -> CampaignSeed:
    if CampaignSeed.objects.filter(campaign=campaign, period=period).exists():
        _fail("period", f"period {period} already has a committed seed")
    return _commit_seed(campaign, period, actor)


def _commit_seed(campaign: Campaign, period: int, actor: str) -> CampaignSeed:
    seed = draws.new_seed()
    commitment = draws.commitment(seed)
    entry = ledger.append_entry(
        "campaign.seed_committed", {"campaign": campaign.slug, "period": period, "commitment": commitment}, actor
    )
    return CampaignSeed.objects.create(
        campaign=campaign, period=period, seed=seed, commitment=commitment, committed_seq=entry.seq
    )


def campaign_period(campaign: Campaign, on: date) -> int | None:
    if on < campaign.starts_on or (campaign.ends_on and on > campaign.ends_on):
        return None
    return (on - campaign.starts_on).days // campaign.period_days


@transaction.atomic
def campaign_draw(campaign: Campaign, period: int, actor: str = "regulator") -> Draw:
    """Draw the period's sample against a fresh checkpoint, reveal the seed, commit the next one."""
    seed = CampaignSeed.objects.select_for_update().filter(campaign=campaign, period=period).first()
    if seed is None:
        _fail("period", f"no seed was committed for period {period}")
    if Draw.objects.filter(campaign=campaign, period=period).exists():
        _fail("period", f"period {period} was already drawn")
    # Signed under the ledger lock, held to the end of this transaction: the registry read
    # below is exactly the ledger's first checkpoint.size entries, which the audit replays.
    checkpoint = ledger.checkpoint_sign()
    root = bytes(checkpoint.root)
    provers = {}
    for prover in campaign_targets(campaign):
        provers[prover.slug] = prover_sample(campaign, prover.slug, _holdings(prover), bytes(seed.seed), root)
    today = timezone.now().date()
    assignments = assign(provers)
    payload = {
        "campaign": campaign.slug, "period": period, "seed": bytes(seed.seed).hex(),
        "checkpoint": {"size": checkpoint.size, "root": base64.b64encode(root).decode()},
        "provers": provers, "assignments": assignments,
    }
    entry = ledger.append_entry("campaign.drawn", payload, actor)
    draw = Draw.objects.create(
        campaign=campaign, period=period, checkpoint_size=checkpoint.size, checkpoint_root=root, drawn_seq=entry.seq,
        drawn_at=entry.time,
    )
    _create_tasks(draw, provers, assignments, today, entry.seq)
    _commit_seed(campaign, period + 1, actor)
    return draw


def campaign_targets(campaign: Campaign) -> list[Organisation]:
    if campaign.country:
        holders = Chip.objects.filter(country=campaign.country, status__in=ELIGIBLE).values("owner").distinct()
        return list(Organisation.objects.filter(pk__in=holders).order_by("slug"))
    return list(campaign.provers.order_by("slug"))


def _holdings(prover: Organisation) -> dict:
    chips = Chip.objects.filter(owner=prover, status__in=ELIGIBLE)
    return {
        "serials": list(chips.values_list("serial", flat=True)),
        "peak_flops": max(chips.values_list("model__peak_flops_16bit", flat=True).distinct(), default=None),
    }


def prover_sample(campaign, prover: str, holdings: dict, seed: bytes, root: bytes) -> dict:
    """Plan and draw for one prover; the same function recomputes it in the audit."""
    serials = holdings["serials"]
    sample = {"chips": len(serials), "chips_needed": None, "samples": 0, "drawn": []}
    if not serials:
        return sample
    try:
        plan = sampling.plan(
            campaign.rule_flops, len(serials), p=campaign.detection_probability, snapshot_rate=campaign.snapshot_rate,
            period_days=campaign.period_days, run_days=campaign.run_days,
            flops_per_chip_second=holdings["peak_flops"] or 1e15,
        )
    except sampling.PlanError as error:
        sample["plan_error"] = str(error)  # recorded on the ledger; the regulator sees it in the draw
        return sample
    sample["chips_needed"] = plan.chips_needed
    if plan.impossible:
        return sample  # the prover cannot run it: nothing to look for
    # The paper's plan samples with replacement and may ask for more than C: inspect them all.
    sample["samples"] = min(plan.samples_per_period, len(serials))
    sample["drawn"] = sorted(draws.draw(seed, root, campaign.slug, serials, sample["samples"]))
    return sample


def assign(provers: dict) -> dict[str, str | None]:
    """serial -> inspection body: by the chip's country, to the body with most capacity left."""
    countries = dict(Chip.objects.filter(serial__in=[s for p in provers.values() for s in p["drawn"]])
                     .values_list("serial", "country"))
    bodies = list(InspectionBody.objects.select_related("organisation").order_by("organisation__slug"))
    left = {body.organisation.slug: body.capacity_per_period for body in bodies}
    serves = defaultdict(list)
    for body in bodies:
        for country in body.countries:
            serves[country].append(body.organisation.slug)
    assignments = {}
    for serial in sorted(countries):
        candidates = [slug for slug in serves.get(countries[serial], []) if left[slug] > 0]
        chosen = max(candidates, key=lambda slug: (left[slug], slug), default=None)
        if chosen:
            left[chosen] -= 1
        assignments[serial] = chosen
    return assignments


def _create_tasks(draw: Draw, provers: dict, assignments: dict, today: date, seq: int) -> None:
    chips = dict(Chip.objects.filter(serial__in=assignments).values_list("serial", "id"))
    orgs = dict(Organisation.objects.values_list("slug", "id"))
    due = today + timedelta(days=TASK_DAYS)
    InspectionTask.objects.bulk_create([
        InspectionTask(draw=draw, chip_id=chips[serial], prover_id=orgs[prover], inspection_body_id=orgs.get(assignments[serial]),
                       due_on=due, assigned_seq=seq)
        for prover, sample in provers.items() for serial in sample["drawn"]
    ])
