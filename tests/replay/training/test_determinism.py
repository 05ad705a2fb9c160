"""The rounding core: close-call detection, the log codec, and replay on a worst-case machine."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.training import architectures as models
from replay.training.determinism import (
    SAFETY,
    Bound,
    LogMismatch,
    Rounder,
    close_calls,
    decode_log,
    dot_bound,
    encode_log,
    from_ordinal,
    full_bound,
    ordinal,
    rounding,
)
from replay.training.ops import Det
from replay.training.train import initial_state, train_step

from ..helpers import TINY


def midpoints_near(v: float):
    import numpy as np

    r = np.float32(v)
    lo, hi = np.nextafter(r, np.float32(-np.inf)), np.nextafter(r, np.float32(np.inf))
    return [(float(lo) + float(r)) / 2, (float(r) + float(hi)) / 2]


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=-1e30, max_value=1e30, allow_nan=False), st.integers(min_value=-60, max_value=-20))
def test_close_calls_are_windows_holding_a_rounding_midpoint(v, log2_rel):
    """Flagged iff v +- SAFETY*err holds a midpoint (or 0, where -0 meets +0); at an exact end, as rounding decides."""
    import numpy as np

    w = (abs(v) * 2.0**log2_rel + 1e-300) * SAFETY
    got = bool(close_calls(torch.tensor([v], dtype=torch.float64), w / SAFETY)[0])
    inside = any(v - w < m < v + w for m in midpoints_near(v)) or v - w < 0 < v + w
    outside = not any(v - w <= m <= v + w for m in midpoints_near(v)) and not v - w <= 0 <= v + w
    if inside:
        assert got
    elif outside:
        assert not got
    else:  # a midpoint exactly at an end: the ends' own roundings decide
        a, b = np.float32(v - w), np.float32(v + w)
        assert got == (a != b or np.signbit(a) != np.signbit(b))


def test_ordinal_is_the_number_line():
    xs = torch.tensor([-1.0, -1e-45, -0.0, 0.0, 1e-45, 1.0, float("inf")], dtype=torch.float32)
    o = ordinal(xs)
    assert o.tolist() == sorted(o.tolist()) and len(set(o.tolist())) == len(xs)
    assert int(o[3] - o[2]) == 1 and int(o[4] - o[3]) == 1
    assert torch.equal(from_ordinal(o).view(torch.int32), xs.view(torch.int32))


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.integers(0, 10_000),
        st.lists(
            st.tuples(st.integers(0, 10_000_000), st.one_of(st.booleans(), st.integers(0, 2**32 - 1))),
            min_size=1,
            max_size=30,
            unique_by=lambda e: e[0],
        ),
    )
)
def test_log_codec_round_trips(raw):
    entries = {k: ([i for i, _ in sorted(v)], [c for _, c in sorted(v)]) for k, v in raw.items()}
    assert decode_log(encode_log(entries)) == entries


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_log_decoder_refuses_garbage_without_crashing(data):
    try:
        decode_log(data)
    except ValueError:
        pass


def test_log_decoder_rejects_trailing_and_truncated_bytes():
    good = encode_log({3: ([1, 5], [True, 0x3F800000])})
    for bad in (good + b"\x00", good[:-1], b"\x02" + good[1:]):
        with pytest.raises(ValueError):
            decode_log(bad)


def _tiny_step(arch: str):
    cfg, b = TINY[arch]["config"], TINY[arch]["batch"]
    from replay.training.bundled_data import Batches

    opt = {
        "kind": "adamw",
        "lr": {"kind": "constant", "lr": 1e-3},
        "betas": [0.9, 0.95],
        "eps": 1e-8,
        "weight_decay": 0.01,
    }
    return models.build(arch, cfg), initial_state(models.init_params(arch, cfg, 0), opt), Batches(arch, cfg, b, 0), opt


def worst_case_machine(seed: int):
    """Moves every value by exactly its error bound, in a random direction: the most a conforming machine may."""
    g = torch.Generator().manual_seed(seed)

    def perturb(v, bound):
        e = bound.at(torch.arange(v.numel())).reshape(v.shape)
        moved = v + (torch.randint(0, 2, v.shape, generator=g).double() * 2 - 1) * e
        return torch.where(e > 0, moved, v)  # an exact result stays exact (-0 + 0 would be +0)

    return perturb


@pytest.mark.parametrize("arch,steps", [("mlp", 3), ("cnn", 2), ("gpt", 2)])
def test_log_makes_worst_case_machines_agree(arch, steps):
    """Prover and verifier both err by their full bound, independently: with the log the bits agree.

    For the MLP and the GPT the same replay without the log differs (the log is needed at this
    size); the tiny CNN's short reductions (K = 9, 36) rarely come close to a midpoint at all.
    """
    model, state, batches, opt = _tiny_step(arch)
    logs, s = [], state
    for t in range(steps):
        r = Rounder("record", perturb=worst_case_machine(t))
        s, _ = train_step(model, s, batches(t), opt, "det64", r)
        logs.append(encode_log(r.entries))
    results = {}
    for use_log in (True, False):
        v = state
        for t in range(steps):
            r = Rounder("replay", entries=decode_log(logs[t]) if use_log else {}, perturb=worst_case_machine(100 + t))
            v, _ = train_step(model, v, batches(t), opt, "det64", r)
        results[use_log] = v.equal(s)
    assert results[True]
    if arch != "cnn":
        assert sum(len(decode_log(b)) for b in logs) > 0
        assert not results[False], "control: without the log a worst-case machine should round differently"


def test_heavy_cancellation_logs_the_whole_float_and_a_moved_verifier_recovers_it():
    """Narrow entries carry a parity bit; where the window holds more than two float32s (tiny results
    with large bounds) the entry carries all 32 bits. Either way a verifier whose own value moved
    within the bound gets the prover's bits back."""
    v = torch.tensor([1e-30, 1.0 + 2.0**-24, -3e-39, 2.0], dtype=torch.float64)
    err = torch.tensor([1e-29, 1e-12, 1e-40, 1e-12], dtype=torch.float64)
    bound = full_bound(err, v.shape)
    prover = Rounder("record")
    out = prover(0, v, bound).float()
    idx, codes = prover.entries[0]
    assert idx == [0, 1, 2]  # 2.0 is a float32, far from any midpoint
    bits = out.view(torch.int32).tolist()
    assert codes[0] == bits[0] & 0xFFFFFFFF and codes[2] == bits[2] & 0xFFFFFFFF  # wide
    assert codes[1] is bool(ordinal(out[1:2]).item() & 1)  # narrow
    for shift in (0.9, -0.9, 0.3):
        verifier = Rounder("replay", entries=decode_log(encode_log(prover.entries)))
        got = verifier(0, v + err * shift, bound).float()
        assert torch.equal(got.view(torch.int32), out.view(torch.int32))
    plain = (v + err * 0.9).float()
    assert not torch.equal(plain.view(torch.int32), out.view(torch.int32)), (
        "control: unlogged the moved values round elsewhere"
    )


