"""The bias gradients' and the cross-entropy's native passes against ops' torch reference, and a logged point
whose bound is given as values replayed in one kernel call against `Rounder._apply`.

The references are ops' own torch formulas, each rounding point through a recording Rounder with the kernel
off. The passes keep the reference's element-wise operations and sum in another order (which the bounds
cover): the same rounded bits and close calls, on any number of threads; the cross-entropy's loss before
rounding and its bound within a few ulps of the reference's.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replay.training import native, ops
from replay.training.determinism import (
    SAFETY,
    SLOTS,
    WIDE,
    LogMismatch,
    Rounder,
    U,
    full_bound,
    gamma,
    rounding,
)

from ..helpers import doctored_entries, doctored_points, kernel_threads

pytestmark = pytest.mark.skipif(native.library() is None, reason="no C compiler: the torch path is used")


@contextlib.contextmanager
def _torch_path():
    lib, native._LIB = native._LIB, False
    try:
        yield
    finally:
        native._LIB = lib


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.int64)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same bits, but for NaN's sign and payload, which IEEE leaves open (docs/replay-limits.md): NaN
    where the other has NaN."""
    nan = a.isnan()
    return a.shape == b.shape and torch.equal(nan, b.isnan()) and torch.equal(_bits(a[~nan]), _bits(b[~nan]))


def _f32(t: torch.Tensor) -> torch.Tensor:
    return t.float().double()


def _ce_back_bound(p, targets, c, v):
    """ops._CrossEntropy.backward's bound on the torch path, its formula as written there."""
    t = targets.unsqueeze(1)
    p_minus_onehot = lambda: p.clone().scatter_add_(1, t, torch.full(t.shape, -1.0, dtype=p.dtype))
    dz = p_minus_onehot().mul_(c)
    e = p_minus_onehot().abs_().mul_(U).add_(p * gamma(v + 10)).mul_(c.abs())
    return e.add_(dz.abs().mul_(2 * U))


_SPECIAL = st.sampled_from([0.0, -0.0, 1.0, 0.5, 3.0e38, -3.0e38, 1e-45, float("inf"), float("nan")])


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    a=st.integers(1, 70),
    o=st.integers(1, 300),
    length=st.sampled_from([1, 2, 17, 64]),
    threads=st.sampled_from([1, 3]),
    seed=st.integers(0, 2**31 - 1),
    pattern=st.sampled_from(["random", "cancel", "special", "scaled"]),
    data=st.data(),
)
def test_the_native_axis_sums_are_the_reference(a, o, length, threads, seed, pattern, data):
    """A bias's gradient, x (A, O, L) summed over A and L: the same rounded bits and close calls as the
    reference (`rows.sum`, `abs_sum(...) * gamma(A * L)` through the rounder); plain rounding the same bits.
    "cancel": float32 values whose sums cancel to near zero, many exact, some on rounding midpoints (close
    calls, so the comparison is not vacuous); "special": infinities, NaN, signed zeros, extremes. Those sums are
    exact in float64 (float32 values over a few thousand terms), so any order gives the same bits, but where
    3e38 and -3e38 meet in one sum (then as "scaled", both logged). "scaled":
    magnitudes over 16 decades, sums inexact, formed in another order than torch's: the same bits wherever
    neither path logs a close call (what the bound guarantees); a close call's own value may differ (the log
    settles it)."""
    g = torch.Generator().manual_seed(seed)
    x = _f32(torch.randn(a, o, length, generator=g, dtype=torch.float64))
    if pattern == "cancel":
        x[1::2] = -x[::2][: x[1::2].shape[0]] * 0.75
    elif pattern == "special":
        at = data.draw(st.lists(st.tuples(st.integers(0, a - 1), st.integers(0, o - 1)), max_size=6))
        for i, j in at:
            x[i, j, 0] = data.draw(_SPECIAL)
    elif pattern == "scaled":
        x = x * torch.pow(10.0, torch.randint(-8, 9, x.shape, generator=g).double())
    with _torch_path():
        r = Rounder("record")
        want = r.full(0, x.sum((0, 2)), lambda: x.abs().sum((0, 2)) * gamma(a * length), (o,))
    with kernel_threads(threads):
        got, points = native.axis_sums(x, gamma(a * length), SAFETY, WIDE, True)
        plain, none = native.axis_sums(x, gamma(a * length), SAFETY, WIDE, False)
    logged = torch.zeros(o, dtype=torch.bool)
    logged[points[0][0] + r.entries.get(0, ([], []))[0]] = True
    if pattern == "scaled":
        assert _same(got[~logged], want[~logged]) and _same(plain[~logged], want[~logged]) and none == []
        return
    # a column holding both 3e38 and -3e38 (and nothing infinite or NaN) cancels them in an order of its own (the
    # other terms absorbed before or after): inexact, as "scaled" is; its window is wide enough to log it in both
    mixed = (x == 3.0e38).any(2).any(0) & (x == -3.0e38).any(2).any(0) & x.isfinite().all(2).all(0)
    assert bool(logged[mixed].all())
    keep = ~mixed
    assert _same(got[keep], want[keep]) and _same(plain[keep], want[keep]) and none == []
    drop = set(torch.nonzero(mixed).flatten().tolist())
    only = lambda e: [(i, c) for i, c in zip(*e) if i not in drop]
    assert only(points[0]) == only(r.entries.get(0, ([], [])))


