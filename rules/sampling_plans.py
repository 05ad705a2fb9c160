"""Sampling plans for randomized chip inspections (docs/draws.md, How many chips; Shavit 2023, §3.2).

Pure functions, no Django. The model:

* A prover holds ``C`` chips. A violating training run of ``H`` FLOPs over ``T`` days needs
  ``N = H / (a·T)`` chips, where ``a = flops_per_chip_second × 86,400`` is one chip's FLOP per day.
  ``N`` is kept as an exact rational (``Fraction``) so that ``chips_needed = ⌈N⌉`` and the
  "impossible" test ``N > C`` are decided exactly, without floating-point rounding.
* Each chip logs a weight snapshot as a Poisson process of rate ``f`` per day, so a chip used by the
  run logs at least once in a monitoring period of ``T_m`` days with probability
  ``r = 1 − e^(−f·T_m)``.
* Each period the verifier samples ``s`` chips uniformly at random. A sampled chip *catches* the run
  if the run used it and it logged in the period.

Two plans are offered:

**The paper's plan** (sampling with replacement). One sample catches the run with probability
``q = (N/C)·r``; the run lasts ``T/T_m`` periods, so ``s`` samples per period detect it with
probability ``1 − (1−q)^(s·T/T_m)``. Setting that to ``p`` gives

    s = log(1−p) / log(1−q) · T_m / T            samples per period (real number),
    samples_per_period = ⌈s⌉,   samples_per_year = ⌈365·s / T_m⌉   (both from the unrounded s).

Being with replacement, this plan may ask for more samples per period than the prover has chips.

**The exact plan** (sampling without replacement). The run uses ``K = ⌈N⌉`` chips (a run cannot use
a fraction of a chip). If ``J`` of the ``s`` sampled chips are used ones (``J`` is hypergeometric:
``C`` chips, ``K`` used, ``s`` drawn), each of them independently failed to log with probability
``x = e^(−f·T_m)``, so a period misses the run with probability

    P_miss(s) = Σ_j [C(K,j)·C(C−K, s−j) / C(C,s)] · x^j          (the hypergeometric PGF at x).

If instead the ``s`` draws were independent (with replacement, each draw's logging independent of
the others) ``J`` would be binomial and the same expectation is exactly ``(1−q)^s`` with ``N = K``:
the paper's formula is that independent-draws model. A hypergeometric law is more concentrated than
the binomial (convex order) and ``K = ⌈N⌉ ≥ N``, so the exact plan never needs more samples than the
paper's. The exact plan is the smallest integer ``s ≤ C``
with ``1 − P_miss(s)^(T/T_m) ≥ p``, found by bisection.

*Fractional number of periods.* ``T/T_m`` need not be an integer; both models treat the run as
``T/T_m`` independent periods and use it as a real exponent — ``(1−q)^(s·T/T_m)`` in the paper's
formula and ``P_miss(s)^(T/T_m)`` in the exact one — which is exactly the convention behind the
paper's ``s = log(1−p)/log(1−q)·T_m/T``. ``period_days`` may not exceed ``run_days``: for a run shorter
than one period the model's ``r = 1 − e^(−f·T_m)`` would credit the run with snapshots logged after
it ended.

Numerics: everything is in log space (``log1p``/``expm1``); ``P_miss`` is summed outward from the mode
of its terms (log-concave, so a few standard deviations suffice) with the mode's term computed from
log-binomials built on a cancellation-free log-gamma ratio, so plans for ``C = 10^7`` take
milliseconds and tiny ``q`` (down to and below the smallest float) keeps its relative accuracy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

__all__ = [  # what the app uses: campaigns' plans (planning.py) and manage.py plan_inspections
    "DAYS_PER_YEAR",
    "DEFAULT_FLOPS_PER_CHIP_SECOND",
    "DEFAULT_P",
    "DEFAULT_PERIOD_DAYS",
    "DEFAULT_RUN_DAYS",
    "DEFAULT_SNAPSHOT_RATE",
    "SECONDS_PER_DAY",
    "ImpossibleRun",
    "Plan",
    "PlanError",
    "UnattainableTarget",
    "detection_probability",
    "period_detection_probability",
    "plan",
]

SECONDS_PER_DAY = 86_400
DAYS_PER_YEAR = 365
DEFAULT_P = 0.9
DEFAULT_SNAPSHOT_RATE = 0.1  # snapshots per chip per day
DEFAULT_PERIOD_DAYS = 30
DEFAULT_RUN_DAYS = 365
DEFAULT_FLOPS_PER_CHIP_SECOND = 1e15  # H100 dense 16-bit, full utilisation

# f·T_m beyond this is treated as this: e^(−10^4) is already 0 in double precision.
_MAX_SNAPSHOTS_PER_PERIOD = 1e4
# Summation of P_miss stops when a term falls below this fraction of the running sum.
_TAIL = 1e-18
# Below this, −log(1−q) (or the per-period exponent) is handled through its logarithm.
_TINY = 1e-290

Number = int | float | Fraction | Decimal


# Plans go on the ledger as I-JSON, whose integers are exact only up to 2^53 - 1.
MAX_CHIPS_NEEDED = 2**53 - 1


class PlanError(ValueError):
    """A bad argument: ``field`` names the offending parameter (as in :func:`plan`)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class ImpossibleRun(PlanError):
    """The run needs more chips than the prover holds: there is nothing to detect."""

    def __init__(self, chips_needed: int, chips: int):
        super().__init__(
            "chips",
            f"the run needs {chips_needed} chips but the prover holds only {chips}: it is impossible for this prover",
        )
        self.chips_needed = chips_needed
        self.chips = chips


