"""The cross-entropy's logits-sized work in place (a GPT-2 step's memory peak): the same bits as the
formulas it replaced, written out here as the reference (a one-hot, out-of-place temporaries)."""

from __future__ import annotations

import hypothesis.strategies as st
import torch
from hypothesis import given, settings

from replay.training.determinism import EXP_ERR, Rounder, U, gamma, rounding
from replay.training.ops import _CrossEntropy


def _reference(logits: torch.Tensor, targets: torch.Tensor, gl: torch.Tensor):
    """(loss before rounding, its bound, dz before rounding, dz's bound) as ops.py formed them before."""
    n, v = logits.shape
    z = logits - logits.amax(-1, keepdim=True)
    e = torch.exp(z)
    s = e.sum(-1, keepdim=True)
    ls = torch.log(s)
    row = ls - z.gather(1, targets.unsqueeze(1))
    inv_n = 1.0 / n
    loss = row.sum() * inv_n
    err_row = gamma(v + 8) + ls.abs() * EXP_ERR + row.abs() * U
    loss_err = (row.abs().sum() * gamma(n + 1) + err_row.sum()) * inv_n
    p = e.div_(s)  # saved as they are: dz's bound covers their error (a sum's order)
    c = gl * inv_n
    onehot = torch.zeros_like(p).scatter_(1, targets.unsqueeze(1), 1.0)
    dz = (p - onehot).mul_(c)
    err = (p - onehot).abs_().mul_(U).add_(p * gamma(v + 10)).mul_(c.abs())
    return loss, loss_err, dz, err.add_(dz.abs().mul_(2 * U))


def _points(logits, targets, gl):
    """The op's rounding points as the rounder sees them: [(value before rounding, bound tensor)]."""
    seen = []
    r = Rounder("record", perturb=lambda v, b: (seen.append((v.detach().clone(), b.window())), v)[1])
    x = logits.clone().requires_grad_()
    with rounding(r):
        loss = _CrossEntropy.apply(x, targets, "ce")
        loss.backward(gl)
    return seen


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.int64)


_VALUE = st.one_of(
    st.floats(-80, 80, width=32),
    st.sampled_from([0.0, -0.0, 3.0e38, -3.0e38, 1e-45, 88.7, -103.0]),
)


@settings(max_examples=150, deadline=None)
@given(
    rows=st.integers(1, 5),
    cols=st.integers(1, 9),
    data=st.data(),
    gl=st.sampled_from([1.0, -0.5, 3.0e-7, 0.0, 7.25]),
)
def test_cross_entropy_in_place_gives_the_former_bits(rows, cols, data, gl):
    values = data.draw(st.lists(_VALUE, min_size=rows * cols, max_size=rows * cols))
    logits = torch.tensor(values, dtype=torch.float32).double().reshape(rows, cols)
    targets = torch.tensor(data.draw(st.lists(st.integers(0, cols - 1), min_size=rows, max_size=rows)))
    g = torch.tensor(gl, dtype=torch.float64)
    (loss, loss_err), (dz, dz_err) = _points(logits, targets, g)
    ref_loss, ref_loss_err, ref_dz, ref_dz_err = _reference(logits, targets, g)
    assert torch.equal(_bits(loss), _bits(ref_loss)) and torch.equal(_bits(loss_err), _bits(ref_loss_err))
    assert torch.equal(_bits(dz), _bits(ref_dz)), "the gradient before rounding"
    assert torch.equal(_bits(dz_err), _bits(ref_dz_err)), "its bound"


def test_the_reference_is_not_the_identity():
    """Control: a one-ulp change to a probability shows in the gradient's bits (the comparison can fail)."""
    logits = torch.tensor([[0.5, -1.25, 2.0], [3.0, 0.0, -7.5]], dtype=torch.float64)
    targets = torch.tensor([2, 0])
    (_, _), (dz, _) = _points(logits, targets, torch.tensor(1.0, dtype=torch.float64))
    _, _, ref_dz, _ = _reference(logits, targets, torch.tensor(1.0, dtype=torch.float64))
    assert torch.equal(_bits(dz), _bits(ref_dz))
    bumped = torch.nextafter(ref_dz, torch.tensor(1.0, dtype=torch.float64))
    assert not torch.equal(_bits(dz), _bits(bumped))