def test_axis_sums_find_close_calls_and_decline_what_they_do_not_take():
    """Control: sums of float32 values that land on float32 midpoints are logged (the comparison above can
    see a close call), and a non-contiguous or float32 input is declined (the caller's reference ops)."""
    x = torch.tensor([[[1.0]], [[2.0**-24]]], dtype=torch.float64).expand(2, 3, 1).contiguous()
    _, points = native.axis_sums(x, gamma(2), SAFETY, WIDE, True)
    assert points[0][0] == [0, 1, 2]
    assert native.axis_sums(x.transpose(0, 1), gamma(2), SAFETY, WIDE, True) is None
    assert native.axis_sums(x.float(), gamma(2), SAFETY, WIDE, True) is None


def _ce_reference(logits, targets, gl):
    """(rounded loss, its close calls, the loss before rounding, its bound, p, rounded dz, its close calls) of
    ops._CrossEntropy on the torch path."""
    with _torch_path():
        r = Rounder("record")
        loss, err, p = ops._CrossEntropy.reference(logits, targets)
        rounded = r.full(0, loss, err, loss.shape, steers=False)
        c = gl * (1.0 / logits.shape[0])
        x = logits.clone().requires_grad_()
        with rounding(r2 := Rounder("record")):
            out = ops._CrossEntropy.apply(x, targets, "ce")
            out.backward(gl)
    return rounded, r.entries, loss, err(), p, c, x.grad, r2.entries


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.integers(1, 40),
    cols=st.integers(1, 50),
    threads=st.sampled_from([1, 3]),
    gl=st.sampled_from([1.0, -0.5, 3.0e-7, 0.0, 7.25]),
    seed=st.integers(0, 2**31 - 1),
    scale=st.sampled_from([1e-3, 1.0, 30.0]),
    data=st.data(),
)
def test_the_native_cross_entropy_is_the_reference(rows, cols, threads, gl, seed, scale, data):
    """Forward: the loss before rounding within twice its bound of the reference's (both within it of the exact
    loss: the sums and the log in another order), the bound and the probabilities within a few ulps of theirs,
    the rounded loss the same bits. Backward from the
    same probabilities: dz's and its bound's operations are the reference's, so the same rounded bits and close
    calls, recorded or plain. Special values (infinities, NaN) included."""
    g = torch.Generator().manual_seed(seed)
    logits = _f32(torch.randn(rows, cols, generator=g, dtype=torch.float64) * scale + scale)
    for i, j in data.draw(st.lists(st.tuples(st.integers(0, rows - 1), st.integers(0, cols - 1)), max_size=4)):
        logits[i, j] = data.draw(_SPECIAL)
    targets = torch.tensor(data.draw(st.lists(st.integers(0, cols - 1), min_size=rows, max_size=rows)))
    g = torch.tensor(gl, dtype=torch.float64)
    rounded, entries, loss, err, p, c, dz, dz_entries = _ce_reference(logits, targets, g)
    consts = (gamma(cols + 8), ops.EXP_ERR, U, gamma(rows + 1), 1.0 / rows)
    with kernel_threads(threads):
        got_loss, got_err, got_p = native.cross_entropy(logits, targets, consts)
        with_point = [native.cross_entropy(logits, targets, consts, (SAFETY, WIDE, log)) for log in (True, False)]
        bounds = torch.empty_like(p)
        back, (points,) = native.cross_entropy_back(
            p, targets, float(c), (U, gamma(cols + 10)), SAFETY, WIDE, True, bounds
        )
        plain, none = native.cross_entropy_back(p, targets, float(c), (U, gamma(cols + 10)), SAFETY, WIDE, False)
    close = lambda x, y, ulps: torch.isclose(x, y, rtol=ulps * 2.0**-52, atol=0.0, equal_nan=True).all()
    assert close(got_err, err, 4 * rows) and close(got_p, p, 4 * cols)
    # each within its bound of the exact loss (the log near 1 turns a sum's last bit into many of the loss's)
    assert got_loss.isnan() == loss.isnan() and got_err.isnan() == err.isnan()
    assert loss.isnan() or (got_loss - loss).abs() <= 2 * err
    recorder = Rounder("record")
    assert _same(recorder.full(0, got_loss, got_err, (), steers=False), rounded)
    assert recorder.entries == entries
    for (point_loss, calls, point_p), log in zip(with_point, (True, False)):  # the loss's point in the same pass
        assert _same(point_loss, rounded) and point_loss.dim() == 0 and _same(point_p, got_p)
        assert calls == (recorder.entries.get(0, ([], [])) if log else ([], []))
    assert _same(back, dz) and _same(plain, dz) and none == []
    assert _same(bounds, _ce_back_bound(p, targets, c, cols))
    assert (points if points[0] else None) == dz_entries.get(1)  # the op's first point after its forward's