def test_verifier_refuses_a_log_entry_that_is_not_a_close_call():
    """A prover may pick among roundings a machine could produce, never push a value by an ulp at will."""
    v = torch.tensor([1.0 + 2.0**-30, 3.0], dtype=torch.float64)
    bound = Bound(1e-15, lambda idx: torch.full((idx.numel(),), 1e-15, dtype=torch.float64))
    up = int(torch.tensor(1.0 + 2.0**-23, dtype=torch.float32).view(torch.int32))  # the next float32 up: a lie
    for code in (up, True):  # True: the parity of 1.0 is even
        for defer in (True, False):  # the device path raises at the step's end, the reference path at once
            r = Rounder("replay", entries={0: ([0], [code])}, defer=defer)
            with pytest.raises(LogMismatch, match="not a close call"):
                r(0, v, bound)
                r.finish()
    with pytest.raises(LogMismatch, match="does not exist"):
        Rounder("replay", entries={0: ([7], [False])})(0, v, bound)
    r = Rounder("replay", entries={5: ([0], [False])})
    with pytest.raises(LogMismatch, match="never reached"):
        r.finish()


def _float32_sum_over_k(x: torch.Tensor, w: torch.Tensor, ks: range):
    """x @ w.t() over the columns ks, summed one k at a time in float32 with elementwise numpy ops: every
    multiply and add is one IEEE-754 rounding, so the result is the same on every CPU (a BLAS or ATen
    reduction picks its own order, blocking and FMA use, which differ between CPUs)."""
    import numpy as np

    xn, wn = x.numpy(), w.numpy()
    acc = np.zeros((x.shape[0], w.shape[0]), dtype=np.float32)
    for k in ks:
        acc = acc + np.multiply.outer(xn[:, k], wn[:, k])
    return acc


