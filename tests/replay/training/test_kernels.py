"""The Triton kernels of the det64 device path (replay/training/kernels.py), held to the torch path
they replace: on the CPU under Triton's interpreter (no GPU needed), and on CUDA where there is one."""

from __future__ import annotations

import importlib.util

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

from replay.training import architectures as models
from replay.training import determinism as det
from replay.training import kernels, native
from replay.training.bundled_data import Batches
from replay.training.train import initial_state, train_step

from ..helpers import TINY

if importlib.util.find_spec("triton") is None:
    pytest.skip("Triton is not installed", allow_module_level=True)
# Triton's interpreter is chosen when Triton is imported (tests/replay/conftest.py): the CPU where there is no GPU
DEVICES = ["cuda"] if torch.cuda.is_available() else ["cpu"]


@pytest.fixture(params=DEVICES)
def device(request, monkeypatch):
    """The kernels on: the CPU through Triton's interpreter, the torch path without the native kernel
    (what a GPU runs)."""
    monkeypatch.setenv("REPLAY_TRITON", "cpu" if request.param == "cpu" else "1")
    monkeypatch.setattr(native, "_LIB", False)
    return torch.device(request.param)


def _near_midpoints(shape, seed: int, device) -> torch.Tensor:
    """float64 values of which a third sit within 2^-40 (relative) of a float32 rounding midpoint,
    the rest just off a float32; some -0 and +0."""
    g = torch.Generator().manual_seed(seed)
    f = torch.randn(shape, generator=g).float()
    up = torch.nextafter(f, torch.full_like(f, float("inf")))
    noise = torch.randn(shape, generator=g, dtype=torch.float64) * f.double().abs() * 2.0**-40
    mid = (f.double() + up.double()) / 2
    v = torch.where(torch.rand(shape, generator=g) < 1 / 3, mid, f.double()) + noise
    flat = v.view(-1)
    signed_zeros = torch.tensor([-0.0, 0.0, -0.0], dtype=torch.float64)
    flat[:3] = signed_zeros[: min(3, flat.numel())]
    return v.to(device)


def _slots(out):
    """The flat indices a pick put in its candidate slots, sorted, and its slot arrays."""
    idx, cand = out[1], out[4]
    on = cand.bool()
    return sorted(idx[on].tolist()), on