@pytest.mark.parametrize("seed", range(6))
def test_the_cross_entropys_loss_point_logs_as_round_full(seed):
    """The loss's point rounded in the cross-entropy's pass (`native.cross_entropy`'s point) decides and codes its close
    call as `round_full` does with the pass's loss and bound: windows widened until the loss is one (a parity code), and
    until it is a wide one; logged only where asked, rounded either way."""
    g = torch.Generator().manual_seed(seed)
    rows, cols = 3 + seed, 2 + seed % 4
    logits = _f32(torch.randn(rows, cols, generator=g, dtype=torch.float64) * 3)
    targets = torch.randint(0, cols, (rows,), generator=g)
    consts = (gamma(cols + 8), ops.EXP_ERR, U, gamma(rows + 1), 1.0 / rows)
    loss, err, _ = native.cross_entropy(logits, targets, consts)
    kinds = set()
    for safety, wide in ((SAFETY, WIDE), (1e9, WIDE), (1e9, 1e12), (1e15, 1e15)):
        want, idx, codes = native.round_full(loss, err, safety, wide)
        got, calls, _ = native.cross_entropy(logits, targets, consts, (safety, wide, True))
        plain, none, _ = native.cross_entropy(logits, targets, consts, (safety, wide, False))
        assert _same(got, want) and _same(plain, want) and calls == (idx, codes) and none == ([], [])
        kinds.update(type(c) for c in codes)
    assert kinds == {bool, int}  # both codes met: the test reaches the pass's logging


