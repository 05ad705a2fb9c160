"""What backward keeps of a rounding point's output, kept as float32 (ops._save, Rounder.as_float32): the
same values, so the same steps bit for bit, in half the memory; never a value that is not float32."""

from __future__ import annotations

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from replay.prover.recorder import DEFAULT_OPTIMIZER
from replay.training import architectures as models
from replay.training import determinism as det
from replay.training import native, ops
from replay.training.bundled_data import Batches
from replay.training.determinism import Rounder, decode_log, encode_log
from replay.training.train import initial_state, train_step

from ..helpers import TINY


def _steps(arch: str, pack: bool, monkeypatch, steps: int = 2, pack_min: int = 0):
    """(states, logs, replayed states, float32 tensors saved) of a det64 recording, then the replay of its logs;
    tensors from pack_min elements packed (by default the tiny models' too)."""
    monkeypatch.setattr(ops, "PACK", pack)
    monkeypatch.setattr(det, "PACK_MIN", pack_min)
    packed = []
    real = Rounder.as_float32
    monkeypatch.setattr(Rounder, "as_float32", lambda self, t: (lambda p: packed.append(p) or p)(real(self, t)))
    cfg, opt = TINY[arch]["config"], DEFAULT_OPTIMIZER[arch]
    model, batches = models.build(arch, cfg), Batches(arch, cfg, TINY[arch]["batch"], 5)
    state = initial_state(models.init_params(arch, cfg, 5), opt)
    states, logs = [state], []
    for t in range(steps):
        rounder = Rounder("record")
        state, _ = train_step(model, state, batches(t), opt, "det64", rounder)
        states.append(state)
        logs.append(encode_log(rounder.entries))
    replayed = [
        train_step(model, states[t], batches(t), opt, "det64", Rounder("replay", entries=decode_log(logs[t])))[0]
        for t in range(steps)
    ]
    return states, logs, replayed, sum(p is not None for p in packed)


@pytest.mark.parametrize(
    "arch,native_on", [("mlp", True), ("cnn", True), ("gpt", True), ("gpt", False)], ids=lambda v: str(v)
)
def test_float32_saves_change_no_bit(arch, native_on, monkeypatch):
    if not native_on:
        monkeypatch.setattr(native, "_LIB", False)
    relu_backs, real = [], native.relu_back
    monkeypatch.setattr(native, "relu_back", lambda g, y: (lambda r: relu_backs.append(r is not None) or r)(real(g, y)))
    on = _steps(arch, True, monkeypatch)
    assert any(relu_backs) == native_on, "control: a relu's gradient from its float32 copy, in the kernel"
    off = _steps(arch, False, monkeypatch)
    assert on[3] > 0 and off[3] == 0, "control: packing happened only where on"
    assert all(a.equal(b) for a, b in zip(on[0], off[0])), "recorded states"
    assert on[1] == off[1], "logs"
    assert all(a.equal(b) for a, b in zip(on[2], off[2])) and all(a.equal(b) for a, b in zip(on[2], on[0][1:]))
    assert any(len(log) > 2 for log in on[1]), "control: the steps log close calls"


def test_only_unchanged_views_of_rounded_outputs_are_packed():
    """A rounding point's output and its views: float32 copies sharing one buffer; changed in place
    (any view), or any other tensor: None (kept as it is)."""
    r = Rounder("record")
    with det.rounding(r):
        out = torch.tensor([[1.5, -2.0, 3.25], [0.1, 7.0, -0.0]], dtype=torch.float64).float().double()
        r.note_exact(out)
        q, k = out[:, :2], out.t()
        a, b = r.as_float32(q), r.as_float32(k)
        assert a.dtype == torch.float32 and a.double().equal(q) and b.double().equal(k)
        assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr(), "one copy for every view"
        assert torch.equal(a.double().view(torch.int64), q.contiguous().view(torch.int64)), "-0.0 kept"
        assert r.as_float32(out.detach()) is not None, "a detached view shares the version counter"
        other = torch.tensor([0.1, 0.2], dtype=torch.float64)  # not float32 values: never noted
        assert r.as_float32(other) is None
        out[0, 0] += 2**-40  # no longer float32 values
        assert r.as_float32(q) is None and r.as_float32(k) is None and not r.is_exact(out)


def test_a_view_is_not_taken_for_its_own_tensor():
    """A tensor noted while it is a view, or offset in its storage, is not noted (its storage holds more)."""
    r = Rounder("record")
    big = torch.zeros(10, dtype=torch.float64)
    r.note_exact(big[2:5])
    assert r.as_float32(big[2:5]) is None and r.as_float32(big) is None


def test_the_relu_gradient_is_torchs():
    """ops._Relu's backward against torch.relu's own (threshold_backward), bit for bit: signed zeros,
    NaN inputs and gradients, infinities."""
    special = [0.0, -0.0, 1.5, -1.5, float("nan"), float("inf"), -float("inf"), 1e-300, -1e-300]
    x = torch.tensor(special * len(special), dtype=torch.float64)
    g = torch.tensor([v for v in special for _ in special], dtype=torch.float64)
    a = x.clone().requires_grad_()
    torch.relu(a).backward(g)
    b = x.clone().requires_grad_()
    with det.rounding(Rounder("record")):
        y = ops._Relu.apply(b)
    y.backward(g)
    assert torch.equal(y.detach().view(torch.int64), torch.relu(x).view(torch.int64))
    assert torch.equal(b.grad.view(torch.int64), a.grad.view(torch.int64))


