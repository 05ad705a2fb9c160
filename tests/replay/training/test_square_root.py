"""The correctly rounded square root (determinism.sqrt_) that the deterministic ops take between their
rounding points: IEEE-754's, the same bits on every machine, where torch's own CPU kernel is not."""

from __future__ import annotations

import math
import struct

import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from replay.training import determinism

# torch 2.13's CPU square root of this value is an ulp below the correctly rounded 0x1.0612738387a67p+0
TORCH_MISSES = float.fromhex("0x1.0c491e0000000p+0") + 1e-5


def _bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", x))[0]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(min_value=0.0, allow_nan=False, allow_infinity=True), min_size=1, max_size=70))
@example([TORCH_MISSES])
@example([0.0, -0.0, 5e-324, 1e308, math.inf])
def test_square_roots_are_correctly_rounded(values):
    """determinism.sqrt_ is IEEE-754's square root (Python's math.sqrt is), in place, at any length (a
    vector loop's body and its tail), however torch's own CPU kernel rounds."""
    t = torch.tensor(values, dtype=torch.float64)
    assert determinism.sqrt_(t) is t
    assert [_bits(x) for x in t.tolist()] == [_bits(math.sqrt(x)) for x in values]


def test_square_roots_of_negatives_and_nan_are_nan_and_of_strided_views_in_place():
    t = torch.tensor([-1.0, math.nan, 4.0, -math.inf], dtype=torch.float64)
    determinism.sqrt_(t)
    assert math.isnan(t[0]) and math.isnan(t[1]) and t[2] == 2.0 and math.isnan(t[3])
    m = torch.full((4, 6), 9.0, dtype=torch.float64)
    version = m._version
    determinism.sqrt_(m[:, 1::2])  # a strided view: only its elements, and the change seen (autograd, packing)
    assert m._version > version
    assert (m[:, 1::2] == 3.0).all() and (m[:, ::2] == 9.0).all()
    assert determinism.sqrt_(torch.empty(0, dtype=torch.float64)).numel() == 0
    scalar = torch.tensor(TORCH_MISSES, dtype=torch.float64)  # 0-d
    assert _bits(float(determinism.sqrt_(scalar))) == _bits(math.sqrt(TORCH_MISSES))
    each = [torch.full((3,), TORCH_MISSES, dtype=torch.float64), torch.full((2, 2), 16.0, dtype=torch.float64)]
    determinism.sqrt_each_(each)
    assert {_bits(x) for x in each[0].tolist()} == {_bits(math.sqrt(TORCH_MISSES))} and (each[1] == 4.0).all()