def test_kernels_run_on_a_cpu_only_when_the_suite_asks(monkeypatch):
    """A CPU runs its native kernel or the torch path; the Triton kernels there are the suite's."""
    monkeypatch.delenv("REPLAY_TRITON", raising=False)
    assert not kernels.usable(torch.zeros(1))
    monkeypatch.setenv("REPLAY_TRITON", "cpu")
    assert kernels.usable(torch.zeros(1)) or torch.cuda.is_available(), "control: the suite's switch"
    monkeypatch.setenv("REPLAY_TRITON", "0")
    assert not kernels.usable(torch.zeros(1))


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    rows=st.integers(1, 70),
    cols=st.integers(1, 70),
    scale=st.sampled_from([2.0**-60, 2.0**-45, 2.0**-30, 1.0]),
    room=st.sampled_from([1, 7, 10_000]),
)
@pytest.mark.skipif(torch.cuda.is_available(), reason="Triton's interpreter runs where there is no GPU")
def test_pick_full_slots_exactly_the_outputs_whose_window_holds_a_midpoint(seed, rows, cols, scale, room):
    """Against `straddle_mask` (the torch path's test): the same set when it fits the slots, else a
    full set of slots all flagged; float32(v) returned whole; zero, negative and NaN widths never
    flag. On the CPU (Triton's interpreter) only: the GPU runs it in the tests below."""
    v = _near_midpoints((rows, cols), seed, "cpu")
    g = torch.Generator().manual_seed(seed + 1)
    err = torch.rand(rows, cols, generator=g, dtype=torch.float64) * scale * v.abs()
    flat = err.view(-1)
    flat[::5] = 0.0
    flat[1::7] = -1.0
    flat[2::11] = float("nan")
    out = kernels.pick_full(v, err, det.SAFETY, room)
    want = det.straddle_mask(v, err * det.SAFETY).view(-1).nonzero().view(-1).tolist()
    got, on = _slots(out)
    r, idx, x, e, cand = out
    assert torch.equal(r.view(torch.int64), v.float().double().view(torch.int64))
    if len(want) <= room:
        assert got == want
    else:
        assert len(got) == room and set(got) <= set(want)
    assert torch.equal(x[on], v.view(-1)[idx[on]]) and torch.equal(e[on], err.view(-1)[idx[on]])
    assert not cand[~on].any() and (idx[~on] == 0).all()


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    rows=st.integers(1, 40),
    vocab=st.integers(1, 70),
    c=st.sampled_from([1.0, -1.0, 0.37, -(2.0**-7), 0.0, 2.0**-1074]),
    room=st.sampled_from([1, 7, 10_000]),
)
@pytest.mark.skipif(torch.cuda.is_available(), reason="Triton's interpreter runs where there is no GPU")
def test_the_cross_entropy_gradients_pick_is_the_full_bounds_pick_of_its_bound(seed, rows, vocab, c, room):
    """`pick_cross_entropy_back` against `pick_full` of the bound the torch path forms as a tensor (ops._CrossEntropy's
    err, written out here): the same rounding, written over v, the same slots, values and bounds. The probabilities
    near float32 midpoints (c = +-1: the gradient is p, or p - 1, exactly), zeros and ones among them."""
    p = _near_midpoints((rows, vocab), seed, "cpu").abs()
    p.view(-1)[5::13] = 1.0
    targets = torch.randint(0, vocab, (rows,), generator=torch.Generator().manual_seed(seed))
    c_t = torch.tensor(c, dtype=torch.float64)
    u, g = det.U, det.gamma(vocab + 10)
    minus_onehot = lambda: p.clone().scatter_add_(1, targets.unsqueeze(1), torch.full((rows, 1), -1.0, dtype=p.dtype))
    dz = minus_onehot().mul_(c_t)
    err = minus_onehot().abs_().mul_(u).add_(p * g).mul_(c_t.abs()).add_(dz.abs().mul_(2 * u))
    want = kernels.pick_full(dz.clone(), err, det.SAFETY, room)
    v = dz.clone()
    got = kernels.pick_cross_entropy_back(v, p, targets, c_t, u, g, det.SAFETY, room)
    assert got[0] is v, "rounded in v's place"
    assert torch.equal(v.view(torch.int64), want[0].view(torch.int64))
    (flagged, on), (flagged_want, on_want) = _slots(got), _slots(want)
    if len(flagged_want) <= room:  # (past the slots, each kernel's blocks fill them in their own order)
        assert flagged == flagged_want
        order, order_want = got[1][on].argsort(), want[1][on_want].argsort()
        for i in (2, 3):  # values and bounds, bit for bit
            assert torch.equal(got[i][on][order].view(torch.int64), want[i][on_want][order_want].view(torch.int64))
    else:
        within = det.straddle_mask(dz, err * det.SAFETY).view(-1).nonzero().view(-1).tolist()
        assert len(flagged) == room and set(flagged) <= set(within)


def test_a_recording_picks_the_cross_entropy_gradient_in_its_kernel_with_two_logits_sized_tensors(monkeypatch):
    """On the device path (the torch path with the kernels, as a GPU records), the loss's gradient goes through
    `pick_cross_entropy_back`, and the step keeps at most two logits-sized float64 tensors at once there (the
    probabilities and the gradient, rounded in place; the torch path's bound and rounding made two more)."""
    from replay.training import ops

    from .test_packed_saves import _LargeStorages

    monkeypatch.setattr(native, "_LIB", False)
    calls = []
    real = kernels.pick_cross_entropy_back
    monkeypatch.setattr(kernels, "pick_cross_entropy_back", lambda *a: calls.append(1) or real(*a))
    rows, vocab = 64, 256  # past SMALL_POINT outputs: picked in slots
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(rows, vocab, generator=g).float().double().requires_grad_()
    targets = torch.randint(0, vocab, (rows,), generator=g)

    def most_at_once(triton: str):
        monkeypatch.setenv("REPLAY_TRITON", triton)
        calls.clear()
        rounder = det.Rounder("record")
        with det.rounding(rounder):
            loss = ops._CrossEntropy.apply(logits, targets, "loss")
            with _LargeStorages(rows * vocab * 8) as seen:
                (grad,) = torch.autograd.grad(loss, logits)
        return seen.most, grad, det.encode_log(rounder.entries), bool(calls)

    kernel, grad, log, ran = most_at_once("cpu")
    torch_path, grad_torch, log_torch, ran_torch = most_at_once("0")
    assert ran and not ran_torch, "control: the kernel ran only where the kernels are on"
    assert torch.equal(grad.view(torch.int64), grad_torch.view(torch.int64)) and log == log_torch
    assert kernel <= 2 < torch_path, (kernel, torch_path)


