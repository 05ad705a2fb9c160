"""The rounding core: close-call detection, the log codec, and replay on a worst-case machine."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from replay import models
from replay.determinism import (
    SAFETY, Bound, LogMismatch, Rounder, close_calls, decode_log, encode_log, from_ordinal, midpoint_distance_lower,
    ordinal, rounding,
)
from replay.ops import Det, Plain
from replay.train import initial_state, train_step

from .helpers import TINY


def brute_force_close(v: float, w: float) -> bool:
    """Reference: does [v - w, v + w] hold a float32 rounding midpoint, or 0 (where -0 meets +0) inside?"""
    import numpy as np

    if v - w < 0 < v + w:
        return True
    r = np.float32(v)
    for a, b in ((np.nextafter(r, np.float32(-np.inf)), r), (r, np.nextafter(r, np.float32(np.inf)))):
        mid = (float(a) + float(b)) / 2
        if v - w <= mid <= v + w:
            return True
    return False


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=-1e30, max_value=1e30, allow_nan=False), st.integers(min_value=-60, max_value=-20))
def test_close_calls_match_brute_force(v, log2_rel):
    err = abs(v) * 2.0**log2_rel + 1e-300
    got = bool(close_calls(torch.tensor([v], dtype=torch.float64), err)[0])
    assert got == brute_force_close(v, err * SAFETY)


def test_midpoint_prefilter_is_exact_in_float32_range_and_never_misses():
    g = torch.Generator().manual_seed(0)
    r = (torch.rand(20000, generator=g, dtype=torch.float64) * 2 - 1) * 10.0 ** torch.randint(-30, 30, (20000,), generator=g)
    mids = (r.float().double() + torch.nextafter(r.float(), torch.tensor(math.inf)).double()) / 2
    v = torch.cat([r, mids, mids + mids.abs() * 2.0**-45, torch.tensor([0.0, -0.0, 1e-40, -3e-45])])
    lower = midpoint_distance_lower(v) * 2.0**-52
    exact = torch.stack([torch.tensor(min(abs(x - m) for m in _mids(x))) for x in v.tolist()])
    assert bool((lower <= exact * (1 + 2.0**-40)).all())
    assert bool(torch.isclose(lower[: 2 * 20000], exact[: 2 * 20000], rtol=1e-12, atol=0).all())


def _mids(x: float):
    import numpy as np

    r = np.float32(x)
    lo, hi = np.nextafter(r, np.float32(-np.inf)), np.nextafter(r, np.float32(np.inf))
    return [(float(lo) + float(r)) / 2, (float(r) + float(hi)) / 2]


def test_ordinal_is_the_number_line():
    xs = torch.tensor([-1.0, -1e-45, -0.0, 0.0, 1e-45, 1.0, float("inf")], dtype=torch.float32)
    o = ordinal(xs)
    assert o.tolist() == sorted(o.tolist()) and len(set(o.tolist())) == len(xs)
    assert int(o[3] - o[2]) == 1 and int(o[4] - o[3]) == 1
    assert torch.equal(from_ordinal(o).view(torch.int32), xs.view(torch.int32))


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.integers(0, 10_000), st.lists(st.tuples(st.integers(0, 10_000_000), st.one_of(
    st.booleans(), st.integers(0, 2**32 - 1))), min_size=1, max_size=30, unique_by=lambda e: e[0])))
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
    from replay.data import Batches

    opt = {"kind": "adamw", "lr": {"kind": "constant", "lr": 1e-3}, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01}
    return models.build(arch, cfg), initial_state(models.init_params(arch, cfg, 0), opt), Batches(arch, cfg, b, 0), opt


def worst_case_machine(seed: int):
    """Moves every value by exactly its error bound, in a random direction: the most a conforming machine may."""
    g = torch.Generator().manual_seed(seed)

    def perturb(v, bound):
        e = bound.at(torch.arange(v.numel())).reshape(v.shape)
        return v + (torch.randint(0, 2, v.shape, generator=g).double() * 2 - 1) * e

    return perturb


@pytest.mark.parametrize("arch", ["mlp", "cnn", "gpt"])
def test_log_makes_worst_case_machines_agree_and_is_needed(arch):
    """Prover and verifier both err by the full bound (independently): with the log the bits agree, without they do not."""
    model, state, batches, opt = _tiny_step(arch)
    steps = 3
    logs, s = [], state
    for t in range(steps):
        r = Rounder("record", perturb=worst_case_machine(t))
        s, _ = train_step(model, s, batches(t), opt, "det64", r)
        logs.append(encode_log(r.entries))
    assert sum(len(decode_log(b)) for b in logs) > 0
    results = {}
    for use_log in (True, False):
        v = state
        for t in range(steps):
            r = Rounder("replay", entries=decode_log(logs[t]) if use_log else {}, perturb=worst_case_machine(100 + t))
            v, _ = train_step(model, v, batches(t), opt, "det64", r)
        results[use_log] = v.equal(s)
    assert results == {True: True, False: False}


def test_verifier_refuses_a_log_entry_that_is_not_a_close_call():
    """A prover may pick among roundings a machine could produce, never push a value by an ulp at will."""
    v = torch.tensor([1.0 + 2.0**-30, 3.0], dtype=torch.float64)
    bound = Bound(1e-15, lambda idx: torch.full((idx.numel(),), 1e-15, dtype=torch.float64))
    up = int(torch.tensor(1.0 + 2.0**-23, dtype=torch.float32).view(torch.int32))  # the next float32 up: a lie
    with pytest.raises(LogMismatch, match="not a close call"):
        Rounder("replay", entries={0: ([0], [up])})(0, v, bound)
    with pytest.raises(LogMismatch, match="not a close call"):
        Rounder("replay", entries={0: ([0], [True])})(0, v, bound)  # parity of 1.0 is even
    with pytest.raises(LogMismatch, match="does not exist"):
        Rounder("replay", entries={0: ([7], [False])})(0, v, bound)
    r = Rounder("replay", entries={5: ([0], [False])})
    with pytest.raises(LogMismatch, match="never reached"):
        r.finish()


def test_det_matmul_is_thread_independent_while_float32_is_not():
    """The measured enemy, at op level: a weight-gradient-shaped matmul (K = 1024) on 1 vs 2 threads."""
    g = torch.Generator().manual_seed(0)
    a = (torch.rand(1024, 64, generator=g, dtype=torch.float64) - 0.5).float()
    b = (torch.rand(1024, 192, generator=g, dtype=torch.float64) - 0.5).float()
    before = torch.get_num_threads()
    out = {}
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            with rounding(Rounder("record")):
                det = Det.linear(b.t().double().contiguous(), a.t().double().contiguous(), None, "w")
            out[n] = (Plain.linear(b.t().contiguous(), a.t().contiguous(), None, "w"), det.float())
    finally:
        torch.set_num_threads(before)
    assert torch.equal(out[1][1], out[2][1])
    assert not torch.equal(out[1][0], out[2][0]), "control: float32 should differ across thread counts here"
