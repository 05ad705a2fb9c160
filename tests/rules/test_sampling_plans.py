"""Inspection sampling plans (docs/draws.md, How many chips; Shavit 2023 §3.2): hand-worked values, limits, properties."""

import itertools
import math
import random
import time
from fractions import Fraction

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rules import sampling_plans
from rules.sampling_plans import ImpossibleRun, PlanError, UnattainableTarget, detection_probability, plan
from rules.sampling_plans import _exact_period_miss_probability as exact_period_miss_probability
from rules.sampling_plans import _required_chips as required_chips

A_DAY = 10**15 * 86_400  # FLOP one chip does in a day at the default 1e15 FLOP/s
A_YEAR = A_DAY * 365  # 3.1536e22 FLOP: one chip for the default 365-day run


def flops_for(chips: int, days: int = 365) -> int:
    """H that needs exactly `chips` chips over `days` days (an exact integer, no float rounding)."""
    return chips * A_DAY * days


# --------------------------------------------------------------------------------------------------
# Hand-worked plans


def test_gpt4_class_run_on_a_large_prover():
    # H = 1e25 FLOP, C = 100,000, defaults (p = 0.9, f = 0.1/day, T_m = 30, T = 365, a = 1e15·86,400).
    #   a·T = 8.64e19 · 365 = 3.1536e22 FLOP per chip over the run
    #   N   = 1e25 / 3.1536e22 = 317.0979198…  → chips_needed = ⌈N⌉ = 318
    #   r   = 1 − e^−3 = 1 − 0.0497870684 = 0.9502129316
    #   q   = (317.0979198 / 100,000) · 0.9502129316 = 0.0030131054
    #   ln(1 − q) = −0.0030176540,  ln(1 − p) = ln 0.1 = −2.3025850930
    #   s   = (−2.3025850930 / −0.0030176540) · 30/365 = 763.0381439 · 0.0821917808 = 62.7154639
    #   → 63 per period; per year ⌈365 · 62.7154639 / 30⌉ = ⌈763.038⌉ = 764
    #     (not ⌈365·63/30⌉ = ⌈766.5⌉: the year count comes from the unrounded s)
    #   achieved: 1 − (1 − q)^(63 · 365/30) = 1 − e^(766.5 · −0.0030176540) = 1 − e^−2.3130318 = 0.9010392
    result = plan(10**25, 100_000)
    assert required_chips(10**25) == Fraction(10**25, A_YEAR)
    assert float(required_chips(10**25)) == pytest.approx(317.0979198, rel=1e-9)
    assert result.chips_needed == 318 and not result.impossible and not result.exact
    assert result.catch_probability == pytest.approx(0.00301310544, rel=1e-9)
    assert result.samples_per_period_unrounded == pytest.approx(62.7154639, rel=1e-8)
    assert (result.samples_per_period, result.samples_per_year) == (63, 764)
    assert result.detection_probability == pytest.approx(0.9010392, abs=1e-7)
    assert result.as_dict() == {
        "chips_needed": 318,
        "samples_per_period": 63,
        "samples_per_year": 764,
        "detection_probability": result.detection_probability,
    }


def test_a_run_needing_exactly_1000_chips():
    # H = 31,536 · 10^21 = 3.1536e25 FLOP exactly → N = 3.1536e25 / 3.1536e22 = 1000 exactly → 1000 chips.
    #   C = 10^6:  q = 0.001 · 0.9502129316 = 9.502129316e-4,  ln(1 − q) = −9.506646701e-4
    #   s = 2.3025850930 / 9.506646701e-4 · 30/365 = 2422.079168 · 0.0821917808 = 199.0750001
    #   → 200 per period (just over 199!), ⌈2422.079⌉ = 2423 per year
    result = plan(31_536 * 10**21, 10**6)
    assert result.chips_needed == 1000
    assert result.catch_probability == pytest.approx(9.502129316e-4, rel=1e-9)
    assert result.samples_per_period_unrounded == pytest.approx(199.0750001, rel=1e-9)
    assert (result.samples_per_period, result.samples_per_year) == (200, 2423)
    # The float 3.1536e25 is 31536000000000001006632960, a hair above 1000 chips' worth: N is decided
    # exactly from the number given, so it needs 1001. The decimal string is read exactly.
    assert plan(3.1536e25, 10**6).chips_needed == 1001
    assert plan("3.1536e25", 10**6).chips_needed == 1000