@pytest.mark.parametrize("batch_a, batch_b", [((), ()), ((3,), ()), ((2, 3), (2, 3)), ((2, 1), (1, 3))])
@pytest.mark.parametrize("bias", [None, "cols", "rows"])
def test_pick_dot_flags_what_the_product_window_flags(device, batch_a, batch_b, bias):
    """The product window ||A_i|| ||B_j|| (+ |bias|) formed in the kernel: the flagged set equals
    `straddle_mask` over the torch-formed window, batch dims broadcast."""
    rows, cols = 23, 37
    batch = tuple(torch.broadcast_shapes(batch_a, batch_b))
    v = _near_midpoints(batch + (rows, cols), 7, device)
    g = torch.Generator().manual_seed(8)
    na = (torch.rand(batch_a + (rows,), generator=g, dtype=torch.float64) * 2.0**-30).to(device)
    nb = (torch.rand(batch_b + (cols,), generator=g, dtype=torch.float64)).to(device)
    b = None
    if bias:
        b = (torch.rand(rows if bias == "rows" else cols, generator=g, dtype=torch.float64) * 2.0**-31).to(device)
    w = na.unsqueeze(-1) * nb.unsqueeze(-2)
    if b is not None:
        w = w + (b.view(-1, 1) if bias == "rows" else b)
    want = det.straddle_mask(v, w, positive=False).view(-1).nonzero().view(-1).tolist()
    out = kernels.pick_dot(v, na, nb, b, bias == "rows", v.numel())
    assert want, "control: some outputs are flagged"
    assert _slots(out)[0] == want
    assert torch.equal(out[0].view(torch.int64), v.float().double().view(torch.int64))


@pytest.mark.parametrize(
    "a_shape, b_shape, transpose_b",
    [
        ((40, 19), (19, 30), False),
        ((40, 19), (19, 30), True),
        ((3, 40, 19), (19, 30), False),
        ((2, 3, 16, 9), (2, 3, 9, 16), True),
        ((2, 1, 16, 9), (1, 3, 9, 16), False),
    ],
)
def test_dot_exact_is_the_gathered_sum_of_magnitudes(device, a_shape, b_shape, transpose_b):
    """sum_k |A_ik B_kj| g + |bias| at the valid slots (to the last bits: another order of addition,
    within SAFETY's slack), exactly 0 at the others; strided and broadcast operands."""
    g = torch.Generator().manual_seed(11)
    a = torch.randn(a_shape, generator=g, dtype=torch.float64).to(device)
    b = torch.randn(b_shape, generator=g, dtype=torch.float64)
    if transpose_b:
        b = b.transpose(-2, -1).contiguous().transpose(-2, -1)
    b = b.to(device)
    bias = torch.randn(b_shape[-1], generator=g, dtype=torch.float64).to(device)
    bound = det.dot_bound(a, b, 0.5, bias)
    out = (a @ b).numel()
    idx = torch.randint(0, out, (300,), generator=g).to(device)
    valid = (torch.rand(300, generator=g) < 0.6).to(device)
    got = bound.exact(idx, valid)
    rows = torch.broadcast_to(a, torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + a.shape[-2:])
    cols = torch.broadcast_to(b, rows.shape[:-2] + b.shape[-2:])
    want = torch.matmul(rows.abs(), cols.abs()).reshape(-1)[idx] * (det.gamma(a.shape[-1] + 2) * 0.5)
    want = want + (bias.abs() * det.gamma(a.shape[-1] + 2))[idx % b.shape[-1]]
    assert torch.allclose(got[valid], want[valid], rtol=1e-12, atol=0)
    assert (got[~valid] == 0).all() and valid.any() and (~valid).any()
    assert torch.allclose(bound.exact(idx)[valid], want[valid], rtol=1e-12, atol=0), "no mask: every slot"


