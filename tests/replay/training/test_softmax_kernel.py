"""The softmax's native passes (`native.softmax`, `native.softmax_back`) against ops._Softmax's torch reference.

The reference is ops._Softmax.reference / backward_reference, each rounding point through a recording Rounder
on the torch path (the kernel off). The native passes keep torch's exp and the reference's element-wise
operations and sum in another order (which the bounds cover): the same bits and close calls, on any number of
threads, masks (-inf) and NaN included; and the same recorded steps of a GPT.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replay.training import determinism, native, ops
from replay.training.determinism import Rounder

from ..helpers import doctored_points, gpt_steps_with_and_without_kernel, kernel_threads

pytestmark = pytest.mark.skipif(native.library() is None, reason="no C compiler: the torch path is used")


def _reference(x, dp):
    r = Rounder("record")
    lib, native._LIB = native._LIB, False
    try:
        p = ops._Softmax.reference(r, 0, x)
        dx = ops._Softmax.backward_reference(r, 1, p, dp)
    finally:
        native._LIB = lib
    return p, dx, r.entries


def _native(x, dp):
    n = x.shape[-1]
    p, (fwd,) = native.softmax(x, determinism.gamma(n + 10), determinism.SAFETY, determinism.WIDE, True)
    dx, (back,) = native.softmax_back(p, dp, ops.SOFTMAX_GRAD, determinism.SAFETY, determinism.WIDE, True)
    return p, dx, {k: e for k, e in ((0, fwd), (1, back)) if e[0]}


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.int64), b.view(torch.int64))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(1, 40),
    st.integers(1, 200),
    st.sampled_from([1, 3]),
    st.integers(0, 2**31 - 1),
    st.sampled_from(["none", "causal", "ties"]),
)
def test_the_native_softmax_is_the_reference(rows, n, threads, seed, pattern):
    """Forward and backward: the same p and dx bits and the same close calls. "causal" masks entries with
    -inf (exact zeros); "ties" makes rows of equal values, whose probabilities 1/n sit on rounding midpoints
    for some n (close calls, not vacuous) and whose gradients cancel."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n, generator=g, dtype=torch.float64).float().double() * 4
    dp = torch.randn(rows, n, generator=g, dtype=torch.float64).float().double()
    if pattern == "causal":
        x = x.masked_fill(torch.ones(rows, n, dtype=torch.bool).triu(1), -math.inf)
    elif pattern == "ties":
        x[::2] = 0.5
        dp[::2] = 1.0
    want = _reference(x, dp)
    with kernel_threads(threads):
        got = _native(x, dp)
    assert _same(got[0], want[0]) and _same(got[1], want[1])
    assert got[2] == want[2]


def test_ties_are_close_calls_in_both():
    """Rows of n equal values, n = 1..69: p = 1/n everywhere and a gradient that cancels to about zero (dp all
    ones): the same bits and entries as the reference at every width, and some widths log close calls."""
    found = False
    for n in range(1, 70):
        x = torch.zeros(4, n, dtype=torch.float64)
        dp = torch.ones(4, n, dtype=torch.float64)
        got, want = _native(x, dp), _reference(x, dp)
        assert _same(got[0], want[0]) and _same(got[1], want[1]) and got[2] == want[2]
        found = found or bool(got[2])
    assert found  # not vacuous: some width's 1/n (or its cancelled gradient) is logged


def test_non_finite_rows_give_the_references_values():
    x = torch.randn(6, 9, dtype=torch.float64).float().double()
    x[0, 2], x[1, :] = math.nan, -math.inf  # a NaN row; a fully masked row (NaN in torch too)
    x[2, 4], x[3, 0] = math.inf, 3e38
    dp = torch.randn(6, 9, dtype=torch.float64).float().double()
    dp[4, 1] = math.nan
    got, want = _native(x, dp), _reference(x, dp)
    for a, b in zip(got[:2], want[:2]):
        assert torch.equal(a.isnan(), b.isnan())
        assert _same(a.nan_to_num(0.0), b.nan_to_num(0.0))
    assert got[2] == want[2]