class UnattainableTarget(PlanError):
    """Exact model only: even inspecting every chip every period falls short of ``p``."""

    def __init__(self, p: float, max_detection_probability: float, chips: int):
        super().__init__(
            "p",
            f"p={p!r} is unattainable without replacement: inspecting all {chips} chips every period "
            f"detects the run with probability {max_detection_probability!r} at most",
        )
        self.p = p
        self.max_detection_probability = max_detection_probability
        self.chips = chips


@dataclass(frozen=True)
class Plan:
    """An inspection plan.

    ``detection_probability`` is the probability achieved over the whole run with the rounded-up
    ``samples_per_period``. An impossible run has ``impossible=True``, zero samples (there is nothing
    to catch) and ``detection_probability=None``.
    """

    chips_needed: int
    samples_per_period: int
    samples_per_year: int
    detection_probability: float | None
    impossible: bool
    exact: bool
    chips: int
    target_probability: float
    catch_probability: float | None  # q, one with-replacement sample catching the run in one period
    samples_per_period_unrounded: float | None  # the paper's s (None for the exact plan or an impossible run)
    periods: float  # T / T_m, the run's length in monitoring periods

    def as_dict(self) -> dict:
        """The JSON shape of ``manage.py plan_inspections --json``."""
        if self.impossible:
            return {"impossible": True, "chips_needed": self.chips_needed}
        return {
            "chips_needed": self.chips_needed,
            "samples_per_period": self.samples_per_period,
            "samples_per_year": self.samples_per_year,
            "detection_probability": self.detection_probability,
        }


# --------------------------------------------------------------------------------------------------
# Argument checking


def _exact(field: str, value) -> Fraction:
    if isinstance(value, bool):
        raise PlanError(field, f"must be a number, not {value!r}")
    try:
        return Fraction(value) if not isinstance(value, str) else Fraction(value.strip())
    except (TypeError, ValueError, OverflowError, ZeroDivisionError, ArithmeticError):
        raise PlanError(field, f"must be a finite number, not {value!r}") from None