def test_three_batch_dims_take_the_torch_path(device):
    a = torch.randn(2, 2, 2, 5, 4, dtype=torch.float64, device=device)
    b = torch.randn(2, 2, 2, 4, 6, dtype=torch.float64, device=device)
    idx = torch.arange(10, device=device)
    assert kernels.dot_exact(a, b, 1.0, None, False, (2, 2, 2, 5, 6), idx) is None


def _run(arch: str, seed: int, steps: int, triton_on: bool, monkeypatch, device, replay_logs=None):
    monkeypatch.setenv("REPLAY_TRITON", ("cpu" if device.type == "cpu" else "1") if triton_on else "0")
    cfg, bs = TINY[arch]["config"], 8 * TINY[arch]["batch"]  # points over SMALL_POINT outputs: picked in slots
    from replay.prover.recorder import DEFAULT_OPTIMIZER

    opt = DEFAULT_OPTIMIZER[arch]
    model, batches = models.build(arch, cfg), Batches(arch, cfg, bs, seed)
    state = initial_state(models.init_params(arch, cfg, seed), opt).to(device)
    logs = []
    for t in range(steps):
        if replay_logs is None:
            rounder = det.Rounder("record")
        else:
            rounder = det.Rounder("replay", entries=det.decode_log(replay_logs[t]))
        state, _ = train_step(model, state, batches(t), opt, "det64", rounder)
        logs.append(det.encode_log(rounder.entries) if replay_logs is None else None)
    return state, logs


@pytest.mark.parametrize("arch", ["mlp", "cnn", "gpt"])
def test_a_recording_through_the_kernels_equals_the_torch_path_and_replays(device, arch, monkeypatch):
    """Three recorded steps through the kernels: the same states and the same log bytes as the torch
    path's; the log replays (static replay, the kernels' masked exact bounds) to the same state."""
    monkeypatch.setenv("REPLAY_STATIC", "1")
    calls = []
    monkeypatch.setattr(det, "_APPLY_CHECKED", set())
    monkeypatch.setattr(det, "_APPLY_OFF", set())
    for name in ("_pick", "dot_exact", "apply_slots", "pick_cross_entropy_back"):
        real = getattr(kernels, name)
        monkeypatch.setattr(kernels, name, lambda *a, real=real, name=name, **k: calls.append(name) or real(*a, **k))
    fast, fast_logs = _run(arch, 4, 3, True, monkeypatch, device)
    assert {"_pick", "dot_exact"} <= set(calls), "control: the kernels ran"
    # the loss's gradient: a slot per output (no pick) under SMALL_POINT outputs, the mlp's and the cnn's
    assert ("pick_cross_entropy_back" in calls) == (arch == "gpt"), "control: the loss's gradient's kernel"
    calls.clear()
    ref, ref_logs = _run(arch, 4, 3, False, monkeypatch, device)
    assert fast.equal(ref) and fast_logs == ref_logs
    assert any(len(log) > 2 for log in fast_logs), "control: the steps have close calls"
    assert not calls, "control: REPLAY_TRITON=0 runs the torch path"
    again, _ = _run(arch, 4, 3, True, monkeypatch, device, replay_logs=fast_logs)
    assert again.equal(fast)
    assert {"dot_exact", "apply_slots"} <= set(calls), "control: the static replay through the kernels"
    assert not det._APPLY_OFF, "the apply kernel agreed with the torch ops where it was checked"
    if device.type == "cpu":  # on a GPU a graph replays steps 2 and 3: checked only where the capture's
        # warm-up meets real entries (the cnn's first entries come in step 3): the torch ops elsewhere
        assert det._APPLY_CHECKED, "control: the check ran"


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_the_multi_tensor_update_is_the_per_parameter_update_bit_for_bit(device, kind, weight_decay):
    """det64's update on a GPU (`_adamw_foreach`, `_sgd_foreach`: one kernel an operation for a group)
    against `_adamw` / `_sgd` a parameter at a time: the same float32 state, bit for bit, over values
    spanning magnitudes, signed zeros and a learning rate from a schedule."""
    from replay.training import train

    g = torch.Generator().manual_seed(21)
    shapes = [(7, 5), (130,), (3, 4, 9), (1,)]

    def spread(shape):
        x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-30, 10, shape, generator=g).float())
        x.view(-1)[0] = -0.0
        return x.to(device)

    p32 = [spread(s) for s in shapes]
    grads = [spread(s).double() for s in shapes]
    names = ("momentum",) if kind == "sgd" else ("m", "v")
    bufs32 = {b: [spread(s).abs() if b == "v" else spread(s) for s in shapes] for b in names}
    hp = {"sgd": {"momentum": 0.9}, "adamw": {"betas": (0.9, 0.999), "eps": 1e-8}}[kind] | {
        "weight_decay": weight_decay
    }
    lr, t = train.lr_at({"kind": "linear", "lr": 3e-3, "warmup": 3, "total": 50, "final": 1e-4}, 7), 7
    p64 = [p.double() for p in p32]
    if kind == "sgd":
        fast_p, fast_b = train._sgd_foreach(hp, lr, p64, grads, bufs32)
    else:
        fast_p, fast_b = train._adamw_foreach(hp, lr, t, p64, grads, bufs32)
    moved = []
    for i in range(len(shapes)):
        to32 = lambda what, v: det.converted(v, torch.float32)
        bufs = {b: det.converted(bufs32[b][i], torch.float64) for b in names}
        if kind == "sgd":
            ref_p, ref_b = train._sgd(hp, lr, p64[i], grads[i], bufs, to32, own=True)
        else:
            ref_p, ref_b = train._adamw(hp, lr, t, p64[i], grads[i], bufs, to32, own=True)
        assert torch.equal(fast_p[i].view(torch.int32), ref_p.view(torch.int32))
        for b in names:
            assert torch.equal(fast_b[b][i].view(torch.int32), ref_b[b].view(torch.int32))
        moved.append(not torch.equal(ref_p.view(torch.int32), p32[i].view(torch.int32)))
    assert all(moved), "control: the step moved every parameter"


