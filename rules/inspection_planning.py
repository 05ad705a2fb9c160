"""What a campaign asks of each prover, as pure functions (no database): its periods, the prover's
sample (plan and draw), the assignment of drawn chips to inspection bodies, and the plan shown to
the regulator. The live draw (``services.campaigns``) and the audit from the ledger
(``audit.audit_draw``) both go through ``prover_sample``, so they cannot drift apart.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import date, timedelta

from rules import sampling_plans
from rules.chip_lifecycle import ACTIVE, Status

# Chips a prover holds for the purpose of a draw: anything it owns that could be training.
ELIGIBLE = sorted(s.value for s in ACTIVE | {Status.IN_TRANSIT})
MODELS = ("paper", "exact")  # the paper's plan (with replacement) or the exact one (without)
DEFAULT_MODEL = "paper"  # also what a campaign created before campaigns chose a model uses
# A country campaign whose ``campaign.created`` says ``"holders": "owners"`` targets only holders registered as
# owners/operators: a vendor's warehouse stock (chips it holds, not yet sold to an owner) is no prover's.
# Older country campaigns (no ``holders``) targeted every holder, and their draws are audited as they were made.
OWNERS_ONLY = "owners"
PROVER_ROLE = "owner"
# What a ``campaign.amended`` entry may change, from the next draw on (docs/draws.md).
AMENDABLE = ("provers", "rule_flops", "detection_probability", "snapshot_rate", "model", "ends_on")


def counts_as_prover(params, roles) -> bool:
    """Whether a holder of eligible chips is a target of the (country) campaign ``params``."""
    holders = params.get("holders") if isinstance(params, dict) else getattr(params, "holders", "")
    return holders != OWNERS_ONLY or PROVER_ROLE in (roles or [])


def next_draw(campaign, today: date, drawn: set[int]) -> tuple[int, date] | None:
    """(period, day) of the campaign's next draw: the current period if it is not drawn yet (beat draws it on its
    next run), else the next period's first day; None when the campaign has no period left."""
    period = campaign_period(campaign, today)
    if period is None:
        if today >= campaign.starts_on:
            return None  # ended or stopped
        period, day = 0, campaign.starts_on
    elif period in drawn:
        period, day = period + 1, campaign.starts_on + timedelta(days=(period + 1) * campaign.period_days)
    else:
        day = today
    if campaign.ends_on is not None and day > campaign.ends_on:
        return None
    return period, day


def campaign_period(campaign, on: date) -> int | None:
    """The period of ``campaign`` that ``on`` falls in, or None outside the campaign."""
    if on < campaign.starts_on or (campaign.ends_on and on > campaign.ends_on):
        return None
    return (on - campaign.starts_on).days // campaign.period_days


@dataclass(frozen=True)
class Holdings:
    """What a draw needs to know of a prover's chips: how many, the fastest model, and a way to rank them."""

    count: int
    peak_flops: float | None
    draw: Callable[[bytes, bytes, str, int], list[str]]  # (seed, root, campaign, k) -> the k lowest-ranked serials


def _plan(campaign, chips: int, peak_flops: float | None, model: str) -> sampling_plans.Plan:
    return sampling_plans.plan(
        campaign.rule_flops,
        chips,
        p=campaign.detection_probability,
        snapshot_rate=campaign.snapshot_rate,
        period_days=campaign.period_days,
        run_days=campaign.run_days,
        flops_per_chip_second=peak_flops or sampling_plans.DEFAULT_FLOPS_PER_CHIP_SECOND,
        exact=model == "exact",
    )


def prover_sample(campaign, prover: str, holdings: Holdings, seed: bytes, root: bytes) -> dict:
    """Plan and draw for one prover by the campaign's sampling model; the audit recomputes it the same way.

    ``campaign`` is a Campaign row or the ``campaign.created`` payload; one without a ``model``
    (created before campaigns chose one) uses the paper's plan.
    """
    sample = {"chips": holdings.count, "chips_needed": None, "samples": 0, "drawn": []}
    if not holdings.count:
        return sample
    try:
        plan = _plan(campaign, holdings.count, holdings.peak_flops, getattr(campaign, "model", None) or DEFAULT_MODEL)
    except sampling_plans.PlanError as error:
        sample["plan_error"] = str(error)  # recorded on the ledger; the regulator sees it in the draw
        return sample
    sample["chips_needed"] = plan.chips_needed
    if plan.impossible:
        return sample  # the prover cannot run it: nothing to look for
    # The paper's plan samples with replacement and may ask for more than C: inspect them all.
    sample["samples"] = min(plan.samples_per_period, holdings.count)
    sample["drawn"] = sorted(holdings.draw(seed, root, campaign.slug, sample["samples"]))
    return sample


