"""The fused rounding kernel (replay/training/_native.c) against the torch path it replaces.

The torch path in determinism.py is the reference: for every bound the kernel handles it must give
the same float32 values and the same close calls, and a training step recorded either way must
give the same rounding log and the same state.
"""

from __future__ import annotations

import ctypes
import math
import os
import struct
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replay.prover.recorder import DEFAULT_OPTIMIZER
from replay.training import architectures as models
from replay.training import determinism, native, ops
from replay.training.bundled_data import Batches
from replay.training.determinism import (
    LogMismatch,
    LogOverflow,
    Rounder,
    abs_sum,
    decode_log,
    dot_bound,
    encode_log,
    full_bound,
    gamma,
)
from replay.training.ops import _weight_grad_bound
from replay.training.train import initial_state, ipow, train_step

from ..helpers import TINY, doctored_entries, doctored_points, kernel_threads

pytestmark = pytest.mark.skipif(native.library() is None, reason="no C compiler: the torch path is used")


def _reference(v, bound):
    """The torch path: float32(v) as float64, and the entries it logs ({} or {0: (indices, codes)});
    the kernel off, exact bounds included (a replay takes those from the kernel: `native.dot_at`)."""
    r = Rounder("record")
    lib, native._LIB = native._LIB, False
    try:
        idx, err = r._close_calls(v, bound)
    finally:
        native._LIB = lib
    if idx.numel():
        r._log(0, v, v.float().double(), idx, err)
    return v.float().double(), r.entries


def _fused(v, bound):
    got = bound.fused(v)
    assert got is not None, "the kernel should take these tensors"
    r, idx, codes = got
    return r, ({0: (idx, codes)} if idx else {})


def _same(v, bound):
    """The kernel and the torch path agree bit for bit (signed zeros too) and log the same entries, in
    the same (increasing index) order; returns how many close calls there were."""
    r0, e0 = _reference(v, bound)
    r1, e1 = _fused(v, bound)
    assert torch.equal(r0.view(torch.int64), r1.view(torch.int64))
    typed = lambda e: {k: (i, [(type(c), c) for c in codes]) for k, (i, codes) in e.items()}
    assert typed(e0) == typed(e1)
    return len(e1[0][0]) if e1 else 0


def _f32(t):
    return t.float().double()  # inputs of a rounding point are float32 values


@st.composite
def dot_cases(draw):
    m, k, n = (draw(st.integers(1, 24)) for _ in range(3))
    batch = draw(st.sampled_from([(), (3,), (2, 3)]))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    a = _f32(torch.randn(*batch, m, k, generator=g, dtype=torch.float64))
    b = _f32(torch.randn(*batch, k, n, generator=g, dtype=torch.float64))
    if draw(st.booleans()):  # zero products: an all-zero sum has a zero bound and is never a close call
        a = a * (torch.rand(a.shape, generator=g, dtype=torch.float64) > 0.5)
    if draw(st.booleans()) and k >= 2:  # cancellation: (x, x) . (y, -y) pairs make some outputs ~0 with a
        h = k // 2  # nonzero bound, close calls by the sign of zero at least
        a[..., 1 : 2 * h : 2] = a[..., 0 : 2 * h : 2]
        cols = torch.rand(n, generator=g) > 0.3
        b[..., 1 : 2 * h : 2, :] = torch.where(cols, -b[..., 0 : 2 * h : 2, :], b[..., 1 : 2 * h : 2, :])
    if draw(st.booleans()):
        a = a.transpose(-2, -1).contiguous().transpose(-2, -1)  # column-major operands
    if draw(st.booleans()):
        b = b.transpose(-2, -1).contiguous().transpose(-2, -1)
    if batch and draw(st.booleans()):
        a = a[(0,) * len(batch)]  # a 2-D operand broadcast over b's batch (the convolution's shape)
    scale = draw(st.sampled_from([1.0, 0.125, -0.3]))
    bias, rows = None, False
    if draw(st.booleans()):
        rows = draw(st.booleans()) and a.dim() == 2
        bias = _f32(torch.randn(m if rows else n, generator=g, dtype=torch.float64))
    return a, b, scale, bias, rows


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dot_cases())
def test_fused_dot_matches_the_torch_path(case):
    a, b, scale, bias, rows = case
    v = torch.matmul(a, b) * scale
    if bias is not None:
        v = v + (bias.unsqueeze(-1) if rows else bias)
    _same(v.contiguous(), dot_bound(a, b, scale, bias, bias_rows=rows))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dot_cases(), st.sampled_from([2, 3, 5]))
def test_fused_dot_on_several_threads_matches_the_torch_path(case, n):
    """Rows split among threads, candidates merged in index order, exact bounds in shares: the same
    values and entries as the torch path (hence as one thread), whatever the thread count."""
    a, b, scale, bias, rows = case
    v = torch.matmul(a, b) * scale
    if bias is not None:
        v = v + (bias.unsqueeze(-1) if rows else bias)
    with kernel_threads(n):
        _same(v.contiguous(), dot_bound(a, b, scale, bias, bias_rows=rows))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dot_cases(), st.sampled_from([1, 3]), st.integers(0, 2**31 - 1))
def test_exact_bounds_at_logged_elements_match_the_torch_path(case, n, seed):
    """A replay's exact bounds at logged elements (`native.dot_at`, any order, repeats): the torch path's
    sum of the same nonnegative terms, in another order, so within both sums' rounding (K u each)."""
    a, b, scale, bias, rows = case
    v = torch.matmul(a, b)
    bound = dot_bound(a, b, scale, bias, bias_rows=rows)
    idx = torch.randint(0, v.numel(), (17,), generator=torch.Generator().manual_seed(seed))
    _same_bounds_at(bound, idx, n, a.shape[-1])


def _same_bounds_at(bound, idx: torch.Tensor, n: int, k: int, chunk: int = 5) -> None:
    """bound.at(idx) in the kernel (n threads, several calls of `chunk` indices, as a long log makes) against
    the torch path: sums of the same nonnegative terms in other orders, within both sums' rounding (K u each),
    and exact zeros exact."""
    chunk, native.DOT_AT_CHUNK = native.DOT_AT_CHUNK, chunk
    try:
        with kernel_threads(n):
            got = bound.at(idx)
    finally:
        native.DOT_AT_CHUNK = chunk
    lib, native._LIB = native._LIB, False
    try:
        want = bound.at(idx)
    finally:
        native._LIB = lib
    assert got.dtype == torch.float64 and got.shape == want.shape
    assert torch.all((got - want).abs() <= want * (2 * (k + 2) * 2.0**-53))
    assert torch.equal(got == 0, want == 0)


def test_exact_bounds_refuse_indices_outside_the_output():
    a, b = torch.randn(3, 4, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64)
    for bad in ([15], [-1], [2**40]):
        assert native.dot_at((3, 5), a, b, 1e-15, None, False, torch.tensor(bad)) is None
    assert native.dot_at((3, 5), a, b, 1e-15, None, False, torch.tensor([14, 0])) is not None


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 5),
    st.integers(1, 9),
    st.integers(1, 9),
    st.integers(1, 40),
    st.sampled_from([1, 3]),
    st.integers(0, 2**31 - 1),
)
def test_a_weight_gradients_exact_bounds_at_logged_elements_match_the_torch_path(batch, o, ck, length, n, seed):
    """A replay's exact bounds at a convolution weight gradient's logged elements (`native.dot_summed_at`, any
    order, repeats, several kernel calls): the torch path's sums of the same terms, within their rounding;
    indices outside the output are refused."""
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(batch, o, length, generator=gen, dtype=torch.float64)
    g[g.abs() < 0.3] = 0.0  # exact zeros, and rows of them
    cols = torch.randn(batch, ck, length, generator=gen, dtype=torch.float64)
    bound = _weight_grad_bound(g, cols)
    _same_bounds_at(bound, torch.randint(0, o * ck, (17,), generator=gen), n, batch * length)
    a, b = g.permute(1, 0, 2), cols.permute(0, 2, 1)
    for bad in ([o * ck], [-1], [2**40]):
        assert native.dot_summed_at(a, b, 1e-15, torch.tensor(bad)) is None


@settings(max_examples=80, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(1, 12),
    st.integers(1, 12),
    st.integers(1, 48),
    st.integers(0, 2**31 - 1),
    st.booleans(),
)
def test_fused_summed_products_match_the_torch_path(batch, o, ck, length, seed, cancel):
    """A convolution's weight gradient, sum_b g_b @ cols_b^T: the kernel takes g and cols as they lie
    (positions of one image in unit-stride pieces: from 16 on, their exact bounds are summed a piece
    at a time)."""
    gen = torch.Generator().manual_seed(seed)
    g = _f32(torch.randn(batch, o, length, generator=gen, dtype=torch.float64))
    cols = _f32(torch.randn(batch, ck, length, generator=gen, dtype=torch.float64))
    if cancel and length >= 2:  # pairs along L that cancel: outputs ~0 with nonzero bounds
        h = length // 2
        g[..., 1 : 2 * h : 2] = g[..., 0 : 2 * h : 2]
        cols[..., 1 : 2 * h : 2] = -cols[..., 0 : 2 * h : 2]
    v = torch.matmul(g, cols.transpose(1, 2)).sum(0)
    _same(v, _weight_grad_bound(g, cols))