def test_the_cross_entropy_refuses_targets_outside_the_row():
    """A target outside its row is declined by both passes; the op then takes the torch path, which refuses it
    as it always has."""
    logits, bad = torch.zeros(2, 3, dtype=torch.float64), torch.tensor([0, 3])
    consts = (gamma(11), ops.EXP_ERR, U, gamma(3), 0.5)
    assert native.cross_entropy(logits, bad, consts) is None
    assert native.cross_entropy(logits, bad, consts, (SAFETY, WIDE, True)) is None
    p = torch.full((2, 3), 1 / 3, dtype=torch.float64)
    assert native.cross_entropy_back(p, bad, 0.5, (U, gamma(13)), SAFETY, WIDE, True) is None
    assert native.cross_entropy(logits, torch.tensor([0, -1]), consts) is None
    with rounding(r := Rounder("record")), pytest.raises((IndexError, RuntimeError)):
        r.op("x")
        ops._CrossEntropy.apply(logits, bad, "loss")


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**16),
    per_row=st.booleans(),
    floor=st.sampled_from([None, 0.0, 1e-3, 1e30]),
    steers=st.booleans(),
    doctor=st.sampled_from([None, "parity", "wide", "window", "past", "many", "unsorted", "codes"]),
    threads=st.sampled_from([1, 3]),
)
def test_a_logged_full_point_replays_in_one_kernel_call_as_apply_does(seed, per_row, floor, steers, doctor, threads):
    """A replay's logged point whose bound is given as values (`Rounder.full`: native.replay_full) and through
    `Rounder.__call__` with `full_bound` (round_scaled, the bound at the entries, apply_at): the same bits, the
    same widest window, and for a doctored log the same refusal in the same words."""
    g = torch.Generator().manual_seed(seed)
    x = _f32(torch.randn(6, 40, 9, generator=g, dtype=torch.float64))
    x[3:] = -x[:3] * 0.5  # sums that cancel: close calls
    v = x.sum(0)
    e = x.abs().sum(0) * gamma(6)
    if per_row:
        e = e.amax(-1, keepdim=True)
    if doctor == "window":
        e = e * 2.0**60
    scale = None if floor is None else torch.tensor(floor, dtype=torch.float64)
    recorder = Rounder("record")
    recorder.full(0, v, e, v.shape, steers, scale)
    idx, codes = doctored_entries(recorder.entries, doctor, v.numel())
    other = v + e * 2.0**-3  # another machine's value, within the bound
    results = []
    for path in ("kernel", "call"):
        r = Rounder("replay", entries={0: (list(idx), list(codes))}, defer=False)
        r.op("point")
        try:
            with kernel_threads(threads):
                if path == "kernel":
                    out = r.full(0, other, lambda: e, v.shape, steers, scale)
                else:
                    out = r(0, other, full_bound(e, v.shape, steers, scale))
            results.append((out.view(torch.int64), r.max_ratio))
        except (LogMismatch, IndexError, RuntimeError) as refused:
            results.append((type(refused), str(refused)))
    (got, got_extra), (want, want_extra) = results
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and torch.equal(got, want) and got_extra == want_extra
    else:
        assert (got, got_extra) == (want, want_extra)


def test_a_logged_full_point_takes_the_kernel_and_refuses_there():
    """Control for the comparison above: the kernel's call is the one taken (a spy on native.replay_full), and
    a wide entry naming a float32 outside its window (2.0) is refused there, naming the point and the element;
    the recorded entry is applied."""
    v = torch.tensor([1.0 + 2.0**-24, 3.0], dtype=torch.float64)
    e = torch.full((2,), 2.0**-40, dtype=torch.float64)
    recorder = Rounder("record")
    recorder.full(0, v, e, v.shape)
    (idx, codes) = recorder.entries[0]
    assert idx == [0]
    calls = []
    real = native.replay_full
    native.replay_full = lambda *a: calls.append(a) or real(*a)
    try:
        r = Rounder("replay", entries={0: ([0], [(1 << 32) | 0x40000000])}, defer=False)
        r.op("bias")
        with pytest.raises(LogMismatch, match=r"bias#0: logged element 0 is not a close call"):
            r.full(0, v, e, v.shape)
        r = Rounder("replay", entries={0: (idx, codes)}, defer=False)
        r.op("bias")
        assert codes == [False] and _same(r.full(0, v, e, v.shape), v.float().double())  # 1.0: the even one
    finally:
        native.replay_full = real
    assert len(calls) == 2