def test_the_native_passes_decline_what_they_do_not_take():
    x = torch.randn(4, 6, dtype=torch.float64)
    args = (0.1, 4.0, 8.0, True)
    assert native.softmax(x, *args) is not None
    assert native.softmax(x.t(), *args) is None  # not contiguous
    assert native.softmax(x.float(), *args) is None
    assert native.softmax(x[:0], *args) is None
    p = native.softmax(x, *args)[0]
    back = (ops.SOFTMAX_GRAD, 4.0, 8.0, True)
    assert native.softmax_back(p, x, *back) is not None
    assert native.softmax_back(p, x[:3], *back) is None  # another shape
    assert native.softmax_back(p, x.t().contiguous().t(), *back) is None


@pytest.mark.parametrize("threads", [1, 2])
def test_recorded_gpt_steps_with_the_native_softmax_are_the_references(threads, monkeypatch):
    """Three recorded steps with the kernel (its softmax passes in use) and on the torch path: the same
    logs and state; the first step's log replays to the same state with the kernel on and off."""
    calls = []
    forward, backward = native.softmax, native.softmax_back
    monkeypatch.setattr(native, "softmax", lambda *a: calls.append("f") or forward(*a))
    monkeypatch.setattr(native, "softmax_back", lambda *a: calls.append("b") or backward(*a))
    gpt_steps_with_and_without_kernel(monkeypatch, 9, threads)
    assert {"f", "b"} <= set(calls)


def test_a_probability_on_a_rounding_midpoint_is_logged_as_the_reference_logs_it():
    """The forward's rounding after torch's exp: exponentials whose quotients are exact, one of them the
    midpoint 1 - 2^-25 between float32's 1 - 2^-24 and 1 (a close call whatever the bound's size), the
    others exact float32s: the reference's p and entries (its post-exp ops on the same exponentials)."""
    e = torch.tensor([[2 - 2.0**-24, 2.0**-24], [1.0, 1.0], [3.0, 1.0]], dtype=torch.float64)
    c = determinism.gamma(2 + 10)
    r = Rounder("record")
    lib, native._LIB = native._LIB, False
    try:
        p_ref = e / e.sum(-1, keepdim=True)
        want = r.full(0, p_ref, lambda: p_ref * c, p_ref.shape)
    finally:
        native._LIB = lib
    got, (entries,) = native._softmax_pass(native.library(), e, None, e.clone(), (c, 0.0, 0.0), 4.0, 8.0, True)
    assert _same(got, want) and r.entries == {0: entries} and entries[0] == [0]


def test_a_pass_rerun_for_room_gives_the_same_probabilities_and_entries(monkeypatch):
    """A point with more close calls than the room kept for them runs its kernel again (`native._collect`):
    the exponentials are still there to read (p has a tensor of its own), so the rerun gives the same."""
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(64, 4096, generator=g, dtype=torch.float64) * 4).float().double()
    args = (determinism.gamma(x.shape[-1] + 10), 4.0, 8.0, True)
    p, (entries,) = native.softmax(x, *args)
    assert len(entries[0]) > 1  # close calls to make room for
    monkeypatch.setattr(native, "_room", lambda v: 1)
    again, (entries_again,) = native.softmax(x, *args)
    assert _same(again, p) and entries_again == entries


def _softmax_step(rounder, x, dp):
    """A softmax point's forward and backward (ops._Softmax) under `rounder`, finished as a step finishes it (a
    deferred replay's checks): (p, dx)."""
    x = x.clone().requires_grad_()
    with determinism.rounding(rounder):
        p = ops._Softmax.apply(x, "attn.softmax")
        (dx,) = torch.autograd.grad(p, x, dp)
    rounder.finish()
    return p.detach(), dx


