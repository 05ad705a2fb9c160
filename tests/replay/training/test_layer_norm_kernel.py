"""LayerNorm's fused native pass (`rp_layer_norm`, `rp_layer_norm_back`) against ops._LayerNorm's torch
reference.

The reference is ops._LayerNorm.reference / backward_reference with every rounding point through a
recording Rounder on the torch path (the kernel off). The fused pass performs the same IEEE operations
between the points and sums the points in another order (which their bounds cover): the same values
and close calls, and the same recorded training steps, on any number of threads.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replay.training import determinism, native, ops
from replay.training.determinism import Rounder

from ..helpers import gpt_steps_with_and_without_kernel, kernel_threads

needs_kernel = pytest.mark.skipif(native.library() is None, reason="no C compiler: the torch path is used")


def _f32(t: torch.Tensor) -> torch.Tensor:
    return t.float().double()


def _reference(x, w, b, dy):
    """The torch path's forward and backward at op 0 (keys 0-5): (y, xhat, rstd, dx, dw, db, entries)."""
    r = Rounder("record")
    lib, native._LIB = native._LIB, False
    try:
        with determinism.rounding(r):
            y, xhat, rstd = ops._LayerNorm.reference(r, 0, x, w, b, 1e-5)
            dx, dw, db = ops._LayerNorm.backward_reference(r, 0, dy, xhat, rstd, w)
    finally:
        native._LIB = lib
    return y, xhat, rstd, dx, dw, db, r.entries


def _fused(x, w, b, dy):
    n, rows = x.shape[-1], x.numel() // x.shape[-1]
    g_mean = determinism.gamma(n + 1) / n
    fwd = native.layer_norm(x, w, b, 1e-5, g_mean, determinism.gamma(n + 1), 4.0, 8.0, True)
    y, xhat, rstd, (mu, var) = fwd
    back = native.layer_norm_back(dy, xhat, rstd, w, g_mean, determinism.gamma(rows), 4.0, 8.0, True)
    dx, dw, db, points = back
    entries = {k: e for k, e in zip(range(6), [mu, var, *points]) if e[0]}
    return y, xhat, rstd, dx, dw, db, entries


def _midpoint_rows(x: torch.Tensor, rows: list[int]) -> None:
    """Rows whose mean is a float32 rounding midpoint exactly (every sum exact in any order): close calls
    of the mean at those rows, whatever the machine. Their deviations are small dyadics summing to 0."""
    n = x.shape[-1]
    for r in rows:
        mid = float(np.nextafter(np.float32(1.0 + r), np.float32(4e9))) / 2 + (1.0 + r) / 2  # halfway
        dev = torch.zeros(n, dtype=torch.float64)
        dev[: n // 2], dev[n // 2 : 2 * (n // 2)] = 0.25, -0.25
        x[r] = mid + dev


@needs_kernel
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(1, 40),
    st.integers(1, 300),
    st.sampled_from([1, 3]),
    st.integers(0, 2**31 - 1),
    st.booleans(),
)
def test_the_fused_layer_norm_is_the_reference(rows, n, threads, seed, midpoints):
    """Forward and backward: the same y, xhat, rstd, dx, dw, db bits and the same close calls at all six
    points, on one thread or several (rows and columns split among them)."""
    g = torch.Generator().manual_seed(seed)
    x = _f32(torch.randn(rows, n, generator=g, dtype=torch.float64) * 3 + 1)
    w, b = (_f32(torch.randn(n, generator=g, dtype=torch.float64)) for _ in range(2))
    dy = _f32(torch.randn(rows, n, generator=g, dtype=torch.float64))
    if midpoints and n >= 2:
        _midpoint_rows(x, list(range(0, rows, 3)))
    want = _reference(x, w, b, dy)
    with kernel_threads(threads):
        got = _fused(x, w, b, dy)
    for a, c in zip(got[:6], want[:6]):
        assert a.shape == c.shape and torch.equal(a.view(torch.int64), c.view(torch.int64))
    assert got[6] == want[6]
    if midpoints and n >= 2:
        assert set(range(0, rows, 3)) <= set(got[6][0][0])  # not vacuous: the means' close calls are logged