@pytest.mark.parametrize("native_on", [True, False])
def test_a_bias_gradients_bound_counts_every_term_summed(native_on):
    """ops' bias gradient point over A x L terms (a convolution's: images x positions) is bounded by
    gamma(A * L), not gamma(A): a sum 2^-45 above a float32 midpoint (1 + 2^-24) is a close call when A = 2
    images of L = 64 positions are summed (4 gamma(128) ~ 5.7e-14 > 2^-45 ~ 2.8e-14; 4 gamma(2) is not), on the
    kernel's path and on the reference's."""
    x = torch.zeros(2, 1, 64, dtype=torch.float64)
    x[0, 0, :3] = torch.tensor([1.0, 2.0**-24, 2.0**-45], dtype=torch.float64)
    with contextlib.nullcontext() if native_on else _torch_path(), rounding(r := Rounder("record")):
        r.op("conv")
        db = ops._sums_native(r, 2, x)
        if db is None:
            assert not native_on
            db = r.full(2, x.sum((0, 2)), lambda: x.abs().sum((0, 2)) * gamma(128), (1,))
    assert r.entries == {2: ([0], [True])} and db.item() == 1.0 + 2.0**-23


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    bsz=st.integers(1, 4),
    c=st.integers(1, 5),
    o=st.integers(1, 6),
    side=st.integers(3, 9),
    stride=st.sampled_from([1, 2]),
    threads=st.sampled_from([1, 3]),
    seed=st.integers(0, 2**31 - 1),
    cancel=st.booleans(),
)
def test_a_convolutions_input_gradient_rounds_in_one_pass_as_the_reference(
    bsz, c, o, side, stride, threads, seed, cancel
):
    """The input gradient's point with its bound as an outer product (`native.round_outer`) against the reference
    (`_conv_input_grad_bound` formed, then the rounder): the same rounded bits and close calls, recorded; the
    same bits, plain. "cancel": filters whose channels cancel, for close calls."""
    g = torch.Generator().manual_seed(seed)
    w = _f32(torch.randn(o, c, 3, 3, generator=g, dtype=torch.float64))
    if cancel and o > 1:
        w[1::2] = -w[: o // 2] * 0.5
    ho = (side + 2 - 3) // stride + 1
    dy = _f32(torch.randn(bsz, o, ho * ho, generator=g, dtype=torch.float64))
    w2 = w.reshape(o, -1)
    fold = lambda t: ops._fold(t, (side, side), (3, 3), 1, stride)
    dx = fold(torch.matmul(w2.t(), dy))
    with _torch_path():
        r = Rounder("record")
        want = r.full(0, dx, lambda: ops._conv_input_grad_bound(w2, dy, fold, (3, 3), dx.shape), dx.shape)
    window, nw, gm = ops._conv_input_grad_factors(w2, dy, fold, (3, 3))
    with kernel_threads(threads):
        got, (points,) = native.round_outer(dx, window, nw, gm, SAFETY, WIDE)
    assert _same(got, want) and _same(native.round_f32(dx), want)
    assert ({0: points} if points[0] else {}) == r.entries
    every = torch.arange(dx.numel())  # a replay's route: the bound at logged elements alone, the same bits
    reference = ops._conv_input_grad_bound(w2, dy, fold, (3, 3), dx.shape).reshape(-1)
    assert _same(ops._outer_bound(window, nw, gm, dx.shape).at(every), reference)
    control = native.round_outer(dx, window, nw * 2.0**30, gm, SAFETY, WIDE)[1][0]
    assert len(control[0]) > len(points[0]), "control: a wider bound flags more"


def test_an_outer_product_bound_is_windows_times_filters_times_gamma():
    """Each element's window is SAFETY * (win[b, p] * f[c]) * g: values 2^-41 above the midpoint 1 + 2^-24 are close
    calls where that window reaches them (win 2, f 3, g 2^-45: 4 * 6 * 2^-45 = 1.5 * 2^-41) and not where a factor
    is a quarter of it (0.375 * 2^-41)."""
    v = torch.full((2, 2, 1), 1.0 + 2.0**-24 + 2.0**-41, dtype=torch.float64)
    win = torch.tensor([[2.0], [0.5]], dtype=torch.float64)
    f = torch.tensor([3.0, 0.75], dtype=torch.float64)
    _, (points,) = native.round_outer(v, win, f, 2.0**-45, SAFETY, WIDE)
    assert points[0] == [0]


def _logged_step(arch: str, seed: int):
    from replay.prover.recorder import DEFAULT_OPTIMIZER
    from replay.training import architectures as models
    from replay.training.bundled_data import Batches
    from replay.training.train import initial_state

    from ..helpers import TINY

    cfg, opt = TINY[arch]["config"], DEFAULT_OPTIMIZER[arch]
    model = models.build(arch, cfg)
    state = initial_state(models.init_params(arch, cfg, seed), opt)
    return model, state, Batches(arch, cfg, TINY[arch]["batch"], seed)(0), opt


@pytest.mark.parametrize("arch", ["mlp", "cnn"])
@pytest.mark.parametrize("doctor", [None, "parity", "wide"])
def test_a_replay_naming_the_passes_points_takes_them_through_the_rounder_as_the_torch_path(arch, doctor, monkeypatch):
    """A replay whose log names a bias gradient's, the loss gradient's or a convolution's input gradient's point (the
    kernel's staged route: its values through the rounder, the bound only at the logged elements) against the torch
    path: the recorded log reproduces the recorded state on both; with every parity at those points flipped (the
    other float32 in each window: honest choices too, and an entry at the convolution's first input gradient, a close
    call or not) both reach the same other state or the same refusal; a wide entry naming a float32 outside its
    window is refused by both in the same words."""
    from replay.training.train import train_step

    model, state, batch, opt = _logged_step(arch, 3)
    rec = Rounder("record")
    want, _ = train_step(model, state, batch, opt, "det64", rec)
    names = {k: rec.name(k) for k in rec.entries}
    staged = [k for k, n in names.items() if (n.startswith("loss") and k % SLOTS == 1) or k % SLOTS in (2, 3)]
    assert staged, f"control: some of the passes' points are logged ({names})"
    entries = dict(rec.entries)
    if arch == "cnn" and doctor:  # the second convolution's input gradient, logged or not: an entry at its first output
        dx_key = rec.names.index("convs.1") * SLOTS + 3
        entries.setdefault(dx_key, ([0], [False]))
        staged.append(dx_key)
    entries = doctored_points(entries, staged, doctor)
    staged_calls = []
    for name, module in (("axis_sums_values", native), ("_outer_bound", ops)):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, real=real, name=name: staged_calls.append(name) or real(*a))
    results = []
    for use_native in (True, False):
        with contextlib.nullcontext() if use_native else _torch_path():
            try:
                got, _ = train_step(model, state, batch, opt, "det64", Rounder("replay", entries=dict(entries)))
                results.append(got)
            except LogMismatch as refused:
                results.append(str(refused))
    # (a wide entry is refused at the first bias gradient, before the input gradient's point)
    outer = {"_outer_bound"} if (arch, doctor) == ("cnn", "parity") else set()
    assert set(staged_calls) == {"axis_sums_values"} | outer
    if doctor == "wide" or isinstance(results[0], str):
        assert isinstance(results[0], str) and results[0] == results[1] and doctor
    else:
        assert results[0].equal(results[1]) and results[0].equal(want) == (doctor is None)