def test_a_kernel_that_fails_to_build_leaves_the_torch_path(device, monkeypatch):
    """A GPU or driver Triton cannot build for: one warning, None (the caller's torch path gives the same
    values), and the kernels stay off for the process."""

    class Unbuildable:
        def __getitem__(self, grid):
            raise RuntimeError("no compiler for this device")

    monkeypatch.setattr(kernels, "_BROKEN", [])
    monkeypatch.setattr(kernels, "_jit", lambda: (Unbuildable(), Unbuildable()))
    v = _near_midpoints((70, 70), 3, device)
    assert kernels.usable(v), "control: on before the failure"
    with pytest.warns(UserWarning, match="Triton kernel failed"):
        assert kernels.pick_full(v, v.abs() * 2.0**-40, det.SAFETY, 100) is None
    assert not kernels.usable(v)


def _crafted_slots(seed: int, slots: int, device):
    """A static replay point's slots as a crafted log could fill them: values near midpoints, bounds
    zero, NaN, too wide or honest, narrow parities and wide codes in and out of their windows, and
    padding (not valid)."""
    g = torch.Generator().manual_seed(seed)
    v = _near_midpoints((slots + 5,), seed, "cpu")
    idx = torch.randint(0, v.numel(), (slots,), generator=g)
    x = v[idx]
    e = x.abs() * torch.exp2(-torch.randint(20, 60, (slots,), generator=g).double())
    pick = torch.randint(0, 6, (slots,), generator=g)
    e = torch.where(pick == 0, 0.0, e)
    e = torch.where(pick == 1, float("nan"), e)
    e = torch.where(pick == 2, x.abs() * 0.01 + 1.0, e)  # far wider than 2^-12 of the scale
    wide = torch.rand(slots, generator=g) < 0.4
    own = x.float().view(torch.int32).long()
    shift = torch.randint(-3, 4, (slots,), generator=g)
    code = torch.where(wide, own + shift, torch.randint(0, 2, (slots,), generator=g))
    code = torch.where(wide & (torch.rand(slots, generator=g) < 0.1), torch.full_like(code, -(2**31)), code)
    valid = torch.rand(slots, generator=g) < 0.8
    return [t.to(device) for t in (v, idx, e, code, wide, valid)]