def test_half_the_fleet_with_short_periods():
    # f = 0.1/day, T_m = 10 days, T = 100 days, H = 4.32e23: a·T = 8.64e21 → N = 50 of C = 100.
    #   r = 1 − e^−1 = 0.6321205588,  q = 0.5 · r = 0.3160602794,  ln(1 − q) = ln 0.6839397206 = −0.3798854930
    #   p = 0.9:  s = 2.3025850930 / 0.3798854930 · 10/100 = 0.6061260920 → 1 per period,
    #             ⌈365 · 0.6061260920 / 10⌉ = ⌈22.1236⌉ = 23 per year,
    #             achieved 1 − 0.6839397206^(1·10) = 1 − 0.0223964 = 0.9776036
    #   p = 0.99: s = 4.6051701860 / 0.3798854930 · 0.1 = 1.2122521840 → 2, ⌈44.2472⌉ = 45 per year
    kwargs = dict(snapshot_rate=0.1, period_days=10, run_days=100)
    result = plan(432 * 10**21, 100, **kwargs)
    assert result.chips_needed == 50 and result.periods == 10
    assert result.catch_probability == pytest.approx(0.3160602794, rel=1e-9)
    assert result.samples_per_period_unrounded == pytest.approx(0.6061260920, rel=1e-9)
    assert (result.samples_per_period, result.samples_per_year) == (1, 23)
    assert result.detection_probability == pytest.approx(0.9776036, abs=1e-7)
    strict = plan(432 * 10**21, 100, p=0.99, **kwargs)
    assert strict.samples_per_period_unrounded == pytest.approx(1.2122521840, rel=1e-9)
    assert (strict.samples_per_period, strict.samples_per_year) == (2, 45)


def test_exact_plan_for_four_chips_by_hand():
    # C = 4 chips, the run uses K = 2 of them for one period (T = T_m = 30), f·T_m = 3, x = e^−3 = 0.0497870684.
    # Draw s = 2 of 4 without replacement (C(4,2) = 6 pairs); j = used chips among them:
    #   j=0: C(2,0)C(2,2)/6 = 1/6,  j=1: C(2,1)C(2,1)/6 = 4/6,  j=2: C(2,2)C(2,0)/6 = 1/6
    #   P_miss(2) = (1 + 4x + x²)/6 = (1 + 0.1991482735 + 0.0024787522)/6 = 0.2002711709 → detect 0.7997288291
    #   P_miss(1) = 1/2 + x/2 = 0.5248935342 (= 1 − q: one draw is the same either way) → detect 0.4751064658
    # Paper (independent draws): q = 0.4751064658, ln(1 − q) = −0.6445598290; for p = 0.75:
    #   s = ln 0.25 / −0.6445598290 = 1.3862943611 / 0.6445598290 = 2.1507613 → 3 per period,
    #   while without replacement 2 draws already reach 0.7997 ≥ 0.75.
    h = flops_for(2, days=30)
    kwargs = dict(period_days=30, run_days=30)
    x = math.exp(-3)
    assert exact_period_miss_probability(4, 2, 2, 0.1, 30) == pytest.approx((1 + 4 * x + x * x) / 6, rel=1e-13)
    assert detection_probability(2, h, 4, exact=True, **kwargs) == pytest.approx(0.7997288291, abs=1e-10)
    assert detection_probability(1, h, 4, exact=True, **kwargs) == pytest.approx(0.4751064658, abs=1e-10)
    assert detection_probability(1, h, 4, **kwargs) == pytest.approx(0.4751064658, abs=1e-10)
    paper = plan(h, 4, p=0.75, **kwargs)
    assert paper.samples_per_period_unrounded == pytest.approx(2.1507613, rel=1e-7)
    assert paper.samples_per_period == 3
    exact = plan(h, 4, p=0.75, exact=True, **kwargs)
    assert (exact.samples_per_period, exact.samples_per_year) == (2, math.ceil(365 * 2 / 30))
    assert exact.detection_probability == pytest.approx(0.7997288291, abs=1e-10)
    assert exact.samples_per_period_unrounded is None