_CRAFTED_PAST_THE_ROOM = """
import sys
import torch
from replay.training.determinism import LogMismatch, Rounder, full_bound
count, path = int(sys.argv[1]), sys.argv[2]
v = torch.zeros(300_000, dtype=torch.float64)
v[1::2][:count] = 1.0
e = torch.full_like(v, 1e-300)
floor = torch.tensor(1.0, dtype=torch.float64)
r = Rounder("replay", entries={7: (list(range(1, 2 * count, 2)), [True] * count)}, defer=False)
r.op("point")
try:
    r.full(7, v, lambda: e, v.shape, True, floor) if path == "kernel" else r(7, v, full_bound(e, v.shape, True, floor))
    print("accepted")
except LogMismatch as refused:
    print(refused)
"""


@pytest.mark.parametrize("count", [65_536, 65_537, 70_000])
def test_a_point_with_more_entries_than_a_thread_keeps_room_for_replays_as_apply_does(count):
    """Past the entries a thread keeps buffers for (2 x 65,536 int64s), the one-call replay's entries and results
    are arrays of their own, held until the kernel returns: one freed before was read after the output took its
    memory, and a crafted log whose windows hold no float32 choice was accepted (in a fresh process, as the
    verifier's subprocess is: its allocator returns such a block to the system and maps it again). The same
    refusal as `__call__` with `full_bound`; and an honest log of that size applied the same."""
    import subprocess
    import sys

    root = str(Path(native.__file__).resolve().parents[2])
    said = [
        subprocess.run(
            [sys.executable, "-c", _CRAFTED_PAST_THE_ROOM, str(count), path],
            capture_output=True,
            text=True,
            cwd=root,
            env={**os.environ, "PYTHONPATH": root},
            timeout=120,
        ).stdout.strip()
        for path in ("kernel", "call")
    ]
    assert said[0] == said[1] == "rounding point point#7: logged element 1 is not a close call"
    v = torch.full((300_000,), 1.0 + 2.0**-24, dtype=torch.float64)  # every element a midpoint
    wide = torch.full_like(v, 2.0**-30)
    honest = (list(range(count)), [bool(i % 2) for i in range(count)])  # either float32 is an honest choice
    outs = []
    for path in ("kernel", "call"):
        r = Rounder("replay", entries={7: (list(honest[0]), list(honest[1]))}, defer=False)
        outs.append(r.full(7, v, lambda: wide, v.shape) if path == "kernel" else r(7, v, full_bound(wide, v.shape)))
    assert torch.equal(outs[0], outs[1]) and outs[0][:count].ne(outs[0][0]).any()