@pytest.mark.parametrize("native_on", [True, False], ids=["native", "torch"])
def test_a_small_convolution_keeps_its_columns_for_backward_and_changes_no_bit(native_on, monkeypatch):
    """Columns under PACK_MIN elements are what a convolution keeps for backward (their copy costs a small network's
    step more than their bytes); past it, the input, unfolded again: the same states, logs and replays either way."""
    if not native_on:
        monkeypatch.setattr(native, "_LIB", False)
    unfolds = []
    real = ops._unfold
    monkeypatch.setattr(ops, "_unfold", lambda *args, **kw: unfolds.append(args) or real(*args, **kw))

    def recorded(pack_min: int):
        monkeypatch.setattr(det, "PACK_MIN", pack_min)
        unfolds.clear()
        states, logs, replayed, _ = _steps("cnn", True, monkeypatch, pack_min=pack_min)
        return states, logs, replayed, len(unfolds)

    kept, again = recorded(1 << 18), recorded(1)
    assert kept[3] == 2 * 2 * 2 and again[3] == 2 * 2 * 4, "control: two layers, record and replay, two steps"
    assert all(a.equal(b) for a, b in zip(kept[0], again[0])), "recorded states"
    assert kept[1] == again[1] and any(len(log) > 2 for log in kept[1]), "the same logs, with close calls"
    assert all(a.equal(b) for a, b in zip(kept[2], again[2]))


class _LargeStorages(TorchDispatchMode):
    """The most storages of at least `size` bytes alive at once among those the ops inside it make or read (each
    tracked by a weak reference to the storage itself, not to a tensor that views it)."""

    def __init__(self, size: int):
        super().__init__()
        self.size, self.alive, self.most = size, {}, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in pytree.tree_leaves((args, kwargs, out)):
            if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes() >= self.size:
                self.alive.setdefault(t.untyped_storage()._cdata, StorageWeakRef(t.untyped_storage()))
        self.alive = {k: ref for k, ref in self.alive.items() if not ref.expired()}
        self.most = max(self.most, len(self.alive))
        return out


@pytest.mark.parametrize("pack_min", [1 << 18, 1], ids=["kept", "unfolded-again"])
def test_a_convolutions_columns_and_their_gradients_columns_are_never_held_at_once(pack_min, monkeypatch):
    """A convolution's columns (B, C*kh*kw, L), kept for backward or unfolded again there, are read last by its weight
    gradient and let go before its input gradient's columns, of the same shape, are made (a small CNN's step peak on a
    CPU: the columns are most of it; the torch path's bounds make temporaries of that size of their own). Kept
    columns among ctx's saved tensors would live until backward returns. The same gradients either way (`_steps`'
    tests hold the bits)."""
    if native.library() is None:
        pytest.skip("the native kernel is off")
    monkeypatch.setattr(det, "PACK_MIN", pack_min)
    x = torch.randn(8, 4, 12, 12, dtype=torch.float32).double().requires_grad_()
    w, b = torch.randn(6, 4, 3, 3).double().requires_grad_(), torch.randn(6).double().requires_grad_()
    dy = torch.randn(8, 6, 12, 12).double()
    columns = 8 * (4 * 9) * (12 * 12) * 8  # bytes; the output (6 channels) and the input (4, unfolded 9x) are smaller
    with det.rounding(Rounder("record")), _LargeStorages(columns) as seen:
        ops._Conv2d.apply(x, w, b, 1, 1, "c").backward(dy)
    assert seen.most == 1, "the columns and their gradient's columns held at once"
    assert x.grad is not None and w.grad is not None, "control: both gradients made"


@pytest.mark.parametrize("pack_min", [1 << 18, 1], ids=["kept", "unfolded-again"])
def test_a_convolution_whose_columns_view_its_input_leaves_the_input_as_it_was(pack_min, monkeypatch):
    """A 1 x 1 window, unpadded, at stride 1: the columns are a view of the input (no copy), kept or made again in
    backward; nothing backward does may change them."""
    monkeypatch.setattr(det, "PACK_MIN", pack_min)
    x = torch.randn(4, 6, 5, 5, dtype=torch.float32).double().requires_grad_()
    before = x.detach().clone()
    w, b = torch.randn(3, 6, 1, 1).double().requires_grad_(), torch.zeros(3, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(4, 3, 5, 5).double()
    with det.rounding(Rounder("record")):
        ops._Conv2d.apply(x, w, b, 1, 0, "c").backward(dy)
    assert torch.equal(x.detach(), before)
    reference = torch.einsum("oc,bohw->bchw", w.detach().reshape(3, 6), dy).float().double()
    assert torch.allclose(x.grad, reference, rtol=1e-6, atol=1e-6), "control: the input gradient itself"


def test_a_second_backward_through_a_convolution_that_let_go_of_its_columns_is_refused_naming_why():
    """Kept columns are let go of in backward (memory): a second backward (retain_graph) cannot read them, and says so
    rather than failing on a missing tensor."""
    x = torch.randn(2, 3, 6, 6, dtype=torch.float32).double().requires_grad_()
    w, b = torch.randn(4, 3, 3, 3).double().requires_grad_(), torch.randn(4).double().requires_grad_()
    with det.rounding(Rounder("record")):
        y = ops._Conv2d.apply(x, w, b, 1, 1, "c")
        y.backward(torch.ones_like(y), retain_graph=True)
        assert x.grad is not None, "control: the first backward"
        with pytest.raises(RuntimeError, match="lets go of its columns in backward: one backward per forward"):
            y.backward(torch.ones_like(y))