def test_fractional_number_of_periods_is_a_real_exponent():
    # T = 45 days, T_m = 30 → the run is 1.5 periods: detection = 1 − (1−q)^(1.5·s).
    h = flops_for(10, days=45)
    q = plan(h, 1000, period_days=30, run_days=45).catch_probability
    assert q == pytest.approx(0.01 * (1 - math.exp(-3)), rel=1e-12)
    for s in (1, 7, 40):
        assert detection_probability(s, h, 1000, period_days=30, run_days=45) == pytest.approx(
            1 - (1 - q) ** (1.5 * s), rel=1e-12
        )
        miss = exact_period_miss_probability(1000, 10, s, 0.1, 30)
        assert detection_probability(s, h, 1000, period_days=30, run_days=45, exact=True) == pytest.approx(
            1 - miss**1.5, rel=1e-12
        )


# --------------------------------------------------------------------------------------------------
# Limits and edges


def test_samples_grow_without_bound_as_p_goes_to_one():
    previous = 0
    for k in range(1, 16):
        p = 1 - 10.0**-k
        result = plan(10**25, 100_000, p=p)
        assert result.samples_per_period > previous and result.detection_probability >= p
        # s is proportional to −log(1 − p): about k times that of p = 0.9
        expected = math.log1p(-p) / math.log(0.1) * 62.7154639
        assert result.samples_per_period_unrounded == pytest.approx(expected, rel=1e-8)
        assert result.samples_per_period_unrounded == pytest.approx(k * 62.7154639, rel=1e-2)
        previous = result.samples_per_period
    with pytest.raises(PlanError, match="p=1 needs infinitely many samples") as error:
        plan(10**25, 100_000, p=1)
    assert error.value.field == "p"
    with pytest.raises(PlanError, match="p=1"):
        plan(10**25, 100_000, p=1, exact=True)


def test_p_equal_to_one_when_every_sample_catches():
    # N = C and f·T_m = 60: 1 − q = e^−60 rounds q to exactly 1.0, so one sample per period is certain.
    h = flops_for(10)
    for exact in (False, True):
        result = plan(h, 10, p=1, snapshot_rate=2, exact=exact)
        assert result.catch_probability == 1.0
        assert result.samples_per_period == 1 and result.detection_probability == 1.0


@pytest.mark.parametrize("p", [0, -0.1, 1.5, math.nan, math.inf, "lots", None, True])
def test_p_must_be_a_probability(p):
    with pytest.raises(PlanError) as error:
        plan(10**25, 100_000, p=p)
    assert error.value.field == "p"


def test_n_approaching_c():
    c = 1000
    at_capacity = plan(flops_for(c), c)  # N == C: possible, every chip is in use
    assert not at_capacity.impossible and at_capacity.chips_needed == c
    assert at_capacity.catch_probability == pytest.approx(1 - math.exp(-3), rel=1e-14)
    assert at_capacity.samples_per_period == 1 and at_capacity.detection_probability > 0.999
    one_flop_more = plan(flops_for(c) + 1, c)
    assert one_flop_more.impossible and one_flop_more.chips_needed == c + 1
    # approaching C from below, fewer and fewer samples are needed
    counts = [plan(flops_for(n), c, snapshot_rate=0.001).samples_per_period for n in (1, 10, 100, 500, 999, 1000)]
    assert counts == sorted(counts, reverse=True) and counts[0] > counts[-1]
    exact = plan(flops_for(c), c, exact=True)
    assert exact.samples_per_period == 1 and not exact.impossible