@dataclass(frozen=True)
class Coverage:
    """An inspection body as the assignment sees it."""

    slug: str
    countries: list[str]
    capacity_per_period: int


def assign(countries: dict[str, str], bodies: Iterable[Coverage]) -> dict[str, str | None]:
    """serial -> inspection body: by the chip's country, to the body with most capacity left.

    ``countries`` maps each drawn serial to its chip's country; a chip no body with capacity
    left covers gets None.
    """
    bodies = sorted(bodies, key=lambda body: body.slug)
    left = {body.slug: body.capacity_per_period for body in bodies}
    serves = defaultdict(list)
    for body in bodies:
        for country in body.countries:
            serves[country].append(body.slug)
    assignments = {}
    for serial in sorted(countries):
        candidates = [slug for slug in serves.get(countries[serial], []) if left[slug] > 0]
        chosen = max(candidates, key=lambda slug: (left[slug], slug), default=None)
        if chosen:
            left[chosen] -= 1
        assignments[serial] = chosen
    return assignments


def prover_plan(campaign, chips: int, peak_flops: float | None) -> dict:
    """Both plans for one prover: samples per period and the detection probability each achieves.

    ``drawn`` is what a draw inspects under the campaign's model (at most the prover's chips), and
    ``drawn_detection`` the probability that this sample, drawn without replacement as draws are,
    catches the run.
    """
    row = {"chips": chips, "model": getattr(campaign, "model", None) or DEFAULT_MODEL, "chips_needed": None}
    if not chips:
        return {**row, "impossible": True}
    for model in MODELS:
        try:
            plan = _plan(campaign, chips, peak_flops, model)
        except sampling_plans.PlanError as error:
            row[model] = {"error": plan_error_words(error)}
            continue
        row["chips_needed"], row["impossible"] = plan.chips_needed, plan.impossible
        row[model] = {
            "samples_per_period": plan.samples_per_period,
            "samples_per_year": plan.samples_per_year,
            "detection_probability": plan.detection_probability,
        }
        if not plan.impossible:
            row[model]["words"] = plan_words(plan.samples_per_period, chips, plan.detection_probability)
    chosen = row.get(row["model"], {})
    if row.get("impossible") is False and "samples_per_period" in chosen:
        row["drawn"] = min(chosen["samples_per_period"], chips)
        row["drawn_detection"] = sampling_plans.detection_probability(
            row["drawn"],
            campaign.rule_flops,
            chips,
            snapshot_rate=campaign.snapshot_rate,
            period_days=campaign.period_days,
            run_days=campaign.run_days,
            flops_per_chip_second=peak_flops or sampling_plans.DEFAULT_FLOPS_PER_CHIP_SECOND,
            exact=True,
        )
    return row


PLAN_FIELD_WORDS = {"flops": "the rule (H)", "p": "the detection target", "chips": "the chips held"}


def plan_words(samples: int, chips: int, detection: float | None) -> str:
    """A plan as a sentence: what a draw inspects each period and what that buys over the run."""
    if samples >= chips:
        asked = f" (the model asks {samples:,})" if samples > chips else ""
        inspect = f"{_all_chips(chips)} each period{asked}"
    else:
        inspect = f"{samples:,} of {chips:,} chips each period"
    return inspect if detection is None else f"{inspect}, detecting the run with probability {detection:.3f}"


def plan_error_words(error: sampling_plans.PlanError) -> str:
    """Why there is no plan, in words (never the exception's text with its parameter names)."""
    if isinstance(error, sampling_plans.UnattainableTarget):
        return (
            f"the target {error.p:.3f} cannot be reached: even inspecting {_all_chips(error.chips)} every period "
            f"detects the run with probability {error.max_detection_probability:.3f} at most; lower the target or "
            "use the paper's model"
        )
    return f"no plan: {PLAN_FIELD_WORDS.get(error.field, error.field.replace('_', ' '))} {error.message}"


def _all_chips(chips: int) -> str:
    return "its only chip" if chips == 1 else f"all {chips:,} chips"