@pytest.mark.parametrize("doctor", [None, "parity", "wide", "unlogged"])
def test_a_replay_naming_the_softmax_points_takes_the_passes_values_through_the_rounder_as_the_torch_path(
    doctor, monkeypatch
):
    """A replay whose log names the softmax's points, forward and backward: the passes' values and bounds, not rounded,
    through the rounder (`softmax_values`, `softmax_back_values`: two tensors of the output's size, where the
    reference's ops make four), against the torch path's replay. The recorded log reproduces the recorded p and dx on
    both; with every parity flipped (the other float32 in each window) both reach the same other values; a wide entry
    naming a float32 outside its window is refused by both in the same words; a log naming neither point: one plain
    pass each way."""
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(64, 4096, generator=g, dtype=torch.float64) * 4).float().double()
    dp = torch.randn(64, 4096, generator=g, dtype=torch.float64).float().double()
    rec = Rounder("record")
    want = _softmax_step(rec, x, dp)
    assert set(rec.entries) == {0, 1}  # control: both points have close calls
    entries = {} if doctor == "unlogged" else doctored_points(rec.entries, (0, 1), doctor)
    calls = []

    def counted(name, real):
        def call(*a):
            got = real(*a)
            calls.append(name if got is not None else f"{name} declined")
            return got

        return call

    for name in ("softmax", "softmax_values", "softmax_back", "softmax_back_values"):
        monkeypatch.setattr(native, name, counted(name, getattr(native, name)))
    results = []
    for lib in (native.library(), False):
        monkeypatch.setattr(native, "_LIB", lib)
        try:
            results.append(_softmax_step(Rounder("replay", entries=dict(entries)), x, dp))
        except determinism.LogMismatch as refused:
            results.append(str(refused))
    staged = {None: ["softmax_values", "softmax_back_values"], "wide": ["softmax_values"]}
    assert calls == staged.get(doctor, staged[None] if doctor == "parity" else ["softmax", "softmax_back"])
    if doctor == "wide":
        assert isinstance(results[0], str) and results[0] == results[1]
        return
    (p, dx), (p_torch, dx_torch) = results
    if doctor == "unlogged":  # the kernel's plain passes: the recording's own values, rounded to the nearer float32s
        # (the torch path's sums, in another order, may fall on the other side of a close call's midpoint: not compared)
        assert _same(p, want[0]) and _same(dx, want[1])
        return
    assert _same(p, p_torch) and _same(dx, dx_torch)
    assert (_same(p, want[0]) and _same(dx, want[1])) == (doctor != "parity")


def test_a_stage_gives_the_passes_values_and_bounds_not_rounded():
    """`softmax_values` / `softmax_back_values`: values that round to the plain passes' outputs, bit for bit, bounds
    the record pass's own (p * c forward, exactly; the backward's formula), x left as it was; they decline what the
    passes decline."""
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(24, 97, generator=g, dtype=torch.float64) * 4).float().double()
    x[::3, 60:] = -math.inf  # masked entries: exact zeros
    dp = torch.randn(24, 97, generator=g, dtype=torch.float64).float().double()
    c, before = determinism.gamma(97 + 10), x.clone()
    v, e = native.softmax_values(x, c)
    plain, _ = native.softmax(x, c, determinism.SAFETY, determinism.WIDE, False)
    assert _same(v.float().double(), plain) and _same(e, v * c) and _same(x, before)
    assert bool(((v - torch.softmax(x, -1)).abs() <= e).all())  # within its bound of torch's own softmax
    p = plain
    dx, eb = native.softmax_back_values(p, dp, ops.SOFTMAX_GRAD)
    plain_dx, _ = native.softmax_back(p, dp, ops.SOFTMAX_GRAD, determinism.SAFETY, determinism.WIDE, False)
    assert _same(dx.float().double(), plain_dx)
    ref = ops.softmax_grad_bound(p, p * dp, dx)
    assert bool(((eb - ref).abs() <= ref * 1e-12).all())
    assert native.softmax_values(x.t(), c) is None and native.softmax_values(x.float(), c) is None
    assert native.softmax_back_values(p, dp[:3], ops.SOFTMAX_GRAD) is None
    assert native.softmax_back_values(p, dp.t().contiguous().t(), ops.SOFTMAX_GRAD) is None