def test_q_close_to_one_keeps_its_precision():
    # N = C, f·T_m = 30: 1 − q = e^−30 = 9.36e-14 exactly, where 1 − float(q) would be off by ~0.1 %.
    model = sampling_plans._model(flops_for(100), 100, 1, 30, 365, 1e15)
    assert model.log1m_q == pytest.approx(-30, rel=1e-14)
    # and q = 1 − e^−30·… with a few spare chips: 1 − q = (1 − ρ) + ρ·e^−30
    model = sampling_plans._model(flops_for(99), 100, 1, 30, 365, 1e15)
    assert model.log1m_q == pytest.approx(math.log(0.01 + 0.99 * math.exp(-30)), rel=1e-14)


def test_more_chips_than_needed_is_impossible_and_says_so():
    for exact in (False, True):
        result = plan(10**25, 317, exact=exact)
        assert result.impossible and result.chips_needed == 318
        assert result.as_dict() == {"impossible": True, "chips_needed": 318}
        assert (result.samples_per_period, result.samples_per_year, result.detection_probability) == (0, 0, None)
    assert plan(10**25, 0).as_dict() == {"impossible": True, "chips_needed": 318}  # a prover with no chips
    with pytest.raises(ImpossibleRun, match="needs 318 chips but the prover holds only 317"):
        detection_probability(10, 10**25, 317)
    with pytest.raises(ImpossibleRun):
        detection_probability(10, 10**25, 317, exact=True)


def test_tiny_q_is_accurate():
    # H = 1 FLOP on 10^7 chips: N = 1/3.1536e22, q = N/C·r ≈ 3.0e-30. 1 − q is 1.0 in floats, so the
    # naive log(1 − q) would be 0 and s infinite; log1p gives s = −ln(0.1)/q · 30/365 to full precision.
    q = float(Fraction(1, A_YEAR * 10**7)) * -math.expm1(-3)
    result = plan(1, 10**7)
    assert result.catch_probability == pytest.approx(q, rel=1e-15)
    assert result.samples_per_period_unrounded == pytest.approx(math.log(10) / q * 30 / 365, rel=1e-13)
    assert result.detection_probability == pytest.approx(0.9, rel=1e-12)
    # q below the smallest float (≈ 3e-330): still planned, in log space, when p is tiny too.
    h = Fraction(1, 10**300)
    log_q = -math.log(10**300 * A_YEAR * 10**7) + math.log(-math.expm1(-3))
    tiny = plan(h, 10**7, p=1e-300)
    assert tiny.catch_probability == 0.0
    expected = math.exp(math.log(1e-300) - log_q + math.log(30 / 365))
    assert tiny.samples_per_period_unrounded == pytest.approx(expected, rel=1e-12)
    assert tiny.samples_per_period == math.ceil(tiny.samples_per_period_unrounded)
    with pytest.raises(PlanError, match="too small to find by sampling") as error:
        plan(h, 10**7)  # p = 0.9 would need about 10^329 samples per period
    assert error.value.field == "flops"


def test_tiny_snapshot_rate_is_accurate():
    # f·T_m = 3e-12: r = −expm1(−3e-12) = 3e-12·(1 − 1.5e-12), where 1 − e^−3e-12 loses 4 digits.
    result = plan(flops_for(1000), 10**6, snapshot_rate=1e-13)
    q = 1e-3 * -math.expm1(-3e-12)
    assert result.catch_probability == pytest.approx(q, rel=1e-15)
    assert result.samples_per_period_unrounded == pytest.approx(-math.log(0.1) / -math.log1p(-q) * 30 / 365, rel=1e-13)


def test_huge_snapshot_rate_stays_finite():
    for exact in (False, True):
        result = plan(flops_for(10), 100, snapshot_rate=1e300, exact=exact)
        assert result.samples_per_period >= 1 and 0.9 <= result.detection_probability <= 1