def _positive(field: str, value) -> float:
    if isinstance(value, bool):
        raise PlanError(field, f"must be a number, not {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise PlanError(field, f"must be a number, not {value!r}") from None
    if not math.isfinite(number) or number <= 0:
        raise PlanError(field, f"must be a positive finite number, not {value!r}")
    return number


def _chip_count(value) -> int:
    count = _exact("chips", value)
    if count.denominator != 1 or count < 0:
        raise PlanError("chips", f"must be a whole number of chips, 0 or more, not {value!r}")
    return int(count)


def _probability(value) -> float:
    if isinstance(value, bool):
        raise PlanError("p", f"must be a probability, not {value!r}")
    try:
        p = float(value)
    except (TypeError, ValueError, OverflowError):
        raise PlanError("p", f"must be a probability, not {value!r}") from None
    if not (0 < p <= 1):  # also rejects NaN
        raise PlanError("p", f"must be a probability in (0, 1), not {value!r}")
    return p


def _log_fraction(value: Fraction) -> float:
    """log of a positive rational, accurate even when it under- or overflows a float."""
    try:
        as_float = float(value)
    except OverflowError:
        as_float = math.inf
    if 1e-300 < as_float < 1e300:
        return math.log(as_float)
    return math.log(value.numerator) - math.log(value.denominator)


def _required_chips(
    flops: Number | str,
    run_days: Number = DEFAULT_RUN_DAYS,
    flops_per_chip_second: Number = DEFAULT_FLOPS_PER_CHIP_SECOND,
) -> Fraction:
    """``N = H / (a·T)``, exactly: the chips a run of ``flops`` over ``run_days`` needs."""
    h = _exact("flops", flops)
    if h <= 0:
        raise PlanError("flops", f"must be positive: a run of {flops!r} FLOPs is nothing to detect")
    days = _exact("run_days", _positive("run_days", run_days))
    rate = _exact("flops_per_chip_second", _positive("flops_per_chip_second", flops_per_chip_second))
    return h / (rate * SECONDS_PER_DAY * days)


@dataclass(frozen=True)
class _Model:
    n: Fraction  # N, exact
    chips_needed: int  # ⌈N⌉
    chips: int  # C
    impossible: bool
    snapshots: float  # f·T_m (expected snapshots of one chip in one period), capped
    q: float  # (N/C)·(1 − e^(−f·T_m))
    log1m_q: float  # log(1 − q), ≤ 0
    log_neg_log1m_q: float  # log(−log(1 − q)), finite even when q underflows
    periods: float  # T / T_m
    period_days: float
    run_days: float


def _model(flops, chips, snapshot_rate, period_days, run_days, flops_per_chip_second) -> _Model:
    c = _chip_count(chips)
    f = _positive("snapshot_rate", snapshot_rate)
    t_m = _positive("period_days", period_days)
    t = _positive("run_days", run_days)
    if t_m > t:
        raise PlanError(
            "period_days",
            f"a monitoring period of {t_m!r} days is longer than the run ({t!r} days); "
            "the model needs the run to span at least one whole period",
        )
    n = _required_chips(flops, t, flops_per_chip_second)
    needed = math.ceil(n)
    if needed > MAX_CHIPS_NEEDED:
        raise PlanError(
            "flops",
            f"the run needs {needed:.3e} chips, more than 2^53 - 1: the plan is not representable "
            "(in JSON, on the ledger) — is the exponent a typo?",
        )
    periods = t / t_m
    snapshots = f * t_m
    if snapshots == 0:
        raise PlanError("snapshot_rate", "snapshot_rate × period_days underflows: no chip would ever log a snapshot")
    snapshots = min(snapshots, _MAX_SNAPSHOTS_PER_PERIOD)
    if c == 0 or n > c:
        return _Model(n, needed, c, True, snapshots, math.nan, math.nan, math.nan, periods, t_m, t)

    rho = n / c  # 0 < rho ≤ 1, exact
    r = -math.expm1(-snapshots)  # P(a chip logs in a period), accurate for tiny f·T_m
    q = float(rho) * r
    if q < 0.5:
        log1m_q = math.log1p(-q)
    else:  # 1 − q = (1 − ρ) + ρ·e^(−f·T_m): a sum of non-negative terms, no cancellation near q = 1
        log_rho = _log_fraction(rho)
        log_rest = _log_fraction(1 - rho) if rho < 1 else -math.inf
        log1m_q = _logaddexp(log_rest, log_rho - snapshots)
    if -log1m_q > _TINY:
        log_neg = math.log(-log1m_q)
    else:  # q is (nearly) below the float range: −log(1−q) = q·(1 + q/2 + …)
        log_q = _log_fraction(rho) + math.log(r)
        log_neg = log_q + math.exp(log_q) / 2
    return _Model(n, needed, c, False, snapshots, q, log1m_q, log_neg, periods, t_m, t)


def _logaddexp(a: float, b: float) -> float:
    if a == -math.inf:
        return b
    if b == -math.inf:
        return a
    high, low = max(a, b), min(a, b)
    return high + math.log1p(math.exp(low - high))


# --------------------------------------------------------------------------------------------------
# The paper's model (with replacement)


def _paper_run_log_miss(model: _Model, samples: int) -> float:
    """log P(the run is missed) with ``samples`` per period: samples·(T/T_m)·log(1−q)."""
    if samples == 0:
        return 0.0
    if -model.log1m_q > _TINY:
        return samples * model.periods * model.log1m_q
    return -math.exp(math.log(samples) + math.log(model.periods) + model.log_neg_log1m_q)


def _paper_samples(model: _Model, p: float) -> float:
    """The paper's real s = log(1−p)/log(1−q)·T_m/T; PlanError if it overflows a float."""
    if p == 1:
        return 0.0  # only reached when q == 1: one sample always catches the run
    neg_log1m_p = -math.log1p(-p)
    if -model.log1m_q > _TINY:
        s = neg_log1m_p / -model.log1m_q / model.periods
        if math.isfinite(s):
            return s
    log_s = math.log(neg_log1m_p) - model.log_neg_log1m_q - math.log(model.periods)
    if log_s > 700:
        raise PlanError(
            "flops",
            f"the run is too small to find by sampling: about 10^{log_s / math.log(10):.0f} samples per period "
            f"would be needed (q = {model.q!r})",
        )
    return math.exp(log_s)


# --------------------------------------------------------------------------------------------------
# The exact model (without replacement)


def _log_gamma_ratio(x: float, h: float) -> float:
    """log Γ(x+h) − log Γ(x) for x ≥ 1, h ≥ 0, without the cancellation of two large lgammas."""
    if h == 0:
        return 0.0
    if x < 10:
        return math.lgamma(x + h) - math.lgamma(x)
    # Stirling: log Γ(z) = (z−½)·log z − z + ½·log 2π + c(z); the difference of the leading terms is
    # (x−½)·log1p(h/x) + h·(log(x+h) − 1), which has no cancellation.
    return (x - 0.5) * math.log1p(h / x) + h * (math.log(x + h) - 1) + _stirling_tail(x + h) - _stirling_tail(x)


def _stirling_tail(z: float) -> float:
    inv = 1.0 / z
    inv2 = inv * inv
    return inv * (1 / 12 - inv2 * (1 / 360 - inv2 * (1 / 1260 - inv2 * (1 / 1680 - inv2 / 1188))))


def _log_binomial(n: int, k: int) -> float:
    k = min(k, n - k)
    if k <= 0:
        return 0.0
    return _log_gamma_ratio(n - k + 1, k) - math.lgamma(k + 1)


def _log_period_miss(chips: int, used: int, samples: int, snapshots: float) -> float:
    """log P(one period misses the run) without replacement.

    ``log Σ_j Hyp(j; chips, used, samples) · x^j`` with ``log x = −snapshots``. The terms are
    log-concave in j, so they are summed outward from their mode until negligible.
    """
    if samples == 0 or used == 0:
        return 0.0
    unused = chips - used
    lo, hi = max(0, samples - unused), min(used, samples)
    log_x = -snapshots
    x = math.exp(log_x)

    def ratio(j: int) -> float:  # term(j+1) / term(j), decreasing in j
        return (used - j) * (samples - j) / ((j + 1) * (unused - samples + j + 1)) * x

    a, b = lo, hi  # the mode: the first j with j == hi or ratio(j) < 1
    while a < b:
        mid = (a + b) // 2
        if ratio(mid) < 1:
            b = mid
        else:
            a = mid + 1
    mode = a
    log_mode_term = (
        _log_binomial(used, mode)
        + _log_binomial(unused, samples - mode)
        - _log_binomial(chips, samples)
        + (mode * log_x if mode else 0.0)
    )
    total, term, j = 1.0, 1.0, mode
    while j < hi:
        term *= ratio(j)
        j += 1
        total += term
        if term < _TAIL * total:
            break
    term, j = 1.0, mode
    while j > lo:
        term /= ratio(j - 1)  # ratio(j−1) ≥ 1 below the mode
        j -= 1
        total += term
        if term < _TAIL * total:
            break
    return min(0.0, log_mode_term + math.log(total))


def _exact_run_log_miss(model: _Model, samples: int) -> float:
    return model.periods * _log_period_miss(model.chips, model.chips_needed, samples, model.snapshots)


def _exact_period_miss_probability(
    chips: int,
    used: int,
    samples: int,
    snapshot_rate: Number = DEFAULT_SNAPSHOT_RATE,
    period_days: Number = DEFAULT_PERIOD_DAYS,
) -> float:
    """P(one period misses the run): ``samples`` of ``chips`` drawn without replacement, ``used`` of
    which the run uses, each used chip logging in the period with probability 1 − e^(−f·T_m)."""
    c = _chip_count(chips)
    if isinstance(used, bool) or not isinstance(used, int) or not 0 <= used <= c:
        raise PlanError("used", f"must be a whole number of chips between 0 and {c}, not {used!r}")
    if isinstance(samples, bool) or not isinstance(samples, int) or not 0 <= samples <= c:
        raise PlanError("samples_per_period", f"must be a whole number between 0 and {c}, not {samples!r}")
    snapshots = _positive("snapshot_rate", snapshot_rate) * _positive("period_days", period_days)
    return math.exp(_log_period_miss(c, used, samples, min(snapshots, _MAX_SNAPSHOTS_PER_PERIOD)))


# --------------------------------------------------------------------------------------------------
# Public API


def _run_detection(model: _Model, samples: int, exact: bool) -> float:
    log_miss = _exact_run_log_miss(model, samples) if exact else _paper_run_log_miss(model, samples)
    return 0.0 - math.expm1(log_miss)  # 0.0 - … turns −0.0 into 0.0


def _sample_count(model: _Model, samples, exact: bool) -> int:
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
        raise PlanError("samples_per_period", f"must be a whole number, 0 or more, not {samples!r}")
    if exact and samples > model.chips:
        raise PlanError(
            "samples_per_period",
            f"cannot draw {samples} chips without replacement from a prover holding {model.chips}",
        )
    return samples


def detection_probability(
    samples_per_period: int,
    flops: Number | str,
    chips: int,
    snapshot_rate: Number = DEFAULT_SNAPSHOT_RATE,
    period_days: Number = DEFAULT_PERIOD_DAYS,
    run_days: Number = DEFAULT_RUN_DAYS,
    flops_per_chip_second: Number = DEFAULT_FLOPS_PER_CHIP_SECOND,
    exact: bool = False,
) -> float:
    """Probability that ``samples_per_period`` inspections each period catch the run before it ends.

    Paper model: ``1 − (1−q)^(s·T/T_m)``; exact model: ``1 − P_miss(s)^(T/T_m)`` (s ≤ C).
    Raises :class:`ImpossibleRun` when the run needs more chips than the prover holds.
    """
    model = _model(flops, chips, snapshot_rate, period_days, run_days, flops_per_chip_second)
    if model.impossible:
        raise ImpossibleRun(model.chips_needed, model.chips)
    return _run_detection(model, _sample_count(model, samples_per_period, exact), exact)


def period_detection_probability(
    samples: int,
    flops: Number | str,
    chips: int,
    snapshot_rate: Number = DEFAULT_SNAPSHOT_RATE,
    period_days: Number = DEFAULT_PERIOD_DAYS,
    run_days: Number = DEFAULT_RUN_DAYS,
    flops_per_chip_second: Number = DEFAULT_FLOPS_PER_CHIP_SECOND,
) -> float:
    """Probability that one period's sample of ``samples`` chips, drawn without replacement as draws are,
    catches the run: ``1 − P_miss(s)`` (the exact model, one period). Raises :class:`ImpossibleRun`."""
    model = _model(flops, chips, snapshot_rate, period_days, run_days, flops_per_chip_second)
    if model.impossible:
        raise ImpossibleRun(model.chips_needed, model.chips)
    samples = _sample_count(model, samples, exact=True)
    return 0.0 - math.expm1(_log_period_miss(model.chips, model.chips_needed, samples, model.snapshots))


def plan(
    flops: Number | str,
    chips: int,
    p: Number = DEFAULT_P,
    snapshot_rate: Number = DEFAULT_SNAPSHOT_RATE,
    period_days: Number = DEFAULT_PERIOD_DAYS,
    run_days: Number = DEFAULT_RUN_DAYS,
    flops_per_chip_second: Number = DEFAULT_FLOPS_PER_CHIP_SECOND,
    exact: bool = False,
) -> Plan:
    """The inspection plan that catches a run of ``flops`` FLOPs on a prover of ``chips`` chips with
    probability at least ``p``.

    ``exact=False``: the paper's plan, ``samples_per_period = ⌈s⌉`` and ``samples_per_year =
    ⌈365·s/T_m⌉`` from the unrounded ``s`` (at least one sample per period whenever the run is
    possible). ``exact=True``: the smallest ``s ≤ C`` that reaches ``p`` without replacement, and
    ``⌈365·s/T_m⌉`` a year. ``p = 1`` is accepted only when one sample always catches the run
    (``q == 1``: every chip used and logging certain to float precision).
    """
    target = _probability(p)
    model = _model(flops, chips, snapshot_rate, period_days, run_days, flops_per_chip_second)
    if model.impossible:
        return Plan(
            chips_needed=model.chips_needed,
            samples_per_period=0,
            samples_per_year=0,
            detection_probability=None,
            impossible=True,
            exact=exact,
            chips=model.chips,
            target_probability=target,
            catch_probability=None,
            samples_per_period_unrounded=None,
            periods=model.periods,
        )
    if target == 1 and model.q < 1:
        raise PlanError(
            "p",
            f"p=1 needs infinitely many samples unless every sample catches the run (q=1); here q={model.q!r}",
        )
    if exact:
        per_period, per_year, unrounded = _exact_plan(model, target), None, None
        per_year = math.ceil(Fraction(DAYS_PER_YEAR) * per_period / Fraction(model.period_days))
    else:
        unrounded = _paper_samples(model, target)
        per_period = max(1, math.ceil(unrounded))
        for _ in range(4):  # guard the ceiling against rounding in s: the plan must reach p
            if _run_detection(model, per_period, False) >= target:
                break
            per_period += 1
        yearly = DAYS_PER_YEAR * unrounded / model.period_days
        if not math.isfinite(yearly):
            raise PlanError("flops", "the run is too small to find by sampling: samples per year overflow")
        per_year = max(1, math.ceil(yearly))
    return Plan(
        chips_needed=model.chips_needed,
        samples_per_period=per_period,
        samples_per_year=per_year,
        detection_probability=_run_detection(model, per_period, exact),
        impossible=False,
        exact=exact,
        chips=model.chips,
        target_probability=target,
        catch_probability=model.q,
        samples_per_period_unrounded=unrounded,
        periods=model.periods,
    )


def _exact_plan(model: _Model, target: float) -> int:
    """The smallest s in [1, C] with exact detection ≥ target (bisection).

    The invariant detection(lo) < target ≤ detection(hi) makes the answer satisfy both
    detection(s) ≥ p and detection(s−1) < p as computed, whatever rounding does near the boundary.
    """

    def reaches(samples: int) -> bool:
        return _run_detection(model, samples, True) >= target

    hi = model.chips
    try:  # the paper's plan (with N ≤ ⌈N⌉ and with replacement) is an upper bound in exact arithmetic
        paper = max(1, math.ceil(_paper_samples(model, target)))
    except PlanError:
        paper = hi
    if paper < hi and reaches(paper):
        hi = paper
    elif not reaches(hi):
        raise UnattainableTarget(target, _run_detection(model, hi, True), model.chips)
    lo = 0  # detection(0) = 0 < target
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if reaches(mid):
            hi = mid
        else:
            lo = mid
    return hi