@settings(max_examples=80, deadline=None)
@given(
    st.integers(1, 3),
    st.integers(1, 20),
    st.integers(1, 40),
    st.integers(1, 12),
    st.booleans(),
    st.booleans(),
    st.integers(0, 2**31 - 1),
    st.sampled_from([1, 3]),
)
def test_a_bias_added_in_the_record_pass_is_the_products_plus_its_bias(batch, m, n, k, rows, in_place, seed, threads):
    """`round_dot`'s add_bias: the product alone, its bias (per column, or per row over a batch: a convolution's)
    added in the kernel's passes over it: the outputs, close calls and codes of the product plus its bias (one IEEE
    addition an element: -0 + -0 stays -0, a NaN bias or product stays NaN), in place or not, on any number of
    threads; a product the kernel declines is left as it was."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=gen, dtype=torch.float64)
    b = (
        torch.randn(batch, k, n, generator=gen, dtype=torch.float64)
        if rows
        else torch.randn(k, n, generator=gen, dtype=torch.float64)
    )
    bias = torch.randn(m if rows else n, generator=gen, dtype=torch.float64)
    bias[torch.rand(bias.shape, generator=gen) < 0.2] = -0.0
    v = torch.matmul(a, b)
    v[torch.rand(v.shape, generator=gen) < 0.1] = -0.0
    if v.numel() > 3:
        v.view(-1)[3] = math.nan
    if bias.numel() > 1:
        bias[1] = math.nan
    want_v = v + (bias.reshape(-1, 1) if rows else bias)
    g = 1e-8  # wide windows: a close call in about one output in three
    with kernel_threads(threads):
        want = native.round_dot(want_v.clone(), a, b, g, bias, g, rows, determinism.SAFETY, determinism.WIDE)
        given = v.clone()
        got = native.round_dot(
            given, a, b, g, bias, g, rows, determinism.SAFETY, determinism.WIDE, in_place, None, True
        )
    assert want is not None and got is not None
    assert torch.equal(got[0].view(torch.int64), want[0].view(torch.int64))
    assert got[1:] == want[1:] and (len(want[1]) > 0 or v.numel() < 40)
    assert (got[0] is given) == in_place
    if not in_place:
        assert torch.equal(given.view(torch.int64), v.view(torch.int64))  # v itself unchanged


@settings(max_examples=80, deadline=None)
@given(
    st.integers(1, 24),
    st.integers(1, 24),
    st.integers(1, 12),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.integers(0, 2**31 - 1),
    st.sampled_from([1, 3]),
)
def test_a_transposed_product_rounds_as_the_product_itself(m, n, k, in_place, given_norms, strided, seed, threads):
    """`round_dot`'s transposed: v the product's transpose (N, M), rounded as the product (M, N) is (its log's layout):
    the outputs are the product's transposed, bit for bit, and the close calls and codes the product's, in its index
    order, with norms handed in (each operand's own) or formed by the kernel, in place or not, the operands contiguous
    or as a weight gradient's (a an activation's transpose: both strided in the kernel's product), on any number of
    threads; exact zeros (cancelling terms), signed zeros, an infinite term and a NaN included. With a bias it
    declines."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(k, m, generator=gen, dtype=torch.float64).t() if strided else torch.randn(m, k, generator=gen)
    a = a.double()
    b = torch.randn(k, n, generator=gen, dtype=torch.float64)
    if k > 1:  # a row of a and a column of b whose terms cancel: an exact 0 with a positive window
        a[0, 1] = a[0, 0]
        b[1, 0] = -b[0, 0]
        a[0, 2:] = 0.0
    if m > 2:
        a[m - 1, 0] = math.inf  # a row of infinities and NaNs (inf * 0), whose window is infinite
    v = a @ b
    v[torch.rand(v.shape, generator=gen) < 0.1] = -0.0
    if v.numel() > 3:
        v.view(-1)[3] = math.nan
    g = 1e-8  # wide windows: a close call in about one output in three
    norms = (a.norm(dim=1), b.norm(dim=0)) if given_norms else None
    with kernel_threads(threads):
        want = native.round_dot(v.clone(), a, b, g, None, g, False, determinism.SAFETY, determinism.WIDE)
        vt = v.t().contiguous()
        got = native.round_dot(
            vt, a, b, g, None, g, False, determinism.SAFETY, determinism.WIDE, in_place, norms, transposed=True
        )
        biased = native.round_dot(
            v.t().contiguous(), a, b, g, b[0], g, False, determinism.SAFETY, determinism.WIDE, transposed=True
        )
    assert want is not None and got is not None and biased is None
    assert got[0].shape == (n, m) and torch.equal(got[0].view(torch.int64), want[0].t().view(torch.int64))
    assert got[1:] == want[1:] and (len(want[1]) > 0 or v.numel() < 40)
    assert got[1] == sorted(got[1])
    assert (got[0] is vt) == in_place


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 24),
    st.integers(1, 24),
    st.integers(1, 12),
    st.sampled_from(["none", "added", "given"]),
    st.booleans(),
    st.integers(0, 2**31 - 1),
    st.sampled_from([1, 3]),
)
def test_a_layers_lean_record_pass_is_round_dots(m, n, k, bias_kind, given_norms, seed, threads):
    """`native.record_product` (a linear layer's points in a CPU recording: `Rounder.kernel_product`) is
    `round_dot` in place: the same outputs, close calls and codes, with a bias added in the pass or none, norms handed
    in or formed; and `column_sums` (its bias gradient) is `axis_sums` over the rows, logging or not."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=gen, dtype=torch.float64)
    b = torch.randn(n, k, generator=gen, dtype=torch.float64).t()  # a weight's transpose, as the layer takes it
    v = a @ b
    v[torch.rand(v.shape, generator=gen) < 0.1] = -0.0
    bias = torch.randn(n, generator=gen, dtype=torch.float64) if bias_kind != "none" else None
    if bias_kind == "given":  # a product with its bias in it (a GPU's addmm): not added again
        v = v + bias
    add = bias_kind == "added"
    norms = (a.norm(dim=1), b.norm(dim=0)) if given_norms else None
    g = 1e-8  # wide windows: a close call in about one output in three
    with kernel_threads(threads):
        want = native.round_dot(
            v.clone(), a, b, g, bias, g, False, determinism.SAFETY, determinism.WIDE, True, norms, add
        )
        mine = v.clone()
        got = native.record_product(mine, a, b, g, g, determinism.SAFETY, determinism.WIDE, bias, add, norms)
        sums = native.column_sums(v, 1e-8, determinism.SAFETY, determinism.WIDE, True)
        want_sums = native.axis_sums(v.unsqueeze(-1), 1e-8, determinism.SAFETY, determinism.WIDE, True)
        plain = native.column_sums(v, 1e-8, determinism.SAFETY, determinism.WIDE, False)
    assert got[0] is mine and torch.equal(got[0].view(torch.int64), want[0].view(torch.int64))
    assert got[1:] == want[1:] and (len(want[1]) > 0 or v.numel() < 40)
    assert torch.equal(sums[0].view(torch.int64), want_sums[0].view(torch.int64))
    assert torch.equal(plain[0].view(torch.int64), want_sums[0].view(torch.int64)) and plain[1:] == ([], [])
    assert list(sums[1:]) == list(want_sums[1][0])


@pytest.mark.parametrize("rows", [3, 40])
def test_a_lean_bias_gradient_is_bounded_by_its_rows(rows):
    """`Rounder.kernel_column_sums` (a linear layer's bias gradient on the kernel): a column sum 3% inside SAFETY
    times its bound, sum |x| * gamma(rows), from a float32 midpoint is a close call, 3% outside is not, as through the
    general pass (`ops._sums_native`); its windows are the rows', not the columns' (o = 12)."""
    o, c = 12, 2.0**-10
    mid = 1 + (2 * torch.arange(o, dtype=torch.float64) + 1) * 2.0**-24  # float32 midpoints
    window = (mid + 2 * c) * gamma(rows) * determinism.SAFETY
    inside = torch.arange(o) % 2 == 0
    x = torch.zeros(rows, o, dtype=torch.float64)
    x[0], x[1], x[2] = c, -c, mid + torch.where(inside, 0.97, 1.03) * window  # every partial sum exact
    got = []
    for lean in (True, False):
        r = Rounder("record")
        r.op("layer")
        out = r.kernel_column_sums(0, x) if lean else ops._sums_native(r, 0, x.unsqueeze(-1))
        got.append((out, r.entries.get(0, ([], []))[0]))
    assert torch.equal(got[0][0], got[1][0])
    assert got[0][1] == got[1][1] == inside.nonzero().flatten().tolist()


def test_a_linear_layers_gradient_in_any_layout_takes_the_lean_points_or_not_alike(monkeypatch):
    """A linear layer's backward given a gradient that is not contiguous (a transpose's: the lean passes read rows of
    it in place) gives what the general routes give: the same gradients, bit for bit, and the same close calls."""
    g = torch.Generator().manual_seed(5)
    x = _f32(torch.randn(16, 20, generator=g, dtype=torch.float64))
    w = _f32(torch.randn(6, 20, generator=g, dtype=torch.float64)).requires_grad_()
    b = _f32(torch.randn(6, generator=g, dtype=torch.float64)).requires_grad_()
    gy = torch.randn(6, 16, generator=g, dtype=torch.float64).t()
    x[:, 1::2], gy[:, 0] = x[:, 0::2], 0.0  # exact zeros, and close calls where sums cancel
    got = []
    for lean in (True, False):
        if not lean:
            monkeypatch.setattr(native, "record_product", lambda *a, **k: None)
            monkeypatch.setattr(native, "column_sums", lambda *a, **k: None)
        r = Rounder("record", defer=False)
        with determinism.rounding(r):
            xg = x.clone().requires_grad_()
            y = ops.Det.linear(xg, w, b, "layer")
            grads = torch.autograd.grad(y, [xg, w, b], gy)
        got.append(([t.view(torch.int64) for t in grads], r.entries))
    assert all(torch.equal(p, q) for p, q in zip(got[0][0], got[1][0])) and got[0][1] == got[1][1]


@pytest.mark.parametrize("arch", ["mlp", "gpt"])
@pytest.mark.parametrize("threads", [1, 3])
def test_a_linear_layers_lean_points_record_and_replay_what_the_rounders_routes_do(arch, threads, monkeypatch):
    """A linear layer's points straight to the kernel (`_Matmul`'s lean: `Rounder.kernel_product`,
    `kernel_column_sums`) record the states and logs that `Rounder.dot`'s routes and the bias gradient's general pass
    do, over three steps; those logs replay to the recorded states either way, and a log with every parity flipped
    replays to the same (other) states either way; the lean path is the one taken where the rounder allows it."""
    cfg, opt = TINY[arch]["config"], DEFAULT_OPTIMIZER[arch]
    model = models.build(arch, cfg)
    batches = Batches(arch, cfg, TINY[arch]["batch"], 11)
    taken = []
    for name in ("kernel_product", "kernel_column_sums"):
        real = getattr(Rounder, name)
        monkeypatch.setattr(
            Rounder, name, lambda self, *a, real=real, **k: taken.append(self.mode) or real(self, *a, **k)
        )
    allows = Rounder.takes_kernel_points

    def run(lean: bool, mode: str, states=None, logs=None):
        monkeypatch.setattr(Rounder, "takes_kernel_points", allows if lean else lambda self: False)
        taken.clear()
        state, out = initial_state(models.init_params(arch, cfg, 11), opt), []
        for t in range(3):
            r = Rounder("record") if mode == "record" else Rounder("replay", entries=decode_log(logs[t]))
            state, loss = train_step(model, state if states is None else states[t], batches(t), opt, "det64", r)
            out.append((state, loss, encode_log(r.entries) if mode == "record" else None))
        assert (mode in taken) == lean
        return out

    with kernel_threads(threads):
        recorded = [run(lean, "record") for lean in (True, False)]
        for (s0, l0, log0), (s1, l1, log1) in zip(*recorded):
            assert s0.equal(s1) and (l0, log0) == (l1, log1)
        states = [initial_state(models.init_params(arch, cfg, 11), opt)] + [s for s, _, _ in recorded[0]]
        logs = [log for _, _, log in recorded[0]]
        assert any(decode_log(log) for log in logs)
        flipped = [encode_log(doctored_points(decode_log(log), decode_log(log), "parity")) for log in logs]
        for given, honest in ((logs, True), (flipped, False)):
            replays = []
            for lean in (True, False):
                try:
                    replays.append(run(lean, "replay", states, given))
                except LogMismatch as exc:  # a flipped parity whose float32 lies outside its window: refused
                    replays.append(str(exc))
            if isinstance(replays[0], str) or isinstance(replays[1], str):
                assert replays[0] == replays[1] and not honest
                continue
            for (s0, l0, _), (s1, l1, _) in zip(*replays):
                assert s0.equal(s1) and l0 == l1
            same = [s.equal(states[t + 1]) for t, (s, _, _) in enumerate(replays[0])]
            assert all(same) if honest else not all(same)


@pytest.mark.parametrize("kernel", [True, False])
@pytest.mark.parametrize("who", ["record", "declined", "replay", "doctored", "wide", "trace", "perturbed"])
def test_a_transposed_point_is_the_point_on_every_route(who, kernel, monkeypatch):
    """`Rounder.dot`'s transposed (v the product's transpose; `ops._b_gradient`): on every route, the kernel on and
    off, the result is the product's point transposed, bit for bit, and what it logs, traces or refuses is the
    product's: a recording (kernel pass, a point the kernel declines, torch path), a replay of that log (plain points in place, logged ones
    applied), a doctored one (the other float32 of each window followed; one far outside refused at the same element),
    a tracer, a perturbed machine."""
    g = torch.Generator().manual_seed(3)
    a, b = (_f32(torch.randn(*shape, generator=g, dtype=torch.float64)) for shape in ((60, 8), (8, 40)))
    a[:5, 1::2], b[1::2] = a[:5, 0::2], -b[0::2]  # five rows of exact zeros: close calls at any scale
    v = a @ b
    f = v[1::7, ::5].float()  # and midpoints between two float32s
    v[1::7, ::5] = (f.double() + torch.nextafter(f, torch.full_like(f, math.inf)).double()) / 2
    monkeypatch.setattr(native, "_LIB", native.library() if kernel else False)
    recorded = Rounder("record", defer=False)  # (the torch path's deferred slots are a step's: LogOverflow here)
    recorded.op("point")
    recorded.dot(0, v.clone(), a, b)
    assert recorded.entries and len(recorded.entries[0][0]) > 1

    if who == "declined":  # the kernel declines the point (a crowded one): the torch path takes it
        monkeypatch.setattr(native, "round_dot", lambda *args, **kw: None)

    def rounder():
        if who in ("record", "declined"):
            r = Rounder("record", defer=False)
        elif who == "trace":
            r = Rounder("record", trace=[], defer=False)
        elif who == "perturbed":
            moved = lambda v, bound: v + bound.at(torch.arange(v.numel())).reshape(v.shape) / 2
            r = Rounder("record", perturb=moved, defer=False)
        else:
            r = Rounder("replay", entries=doctored_points(recorded.entries, [0], {"doctored": "parity"}.get(who, who)))
        r.op("point")
        return r

    outcomes = []
    for transposed in (False, True):
        r, given = rounder(), (v.t().contiguous() if transposed else v.clone())
        try:
            out = r.dot(0, given, a, b, owned=True, transposed=transposed)
            r.finish()  # (a deferred replay's refusals come at the step's end)
            outcomes.append((out.t() if transposed else out, r.entries if r.mode == "record" else None, r.trace))
        except LogMismatch as exc:
            outcomes.append(str(exc))
    plain, turned = outcomes
    if who == "wide":
        assert isinstance(plain, str) and plain == turned
        return
    assert torch.equal(turned[0].view(torch.int64), plain[0].view(torch.int64))
    assert turned[1] == plain[1]
    if who == "trace":
        assert len(turned[2]) == len(plain[2]) == 1 and torch.equal(turned[2][0][2], plain[2][0][2])


@pytest.mark.parametrize("bias_rows", [False, True])
def test_a_products_bias_term_is_its_own_magnitude_per_row_or_column(bias_rows):
    """A product's bound's bias term is |bias| * gamma(K + 2), per column (or per row, a convolution's), not
    scaled with the product (scale 3): with A = 0 it is the whole bound, and an output 3% inside SAFETY
    times it from a float32 midpoint is a close call, 3% outside is not, in the kernel as on the torch
    path (a term from the wrong row or column, or the product's factor in its place, misses the first)."""
    m, k, n = 4, 6, 5
    a, b = torch.zeros(m, k, dtype=torch.float64), torch.ones(k, n, dtype=torch.float64)
    bias = torch.arange(1, (m if bias_rows else n) + 1, dtype=torch.float64) * -370.0  # windows far above an ulp
    per = (bias.unsqueeze(-1) if bias_rows else bias).expand(m, n) * determinism.gamma(k + 2)
    mid = 1 + (2 * torch.arange(m * n, dtype=torch.float64).reshape(m, n) + 1) * 2.0**-24
    inside = (torch.arange(m * n) % 3 == 0).reshape(m, n)
    v = mid + torch.where(inside, 0.97, 1.03) * determinism.SAFETY * per
    got = []
    for lib in (native.library(), False):
        saved, native._LIB = native._LIB, lib
        try:
            r = Rounder("record")
            r.dot(0, v.clone(), a, b, 3.0, bias, bias_rows)
            got.append(r.entries.get(0, ([], []))[0])
        finally:
            native._LIB = saved
    assert got[0] == got[1] == inside.flatten().nonzero().flatten().tolist()


@pytest.mark.parametrize(
    ("batch", "o", "ck", "length"),
    [(3, 4, 5, 3), (3, 4, 5, 16), (3, 4, 5, 37), (2, 8, 1592, 40), (2, 8, 1592, 47), (2, 8, 1592, 64)],
)
@pytest.mark.parametrize("threads", [1, 3])
def test_summed_exact_bounds_are_every_terms(batch, o, ck, length, threads):
    """The exact bound of a summed product's candidate counts every term of every image: with +-1
    operands each output's bound is gamma(K + 2) * K (K = images x positions), and an output placed 3%
    inside determinism.SAFETY times that bound from a float32 midpoint is a close call, 3% outside it is not (a bound
    short of one term in 16, or of one image, would miss the first). 1,592 columns outgrow PIECES_CACHE: each
    candidate's terms are summed block by block (16 positions), its lanes kept between blocks, and a block's tail (40:
    16 + 16 + 8 that no lane takes; 47: 15) on its own."""
    gen = torch.Generator().manual_seed(length)
    g = torch.randn(batch, o, length, generator=gen, dtype=torch.float64).sign()
    cols = torch.randn(batch, ck, length, generator=gen, dtype=torch.float64).sign()
    k = batch * length
    e = determinism.gamma(k + 2) * k
    mid = 1 + (2 * torch.arange(o * ck, dtype=torch.float64) + 1) * 2.0**-24  # float32 midpoints above 1
    inside = torch.arange(o * ck) % 2 == 0
    v = (mid + torch.where(inside, 0.97, 1.03) * determinism.SAFETY * e).reshape(o, ck)
    with kernel_threads(threads):
        got = native.round_dot_summed(
            v, g.permute(1, 0, 2), cols.permute(0, 2, 1), determinism.gamma(k + 2), determinism.SAFETY, determinism.WIDE
        )
    assert got is not None and got[1] == inside.nonzero().flatten().tolist()


@pytest.mark.parametrize(("ck", "length"), [(1592, 40), (700, 71), (700, 90), (3, 300)])
def test_a_weight_gradients_exact_bounds_count_every_term_once(ck, length):
    """Integer operands, whose sums are exact in any order: a weight gradient's exact bounds at every output
    (`native.dot_summed_at`, the record pass's sums) are sum |g| |cols| exactly, block by block (1,592 columns: 16
    positions a block; 700: 32, so 71 is two blocks and a tail of 7, 90 two and one of 16 lanes and 10 more) or an
    image's piece at a time (3 columns): a term dropped or counted twice changes one."""
    gen = torch.Generator().manual_seed(ck + length)
    g = torch.randint(-1000, 1001, (2, 8, length), generator=gen).double()
    cols = torch.randint(-1000, 1001, (2, ck, length), generator=gen).double()
    want = torch.einsum("bol,bcl->oc", g.abs(), cols.abs()).flatten()
    got = native.dot_summed_at(g.permute(1, 0, 2), cols.permute(0, 2, 1), 1.0, torch.arange(8 * ck))
    assert got is not None and torch.equal(got, want)


@pytest.fixture(scope="module")
def lane_builds(tmp_path_factory):
    """The kernel with its eight-double lanes in vector types and in arrays (`VECTOR_LANES` in _native.c): this
    process's own library for the kind this CPU takes by itself, the other built in a cache of its own."""
    own = native.library()
    kinds = ("arrays", "vector types")
    libs = {kinds[own.rp_vector_lanes()]: own}
    other = kinds[1 - own.rp_vector_lanes()]
    patch = pytest.MonkeyPatch()
    try:
        patch.setenv("REPLAY_NATIVE_CACHE", str(tmp_path_factory.mktemp("lanes")))
        patch.setattr(native, "FLAGS", [*native.FLAGS, f"-DVECTOR_LANES={kinds.index(other)}"])
        patch.setattr(native, "_LIB", None)
        libs[other] = native.library()
        assert libs[other] is not None and libs[other].rp_vector_lanes() == kinds.index(other)
    finally:
        patch.undo()
    return libs


def _on_each(libs: dict, run) -> list:
    """run() with each library in turn as this process's kernel."""
    saved, got = native._LIB, []
    try:
        for lib in libs.values():
            native._LIB = lib
            got.append(run())
    finally:
        native._LIB = saved
    return got


def _bits(x):
    if isinstance(x, torch.Tensor):
        return x.detach().contiguous().view(torch.uint8).flatten().tolist()
    return [_bits(y) for y in x] if isinstance(x, (tuple, list)) else x


@pytest.mark.parametrize("k", [16, 37, 77])
def test_lanes_in_vector_types_and_in_arrays_give_the_same_bits(lane_builds, k):
    """The two builds of the lane loops on products with many candidates: exact bounds of unit-stride vectors with a
    tail (abs_dot), a weight gradient's pieces block by block, both norms of an operand in one pass
    (square_sums_block): the same outputs, entries, codes and bounds, bit for bit (a lane summed in another order
    differs in its last bits; NaNs aside, whose payloads either build may pick). square_sums8's norms only choose the
    candidates (no output shows their bits): `test_either_lane_build_finds_the_close_calls_out_to_the_windows_edge`."""
    gen = torch.Generator().manual_seed(k)
    a = _f32(torch.randn(19, k, generator=gen, dtype=torch.float64))
    bt = _f32(torch.randn(13, k, generator=gen, dtype=torch.float64))
    odd, even = slice(1, k // 2 * 2, 2), slice(0, k // 2 * 2, 2)  # pairs that cancel
    a[:, odd], bt[::2, odd] = a[:, even], -bt[::2, even]
    a[:, k // 2 * 2 :] *= 2.0**-30  # an odd k's last term: small, and still in the bound
    b = bt.t()  # unit-stride columns
    g = _f32(torch.randn(2, 8, k, generator=gen, dtype=torch.float64))
    cols = _f32(torch.randn(2, 1592, k, generator=gen, dtype=torch.float64))
    g[..., odd], cols[..., odd] = g[..., even], -cols[..., even]
    g[..., k // 2 * 2 :] *= 2.0**-30
    gm, gs = determinism.gamma(k + 2), determinism.gamma(2 * k + 2)
    runs = {
        "product": lambda: native.round_dot(a @ b, a, b, gm, None, 0.0, False, determinism.SAFETY, determinism.WIDE),
        "summed": lambda: native.round_dot_summed(
            torch.matmul(g, cols.transpose(1, 2)).sum(0),
            g.permute(1, 0, 2),
            cols.permute(0, 2, 1),
            gs,
            determinism.SAFETY,
            determinism.WIDE,
        ),
        "norms": lambda: native.row_col_norms(torch.cat([a, a * 3], 0)),
        "bounds": lambda: native.dot_at((19, 13), a, b, gm, None, False, torch.arange(19 * 13)),
        "summed bounds": lambda: native.dot_summed_at(
            g.permute(1, 0, 2), cols.permute(0, 2, 1), gs, torch.arange(0, 8 * 1592, 7)
        ),
    }
    for name, run in runs.items():
        first, second = _on_each(lane_builds, run)
        assert first is not None and _bits(first) == _bits(second), name
        assert name not in ("product", "summed") or len(first[1]) > 10  # close calls: exact bounds were summed


@pytest.mark.parametrize("lanes", ["vector types", "arrays"])
def test_either_lane_build_finds_the_close_calls_out_to_the_windows_edge(lane_builds, lanes, monkeypatch):
    """Norms eight vectors at a time (square_sums8) in either build: exact, every lane and the tail's."""
    monkeypatch.setattr(native, "_LIB", lane_builds[lanes])
    for k in (16, 19):
        test_an_attention_products_short_vectors_norms_find_the_close_calls_out_to_the_windows_edge(k)


@pytest.mark.parametrize("arch", ["mlp", "cnn", "gpt"])
def test_lanes_in_vector_types_and_in_arrays_train_the_same_step(lane_builds, arch):
    """A det64 step of each architecture on either build: the same state, bit for bit, and the same log."""
    cfg, opt = TINY[arch]["config"], DEFAULT_OPTIMIZER[arch]
    model, batch = models.build(arch, cfg), Batches(arch, cfg, TINY[arch]["batch"], 0)(0)
    state = initial_state(models.init_params(arch, cfg, 0), opt)

    def step():
        r = Rounder("record")
        after, _ = train_step(model, state, batch, opt, "det64", r)
        return [*after.params.values(), *(t for b in after.buffers.values() for t in b.values())], encode_log(r.entries)

    (t1, log1), (t2, log2) = _on_each(lane_builds, step)
    assert log1 == log2 and len(t1) == len(t2) > 0 and _bits(t1) == _bits(t2)


@settings(max_examples=100, deadline=None)
@given(
    st.integers(1, 40),
    st.integers(1, 40),
    st.integers(0, 2**31 - 1),
    st.sampled_from(["element", "row", "scalar"]),
    st.sampled_from([1e-16, 1e-9, 1e-7]),
    st.sampled_from([1, 2, 3]),
)
def test_fused_full_bounds_match_the_torch_path(rows, cols, seed, per, rel, n):
    """On one thread and on several (rows split in blocks, close calls merged in order)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g, dtype=torch.float64)
    x[0, 0] = 0.0  # an exact zero with a positive bound: a close call (the sign of zero)
    with kernel_threads(n):
        if per == "element":
            _same(x, full_bound(x.abs() * rel, x.shape))
        elif per == "row":
            _same(x, full_bound(x.abs().sum(-1, keepdim=True) * rel, x.shape))
        else:
            s = x.sum()
            _same(s, full_bound(x.abs().sum() * rel, s.shape))


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([1, 8, 300, 4097]), st.integers(0, 2**31 - 1), st.sampled_from([1, 2, 3]))
def test_full_bounds_across_stretches(cols, seed, n):
    """A bound per element is rounded in flat stretches of 4,096 values whatever the rows (short rows cost
    no more than long ones): close calls on both sides of stretch and row boundaries, on one thread and
    on several, logged as the torch path logs them (row bounds are taken row by row, as before)."""
    g = torch.Generator().manual_seed(seed)
    rows = -(-3 * 4096 // cols) + 1
    x = torch.randn(rows, cols, generator=g, dtype=torch.float64)
    flat = x.view(-1)
    for at in (0, 4095, 4096, 4097, 8191, 8192, flat.numel() - 1):
        flat[at] = 1.0 + 2.0**-24  # a float32 midpoint: a close call under any positive bound
    with kernel_threads(n):
        assert _same(x, full_bound(torch.full_like(x, 1e-12), x.shape)) >= 7
        _same(x, full_bound(x.abs().sum(-1, keepdim=True) * 1e-9, x.shape))


def test_close_calls_are_found_and_exact_zeros_are_not():
    """Not vacuous: the cases above do hit close calls, and a zero bound never flags."""
    x = torch.tensor([[0.0, 1.0 + 2.0**-24, 2.0, -0.0]], dtype=torch.float64)  # 1 + 2^-24: a float32 midpoint
    assert _same(x, full_bound(torch.full_like(x, 1e-12), x.shape)) == 3  # 0, the midpoint, -0
    assert _same(x, full_bound(torch.zeros_like(x), x.shape)) == 0
    zeros = torch.zeros(64, 64, dtype=torch.float64)  # more close calls than the kernel's first buffer holds
    assert _same(zeros, full_bound(torch.full_like(zeros, 1e-12), zeros.shape)) == 64 * 64


@pytest.mark.parametrize("special", [math.nan, math.inf])
@pytest.mark.parametrize("where", ["column", "bias"])
def test_a_non_finite_column_hides_no_close_call_in_the_others(special, where):
    """A NaN in one column of B, or in its bias, makes that column's outputs NaN, never close calls; the other
    columns' close calls (cancellations to zero) are logged all the same, by the torch path as by the kernel: the
    torch path's coarse window took the max of the columns' norms, and a NaN there made every row's window NaN, so
    the point logged nothing where the kernel, whose windows are per column, logged them. An inf column's outputs
    are infinite, and both paths flag them alike (its window stays infinite)."""
    g = torch.Generator().manual_seed(3)
    a = _f32(torch.randn(24, 16, generator=g, dtype=torch.float64))
    b = _f32(torch.randn(16, 10, generator=g, dtype=torch.float64))
    a[:, 1::2] = a[:, 0::2]
    b[1::2] = -b[0::2]  # every output cancels to zero: a close call by the sign of zero
    bias = None
    if where == "column":
        b[5, 3] = special
    else:
        bias = torch.zeros(10, dtype=torch.float64)
        bias[3] = special
    v = torch.matmul(a, b) if bias is None else torch.addmm(bias, a, b)
    found = _same(v, dot_bound(a, b, 1.0, bias))
    assert found >= 24 * 9, "the nine finite columns' close calls"


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("a_major,b_major", [("row", "row"), ("col", "col"), ("col", "row"), ("row", "col")])
def test_strided_operands_for_the_exact_bounds(a_major, b_major, threads):
    """Every output a close call (pairs that cancel to zero), 6,144 of them: more than one pass of exact
    bounds holds. One strided operand is copied to unit stride (past an eighth of its vectors), two
    (a weight gradient's layout: A column-major, B row-major) as well (past twice their vectors); bounds
    and codes stay the torch path's, on one thread and on several."""
    g = torch.Generator().manual_seed(7)
    a = _f32(torch.randn(64, 8, generator=g, dtype=torch.float64))
    b = _f32(torch.randn(8, 96, generator=g, dtype=torch.float64))
    a[:, 1::2] = a[:, 0::2]
    b[1::2] = -b[0::2]
    if a_major == "col":
        a = a.t().contiguous().t()
    if b_major == "col":
        b = b.t().contiguous().t()
    with kernel_threads(threads):
        assert _same(torch.matmul(a, b), dot_bound(a, b)) == 64 * 96


def _relu_weight_gradient(k: int, m: int, n: int, seed: int):
    """A ReLU MLP's weight gradient's operands, A = activations^T (m, k) and B = gradients (k, n), strided as
    the step's are (an odd seed: A's rows unit-stride instead). Even rows of A are nonzero on the first half of
    the batch only, odd columns of B at two terms of the second half only (`half`, the last): those pairs'
    outputs are exact zeros under a Cauchy-Schwarz window > 0. Rows 2 mod 4 of A bridge them, equal at both
    terms where B's odd columns are opposite: zeros again, over common terms, that are close calls by the sign
    of zero; so are the outputs of even columns of B that cancel over pairs of rows repeated in A's first rows."""
    g = torch.Generator().manual_seed(seed)
    act = _f32(torch.randn(k, m, generator=g, dtype=torch.float64)).clamp_min(0)
    grad = _f32(torch.randn(k, n, generator=g, dtype=torch.float64))
    half = k // 2
    act[half:, 0::2] = 0.0
    act[half, 2::4] = act[k - 1, 2::4] = 0.75
    grad[:, 1::2] = 0.0
    grad[half, 1::2] = _f32(torch.randn(n // 2, generator=g, dtype=torch.float64))
    grad[k - 1, 1::2] = -grad[half, 1::2]
    grad[1::2, 0::4] = -grad[0::2, 0::4][: grad[1::2].shape[0]]
    act[1::2, :2] = act[0::2, :2][: act[1::2].shape[0]]
    return (act.t().contiguous() if seed % 2 else act.t()), grad


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("k", [64, 100, 1024, 1100])
@pytest.mark.parametrize("special", [None, math.inf, math.nan])
def test_a_weight_gradients_outputs_over_disjoint_zeros_have_the_torch_paths_bounds(k, special, threads):
    """Where an A row's nonzero terms and a B column's miss each other, the kernel takes the exact bound as +0
    from the operands' support masks, without summing (up to 1,024 terms; past that it sums): every output's
    bits and every entry are the torch path's, the cancelling zeros still close calls, on one thread and on
    several; and with an inf or NaN term among them (its outputs NaN, never candidates; the kernel does not take
    +0 from the masks where an operand's norm is not finite: |0| |inf| is NaN, not 0)."""
    for seed in (0, 1):
        a, b = _relu_weight_gradient(k, 40, 36, seed)
        if special is not None:
            a[4, k - 2] = special  # where the odd columns are zero: an output of 0 * inf, NaN
        v = torch.matmul(a, b)
        window = a.norm(dim=1).unsqueeze(1) * b.norm(dim=0) > 0  # Cauchy-Schwarz's, before its factor
        zeros = int(((v == 0) & (a.abs() @ b.abs() == 0) & window).sum())
        with kernel_threads(threads):
            found = _same(v, dot_bound(a, b))
        assert zeros >= 150 and found >= 180  # exact zeros the window flags; close calls among the others


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize(
    "m,n,cancelling,a_major", [(64, 96, 2, "col"), (64, 96, 64, "col"), (4, 20000, 1, "row"), (4, 20000, 3, "row")]
)
def test_strided_operands_copied_or_streamed_by_how_often_they_are_read(m, n, cancelling, a_major, threads):
    """A's rows that cancel make close calls of their whole rows, the rest few. Both operands strided (a weight
    gradient's layout) are streamed while candidates are at most twice their vectors (2 of 64 rows: 192 for
    160 vectors) and copied past that (all rows); B alone strided beyond the cache (20,000 vectors of 8
    terms) likewise (1 row of 4: 20,000 candidates, streamed; 3 rows: copied). Every way, the torch path's
    bounds and codes; and the bounds themselves, the torch path's within their rounding, taken at every output
    (a replay's kernel, `native.dot_at`, whose candidates are all of them: copied or streamed alike)."""
    g = torch.Generator().manual_seed(11)
    a = _f32(torch.randn(m, 8, generator=g, dtype=torch.float64))
    b = _f32(torch.randn(8, n, generator=g, dtype=torch.float64))
    a[:cancelling, 1::2] = a[:cancelling, 0::2]
    b[1::2] = -b[0::2]
    a = a.t().contiguous().t() if a_major == "col" else a
    with kernel_threads(threads):
        assert _same(torch.matmul(a, b), dot_bound(a, b)) >= cancelling * n
    _same_bounds_at(dot_bound(a, b), torch.arange(m * n), threads, 8, native.DOT_AT_CHUNK)


def test_a_kernel_out_of_memory_takes_the_torch_path():
    """A kernel says -1 when it cannot allocate its working space: the caller is told to use torch."""
    room = struct.Struct("=2Qq")  # a block of the room alone: idx, code, cap
    assert native._collect(lambda block: -1, room, (), 16) is None
    assert native._collect(lambda block: 0, room, (), 16) == ([], [])


def test_a_kernel_short_of_room_runs_again_with_room_for_all():
    """A kernel that found more close calls than its room says how many: it runs once more with room for
    them all, and every one comes back (codes as Rounder.entries holds them)."""
    block, caps = struct.Struct("=q2Qq"), []

    def kernel(packed):
        tag, idx, code, cap = block.unpack(packed)
        caps.append((tag, cap))
        if cap < 20:
            return 20
        for i in range(20):
            ctypes.c_int64.from_address(idx + 8 * i).value = 3 * i
            ctypes.c_int64.from_address(code + 8 * i).value = i % 2 if i < 10 else (1 << 32) | i
        return 20

    assert native._collect(kernel, block, (7,), 16) == (
        [3 * i for i in range(20)],
        [bool(i % 2) for i in range(10)] + list(range(10, 20)),
    )
    assert caps == [(7, 16), (7, 20)]  # the arguments, then the room


def test_the_kernel_declines_what_it_does_not_handle():
    a, b = torch.randn(2, 2, 2, 3, 4, dtype=torch.float64), torch.randn(2, 2, 2, 4, 5, dtype=torch.float64)
    assert dot_bound(a, b).fused(torch.matmul(a, b)) is None  # three batch dims
    v = torch.randn(5, 4, dtype=torch.float64).t()
    assert full_bound(v.abs(), v.shape).fused(v) is None  # not contiguous
    f = torch.randn(4, 5)
    assert full_bound(f.abs(), f.shape).fused(f) is None  # not float64


def _unbatched(bias=True):
    a, b = torch.randn(6, 4, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64)
    return a, b, torch.randn(5, dtype=torch.float64) if bias else None


_UNBATCHED_REFUSED = {
    "v transposed": lambda a, b, c: (torch.randn(5, 6, dtype=torch.float64).t(), a, b, c, False),
    "v float32": lambda a, b, c: ((a @ b).float(), a, b, c, False),
    "a float32": lambda a, b, c: (a @ b, a.float(), b, c, False),
    "b float32": lambda a, b, c: (a @ b, a, b.float(), c, False),
    "K differs": lambda a, b, c: (a @ b, a, torch.randn(3, 5, dtype=torch.float64), c, False),
    "v's rows differ": lambda a, b, c: (torch.randn(7, 5, dtype=torch.float64), a, b, c, False),
    "v's columns differ": lambda a, b, c: (torch.randn(6, 4, dtype=torch.float64), a, b, c, False),
    "bias too short": lambda a, b, c: (a @ b, a, b, c[:4], False),
    "bias strided": lambda a, b, c: (a @ b, a, b, torch.randn(10, dtype=torch.float64)[::2], False),
    "bias float32": lambda a, b, c: (a @ b, a, b, c.float(), False),
    "bias per row, of a column's length": lambda a, b, c: (a @ b, a, b, c, True),
    "bias 2-D": lambda a, b, c: (a @ b, a, b, c.view(1, 5), False),
}


@pytest.mark.parametrize("case", sorted(_UNBATCHED_REFUSED))
def test_an_unbatched_product_the_kernel_cannot_take_is_declined(case):
    """The inline checks of a linear layer's product: each refusal keeps a tensor the kernel would misread from it."""
    v, a, b, bias, rows = _UNBATCHED_REFUSED[case](*_unbatched())
    assert native.round_dot(v, a, b, 1e-14, bias, 1e-14, rows, determinism.SAFETY, determinism.WIDE) is None
    a, b, bias = _unbatched()  # its control: the same shapes, taken
    good = native.round_dot(a @ b, a, b, 1e-14, bias, 1e-14, False, determinism.SAFETY, determinism.WIDE)
    assert good is not None and torch.equal(good[0], (a @ b).float().double())  # (the bias is the caller's to add)


@pytest.mark.parametrize("arch", ["mlp", "cnn", "gpt"])
def test_recorded_steps_are_the_same_with_and_without_the_kernel(arch, monkeypatch):
    """Rounding points and optimizer updates (SGD, SGD with weight decay, AdamW: the three defaults)."""
    cfg, opt = TINY[arch]["config"], DEFAULT_OPTIMIZER[arch]
    model = models.build(arch, cfg)
    state = initial_state(models.init_params(arch, cfg, 3), opt)
    batch = Batches(arch, cfg, TINY[arch]["batch"], 3)(0)
    results = []
    for lib in (native.library(), False):
        monkeypatch.setattr(native, "_LIB", lib)
        s, steps = state, []
        for _ in range(3):  # past the first step, so the optimizer buffers are not zero
            rounder = Rounder("record", trace=[])
            s, loss = train_step(model, s, batch, opt, "det64", rounder)
            steps.append((loss, rounder.entries, [(k, x) for k, _, x in rounder.trace]))
        results.append((s, steps))
    (s0, steps0), (s1, steps1) = results
    assert s0.equal(s1) and not s0.equal(state)
    for (l0, e0, t0), (l1, e1, t1) in zip(steps0, steps1):
        assert l0 == l1 and e0 == e1
        assert [k for k, _ in t0] == [k for k, _ in t1]
        assert all(torch.equal(x.view(torch.int32), y.view(torch.int32)) for (_, x), (_, y) in zip(t0, t1))


@pytest.mark.parametrize("arch", ["mlp", "gpt"])
def test_recorded_steps_are_the_same_with_norms_formed_once_for_two_products(arch, monkeypatch):
    """A linear layer's operands' row and column norms formed in one pass each (`row_col_norms`, every operand here:
    the threshold lowered) and handed to its products' record passes: the same states and logs as the kernel's own
    norms and as the torch path's."""
    cfg, opt = TINY[arch]["config"], DEFAULT_OPTIMIZER[arch]
    model = models.build(arch, cfg)
    state = initial_state(models.init_params(arch, cfg, 3), opt)
    batch = Batches(arch, cfg, TINY[arch]["batch"], 3)(0)
    formed, real = [], native.row_col_norms
    monkeypatch.setattr(native, "row_col_norms", lambda t: formed.append(t.shape) or real(t))
    results = []
    for lib, shared in ((native.library(), 1), (native.library(), 1 << 60), (False, 1)):
        monkeypatch.setattr(native, "_LIB", lib)
        monkeypatch.setattr(determinism, "SHARED_NORMS_MIN", shared)
        s, logs = state, []
        for _ in range(2):
            rounder = Rounder("record")
            s, loss = train_step(model, s, batch, opt, "det64", rounder)
            logs.append((loss, rounder.entries))
        results.append((s, logs))
        if shared == 1 and lib:
            assert len(formed) >= 2 * 3 * 2, formed  # not vacuous: a forward's two operands, the backward's gradient
            formed.clear()
    (s0, logs0), (s1, logs1), (s2, logs2) = results
    assert s0.equal(s1) and s0.equal(s2) and logs0 == logs1 == logs2 and not formed  # (the torch path forms none)


def test_a_convolutions_recorded_steps_are_the_same_with_norms_from_its_columns_pass_and_its_input(monkeypatch):
    """A convolution's forward point handed its columns' norms by the pass that makes the columns (`im2col`
    with_norms), and its weight gradient's handed its input channels' norms (`_channel_norms`, a looser screen):
    the same states and logs as with the kernel's own norms and as on the torch path, close calls at both points."""
    from replay.training import ops

    arch, opt = "cnn", DEFAULT_OPTIMIZER["cnn"]
    cfg = {"in_channels": 3, "image": 16, "channels": [8, 16], "classes": 4}
    model = models.build(arch, cfg)
    state = initial_state(models.init_params(arch, cfg, 1), opt)  # (a seed whose steps log a weight gradient's point)
    batch = Batches(arch, cfg, 16, 1)(0)
    real_im2col, real_channel_norms, given = native.im2col, ops._channel_norms, []
    monkeypatch.setattr(determinism, "PACK_MIN", 1)  # backward unfolds each input again (columns this small are kept)
    results = []
    for lib, handed in ((native.library(), True), (native.library(), False), (False, True)):
        with monkeypatch.context() as m:
            m.setattr(native, "_LIB", lib)
            if handed:  # counted
                m.setattr(native, "im2col", lambda *a, **k: given.append(k) or real_im2col(*a, **k))
                m.setattr(ops, "_channel_norms", lambda *a: given.append(a) or real_channel_norms(*a))
            else:  # the kernel's own
                m.setattr(Rounder, "hands_norms", lambda self: False)
                m.setattr(ops, "_channel_norms", lambda *a: None)
            s, logs = state, []
            for _ in range(3):
                rounder = Rounder("record")
                s, loss = train_step(model, s, batch, opt, "det64", rounder)
                logs.append((loss, rounder.entries))
        results.append((s, logs))
        if lib and handed:  # not vacuous: both layers' columns with norms, both weight gradients' channels
            assert sum(bool(k.get("with_norms")) for k in given if isinstance(k, dict)) == 2 * 3
            assert sum(isinstance(a, tuple) for a in given) == 2 * 3
            names = {rounder.name(k) for _, entries in logs for k in entries}
            assert {"convs.0#0", "convs.1#0", "convs.1#1"} <= names, names
    (s0, logs0), (s1, logs1), (s2, logs2) = results
    assert s0.equal(s1) and s0.equal(s2) and logs0 == logs1 == logs2


@pytest.mark.parametrize("special", [math.nan, math.inf])
def test_a_weight_gradients_channel_norms_screen_no_fewer_close_calls_past_a_non_finite_pixel(special):
    """`_channel_norms` where a channel holds a NaN or inf pixel that some of its rows never read (a 1 x 1 window at
    stride 2): those rows' own norms are finite, the channel's is not; its rows are screened wide open (an infinite
    window), so the exact bounds find the close calls the rows' own norms find."""
    from replay.training import ops

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 2, 8, 8, generator=gen, dtype=torch.float64)
    x[0, 0, 1, 1] = special  # a pixel no 1 x 1 stride-2 window reads
    cols = F.unfold(x, (1, 1), padding=0, stride=2)
    assert cols.isfinite().all()
    g = torch.randn(4, 3, cols.shape[2], generator=gen, dtype=torch.float64)
    v = torch.matmul(g, cols.transpose(1, 2)).sum(0)
    a, b, gm = g.permute(1, 0, 2), cols.permute(0, 2, 1), 1e-8  # wide windows: close calls in most outputs
    own = native.round_dot_summed(v.clone(), a, b, gm, determinism.SAFETY, determinism.WIDE)
    norms = ops._channel_norms(x, (1, 1))
    assert norms[0] == math.inf and norms[1].isfinite()
    given = native.round_dot_summed(v.clone(), a, b, gm, determinism.SAFETY, determinism.WIDE, (None, norms))
    assert own is not None and given is not None and len(own[1]) >= 3
    assert given[1:] == own[1:] and torch.equal(given[0], own[0])


@pytest.mark.parametrize("native_on", [True, False])
def test_steps_recorded_under_the_wider_weight_gradient_bound_still_replay(native_on, monkeypatch):
    """Transcripts recorded before the weight gradient's bound was its sum's depth (gamma(B * L + 2), 50 times wider
    at cnn-32's size, many more close calls logged) replay under the narrower one to the same states, with the kernel
    and on the torch path: every entry is taken, none refused."""
    from replay.training import ops

    opt, cfg = DEFAULT_OPTIMIZER["cnn"], {"in_channels": 3, "image": 16, "channels": [8, 16], "classes": 4}
    model = models.build("cnn", cfg)
    state = initial_state(models.init_params("cnn", cfg, 1), opt)
    batch = Batches("cnn", cfg, 16, 1)(0)
    with monkeypatch.context() as m:
        m.setattr(ops, "_weight_grad_gamma", lambda images, positions: gamma(images * positions + 2))
        recorded, s = [], state
        for _ in range(3):
            rounder = Rounder("record")
            s, _ = train_step(model, s, batch, opt, "det64", rounder)
            recorded.append((s, rounder.entries))
    names = [rounder.name(k) for k in rounder.entries]
    assert sum(n.endswith("#1") and n.startswith("convs") for n in names) == 2, names  # both weight gradients logged
    monkeypatch.setattr(native, "_LIB", native.library() if native_on else False)
    s = state
    for want, entries in recorded:
        rounder = Rounder("replay", entries=entries)
        s, _ = train_step(model, s, batch, opt, "det64", rounder)
        rounder.finish()
        assert s.equal(want)


@pytest.mark.parametrize("layout", ["rows", "columns", "sliced"])
def test_row_and_column_norms_in_one_pass_are_the_norms_at_any_thread_count(layout):
    """`row_col_norms` of a row-major, a column-major (a transposed view) and a sliced operand: each norm within its
    sum's rounding of torch's, zeros exact, the same bits on one thread or three (columns in blocks, a row's partial
    sums added in block order); a layout without a unit stride, or float32, declined."""
    g = torch.Generator().manual_seed(7)
    base = _f32(torch.randn(300, 900, generator=g, dtype=torch.float64)) * 10.0 ** torch.randint(
        -3, 4, (300, 900), generator=g
    )
    base[5], base[:, 17] = 0.0, 0.0
    t = {"rows": base[:, :700], "columns": base[:, :700].t(), "sliced": base[:, 100:800]}[layout]
    with kernel_threads(1):
        rn, cn = native.row_col_norms(t)
    with kernel_threads(3):
        rn3, cn3 = native.row_col_norms(t)
    assert torch.equal(rn, rn3) and torch.equal(cn, cn3)
    for got, want, n in ((rn, t.pow(2).sum(1).sqrt(), t.shape[1]), (cn, t.pow(2).sum(0).sqrt(), t.shape[0])):
        assert got.shape == want.shape and torch.all((got - want).abs() <= want * ((n + 4) * 2.0**-53))
        assert torch.equal(got == 0, want == 0)
    assert native.row_col_norms(base[:, ::2]) is None and native.row_col_norms(t.float()) is None


def test_a_product_given_its_operands_norms_finds_the_close_calls_it_finds_alone():
    """Rows of A and columns of B parallel (Cauchy-Schwarz exact: the screen's window is the exact one), outputs set at
    fractions of that window from float32 midpoints: close calls up to the window's edge, none past it; with the norms
    handed in (`row_col_norms`), the kernel logs what it logs forming them itself, and what the torch path logs."""
    k, m, n = 48, 20, 24
    a = torch.full((m, k), 0.75, dtype=torch.float64)
    b = torch.full((k, n), 0.375, dtype=torch.float64)
    bound = dot_bound(a, b)
    window = bound.at(torch.arange(m * n)) * determinism.SAFETY
    f = (18.0 + torch.arange(m * n, dtype=torch.float64) * 2.0**-10).float()
    mid = (f.double() + torch.nextafter(f, torch.full_like(f, math.inf)).double()) / 2
    frac = torch.linspace(-1.5, 1.5, m * n, dtype=torch.float64)
    v = (mid + frac * window).reshape(m, n)
    want_r, want = _reference(v, bound)
    args = (a, b, determinism.gamma(k + 2), None, 0.0, False, determinism.SAFETY, determinism.WIDE)  # dot_bound's
    alone = native.round_dot(v, *args)
    given = native.round_dot(v, *args, norms=(native.row_col_norms(a)[0], native.row_col_norms(b)[1]))
    assert torch.equal(given[0], want_r) and torch.equal(alone[0], want_r)
    assert given[1:] == alone[1:] and {0: tuple(given[1:])} == want
    logged = frac[given[1]].abs()
    assert bool((logged < 1).all()) and bool(((logged > 0.6) & (logged < 0.95)).any())  # out to the window's edge


@pytest.mark.parametrize("k", [16, 19])
def test_an_attention_products_short_vectors_norms_find_the_close_calls_out_to_the_windows_edge(k):
    """An attention head's product (batched; A's rows and B's columns unit-stride vectors of k terms, formed eight at a
    time): each batch's vectors one spike at its own position (every lane and the tail's, one batch each), scaled by
    powers of two apart (a lane taken from a neighbour's vector is off by a factor of two or more), so that
    Cauchy-Schwarz is exact and the screen's window is the exact one; outputs set at fractions of that window from
    float32 midpoints, every row and every column from outside to outside. The kernel logs what the torch path logs,
    out to the window's edge in every batch: a norm short of a lane, or of its tail, misses close calls (one too large
    is only slower: not tested)."""
    m, n = 21, 13  # vectors on both sides: two groups of eight and a rest
    spikes = torch.eye(k, dtype=torch.float64)  # batch t: every vector along e_t
    scale_a = 2.0 ** (torch.arange(m, dtype=torch.float64) % 4)
    scale_b = 2.0 ** -(torch.arange(n, dtype=torch.float64) % 3)
    a = scale_a[None, :, None] * spikes[:, None, :]  # (k, m, k): rows unit-stride
    b = (scale_b[None, :, None] * spikes[:, None, :]).transpose(-2, -1)  # (k, k, n): columns unit-stride
    bound = dot_bound(a, b)
    size = k * m * n
    window = bound.at(torch.arange(size)) * determinism.SAFETY
    f = (0.125 + torch.arange(size, dtype=torch.float64) * 2.0**-20).float()  # windows of 70 float64 steps or more
    mid = (f.double() + torch.nextafter(f, torch.full_like(f, math.inf)).double()) / 2
    steps = torch.tensor([-1.4, -1.2, -0.97, -0.9, -0.75, -0.5, 0, 0.5, 0.75, 0.9, 0.97, 1.2, 1.4], dtype=torch.float64)
    i, j = torch.arange(m)[:, None], torch.arange(n)[None, :]
    frac = steps[(i + j) % 13].reshape(-1).repeat(k)  # each row's and each column's outputs at every fraction
    v = (mid + frac * window).reshape(k, m, n)
    want_r, want = _reference(v, bound)
    got = native.round_dot(v, a, b, determinism.gamma(k + 2), None, 0.0, False, determinism.SAFETY, determinism.WIDE)
    assert got is not None and torch.equal(got[0], want_r) and {0: tuple(got[1:])} == want
    logged = frac[got[1]].abs()
    assert bool((logged < 1).all()) and bool((logged == 0.97).any())  # out to the window's edge (a norm 5% short fails)
    at = torch.tensor(got[1])
    rows, cols = {(int(t), int(r)) for t, r in zip(at // (m * n), at // n % m)}, {int(c) for c in at % n}
    assert rows == {(t, r) for t in range(k) for r in range(m)} and cols == set(range(n))  # every vector's


def test_without_a_compiler_replay_falls_back_to_torch(monkeypatch, tmp_path):
    monkeypatch.setattr(native, "_LIB", None)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("REPLAY_NATIVE_CACHE", str(tmp_path / "cache"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert native.library() is None
    assert any("torch path" in str(w.message) for w in caught)
    x = torch.tensor([1.0 + 2.0**-24], dtype=torch.float64)
    assert full_bound(torch.full_like(x, 1e-12), x.shape).fused(x) is None
    r = Rounder("record")
    assert torch.equal(r(0, x, full_bound(torch.full_like(x, 1e-12), x.shape)), x.float().double())
    assert 0 in r.entries  # the torch path still finds the close call


def test_a_compiler_without_openmp_builds_the_kernel_single_threaded(monkeypatch, tmp_path):
    """A flag the compiler refuses in OpenMP's place: the kernel is built without it, and on several
    threads' worth of work gives the torch path's values and entries (its pragmas ignored)."""
    monkeypatch.setattr(native, "_LIB", None)
    monkeypatch.setattr(native, "OPENMP", ["-fno-such-openmp-flag"])
    monkeypatch.setenv("REPLAY_NATIVE_CACHE", str(tmp_path / "cache"))
    assert native.library() is not None
    g = torch.Generator().manual_seed(3)
    a = _f32(torch.randn(256, 8, generator=g, dtype=torch.float64))
    b = _f32(torch.randn(8, 256, generator=g, dtype=torch.float64))
    a[:, 1::2] = a[:, 0::2]
    b[1::2] = -b[0::2]
    with kernel_threads(3):
        assert _same(torch.matmul(a, b), dot_bound(a, b)) > 0


@pytest.mark.kernel_independent
@pytest.mark.skipif(not native.WIDE_VECTORS, reason="x86 only: no wide-vector flag to refuse")
@pytest.mark.parametrize("refused", ["WIDE_VECTORS", "OPENMP"])
def test_each_flag_a_compiler_refuses_is_dropped_alone(monkeypatch, tmp_path, refused):
    """The wide vectors refused: the kernel is still built with OpenMP (its parallel loops) where the compiler builds
    it with OpenMP at all (GCC's libgomp, or an LLVM OpenMP; a clang without one builds it without); OpenMP refused:
    built without it."""
    openmp = lambda lib: any(s in lib.read_bytes() for s in (b"GOMP_parallel", b"__kmpc_fork_call"))
    with_every_flag = openmp(native._build())  # this process's own library (cached: not built again)
    monkeypatch.setattr(native, "_LIB", None)
    monkeypatch.setattr(native, refused, ["-fno-such-flag"])
    monkeypatch.setenv("REPLAY_NATIVE_CACHE", str(tmp_path / "cache"))
    assert native.library() is not None
    (built,) = (tmp_path / "cache").glob("rounding-*.so")
    assert openmp(built) == (with_every_flag and refused == "WIDE_VECTORS")
    version = subprocess.run([native.compiler(), "--version"], capture_output=True, text=True).stdout
    assert with_every_flag or "Free Software Foundation" not in version  # GCC builds it with OpenMP


@pytest.mark.kernel_independent
def test_a_library_whose_argument_blocks_differ_is_not_used(monkeypatch, tmp_path):
    """native.py packs rp_dot's and rp_full's arguments as the C structs lay them out; a library built from
    another layout (a field added on one side only) would read garbage: it is refused, the torch path
    runs."""
    monkeypatch.setattr(native, "_LIB", None)
    monkeypatch.setattr(native, "_FULL_ARGS", struct.Struct(native._FULL_ARGS.format + "q"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert native.library() is None
    assert any("argument blocks" in str(w.message) for w in caught)


def test_room_for_close_calls_is_kept_for_small_points_only(monkeypatch):
    """Each thread's room for a kernel's close calls is reused by every small point; a larger point's is
    made for it alone (not kept), and either way the same entries come back."""
    g = torch.Generator().manual_seed(5)
    a = _f32(torch.randn(40, 30, generator=g, dtype=torch.float64))
    b = _f32(torch.randn(30, 50, generator=g, dtype=torch.float64))
    a[:, 1::2] = a[:, ::2]
    b[1::2, :5] = -b[::2, :5]
    v = a @ b
    want = Rounder("record")
    want.dot(0, v, a, b)
    assert len(want.entries[0][0]) > 100
    kept = native._room_buffer(16)[1]
    assert native._room_buffer(native.ROOM_KEPT)[1] == kept
    assert native._room_buffer(native.ROOM_KEPT + 1)[1] != kept
    monkeypatch.setattr(native, "ROOM_KEPT", 8)  # every point's room now its own
    got = Rounder("record")
    got.dot(0, v, a, b)
    assert got.entries == want.entries


def test_replay_native_0_turns_the_kernel_off(monkeypatch):
    monkeypatch.setattr(native, "_LIB", None)
    monkeypatch.setenv("REPLAY_NATIVE", "0")
    assert native.library() is None


_SPECIAL = [0.0, -0.0, 1.0 + 2.0**-24, 3.4028235e38, -3.4028235e38, 3.5e38, 1e-45, float("nan"), float("inf")]


@st.composite
def applied_entries(draw):
    """A rounding point and a log for it: values with float32 midpoints, signed zeros, overflow and NaN;
    windows zero, tiny, wide, NaN; codes that fit, parities that do not, wide values in and out."""
    n = draw(st.integers(1, 40))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(n, generator=g, dtype=torch.float64) * draw(st.sampled_from([1.0, 1e-30, 1e30]))
    for i in draw(st.lists(st.integers(0, n - 1), max_size=4)):
        v[i] = draw(st.sampled_from(_SPECIAL))
    rel = draw(st.sampled_from([0.0, 1e-20, 1e-9, 1.5e-8, 3e-8, 1e-7, 1e-3]))  # windows of 0, 1, 2, 3+ floats
    err = v.abs() * rel
    for i in draw(st.lists(st.integers(0, n - 1), max_size=3)):
        err[i] = draw(st.sampled_from([0.0, float("nan"), 1e-12, 1.0]))
    idx = sorted(draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n)))
    codes = []
    for i in idx:
        kind = draw(st.sampled_from(["parity", "own", "wide-random"]))
        own = int(v[i : i + 1].float().view(torch.int32)) & 0xFFFFFFFF
        if kind == "parity":
            codes.append(draw(st.booleans()))
        elif kind == "own":
            codes.append(own)
        else:
            codes.append(draw(st.integers(0, 2**32 - 1)))
    scale = draw(st.sampled_from([None, 1e-3]))
    return v, err, idx, codes, draw(st.booleans()), scale


@settings(max_examples=300, deadline=None)
@given(applied_entries())
def test_applied_entries_match_the_reference(case):
    """Rounder._apply's per-entry decisions in C against its Python loop: the same float32 values bit for
    bit, the same widest window, and the same refusal, word for word (`native.apply_at`: v contiguous, read
    in place, or a strided view, gathered first); a refused log leaves the output as it was."""
    v, err, idx, codes, steers, scale = case
    strided = torch.stack([v, -v], -1)[..., 0]
    results = []
    for lib, values in ((native.library(), v), (native.library(), strided), (False, v)):
        bound = full_bound(err, v.shape, steers=steers, scale=None if scale is None else torch.tensor(scale))
        rounder = Rounder("replay", entries={0: (list(idx), list(codes))})
        rounder.op("point")
        saved, native._LIB = native._LIB, lib
        # the output as it stands before the log is applied, each logged element's bits unlike anything a
        # log gives (a missed write shows), the others as they are
        before = v.float().double().index_fill_(0, torch.tensor(idx), 7.0)
        out = before.clone()
        try:
            r = rounder._apply(0, values, out, bound)
            results.append(("ok", r.float().view(torch.int32).tolist(), rounder.max_ratio))
        except LogMismatch as exc:
            results.append(("refused", str(exc)))
            assert torch.equal(out.view(torch.int64), before.view(torch.int64))
        finally:
            native._LIB = saved
    assert (v.numel() == 1 or not strided.is_contiguous()) and results[0] == results[1] == results[2]


def test_rounding_alone_on_severalkernel_threads():
    """A replay rounds every point's whole output (`native.round_f32`): on three threads, blocks of a
    large tensor, the same bits as torch's conversion, signed zeros, overflow and NaN included."""
    v = torch.randn(70_001, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 1e38
    v[:5] = torch.tensor([-0.0, float("nan"), 3.5e38, -float("inf"), 1.0 + 2.0**-24])
    with kernel_threads(3):
        got = native.round_f32(v)
    assert torch.equal(got.view(torch.int64), v.float().double().view(torch.int64))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 300), st.integers(1, 300), st.sampled_from([0, -1]), st.sampled_from([1, 3]), st.integers(0, 99))
def test_magnitude_sums_match_the_torch_path(rows, cols, dim, n, seed):
    """A bound's sum of |x| over rows or columns in one native pass (`determinism.abs_sum`): torch's sum
    of the same nonnegative terms in another order, so within both sums' rounding; zeros stay zero."""
    x = torch.randn(rows, cols, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    x[:, 0] = 0.0
    x[0] = -0.0
    with kernel_threads(n):
        got = abs_sum(x, dim, keepdim=True)
    want = x.abs().sum(dim, keepdim=True)
    terms = x.shape[dim]
    assert got.shape == want.shape and got.dtype == torch.float64
    assert torch.all((got - want).abs() <= want * (2 * terms * 2.0**-53))
    assert torch.equal(got == 0, want == 0)


@pytest.mark.parametrize("threads", [1, 3])
def test_a_crowded_point_takes_the_torch_path(threads):
    """Every one of 90,000 outputs a close call (signed zeros with a positive bound): more candidates than
    the kernel holds for a point that size, so it declines, and the step logs what the torch path logs."""
    v = torch.zeros(300, 300, dtype=torch.float64)
    v[::2] = -0.0
    bound = full_bound(torch.full_like(v, 1e-12), v.shape)
    with kernel_threads(threads):
        assert bound.fused(v) is None
        rounder = Rounder("record")
        with pytest.raises(LogOverflow) as overflow:  # the device path's slots overflow: as train_step does,
            rounder(0, v, bound)  # the point is redone dense
            rounder.finish()
        rounder.dense.update(overflow.value.keys)
        rounder.reset(defer=True)
        r = rounder(0, v, bound)
    assert torch.equal(r.view(torch.int64), v.float().double().view(torch.int64))
    _, want = _reference(v, bound)
    assert rounder.entries == want and len(want[0][0]) == v.numel()


def _cancelling_product(seed: int, m: int = 300, k: int = 8, n: int = 200):
    """a @ b with exact cancellations (columns of a in equal pairs, rows of b in opposite pairs, half of the rows):
    zeros with a positive bound (close calls) among ordinary outputs; a bias per column, zero in every other."""
    g = torch.Generator().manual_seed(seed)
    a = _f32(torch.randn(m, k, generator=g, dtype=torch.float64))
    b = _f32(torch.randn(k, n, generator=g, dtype=torch.float64))
    a[: m // 2, 1::2] = a[: m // 2, 0::2]
    b[1::2] = -b[0::2]
    bias = _f32(torch.randn(n, generator=g, dtype=torch.float64))
    bias[0::2] = 0.0  # those columns' cancelled outputs stay zeros
    return a, b, bias


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("room", ["enough", "short"])
def test_a_product_rounded_in_place_is_the_one_rounded_into_a_new_tensor(threads, room, monkeypatch):
    """`round_dot(..., in_place=True)` rounds v itself (the caller's temporary, no output made) to the bits and
    entries a new output gets; short of room for its close calls, its second run reads v as it was (v is
    rounded last, after every close call is found)."""
    a, b, bias = _cancelling_product(threads)
    v = torch.addmm(bias, a, b)
    f = v[1::7, ::5].float()  # and midpoints between two float32s: close calls that rounding v would hide
    v[1::7, ::5] = (f.double() + torch.nextafter(f, torch.full_like(f, math.inf)).double()) / 2
    args = (a, b, 1e-15, bias, 1e-15, False, determinism.SAFETY, determinism.WIDE)
    with kernel_threads(threads):
        want, want_idx, want_codes = native.round_dot(v, *args)
        if room == "short":
            monkeypatch.setattr(native, "_room_for", lambda outputs: 1)
        got, idx, codes = native.round_dot(v, *args, in_place=True)
    assert got is v and torch.equal(v.view(torch.int64), want.view(torch.int64))
    assert (idx, codes) == (want_idx, want_codes) and len(idx) > 1


@pytest.mark.parametrize("threads", [1, 3])
def test_a_crowded_product_declined_in_place_is_left_as_it_was(threads):
    """Where the kernel declines a point it was to round in place (more candidates than it holds), v is
    unchanged, signed zeros and all: the torch path that takes the point then reads the product's values."""
    a, b = torch.ones(300, 2, dtype=torch.float64), torch.ones(2, 300, dtype=torch.float64)
    b[1] = -1.0  # every output 1 - 1 = 0 with a positive bound: all candidates
    v = a @ b
    v[::2] = -0.0
    v[1, 1] = 1.0 + 2.0**-30  # one value the rounding would change
    before = v.clone()
    with kernel_threads(threads):
        assert native.round_dot(v, a, b, 1e-14, None, 0.0, False, 4.0, 8.0, in_place=True) is None
    assert torch.equal(v.view(torch.int64), before.view(torch.int64))


def _b_gradient_as_product(R, key, a, g, norms, weight, lean=False):
    """`ops._b_gradient` as it was: always A^T g, the point's own layout (another machine's GEMM, in effect)."""
    at = a.transpose(-2, -1)
    gb = R.dot(key, torch.matmul(at, g), at, g, owned=True, norms=norms)
    return gb.t() if weight else gb


@pytest.mark.parametrize("arch", ["mlp", "gpt"])
@pytest.mark.parametrize("kernel", [True, False])
def test_a_weight_gradient_formed_transposed_replays_where_it_is_not(arch, kernel, monkeypatch):
    """A narrow linear layer's weight gradient is formed as its transpose on a CPU (`ops._b_gradient`: the tiny MLP's
    head 48 -> 4, the GPT's MLP 128 -> 32), another sum than the point's own layout: three recorded steps replay
    to the same states where the gradient is formed the other way (as a machine with another GEMM sums), and the
    other way round, with the kernel on and off; and the transposed product is the one recorded."""
    cfg, opt = TINY[arch]["config"], DEFAULT_OPTIMIZER[arch]
    model = models.build(arch, cfg)
    batches = Batches(arch, cfg, TINY[arch]["batch"], 7)
    monkeypatch.setattr(native, "_LIB", native.library() if kernel else False)
    turned = []
    for name in ("dot", "kernel_product"):  # (a recording on the kernel takes the lean one: `_Matmul`)
        real = getattr(Rounder, name)
        spy = lambda self, *a, real=real, **kw: turned.append(kw.get("transposed")) or real(self, *a, **kw)
        monkeypatch.setattr(Rounder, name, spy)
    ways = {"transposed": ops._b_gradient, "as product": _b_gradient_as_product}
    for recorded_way, replayed_way in (("transposed", "as product"), ("as product", "transposed")):
        monkeypatch.setattr(ops, "_b_gradient", ways[recorded_way])
        turned.clear()
        state = initial_state(models.init_params(arch, cfg, 7), opt)
        states, logs = [state], []
        for t in range(3):
            r = Rounder("record")
            state, _ = train_step(model, state, batches(t), opt, "det64", r)
            states.append(state)
            logs.append(encode_log(r.entries))
        assert any(turned) == (recorded_way == "transposed")
        assert sum(len(decode_log(log)) for log in logs) > 0
        monkeypatch.setattr(ops, "_b_gradient", ways[replayed_way])
        for t in range(3):
            replayed, _ = train_step(
                model, states[t], batches(t), opt, "det64", Rounder("replay", entries=decode_log(logs[t]))
            )
            assert replayed.equal(states[t + 1]), (recorded_way, t)


@pytest.mark.parametrize("kernel", [True, False])
@pytest.mark.parametrize(("k", "n", "turned"), [(48, 4, True), (48, 48, True), (16, 48, False)])
def test_a_weight_gradient_is_formed_in_the_weights_layout_unless_its_layer_widens(k, n, turned, kernel, monkeypatch):
    """On a CPU a linear layer that narrows or keeps its width (N <= K) forms its weight gradient as g^T x, the weight's
    own layout, rounded as the point's transpose, so that the optimizer reads it as it lies; a widening layer keeps
    A^T g (the accelerator's route, which `REPLAY_NATIVE=0` runs in CI), its gradient a transposed view. Kernel on and
    off; either way the gradient is x^T g's to within its float32 rounding."""
    monkeypatch.setattr(native, "_LIB", native.library() if kernel else False)
    routes = {}
    for name in ("dot", "kernel_product"):
        real = getattr(Rounder, name)

        def spy(self, key, *a, real=real, **kw):
            routes.setdefault(key, kw.get("transposed", False))  # (the caller's call: a fallback may call again)
            return real(self, key, *a, **kw)

        monkeypatch.setattr(Rounder, name, spy)
    gen = torch.Generator().manual_seed(k * 100 + n)
    x = _f32(torch.randn(32, k, generator=gen, dtype=torch.float64)).requires_grad_()
    w = _f32(torch.randn(n, k, generator=gen, dtype=torch.float64)).requires_grad_()
    gy = _f32(torch.randn(32, n, generator=gen, dtype=torch.float64))
    r = Rounder("record")
    with determinism.rounding(r):
        (gw,) = torch.autograd.grad(ops.Det.linear(x, w, None, "layer"), [w], gy)
    r.finish()
    assert routes[2] is turned  # the layer's op 0: its weight gradient's key is 2
    assert gw.is_contiguous() is turned and gw.shape == (n, k)
    exact = (gy.t() @ x.detach()).float().double()
    assert torch.allclose(gw, exact, rtol=1e-6, atol=0), (k, n)


@pytest.mark.parametrize("kernel", [(True, True), (False, False), (True, False)])
def test_a_narrow_layers_logged_weight_gradient_replays_the_other_way(kernel, monkeypatch):
    """A narrow layer's weight gradient with many close calls (cancelling halves of the batch: small sums in wide
    windows) recorded one way (`ops._b_gradient` transposed, or as the product) replays to the same gradient the other
    way, the kernel on for both, off for both, or on for the recording alone: the log's indices are the point's either
    way, and they are used (hundreds of entries at the weight gradient's key)."""
    entries_at_weight_gradient = 0
    for seed, (batch, k, n) in enumerate([(8, 9, 1), (33, 48, 5), (64, 130, 8), (128, 48, 2)]):
        gen = torch.Generator().manual_seed(seed)
        scale = torch.rand(batch, k, generator=gen, dtype=torch.float64).mul(30).exp2()
        x = _f32(torch.randn(batch, k, generator=gen, dtype=torch.float64) * scale)
        gy = _f32(torch.randn(batch, n, generator=gen, dtype=torch.float64))
        h = batch // 2
        gy[h : 2 * h], x[h : 2 * h, ::3] = -gy[:h], x[:h, ::3]  # cancellations: small sums with wide windows
        w = _f32(torch.randn(n, k, generator=gen, dtype=torch.float64)).requires_grad_()
        ways = (ops._b_gradient, _b_gradient_as_product)
        for recorded, replayed in (ways, ways[::-1]):
            got = []
            for mode, way, lib in (("record", recorded, kernel[0]), ("replay", replayed, kernel[1])):
                monkeypatch.setattr(ops, "_b_gradient", way)
                monkeypatch.setattr(native, "_LIB", native.library() if lib else False)
                r = Rounder(mode, entries=decode_log(encode_log(got[0][1])) if got else None)
                with determinism.rounding(r):
                    xg = x.clone().requires_grad_()
                    (gw,) = torch.autograd.grad(ops.Det.linear(xg, w, None, "layer"), [w], gy)
                r.finish()
                got.append((gw, dict(r.entries)))
            assert torch.equal(got[0][0].view(torch.int64), got[1][0].view(torch.int64)), (seed, recorded)
            entries_at_weight_gradient += len(got[0][1].get(2, ([], []))[0])  # the layer's op 0: its key + 2
    assert entries_at_weight_gradient > 100


def test_a_transposed_point_takes_no_bias_and_leaves_a_callers_product_alone():
    """`Rounder.dot`'s transposed refuses a bias (the point's bias lies along the other axis), and where the product's
    transpose is a view of it (one side 1) a replay that applies a log there leaves the caller's product as it was
    unless the caller owns it."""
    a, b = torch.randn(1, 6, dtype=torch.float64), torch.randn(6, 5, dtype=torch.float64)
    with pytest.raises(ValueError, match="no bias"):
        Rounder("record").dot(
            0, (a @ b).t().contiguous(), a, b, bias=torch.ones(5, dtype=torch.float64), transposed=True
        )
    with pytest.raises(ValueError, match="no bias"):
        Rounder("record").kernel_product(0, (a @ b).t().contiguous(), a, b, bias=torch.ones(5), transposed=True)
    v = (a @ b).t().contiguous()  # (5, 1): its transpose (1, 5) is a view of it
    kept = v.clone()
    r = Rounder("replay", entries={0: ([2], [False])})
    r.op("point")
    try:
        r.dot(0, v, a, b, owned=False, transposed=True)
    except LogMismatch:
        pass  # (element 2 need not be a close call: what matters is v)
    assert torch.equal(v.view(torch.int64), kept.view(torch.int64))


@pytest.mark.parametrize("route", ["logged replay", "declined"])
def test_a_transposed_point_on_the_point_layouts_routes_comes_back_in_the_callers_product(route, monkeypatch):
    """Where a transposed point goes through the point's own layout (a replay whose log names it, a recording the kernel
    declines), the copy lives for that call alone: the result is written back into the caller's product where the
    caller owns it (keeping the copy as the result left a convolution's columns a fresh segment of the step allocator:
    cnn-32's replay peak 86 -> 122 MiB), the same values as the copy's."""
    g = torch.Generator().manual_seed(2)
    a, b = (_f32(torch.randn(*shape, generator=g, dtype=torch.float64)) for shape in ((30, 8), (8, 4)))
    a[:3, 1::2], b[1::2] = a[:3, 0::2], -b[0::2]  # exact zeros: close calls
    recorded = Rounder("record", defer=False)
    recorded.op("point")
    want = recorded.dot(0, a @ b, a, b).t()
    assert recorded.entries
    if route == "declined":
        monkeypatch.setattr(native, "round_dot", lambda *args, **kw: None)
        r = Rounder("record", defer=False)
    else:
        r = Rounder("replay", entries=dict(recorded.entries))
    r.op("point")
    v = (a @ b).t().contiguous()
    got = r.dot(0, v, a, b, owned=True, transposed=True)
    r.finish()
    assert got is v and torch.equal(got.view(torch.int64), want.view(torch.int64))


@pytest.mark.parametrize("log", ["honest", "flipped", "minus one", "past the end"])
def test_a_transposed_points_logged_replay_is_one_kernel_call_in_its_own_layout(log, monkeypatch):
    """A replay whose log names a transposed point applies it on the kernel in v's own layout (`Rounder._replay_turned`:
    the log's indices mapped, no copy into the point's layout and back), with the point's own outcome: the same bits,
    or the same refusal of the same entry (every parity flipped and every wide entry moved a float32 on: the window's
    other float32 followed, or refused). An index outside the outputs (a crafted entries dict: -1, or one past the end)
    goes through the point's layout, which refuses it by name."""
    g = torch.Generator().manual_seed(4)
    a, b = (_f32(torch.randn(*shape, generator=g, dtype=torch.float64)) for shape in ((30, 8), (8, 12)))
    a[:4, 1::2], b[1::2] = a[:4, 0::2], -b[0::2]  # exact zeros: close calls across whole rows (wide entries)
    product = a @ b
    f = product[5::4, 1::3].float()  # and midpoints between two float32s (parity entries)
    product[5::4, 1::3] = (f.double() + torch.nextafter(f, torch.full_like(f, math.inf)).double()) / 2
    recorded = Rounder("record", defer=False)
    recorded.op("point")
    recorded.dot(0, product.clone(), a, b)
    idx, codes = recorded.entries[0]
    assert len(idx) > 8 and len({f % 12 for f in idx}) > 1 and len({f // 12 for f in idx}) > 1
    assert any(isinstance(c, bool) for c in codes) and not all(isinstance(c, bool) for c in codes)
    if log == "flipped":
        codes = [not c if isinstance(c, bool) else c ^ 1 for c in codes]
    elif log == "minus one":
        idx, codes = [-1, *idx], [False, *codes]
    elif log == "past the end":
        idx, codes = [*idx, 30 * 12], [*codes, False]
    copies = []
    real = Rounder._transposed_back
    monkeypatch.setattr(Rounder, "_transposed_back", staticmethod(lambda *x: copies.append(1) or real(*x)))
    outcomes = []
    for transposed in (False, True):
        r = Rounder("replay", entries={0: (list(idx), list(codes))})
        r.op("point")
        v = product.t().contiguous() if transposed else product.clone()
        try:
            out = r.dot(0, v, a, b, owned=True, transposed=transposed)
            outcomes.append(out.t() if transposed else out)
        except LogMismatch as exc:
            outcomes.append(str(exc))
    plain, turned = outcomes
    assert bool(copies) is (log in ("minus one", "past the end"))
    if isinstance(plain, str):
        assert plain == turned and log != "honest"
    else:  # (a flipped parity may name the window's other float32: followed, on both)
        assert log in ("honest", "flipped") and torch.equal(turned.view(torch.int64), plain.view(torch.int64))
        recorded_bits = torch.equal(plain.view(torch.int64), _f32(product).view(torch.int64))
        assert recorded_bits is (log == "honest")  # (the honest log rounds as the recording did: its midpoints too)


def test_a_replays_unlogged_product_is_rounded_in_place_where_its_caller_owns_it():
    """Rounder.dot with owned=True: a recording's and a replay's plain rounding write over v (no new output);
    without it v is left as it was. The values are the same either way."""
    a, b, bias = _cancelling_product(5)
    for mode in ("record", "replay"):
        v = torch.addmm(bias, a, b)
        kept = v.clone()
        rounder = Rounder(mode)
        rounder.op("point")
        fresh = rounder.dot(0, v, a, b, bias=bias)
        assert fresh is not v and torch.equal(v.view(torch.int64), kept.view(torch.int64))
        rounder = Rounder(mode)
        rounder.op("point")
        assert rounder.dot(0, v, a, b, bias=bias, owned=True) is v
        assert torch.equal(v.view(torch.int64), fresh.view(torch.int64))


def test_a_crowded_point_is_offered_to_the_kernel_once(monkeypatch):
    """`Rounder.full` / `Rounder.dot` on a point the kernel declines (too many candidates): the step goes on
    as `__call__` with the whole bound does (its slots overflow, it is redone dense), and the kernel, which
    would decline again, is not asked twice."""
    v = torch.zeros(300, 300, dtype=torch.float64)
    v[::2] = -0.0
    a, b = torch.ones(300, 2, dtype=torch.float64), torch.ones(2, 300, dtype=torch.float64)
    b[1] = -1.0  # every output 1 - 1 = 0 with a positive bound: all close calls
    calls = []
    for name in ("round_full", "round_dot"):
        real = getattr(native, name)
        monkeypatch.setattr(native, name, lambda *x, real=real, name=name: calls.append(name) or real(*x))
    ab = a @ b
    points = (lambda r: r.full(0, v, torch.full_like(v, 1e-12), v.shape), v), (lambda r: r.dot(0, ab, a, b), ab)
    for point, values in points:
        rounder = Rounder("record")
        with pytest.raises(LogOverflow) as overflow:
            point(rounder)
            rounder.finish()
        assert len(calls) == 1, calls
        rounder.dense.update(overflow.value.keys)
        rounder.reset(defer=True)
        r = point(rounder)
        assert torch.equal(r.view(torch.int64), values.float().double().view(torch.int64))
        assert len(rounder.entries[0][0]) == v.numel()
        calls.clear()


def _torch_update(kind: str, hp: dict, p32, g, bufs32: dict):
    """train.py's reference update (torch ops, the non-fused path): (param, buffers) float32."""
    from replay.training.determinism import converted
    from replay.training.train import _adamw, _sgd

    bufs = {b: converted(v, torch.float64) for b, v in bufs32.items()}
    to32 = lambda what, v: converted(v, torch.float32)
    p = converted(p32, torch.float64)
    if kind == "sgd":
        return _sgd(hp, 0.01, p, g, bufs, to32)
    return _adamw(hp, 0.01, 4, p, g, bufs, to32)


@pytest.mark.parametrize("kind", ["adamw", "sgd", "sgd_wd"])
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("n", [1, 3])
def test_optimizer_updates_on_threads_match_the_torch_path(kind, transposed, n):
    """The fused optimizer updates (SGD, SGD with weight decay, AdamW) over a weight large enough for
    threads, its gradient transposed as a matmul's backward leaves it (read in place): the same bits as
    train.py's torch ops, with zeros, subnormals, huge and tiny gradients among them."""
    gen = torch.Generator().manual_seed(7)
    rows, cols = 301, 257  # 77,357 elements: past PARALLEL_MIN, rows not a multiple of the thread count
    g = torch.randn(cols, rows, dtype=torch.float64, generator=gen).t() if transposed else None
    g = g if g is not None else torch.randn(rows, cols, dtype=torch.float64, generator=gen)
    g[0, :4] = torch.tensor([0.0, -0.0, 1e-310, 3e38], dtype=torch.float64)
    g[1, :2] = torch.tensor([1e-30, -1e30], dtype=torch.float64)
    p = torch.randn(rows, cols, generator=gen)
    hp = {"sgd": {"momentum": 0.9}, "sgd_wd": {"momentum": 0.9, "weight_decay": 0.01}}.get(kind)
    hp = hp or {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
    names = ["momentum"] if kind.startswith("sgd") else ["m", "v"]
    bufs32 = {b: torch.rand(rows, cols, generator=gen) for b in names}
    assert g.is_contiguous() is not transposed
    want_p, want_b = _torch_update("sgd" if kind.startswith("sgd") else "adamw", hp, p, g, bufs32)
    with kernel_threads(n):
        if kind.startswith("sgd"):
            out = native.sgd_group([p], [g], [bufs32["momentum"]], hp["momentum"], hp.get("weight_decay", 0.0), 0.01)
        else:
            b1, b2 = hp["betas"]
            c1, c2 = 1 / (1 - ipow(b1, 5)), 1 / (1 - ipow(b2, 5))
            out = native.adamw_group([p], [g], [bufs32["m"]], [bufs32["v"]], b1, b2, c1, c2, hp["eps"], 0.01, 0.01)
        got = [t[0] for t in out]
    same = lambda x, y: torch.equal(x.view(torch.int32), y.view(torch.int32))
    assert same(got[0], want_p)
    assert all(same(x, want_b[b]) for x, b in zip(got[1:], names))


@pytest.mark.parametrize("kind", ["adamw", "sgd", "sgd_wd"])
@pytest.mark.parametrize("n", [1, 3])
def test_a_group_of_parameters_updates_in_one_call_as_each_alone(kind, n):
    """`native.adamw_group` / `sgd_group` (a step's parameters in one call): per parameter the same bits
    as train.py's torch ops, whatever the shapes in the group (a transposed weight gradient read in
    place, a vector, a 3-D tensor, a weight past PARALLEL_MIN, an empty one); None (nothing written) where
    one parameter's state is not the kernel's (float64 here)."""
    gen = torch.Generator().manual_seed(11)
    shapes = [(301, 257), (7,), (3, 4, 5), (0,), (64, 9)]
    grads = [torch.randn(s, dtype=torch.float64, generator=gen) for s in shapes]
    grads[-1] = torch.randn(9, 64, dtype=torch.float64, generator=gen).t()  # as a matmul's backward leaves it
    ps = [torch.randn(s, generator=gen) for s in shapes]
    names = ["momentum"] if kind.startswith("sgd") else ["m", "v"]
    bufs = {b: [torch.rand(s, generator=gen) for s in shapes] for b in names}
    hp = {"sgd": {"momentum": 0.9}, "sgd_wd": {"momentum": 0.9, "weight_decay": 0.01}}.get(kind)
    hp = hp or {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
    b1, b2 = hp.get("betas", (0, 0))
    call = (
        (lambda ps, bufs: native.sgd_group(ps, grads, bufs["momentum"], 0.9, hp.get("weight_decay", 0.0), 0.01))
        if kind.startswith("sgd")
        else (
            lambda ps, bufs: native.adamw_group(
                ps, grads, bufs["m"], bufs["v"], b1, b2, 1 / (1 - ipow(b1, 5)), 1 / (1 - ipow(b2, 5)), 1e-8, 0.01, 0.01
            )
        )
    )
    with kernel_threads(n):
        got = call(ps, bufs)
    same = lambda x, y: torch.equal(x.view(torch.int32), y.view(torch.int32))
    for k in range(len(shapes)):
        one = {b: bufs[b][k] for b in names}
        want_p, want_b = _torch_update("sgd" if kind.startswith("sgd") else "adamw", hp, ps[k], grads[k], one)
        assert same(got[0][k], want_p), shapes[k]
        assert all(same(got[1 + i][k], want_b[b]) for i, b in enumerate(names)), shapes[k]
    wrong = {b: [*bufs[b][:-1], bufs[b][-1].double()] for b in names}
    assert call(ps, wrong) is None


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.integers(1, 300), st.sampled_from([1, 3]), st.integers(0, 99))
def test_the_softmax_gradient_bound_matches_the_torch_path(rows, n, threads, seed):
    """`ops.softmax_grad_bound` in one native pass: the torch ops' values, the magnitude sum in another
    order (within both sums' rounding); masked rows (one or no nonzero term) exactly."""
    from replay.training.ops import softmax_grad_bound

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n, dtype=torch.float64, generator=gen)
    x[0, 1:] = -float("inf")  # a causal first row: one nonzero term, an exact sum
    p = torch.softmax(x, -1)
    dp = torch.randn(rows, n, dtype=torch.float64, generator=gen)
    dp[-1] = 0.0  # no nonzero term
    pd = p * dp
    dx = p * (dp - pd.sum(-1, keepdim=True))
    with kernel_threads(threads):
        got = softmax_grad_bound(p, pd, dx)
    saved, native._LIB = native._LIB, False
    try:
        want = softmax_grad_bound(p, pd, dx)
    finally:
        native._LIB = saved
    assert native.softmax_err(p, pd, dx, 1.0, 1.0, 1.0) is not None  # the native pass was the one tested
    assert got.shape == want.shape and got.dtype == torch.float64
    assert torch.all((got - want).abs() <= want * (2 * n * 2.0**-53))
    assert torch.equal(got[0], want[0]) and torch.equal(got[-1], want[-1])


@pytest.mark.parametrize("bias", [False, True])
def test_the_rounders_direct_points_are_its_call(bias):
    """`Rounder.dot` / `Rounder.full` (the native record pass, or a replay's plain rounding, without the
    bound's other forms) give what `Rounder.__call__` with `dot_bound` / `full_bound` gives: the same
    bits and entries when recording, the same applied log when replaying; and a subclass that overrides
    `__call__` (a doctored kernel in the tests' cheats) still sees every point."""
    g = torch.Generator().manual_seed(3)
    a, b = (
        _f32(torch.randn(40, 30, generator=g, dtype=torch.float64)),
        _f32(torch.randn(30, 50, generator=g, dtype=torch.float64)),
    )
    a[:, 1::2] = a[:, ::2]  # cancellation: close calls to log
    b[1::2, :5] = -b[::2, :5]  # in 5 of 50 columns: 200 close calls, within the point's entry cap
    c = _f32(torch.randn(50, generator=g, dtype=torch.float64)) if bias else None
    v = a @ b + (c if bias else 0)
    err = lambda: v.abs() * 2.0**-31  # some tens of close calls

    def points(r, v=v, v8=v):
        return r.dot(0, v, a, b, 1.0, c), r.full(8, v8, err, v.shape)

    direct, called = Rounder("record"), Rounder("record")
    got = points(direct)
    want = called(0, v, dot_bound(a, b, 1.0, c)), called(8, v, full_bound(err, v.shape))
    assert all(torch.equal(x.view(torch.int64), y.view(torch.int64)) for x, y in zip(got, want))
    assert direct.entries == called.entries and direct.entries[8][0]
    assert bias or direct.entries[0][0]  # without a bias, the cancelled columns' exact zeros are close calls
    log = encode_log(direct.entries)
    # as another machine computes them: within each point's bound, across rounding midpoints at close calls
    other = v + (a.abs() @ b.abs() + (c.abs() if bias else 0)) * 2.0**-50, v + err() * 0.5
    same = lambda x, y: torch.equal(x.view(torch.int64), y.view(torch.int64))
    assert not same(other[1].float().double(), want[1])  # not vacuous: the log steers these
    for key in (0, 8, None):  # each point logged alone (the other rounded as the log says: plainly), and both
        entries = {k: e for k, e in decode_log(log).items() if key is None or k == key}
        replayed = points(Rounder("replay", entries=dict(entries)), *other)
        for k, x, y, o in zip((0, 8), replayed, want, other):
            assert same(x, y if key in (k, None) else o.float().double())

    class Seen(Rounder):
        def __call__(self, key, v, bound):
            self.seen = [*getattr(self, "seen", []), key]
            return super().__call__(key, v, bound)

    seen = Seen("record")
    points(seen)
    assert seen.seen == [0, 8] and seen.entries == called.entries


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**16),
    batched=st.booleans(),
    bias=st.sampled_from([None, "columns", "rows"]),
    doctor=st.sampled_from([None, "parity", "wide", "window", "past", "many", "unsorted", "codes"]),
    threads=st.sampled_from([1, 3]),
    owned=st.booleans(),
)
def test_a_logged_product_replays_in_one_kernel_call_as_apply_does(seed, batched, bias, doctor, threads, owned):
    """A replay's logged product point through the kernel's one call (`Rounder.dot`: native.replay_dot)
    and through `Rounder.__call__` with `dot_bound` (round_scaled, the bound at the entries, apply_at):
    the same bits, the same widest window, and for a doctored log (a wrong parity, a wide entry outside
    its window, a window too wide, an index past the outputs, more entries than allowed, unsorted indices,
    fewer codes than entries) the same refusal in the same words; owned, the product rounded in place."""
    g = torch.Generator().manual_seed(seed)
    shape = (2, 3) if batched else ()
    a = _f32(torch.randn(*shape, 12, 16, generator=g, dtype=torch.float64))
    b = _f32(torch.randn(*shape, 16, 10, generator=g, dtype=torch.float64))
    a[..., 1::2] = a[..., ::2]
    b[..., 1::2, :4] = -b[..., ::2, :4]  # cancellation: close calls in 4 of 10 columns
    if doctor == "window":  # the cancelled columns' windows wider than 2^-12 of the point's largest |value|
        b[..., :, 4:] *= 2.0**-100
    c = None
    if bias and not batched:
        c = _f32(torch.randn(12 if bias == "rows" else 10, generator=g, dtype=torch.float64))
    rows = bias == "rows" and c is not None
    v = a @ b + (c.view(-1, 1) if rows else c if c is not None else 0)
    recorder = Rounder("record")
    recorder.dot(0, v, a, b, 1.0, c, rows)
    idx, codes = doctored_entries(recorder.entries, doctor, v.numel())
    other = v + (a.abs() @ b.abs() + (c.abs().view(-1, 1) if rows else c.abs() if c is not None else 0)) * 2.0**-50
    results = []
    for path in ("kernel", "call"):
        r = Rounder("replay", entries={0: (list(idx), list(codes))}, defer=False)
        r.op("point")
        try:
            with kernel_threads(threads):
                if path == "kernel":
                    mine = other.clone()
                    out = r.dot(0, mine, a, b, 1.0, c, rows, owned=owned)
                    assert (out is mine) == owned
                else:
                    out = r(0, other, dot_bound(a, b, 1.0, c, rows))
            results.append((out.view(torch.int64), r.max_ratio))
        except (LogMismatch, IndexError, RuntimeError) as refused:
            results.append((type(refused), str(refused)))
    (got, got_extra), (want, want_extra) = results
    if doctor == "codes":  # refused as such, not applied with entries and codes paired off by zip
        assert want is LogMismatch and want_extra.endswith(f"{len(idx)} log entries, {len(idx) - 1} codes")
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and torch.equal(got, want) and got_extra == want_extra
    else:
        assert (got, got_extra) == (want, want_extra)


@pytest.mark.parametrize("native_on", [True, False])
def test_a_point_whose_entries_and_codes_differ_in_number_is_refused_by_name(native_on, monkeypatch):
    """Entries handed to a replay directly (a decoded log's never differ): fewer codes than indices are
    refused, naming the point, on the CPU's path and on the device path (its table of the whole log),
    not paired off with another point's codes."""
    if not native_on:
        monkeypatch.setattr(native, "_LIB", False)
    a, b = torch.randn(4, 3, dtype=torch.float64), torch.randn(3, 5, dtype=torch.float64)
    v = a @ b
    for defer in (False, True):
        r = Rounder("replay", entries={0: ([1, 2], [True]), 1: ([3], [False])}, defer=defer)
        r.op("short")
        with pytest.raises(LogMismatch, match=r"short#0: 2 log entries, 1 codes"):
            r.dot(0, v, a, b)


def test_a_logged_product_past_one_bound_call_takes_the_chunked_path(monkeypatch):
    """More entries at a point than `_exact_at` bounds in one kernel call: its windows are summed chunk by
    chunk there (a copy of an operand, or not, depends on a call's indices), so the one-call path declines
    and the chunked one decides; at the limit the one call takes them."""
    a, b = torch.randn(6, 8, dtype=torch.float64), torch.randn(8, 5, dtype=torch.float64)
    v = a @ b
    monkeypatch.setattr(native, "DOT_AT_CHUNK", 3)
    args = (v, a, b, 1e-15, None, 0.0, False)
    assert native.replay_dot(*args, [0, 1, 2, 3], [False] * 4, 4.0, 2.0**-12) is None
    assert native.replay_dot(*args, [0, 1, 2], [False] * 3, 4.0, 2.0**-12) is not None
    assert native.replay_dot(*args, [0, 1, 2], [False] * 2, 4.0, 2.0**-12) is None  # a code short


@pytest.mark.parametrize("past", [30, -1])
def test_a_logged_product_the_kernel_declines_in_place_is_left_as_it_was(past):
    """An index outside the output (the kernel's own check, behind the rounder's): declined before v is
    rounded over itself, so the path that then runs reads the product's values."""
    a, b = torch.randn(6, 8, dtype=torch.float64), torch.randn(8, 5, dtype=torch.float64)
    v = a @ b
    before = v.clone()
    assert native.replay_dot(v, a, b, 1e-15, None, 0.0, False, [1, past], [False] * 2, 4.0, 0.5, True) is None
    assert torch.equal(v.view(torch.int64), before.view(torch.int64))
    got = native.replay_dot(v, a, b, 1e-15, None, 0.0, False, [], [], 4.0, 0.5, True)
    assert got[0] is v and torch.equal(v, before.float().double())  # control: taken, rounded in place


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from([0.0, -0.0, 1.5, -2.5, 1e-310, -1e308, float("inf"), float("-inf"), float("nan")])
        | st.floats(),
        max_size=40,
    )
)
def test_the_largest_magnitude_is_torchs(values):
    """`native.max_abs` (a replay's scale at a logged point, one pass): the number torch's two reductions
    give, NaN wherever one is NaN, 0 for no values."""
    from replay.training.determinism import max_abs

    v = torch.tensor(values, dtype=torch.float64)
    got = native.max_abs(v)
    want = float(max_abs(v)) + 0.0 if values else 0.0
    assert got == want or (got != got and want != want)
    assert math.copysign(1.0, got) == 1.0  # never -0: a refusal's message prints this scale
    with kernel_threads(3):
        again = native.max_abs(v)
    assert again == got or (again != again and got != got)
    for n in (1, 3):  # a replay's logged point: its rounding and this scale in one pass
        with kernel_threads(n):
            rounded, scale = native.round_scaled(v)
        assert torch.equal(rounded.view(torch.int64), v.float().double().view(torch.int64))
        assert scale == got or (scale != scale and got != got)
        assert math.copysign(1.0, scale) == 1.0


@settings(max_examples=60, deadline=None)
@given(
    n=st.sampled_from([(1 << 14) - 1, 1 << 14, (1 << 14) + 1, 3 * (1 << 14) + 5]),
    at=st.floats(0, 1, exclude_max=True),
    top=st.sampled_from([3.0, -3.0, 1e308, float("-inf"), float("nan"), -float("nan")]),
    seed=st.integers(0, 2**16),
)
def test_the_largest_magnitude_over_many_spans(n, at, top, seed):
    """`max_abs` and `round_scaled` split a long tensor into spans (threads take whole spans): the largest
    magnitude is found in any span, the first, a middle one or a short last one, and the rounding of every
    value is float32's, on one thread or several."""
    v = torch.empty(n, dtype=torch.float64).uniform_(-2.0, 2.0, generator=torch.Generator().manual_seed(seed))
    v[int(at * n)] = top
    want = math.nan if top != top else abs(top)
    for threads in (1, 3):
        with kernel_threads(threads):
            got = native.max_abs(v)
            rounded, scale = native.round_scaled(v)
        assert got == want or (got != got and want != want)
        assert scale == got or (scale != scale and got != got)
        assert torch.equal(rounded.view(torch.int64), v.float().double().view(torch.int64))


@pytest.mark.parametrize(
    "a_shape, b_shape", [((0, 5), (5, 4)), ((0, 3, 5), (0, 5, 4)), ((2, 0, 5), (2, 5, 4)), ((3, 0), (0, 4))]
)
def test_an_empty_product_rounds_to_nothing(a_shape, b_shape):
    """No rows (M or a batch dim 0): nothing to round or log, not a division by zero in the kernel; no terms
    (K 0): exact zeros, never close calls."""
    a, b = torch.randn(a_shape, dtype=torch.float64), torch.randn(b_shape, dtype=torch.float64)
    v = a @ b
    out, idx, codes = native.round_dot(v, a, b, 1e-15, None, 0.0, False, 4.0, 8.0)
    assert out.shape == v.shape and torch.equal(out, v) and idx == codes == []
    r = Rounder("record")
    assert r.dot(0, v, a, b).shape == v.shape and not r.entries


def test_a_refusal_names_the_same_scale_on_every_path():
    """A point whose values are all zeros, one of them -0 (torch's reductions give -0 as its largest |value|,
    the kernel +0): the refusal reads the same words with the kernel and without."""
    v = torch.tensor([0.0, -0.0], dtype=torch.float64)
    said = []
    for lib in (native.library(), False):
        rounder = Rounder("replay", entries={0: ([0], [False])}, defer=False)
        rounder.op("point")
        saved, native._LIB = native._LIB, lib
        try:
            with pytest.raises(LogMismatch) as refused:
                rounder(0, v, full_bound(torch.full_like(v, 1e-30), v.shape))
        finally:
            native._LIB = saved
        said.append(str(refused.value))
    assert said[0] == said[1] and "there (0)" in said[0]


@st.composite
def conv_geometries(draw):
    """A convolution's input and window: kernels 1-4 a side, padding up to past the kernel, strides past it;
    rows short (gathered, and folded, by table) and long (row by row: 16 outputs or more)."""
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    pad, stride = draw(st.integers(0, 4)), draw(st.integers(1, 4))
    h = draw(st.integers(max(1, kh - 2 * pad), 9))
    w = draw(st.one_of(st.integers(max(1, kw - 2 * pad), 9), st.integers(16 * stride + kw, 16 * stride + kw + 8)))
    return draw(st.integers(1, 3)), draw(st.integers(1, 3)), h, w, (kh, kw), pad, stride


@settings(max_examples=150, deadline=None)
@given(conv_geometries(), st.sampled_from(["contiguous", "transposed", "sliced"]), st.sampled_from([1, 3]))
def test_im2col_and_col2im_are_torchs_unfold_and_fold(geometry, layout, n):
    """The native im2col copies exactly what F.unfold does, from an input at any strides, with its columns' norms
    where asked (the same columns, each image's norms in turn); the native col2im adds exactly what F.fold adds, in
    its order (the same bits, -0 and all), from columns at any strides (a broadcast too), on any number of threads."""
    bsz, c, h, w, ksize, pad, stride = geometry
    g = torch.Generator().manual_seed(bsz * 1000 + c * 100 + h * 10 + w)
    x = torch.randn(bsz, c, h, w, generator=g, dtype=torch.float64)
    x[..., 0, 0] = -0.0
    if layout == "transposed":
        x = x.transpose(2, 3).contiguous().transpose(2, 3)
    elif layout == "sliced":
        x = torch.randn(bsz, c, h, 2 * w, generator=g, dtype=torch.float64)[..., ::2]
    want = F.unfold(x, ksize, padding=pad, stride=stride)
    with kernel_threads(n):
        got = native.im2col(x, ksize, pad, stride)
        with_norms, norms = native.im2col(x, ksize, pad, stride, with_norms=True)
        cols = torch.randn(want.shape, generator=g, dtype=torch.float64) * 1e3
        cols[cols.abs() < 300] = 0.0
        cols[cols.abs() < 500] *= -0.0  # exact zeros of both signs among the overlaps' terms
        folded = native.col2im(cols, (h, w), ksize, pad, stride)
        wide = cols[:, :1].expand(want.shape) if want.shape[1] else cols
        folded_wide = native.col2im(wide, (h, w), ksize, pad, stride)
        folded_strided = native.col2im(cols.transpose(1, 2).contiguous().transpose(1, 2), (h, w), ksize, pad, stride)
    assert got.is_contiguous() and torch.equal(got.view(torch.int64), want.view(torch.int64))
    assert torch.equal(with_norms.view(torch.int64), want.view(torch.int64))
    # each column's squares added row by row: torch's norm of the same column, within a few roundings
    torch.testing.assert_close(norms, torch.linalg.vector_norm(want, dim=1).reshape(-1), rtol=1e-14, atol=0)
    same = lambda a, b: torch.equal(a.view(torch.int64), b.view(torch.int64))
    assert same(folded, F.fold(cols, (h, w), ksize, padding=pad, stride=stride))
    assert same(folded_strided, folded)
    assert same(folded_wide, F.fold(wide, (h, w), ksize, padding=pad, stride=stride))


_SPECIAL = [0.0, -0.0, math.inf, -math.inf, math.nan, 1e-310, -1e-310, 1.5, -2.5]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 3000), st.integers(0, 2**31 - 1), st.sampled_from([1, 3]))
def test_relu_backward_from_the_float32_copy_is_torchs(n, seed, threads):
    """torch.relu's gradient from the float32 copy backward keeps (`native.relu_back`): threshold_backward's bits
    (its +0 where the output is <= 0, -0 and NaN outputs included; g's own NaN, infinities, zeros and subnormals
    passed through), on any number of threads; what the kernel does not take is declined."""
    gen = torch.Generator().manual_seed(seed)
    pick = lambda: torch.tensor(_SPECIAL, dtype=torch.float64)[torch.randint(0, len(_SPECIAL), (n,), generator=gen)]
    g = torch.where(torch.rand(n, generator=gen) < 0.2, pick(), torch.randn(n, generator=gen, dtype=torch.float64))
    y = torch.where(torch.rand(n, generator=gen) < 0.3, pick(), torch.randn(n, generator=gen, dtype=torch.float64))
    y32 = y.float()
    with kernel_threads(threads):
        got = native.relu_back(g, y32)
    want = torch.ops.aten.threshold_backward(g, y32.double(), 0)
    assert got is not None and torch.equal(got.view(torch.int64), want.view(torch.int64))
    if n >= 3:  # (two elements or more: one is contiguous at any stride)
        assert native.relu_back(g[::2], y32[::2]) is None  # strided
    assert native.relu_back(g, y) is None and native.relu_back(g.float(), y32) is None  # dtypes
    assert native.relu_back(g.reshape(1, -1), y32) is None  # shapes


def test_im2col_and_col2im_decline_what_they_do_not_take():
    x = torch.randn(2, 3, 5, 5)
    assert native.im2col(x, (3, 3), 1, 1) is None  # float32
    assert native.im2col(x.double()[:0], (3, 3), 1, 1) is None  # no images
    for ksize, pad, stride in (((3, 3), -1, 1), ((3, 3), 1, 0), ((0, 3), 1, 1)):  # F.unfold's errors, not ours
        assert native.im2col(x.double(), ksize, pad, stride) is None
        assert native.col2im(torch.randn(2, 27, 25, dtype=torch.float64), (5, 5), ksize, pad, stride) is None
    assert native.col2im(torch.randn(2, 10, 25, dtype=torch.float64), (5, 5), (3, 3), 1, 1) is None  # 10 % 9
    assert native.col2im(torch.randn(2, 9, 24, dtype=torch.float64), (5, 5), (3, 3), 1, 1) is None  # 24 != 25


_HEAP_AFTER_A_LARGE_TENSOR = """
import resource, sys, torch
from replay.training import native
if sys.argv[1] == "capped":  # as the verifier's subprocess runs
    resource.setrlimit(resource.RLIMIT_AS, (1 << 40, resource.RLIM_INFINITY))
if sys.argv[1] != "plain":
    native.tune_allocator()
t = torch.empty(96 << 20, dtype=torch.uint8).fill_(1)  # over glibc's 32 MiB mmap cap
del t
heap = 0
for line in open("/proc/self/maps"):
    if line.rstrip().endswith("[heap]"):
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        heap += hi - lo
print(heap)
"""


@pytest.mark.kernel_independent
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator, /proc/self/maps")
def test_without_the_step_allocator_a_replay_process_keeps_even_its_largest_blocks_on_the_heap():
    """Without the step allocator (`REPLAY_ALLOCATOR=0`, or no C++ compiler: tests/replay/training/
    test_step_allocator.py has it), after `tune_allocator` a block over glibc's 32 MiB mmap cap comes from the heap
    and stays there when freed (the next step reuses its pages instead of faulting fresh ones in); untuned, or under
    an address-space cap (the verifier's subprocess: the heap's holes must not take its room), it is an mmap of its
    own, returned at once."""
    heap = {}
    env = {**os.environ, "REPLAY_ALLOCATOR": "0"}
    for mode in ("tuned", "plain", "capped"):
        run = [sys.executable, "-c", _HEAP_AFTER_A_LARGE_TENSOR, mode]
        done = subprocess.run(run, capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr
        heap[mode] = int(done.stdout.split()[-1])
    assert heap["tuned"] >= 96 << 20 > max(heap["plain"], heap["capped"])


@pytest.mark.parametrize("special", [math.nan, math.inf])
def test_a_non_finite_column_hides_no_close_call_in_a_convolutions_weight_gradient(special):
    """The same for a convolution's weight gradient (`_weight_grad_bound`): a NaN or inf among one channel's
    columns, and the others' cancelling outputs are close calls on the torch path as in the kernel."""
    gen = torch.Generator().manual_seed(4)
    g = _f32(torch.randn(3, 6, 10, generator=gen, dtype=torch.float64))
    cols = _f32(torch.randn(3, 5, 10, generator=gen, dtype=torch.float64))
    g[..., 1::2] = g[..., 0::2]
    cols[..., 1::2] = -cols[..., 0::2]
    cols[1, 2, 4] = special
    v = torch.matmul(g, cols.transpose(1, 2)).sum(0)
    assert _same(v, _weight_grad_bound(g, cols)) >= 6 * 4