def test_det_matmul_is_independent_of_summation_order_while_float32_is_not():
    """The measured enemy, at op level: a weight-gradient-shaped matmul (K = 1024) summed in one pass
    on 1 thread (the prover) and as two halves of K on 2 threads (a machine that splits the reduction
    across its threads). Whether MKL itself splits K by thread count depends on the CPU (it does on
    the Intel machine the issue measured, not on every AMD one), so the split is made explicit.

    The control shows that float32 depends on the summation order with sums whose every rounding IEEE
    fixes, not with `x @ w.t()`: what a BLAS kernel does with the order is a property of one CPU
    (on an AVX-512 Xeon MKL's one-pass product equals the two halves added)."""
    g = torch.Generator().manual_seed(0)
    x = ((torch.rand(1024, 192, generator=g, dtype=torch.float64) - 0.5).float()).t().contiguous()
    w = ((torch.rand(1024, 64, generator=g, dtype=torch.float64) - 0.5).float()).t().contiguous()
    split = lambda p, q: p[:, :512] @ q[:, :512].t() + p[:, 512:] @ q[:, 512:].t()
    one_pass = _float32_sum_over_k(x, w, range(1024))
    halves = _float32_sum_over_k(x, w, range(512)) + _float32_sum_over_k(x, w, range(512, 1024))
    assert (one_pass != halves).mean() > 0.5, "control: float32 should depend on the summation order"

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        prover = Rounder("record")
        with rounding(prover):
            det = Det.linear(x.double(), w.double(), None, "w").float()
        torch.set_num_threads(2)
        x64, w64 = x.double(), w.double()
        verifier = Rounder("replay", entries=dict(prover.entries))
        replayed = verifier(0, split(x64, w64), dot_bound(x64, w64.t())).float()
    finally:
        torch.set_num_threads(before)
    verifier.finish()
    assert torch.equal(det, replayed)


# --------------------------------------------------------------------------- the bounds themselves


def _captured(fn):
    """Run fn under a recording Rounder; return [(name, float64 value before rounding, bound)] per rounding point."""
    caps = []
    r = Rounder("record", perturb=lambda v, b: (caps.append((v.detach().clone(), b)), v)[1])
    with rounding(r):
        fn()
    return caps


def _ld(t: torch.Tensor):
    import numpy as np

    return t.detach().numpy().astype(np.longdouble)


# The reference needs more bits than float64: x87 extended (64-bit significand) on x86-64 Linux, IEEE quad
# on ARM64 Linux. Where numpy's longdouble is plain float64 (Windows, macOS on ARM64) the reference would
# carry errors as large as the bounds it checks, so the check cannot be made there.
EXTENDED = pytest.mark.skipif(
    np.finfo(np.longdouble).nmant <= 52,
    reason="numpy's longdouble is float64 on this platform: no reference wider than the values checked",
)


def _check(v: torch.Tensor, bound, exact) -> None:
    """|v - exact| <= bound everywhere, exact computed in numpy's longdouble (wider than float64, see EXTENDED)."""
    import numpy as np

    err = bound.at(torch.arange(v.numel())).reshape(v.shape).detach().numpy().astype(np.longdouble)
    gap = np.abs(v.detach().numpy().astype(np.longdouble) - exact)
    assert (gap <= err * (1 + 1e-3) + 1e-300).all(), float((gap - err).max())