@needs_kernel
@settings(max_examples=60, deadline=None)
@given(st.integers(1, 12), st.integers(1, 200), st.integers(0, 2**31 - 1))
def test_the_layer_norms_points_have_the_references_values_and_bounds(rows, n, seed):
    """Each of the six points' values and bounds as the stages hand them to the rounder, against the torch
    reference's (ops._mean, the column sums): the same sums in other orders (lanes, pairwise), so within both
    sums' rounding (n u each), and the bounds' magnitudes complete (every term's)."""
    g = torch.Generator().manual_seed(seed)
    x = _f32(torch.randn(rows, n, generator=g, dtype=torch.float64) * 3 + 1)
    w, b, dy = (_f32(torch.randn(*shape, generator=g, dtype=torch.float64)) for shape in ((n,), (n,), (rows, n)))
    gm, got = determinism.gamma(n + 1) / n, {}

    def point(slot, v, e):
        got[slot] = (v.clone(), e.clone())
        return _f32(v)

    _, xhat, rstd = native.layer_norm_staged(x, w, b, 1e-5, gm, determinism.gamma(n + 1), point)
    native.layer_norm_back_staged(dy, xhat, rstd, w, gm, determinism.gamma(rows), point)
    d = x - _f32(got[0][0]).view(-1, 1)
    terms = {0: x, 1: d * d, 4: dy * w, 5: dy * w * xhat}  # per row: sum * (1 / n), bound sum |.| * gamma-ish
    factors = {0: gm, 1: determinism.gamma(n + 1) / n, 4: gm, 5: gm}
    for slot, t in terms.items():
        v, e = got[slot]
        want_v, want_e = t.sum(-1) * (1.0 / n), t.abs().sum(-1) * factors[slot]
        slack = 2 * (n + 2) * 2.0**-53
        assert torch.all((v - want_v).abs() <= want_e / factors[slot] * slack), slot
        assert torch.all((e - want_e).abs() <= want_e * slack), slot
    for slot, t in {2: dy * xhat, 3: dy}.items():  # dw, db: column sums over the rows
        (v, e), want_e, slack = got[slot], t.abs().sum(0) * determinism.gamma(rows), 2 * (rows + 2) * 2.0**-53
        assert torch.all((v - t.sum(0)).abs() <= t.abs().sum(0) * slack), slot
        assert torch.all((e - want_e).abs() <= want_e * slack), slot


@needs_kernel
def test_the_fused_layer_norm_takes_what_the_reference_takes_and_declines_the_rest():
    x = torch.randn(4, 6, dtype=torch.float64)
    w, b = torch.ones(6, dtype=torch.float64), torch.zeros(6, dtype=torch.float64)
    args = (1e-5, 0.1, 0.1, 4.0, 8.0, True)
    assert native.layer_norm(x, w, b, *args) is not None
    assert native.layer_norm(x.t().contiguous().t(), w, b, *args) is None  # not contiguous
    assert native.layer_norm(x.float(), w.float(), b.float(), *args) is None  # float32
    assert native.layer_norm(x, w[:5], b, *args) is None  # a weight of another width
    assert native.layer_norm(x[:0], w, b, *args) is None  # no rows
    _, xhat, rstd, _ = native.layer_norm(x, w, b, *args)
    back = (0.1, 0.1, 4.0, 8.0, True)
    assert native.layer_norm_back(x, xhat, rstd, w, *back) is not None
    assert native.layer_norm_back(x[:3], xhat, rstd, w, *back) is None  # dy of another shape
    assert native.layer_norm_back(x, xhat, rstd[:3], w, *back) is None  # an rstd per row it does not have
    assert native.layer_norm_back(x.t().contiguous().t(), xhat, rstd, w, *back) is None


@needs_kernel
def test_non_finite_inputs_give_the_references_values():
    """NaN, infinities, huge and subnormal values in a row: the same bits as the reference (NaN rows, no
    close calls from NaN bounds), the other rows untouched."""
    x = _f32(torch.randn(6, 20, dtype=torch.float64))
    x[0, 3], x[1, 0], x[2, 5], x[3, :] = math.nan, math.inf, -3e38, 1e-40
    x[4, 7] = 3e38
    w, b, dy = torch.ones(20, dtype=torch.float64), torch.zeros(20, dtype=torch.float64), x.clone()
    dy[5, 2] = math.nan
    want, got = _reference(x, w, b, dy), _fused(x, w, b, dy)
    for a, c in zip(got[:6], want[:6]):
        assert torch.equal(a.isnan(), c.isnan())
        assert torch.equal(a.nan_to_num(0.0).view(torch.int64), c.nan_to_num(0.0).view(torch.int64))
    assert got[6] == want[6]


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
def test_recorded_gpt_steps_are_the_same_with_and_without_the_kernel(threads, monkeypatch):
    """The direct path (no tracer: the fused layer norm in use) against the torch path: the same log and
    state after three steps; and the log replays with the kernel on and off."""
    calls = []
    fused = native.layer_norm
    monkeypatch.setattr(native, "layer_norm", lambda *a: calls.append(1) or fused(*a))
    gpt_steps_with_and_without_kernel(monkeypatch, 5, threads)
    assert calls  # not vacuous: the kernel's pass ran