@pytest.mark.skipif(torch.cuda.is_available(), reason="Triton's interpreter runs where there is no GPU")
@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**16), slots=st.integers(1, 300), steers=st.booleans(), zero_scale=st.booleans())
def test_the_apply_kernel_decides_every_slot_as_the_torch_ops(seed, slots, steers, zero_scale):
    """`kernels.apply_slots` against `_static_decisions_torch` (what a static replay ran before): the
    same chosen value at every real entry, bit for bit, the same refusals and the same ratios, over
    crafted slots (refusable and acceptable, narrow and wide, NaN and zero bounds, zero scales)."""
    v, idx, e, code, wide, valid = _crafted_slots(seed, slots, "cpu")
    scale = torch.zeros((), dtype=torch.float64) if zero_scale else det.max_abs(v)
    got = kernels.apply_slots(v, idx, e, code, wide, valid, scale, steers, det.DECODE, det.REL_WINDOW)
    want = det._static_decisions_torch(v[idx], e, code, wide, valid, scale, steers)
    vals, bad, ratio = got
    assert torch.equal(vals[valid].view(torch.int64), want[0][valid].view(torch.int64))
    assert torch.equal(bad.bool(), want[1]) and torch.equal(ratio, want[2])


def test_an_apply_kernel_that_disagrees_is_turned_off(device, monkeypatch):
    """Until a kernel variant has agreed with the torch ops on a point with real entries, both run; a
    kernel that chose another value (a compiler's surprise) is switched off on the device, with a warning,
    and the torch ops' choice is the one used, then and after. A first point without entries checks
    nothing: it does not vouch for the kernel."""
    v, idx, e, code, wide, valid = _crafted_slots(5, 200, device)
    scale = det.max_abs(v)
    want = det._static_decisions_torch(v[idx], e, code, wide, valid, scale, True)
    real = kernels.apply_slots

    def wrong(*a, **k):
        vals, bad, ratio = real(*a, **k)
        return torch.nextafter(vals, torch.full_like(vals, float("inf"))), bad, ratio

    monkeypatch.setattr(det, "_APPLY_CHECKED", set())
    monkeypatch.setattr(det, "_APPLY_OFF", set())
    monkeypatch.setattr(kernels, "apply_slots", wrong)
    none = torch.zeros_like(valid)
    det._static_decisions(v, idx, e, code, wide, none, scale, True)
    assert not det._APPLY_CHECKED and not det._APPLY_OFF, "a point without entries vouches for nothing"
    with pytest.warns(UserWarning, match="disagreed"):
        got = det._static_decisions(v, idx, e, code, wide, valid, scale, True)
    assert {v.device} == det._APPLY_OFF and valid.any()
    assert torch.equal(got[0].view(torch.int64), want[0].view(torch.int64))
    again = det._static_decisions(v, idx, e, code, wide, valid, scale, True)
    assert torch.equal(again[0].view(torch.int64), want[0].view(torch.int64)), "off for the process"
    monkeypatch.setattr(det, "_APPLY_OFF", set())
    monkeypatch.setattr(kernels, "apply_slots", real)
    fine = det._static_decisions(v, idx, e, code, wide, valid, scale, True)
    assert len(det._APPLY_CHECKED) == 1 and not det._APPLY_OFF, "control: the real kernel agrees"
    assert torch.equal(fine[0][valid].view(torch.int64), want[0][valid].view(torch.int64))
    odd = det._static_decisions(v, idx[1:], e[1:], code[1:], wide[1:], valid[1:], scale, False)
    assert len(det._APPLY_CHECKED) == 2, "another variant (steers, alignment) is checked on its own"
    assert torch.equal(
        odd[1], det._static_decisions_torch(v[idx[1:]], e[1:], code[1:], wide[1:], valid[1:], scale, False)[1]
    )


def test_a_nan_ratio_is_not_a_disagreement(device, monkeypatch):
    """A point whose values hold a NaN has a NaN scale (its ratios NaN where used): the kernel and the torch
    ops agree bit for bit, and the check must say so (NaN != NaN as numbers)."""
    v, idx, e, code, wide, valid = _crafted_slots(9, 64, device)
    monkeypatch.setattr(det, "_APPLY_CHECKED", set())
    monkeypatch.setattr(det, "_APPLY_OFF", set())
    scale = torch.tensor(float("nan"), dtype=torch.float64, device=device)
    det._static_decisions(v, idx, e, code, wide, valid, scale, False)
    assert not det._APPLY_OFF and det._APPLY_CHECKED