def _f32(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return ((torch.rand(*shape, generator=g, dtype=torch.float64) * 2 - 1) * scale).float().double()


@EXTENDED
def test_matmul_bounds_hold_against_extended_precision():
    import numpy as np

    from replay.training.ops import _Matmul

    a, b, bias = _f32(64, 300), _f32(300, 40, seed=1), _f32(40, seed=2)
    b[:, 0], bias[0] = 0, 0  # an exactly zero output column: its bound must be exactly zero
    a.requires_grad_(), b.requires_grad_(), bias.requires_grad_()
    g = _f32(64, 40, seed=3)
    caps = _captured(lambda: _Matmul.apply(a, b, bias, 0.37, "m").backward(g))
    (v, fwd), (ga, bga), (gb, bgb), (gbias, bgbias) = caps
    A, B, G = _ld(a), _ld(b), _ld(g)
    _check(v, fwd, (A @ B) * np.longdouble(0.37) + _ld(bias))
    _check(ga, bga, (G * np.longdouble(0.37)) @ B.T)
    _check(gb, bgb, A.T @ (G * np.longdouble(0.37)))
    _check(gbias, bgbias, (G * np.longdouble(0.37)).sum(0))
    assert float(fwd.at(torch.arange(0, 64 * 40, 40)).detach().abs().max()) == 0.0


@EXTENDED
@pytest.mark.parametrize("stride", [1, 2])
def test_convolution_bounds_hold_against_extended_precision(stride):
    """A convolution's four points against a wider reference: the forward product, the weight gradient (each image's
    product, then their sum: its bound gamma(B + L), the depth of that sum, not gamma(B * L)), the bias gradient and
    the input gradient. Positive operands: no cancellation, every rounding error adds up."""
    import numpy as np

    from replay.training.ops import _Conv2d

    x = _f32(6, 3, 11, 11, seed=1).abs().requires_grad_()
    w, b = _f32(5, 3, 3, 3, seed=2).abs().requires_grad_(), _f32(5, seed=3).requires_grad_()
    ho = (11 + 2 - 3) // stride + 1
    dy = _f32(6, 5, ho, ho, seed=4).abs()
    caps = _captured(lambda: _Conv2d.apply(x, w, b, stride, 1, "c").backward(dy))
    (y, by), (dw, bdw), (db, bdb), (dx, bdx) = caps
    cols = _ld(torch.nn.functional.unfold(x.detach(), (3, 3), padding=1, stride=stride))  # (B, CK, L), exact copies
    W, G = _ld(w).reshape(5, -1), _ld(dy).reshape(6, 5, -1)
    _check(y, by, W @ cols + _ld(b)[:, None])  # (B, O, L): the point is before the reshape
    _check(dw, bdw, np.einsum("bol,bcl->oc", G, cols))
    _check(db, bdb, G.sum((0, 2)))
    dcols = np.einsum("oc,bol->bcl", W, G).astype(
        np.float64
    )  # each term of a fold is one product (exact in longdouble)
    folded = torch.nn.functional.fold(torch.from_numpy(dcols), (11, 11), (3, 3), padding=1, stride=stride)
    assert bdx.at(torch.arange(dx.numel())).max() > 0  # (the reference's own rounding, below, is far inside it)
    _check(dx, bdx, _ld(folded))


@EXTENDED
def test_softmax_layernorm_and_loss_bounds_hold_against_extended_precision():
    import numpy as np

    from replay.training.ops import _CrossEntropy, _LayerNorm, _Softmax

    x = _f32(8, 50, scale=6.0).requires_grad_()
    dp = _f32(8, 50, seed=1)
    (p, bp), (dx, bdx) = _captured(lambda: _Softmax.apply(x, "s").backward(dp))
    X = _ld(x)
    e = np.exp(X - X.max(-1, keepdims=True))
    _check(p, bp, e / e.sum(-1, keepdims=True))
    P, DP = _ld(p.float().double()), _ld(dp)  # the backward uses the rounded p
    _check(dx, bdx, P * (DP - (P * DP).sum(-1, keepdims=True)))

    y = _f32(16, 96, seed=4, scale=3.0) + 0.5
    w, bb = _f32(96, seed=5), _f32(96, seed=6)
    (mu, bmu), (var, bvar) = _captured(lambda: _LayerNorm.apply(y, w, bb, 1e-5, "ln"))
    Y = _ld(y)
    _check(mu, bmu, Y.mean(-1, keepdims=True))
    d = Y - _ld(mu.float().double())
    _check(var, bvar, (d * d).mean(-1, keepdims=True))

    logits, targets = (
        _f32(32, 20, seed=7, scale=4.0),
        torch.randint(0, 20, (32,), generator=torch.Generator().manual_seed(8)),
    )
    ((loss, bl),) = _captured(lambda: _CrossEntropy.apply(logits, targets, "ce"))
    L = _ld(logits)
    m = L.max(-1, keepdims=True)
    lse = np.log(np.exp(L - m).sum(-1)) + m[:, 0]
    _check(loss, bl, (lse - L[np.arange(32), targets.numpy()]).mean())
