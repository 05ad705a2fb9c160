"""Pure planning: the sample by the campaign's model (old campaigns: the paper's), assignment, both plans."""

from types import SimpleNamespace

from rules import draw_ranking, sampling_plans
from rules.inspection_planning import Coverage, Holdings, assign, prover_plan, prover_sample

H100, YEAR = 989e12, 86_400 * 365
PARAMS = {
    "slug": "c",
    "rule_flops": 10 * H100 * YEAR,
    "detection_probability": 0.999,
    "snapshot_rate": 0.1,
    "period_days": 365,
    "run_days": 365,
}
SERIALS = [f"S{n:04d}" for n in range(200)]


def holdings() -> Holdings:
    return Holdings(len(SERIALS), H100, lambda seed, root, slug, k: draw_ranking.draw(seed, root, slug, SERIALS, k))


def test_a_campaign_without_a_model_is_sampled_by_the_papers_plan():
    seed, root = b"s" * 32, b"r" * 32
    legacy = prover_sample(SimpleNamespace(**PARAMS), "p", holdings(), seed, root)  # a campaign.created of old
    paper = prover_sample(SimpleNamespace(**PARAMS, model="paper"), "p", holdings(), seed, root)
    exact = prover_sample(SimpleNamespace(**PARAMS, model="exact"), "p", holdings(), seed, root)
    assert legacy == paper and (paper["samples"], exact["samples"]) == (135, 98)
    assert set(exact["drawn"]) < set(paper["drawn"])  # the same ranking, fewer taken


def test_assignment_by_country_and_most_capacity_left():
    bodies = [Coverage("us-1", ["US"], 2), Coverage("us-2", ["US"], 1), Coverage("eu", ["NL", "DE"], 5)]
    countries = {"A1": "US", "A2": "US", "A3": "US", "A4": "US", "B1": "NL", "C1": "FR"}
    got = assign(countries, bodies)
    assert got == {"A1": "us-1", "A2": "us-2", "A3": "us-1", "A4": None, "B1": "eu", "C1": None}


def test_a_plan_shows_both_models_and_what_the_draw_achieves():
    row = prover_plan(SimpleNamespace(**PARAMS, model="exact"), 200, H100)
    assert (row["paper"]["samples_per_period"], row["exact"]["samples_per_period"]) == (135, 98)
    assert row["exact"]["detection_probability"] >= 0.999 and row["drawn"] == 98
    assert row["drawn_detection"] == sampling_plans.detection_probability(
        98, PARAMS["rule_flops"], 200, period_days=365, flops_per_chip_second=H100, exact=True
    )
    assert prover_plan(SimpleNamespace(**PARAMS), 5, H100)["impossible"] is True
    assert prover_plan(SimpleNamespace(**PARAMS), 0, None)["impossible"] is True