def _ln_step(rounder, x, w, b, dy):
    """One layer norm's forward and backward under `rounder`, settled as a step is (`finish`: the torch path
    decides a replay's entries there): (y, dx, dw, db)."""
    x, w, b = (t.clone().requires_grad_() for t in (x, w, b))
    with determinism.rounding(rounder):
        y = ops.Det.layer_norm(x, w, b, "ln")
        y.backward(dy)
    rounder.finish()
    return y.detach(), x.grad, w.grad, b.grad


def _midpoint_case():
    """Means on rounding midpoints in the forward (rows 2, 5 of x) and in the backward (rows 1, 6 of dy, w all
    ones: a = mean(dy * w)), so that a recording logs both passes' points."""
    g = torch.Generator().manual_seed(4)
    x, dy = (_f32(torch.randn(8, 16, dtype=torch.float64, generator=g)) for _ in range(2))
    _midpoint_rows(x, [2, 5])
    _midpoint_rows(dy, [1, 6])
    return x, torch.ones(16, dtype=torch.float64), _f32(torch.randn(16, dtype=torch.float64, generator=g)), dy


@needs_kernel
def test_a_replay_whose_log_names_layer_norm_points_goes_in_stages_as_the_reference(monkeypatch):
    """A log naming a layer norm's points: the kernel stops at each point and the rounder applies the log
    there (`layer_norm_staged`, `layer_norm_back_staged`); the same outputs as the torch path's replay, with the
    log as recorded, with parities flipped (the other neighbour of a midpoint: a different, accepted result),
    and the same refusal for an entry that is not a close call. A log naming none: one plain pass each way."""
    x, w, b, dy = _midpoint_case()
    rec = Rounder("record")
    recorded = _ln_step(rec, x, w, b, dy)
    assert {2, 5} <= set(rec.entries[0][0]) and {1, 6} <= set(rec.entries[4][0])
    staged = []
    for name in ("layer_norm", "layer_norm_staged", "layer_norm_back", "layer_norm_back_staged"):
        fn = getattr(native, name)
        monkeypatch.setattr(native, name, lambda *a, fn=fn, name=name: staged.append(name) or fn(*a))

    def flipped(key, row):
        idx, codes = rec.entries[key]
        return {**rec.entries, key: (idx, [not c if i == row else c for i, c in zip(idx, codes)])}

    def replay(entries, lib):
        monkeypatch.setattr(native, "_LIB", lib)
        try:
            return _ln_step(Rounder("replay", entries=dict(entries)), x, w, b, dy)
        except determinism.LogMismatch as exc:
            return str(exc)

    not_a_close_call = {**rec.entries, 4: ([0], [True])}  # row 0's mean is far from any midpoint
    for entries in (rec.entries, flipped(0, 5), flipped(4, 6), not_a_close_call, {}):
        staged.clear()
        got, want = replay(entries, native.library()), replay(entries, False)
        assert staged == (
            ["layer_norm", "layer_norm_back"] if not entries else ["layer_norm_staged", "layer_norm_back_staged"]
        )
        if isinstance(want, str):
            assert got == want and "not a close call" in want
            continue
        assert all(torch.equal(a.view(torch.int64), c.view(torch.int64)) for a, c in zip(got, want))
        if entries is not rec.entries and entries:
            assert not all(torch.equal(a, c) for a, c in zip(got, recorded))  # not vacuous: the flip took


@needs_kernel
def test_a_stage_that_fails_after_the_rounder_applied_a_point_says_so(monkeypatch):
    """The torch path would meet the points again without the entries the rounder has taken: a failing later
    stage (out of memory: none allocates, so it cannot) raises, it does not fall back."""
    x, w, b, dy = _midpoint_case()
    rec = Rounder("record")
    _ln_step(rec, x, w, b, dy)
    real, calls = native.library(), []

    class FailsLast:
        def __getattr__(self, name):
            return getattr(real, name)

        def rp_layer_norm(self, block):
            calls.append(1)
            return -1 if len(calls) == 3 else real.rp_layer_norm(block)

    monkeypatch.setattr(native, "_LIB", FailsLast())
    with pytest.raises(MemoryError, match="after its points were applied"):
        _ln_step(Rounder("replay", entries=dict(rec.entries)), x, w, b, dy)