def test_at_least_one_sample_per_period_when_possible():
    result = plan(flops_for(999), 1000, p=0.01)
    assert result.samples_per_period_unrounded < 0.01
    assert (result.samples_per_period, result.samples_per_year) == (1, 1)


def test_period_may_not_exceed_the_run():
    with pytest.raises(PlanError, match="longer than the run") as error:
        plan(10**25, 10**5, period_days=31, run_days=30)
    assert error.value.field == "period_days"
    assert plan(10**25, 10**5, period_days=30, run_days=30).periods == 1


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(flops=0), "flops"),
        (dict(flops=-1e25), "flops"),
        (dict(flops=math.nan), "flops"),
        (dict(flops=math.inf), "flops"),
        (dict(flops="lots"), "flops"),
        (dict(chips=-1), "chips"),
        (dict(chips=10.5), "chips"),
        (dict(chips="many"), "chips"),
        (dict(snapshot_rate=0), "snapshot_rate"),
        (dict(snapshot_rate=-0.1), "snapshot_rate"),
        (dict(snapshot_rate=math.inf), "snapshot_rate"),
        (dict(period_days=0), "period_days"),
        (dict(run_days=-365), "run_days"),
        (dict(run_days=math.nan), "run_days"),
        (dict(flops_per_chip_second=0), "flops_per_chip_second"),
        (dict(snapshot_rate=1e-320, period_days=1e-10), "snapshot_rate"),
    ],
)
def test_bad_arguments_name_the_parameter(kwargs, field):
    arguments = dict(flops=10**25, chips=100_000) | kwargs
    with pytest.raises(PlanError) as error:
        plan(**arguments)
    assert error.value.field == field and str(error.value).startswith(field + ":")


def test_exact_plan_may_be_unattainable():
    # 10 chips all used, f·T_m = 0.003: inspecting every chip every period still misses most runs.
    with pytest.raises(UnattainableTarget) as error:
        plan(flops_for(10), 10, snapshot_rate=1e-4, exact=True)
    best = 1 - math.exp(-0.003 * 10 * 365 / 30)
    assert error.value.field == "p" and error.value.max_detection_probability == pytest.approx(best, rel=1e-12)
    # the paper's with-replacement formula keeps going past C
    assert plan(flops_for(10), 10, snapshot_rate=1e-4).samples_per_period > 10


def test_integral_floats_and_strings_are_chip_counts():
    assert plan(10**25, 1e5) == plan(10**25, 100_000) == plan(10**25, "1e5")


# --------------------------------------------------------------------------------------------------
# The exact model against enumeration, Monte Carlo and the paper's limit


def brute_force_period_miss(chips: int, used: int, samples: int, r: float) -> float:
    """Enumerate every logging pattern of the used chips and every sample: P(no sampled chip logged)."""
    draws = list(itertools.combinations(range(chips), samples))
    total = 0.0
    for pattern in range(1 << used):
        logged = {chip for chip in range(used) if pattern >> chip & 1}
        weight = r ** len(logged) * (1 - r) ** (used - len(logged))
        total += weight * sum(1 for draw in draws if logged.isdisjoint(draw)) / len(draws)
    return total


def test_exact_model_matches_enumeration_for_small_provers():
    rate, period = 0.02, 30  # r = 1 − e^−0.6 = 0.4512
    r = -math.expm1(-rate * period)
    cases = [(c, k, s) for c in range(1, 8) for k in range(c + 1) for s in range(c + 1)]
    cases += [(12, 5, 6), (12, 3, 11), (12, 12, 4), (11, 6, 7)]
    for chips, used, samples in cases:
        expected = brute_force_period_miss(chips, used, samples, r)
        got = exact_period_miss_probability(chips, used, samples, rate, period)
        assert got == pytest.approx(expected, rel=1e-12, abs=1e-300), (chips, used, samples)


def test_exact_model_matches_monte_carlo():
    # 10 chips, 3 used, 3 periods of 30 days, f = 0.01/day; each period draw 3 chips without replacement;
    # a used chip's first snapshot arrives after an exponential wait of mean 100 days.
    chips, used, samples, rate, period, periods = 10, 3, 3, 0.01, 30, 3
    h = flops_for(used, days=period * periods)
    expected = detection_probability(
        samples, h, chips, snapshot_rate=rate, period_days=period, run_days=period * periods, exact=True
    )
    rng = random.Random(20230415)
    trials = 20_000
    caught = 0
    for _ in range(trials):
        caught += any(
            chip < used and rng.expovariate(rate) < period
            for _ in range(periods)
            for chip in rng.sample(range(chips), samples)
        )
    sigma = math.sqrt(expected * (1 - expected) / trials)
    assert abs(caught / trials - expected) < 4 * sigma


def test_exact_model_converges_to_the_paper_as_the_prover_grows():
    # N/C = 1/100 fixed; at the paper's plan (20 per period) the exact model detects a little more,
    # by an amount that shrinks like 1/C (≈ 2.06/C here).
    gaps = []
    for chips in (10**3, 10**4, 10**5, 10**6, 10**7):
        h = flops_for(chips // 100)
        s = plan(h, chips).samples_per_period
        assert s == 20 == plan(h, chips, exact=True).samples_per_period
        gaps.append(detection_probability(s, h, chips, exact=True) - detection_probability(s, h, chips))
    assert all(gap > 0 for gap in gaps)
    assert all(later < earlier / 9 for earlier, later in zip(gaps, gaps[1:]))
    assert gaps[-1] < 1e-6
    assert gaps[0] * 10**3 == pytest.approx(gaps[-1] * 10**7, rel=0.01)


def test_large_prover_against_the_product_formula():
    # With x → 0 every sampled used chip catches: P_miss = C(C−K, s)/C(C, s) = Π_{i<s} (1 − K/(C − i)).
    chips, used, samples = 10**7, 318, 6262
    product = math.exp(math.fsum(math.log1p(-used / (chips - i)) for i in range(samples)))
    assert exact_period_miss_probability(chips, used, samples, 1e4, 1) == pytest.approx(product, rel=1e-11)
    # and with x = e^−3, against the hypergeometric sum done in exact integer arithmetic
    chips, used, samples = 20_000, 40, 300
    x = Fraction(math.exp(-3))
    exact_sum = sum(
        Fraction(math.comb(used, j) * math.comb(chips - used, samples - j), math.comb(chips, samples)) * x**j
        for j in range(used + 1)
    )
    assert exact_period_miss_probability(chips, used, samples, 0.1, 30) == pytest.approx(float(exact_sum), rel=1e-12)


def test_a_plan_for_ten_million_chips_is_fast():
    start = time.perf_counter()
    for flops in (10**25, 10**26, 3 * 10**28, flops_for(5 * 10**6)):
        for rate in (0.1, 1e-4):
            plan(flops, 10**7, exact=True, snapshot_rate=rate)
    assert time.perf_counter() - start < 1.0


# --------------------------------------------------------------------------------------------------
# Detection probability of a sample size


def test_detection_probability_of_a_plan_and_its_bounds():
    assert detection_probability(63, 10**25, 100_000) == plan(10**25, 100_000).detection_probability
    assert detection_probability(0, 10**25, 100_000) == 0.0
    with pytest.raises(PlanError, match="without replacement") as error:
        detection_probability(1001, 10**25, 1000, exact=True)
    assert error.value.field == "samples_per_period"
    with pytest.raises(PlanError):
        detection_probability(-1, 10**25, 1000)


# --------------------------------------------------------------------------------------------------
# Properties

probabilities = st.floats(min_value=0.05, max_value=0.999)
rates = st.floats(min_value=0.001, max_value=1.0)
periods = st.sampled_from([7, 30, 90])


@settings(max_examples=60, deadline=None)
@given(
    needed=st.integers(1, 2000),
    chips=st.integers(1, 10**6),
    more=st.integers(1, 10**6),
    p=probabilities,
    rate=rates,
    period=periods,
    exact=st.booleans(),
)
def test_more_chips_need_at_least_as_many_samples(needed, chips, more, p, rate, period, exact):
    chips = max(chips, needed)
    kwargs = dict(p=p, snapshot_rate=rate, period_days=period, exact=exact)
    try:
        small = plan(flops_for(needed), chips, **kwargs)
        large = plan(flops_for(needed), chips + more, **kwargs)
    except UnattainableTarget:
        assume(False)
    assert small.samples_per_period <= large.samples_per_period
    assert small.samples_per_year <= large.samples_per_year


@settings(max_examples=60, deadline=None)
@given(
    flops=st.integers(10**18, 10**27),
    bigger=st.integers(1, 10**27),
    chips=st.integers(1, 10**6),
    p=probabilities,
    rate=rates,
    period=periods,
    exact=st.booleans(),
)
def test_bigger_runs_need_no_more_samples(flops, bigger, chips, p, rate, period, exact):
    kwargs = dict(p=p, snapshot_rate=rate, period_days=period, exact=exact)
    try:
        small = plan(flops, chips, **kwargs)
        large = plan(flops + bigger, chips, **kwargs)
    except UnattainableTarget:
        assume(False)
    assume(not large.impossible)
    assert large.samples_per_period <= small.samples_per_period
    assert large.samples_per_year <= small.samples_per_year


@settings(max_examples=80, deadline=None)
@given(
    flops=st.integers(10**18, 10**27),
    chips=st.integers(1, 10**6),
    p=probabilities,
    rate=rates,
    period=periods,
    run_days=st.integers(90, 730),
)
def test_plans_reach_p_and_the_exact_one_is_the_smallest(flops, chips, p, rate, period, run_days):
    kwargs = dict(p=p, snapshot_rate=rate, period_days=period, run_days=run_days)
    paper = plan(flops, chips, **kwargs)
    assume(not paper.impossible)
    curve = dict(snapshot_rate=rate, period_days=period, run_days=run_days)
    assert paper.detection_probability >= p
    assert paper.detection_probability == detection_probability(paper.samples_per_period, flops, chips, **curve)
    try:
        exact = plan(flops, chips, exact=True, **kwargs)
    except UnattainableTarget as error:
        assert error.max_detection_probability < p and paper.samples_per_period > chips
        return
    s = exact.samples_per_period
    assert exact.detection_probability >= p
    assert s == 1 or detection_probability(s - 1, flops, chips, exact=True, **curve) < p
    assert s <= paper.samples_per_period
    assert exact.detection_probability >= detection_probability(s, flops, chips, **curve) - 1e-12


@settings(max_examples=40, deadline=None)
@given(needed=st.integers(1, 500), chips=st.integers(1, 5000), rate=rates, exact=st.booleans())
def test_the_curve_never_decreases(needed, chips, rate, exact):
    chips = max(chips, needed)
    sizes = sorted({round(i * chips / 29) for i in range(30)})
    values = [detection_probability(n, flops_for(needed), chips, snapshot_rate=rate, exact=exact) for n in sizes]
    assert all(0 <= v <= 1 for v in values)
    assert all(b >= a - 1e-12 for a, b in zip(values, values[1:]))


@pytest.mark.parametrize("flops", [1e40, "1e40", 10**60])
def test_a_plan_needing_more_than_2_to_53_chips_is_refused_naming_flops(flops):
    """Chips needed go on the ledger as I-JSON integers: above 2^53 - 1 the plan is not representable."""
    with pytest.raises(sampling_plans.PlanError) as error:
        sampling_plans.plan(flops, 10**6)
    assert error.value.field == "flops" and "not representable" in error.value.message
    assert sampling_plans.plan(1e26, 10**6).chips_needed < sampling_plans.MAX_CHIPS_NEEDED  # the intended value plans
