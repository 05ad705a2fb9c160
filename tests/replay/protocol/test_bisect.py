"""Dispute bisection finds the exact first divergent step, then the exact op, of an edited transcript."""

from __future__ import annotations

import random

import pytest

from replay import Budget, verify
from replay.protocol.bisect import RecomputingStore
from replay.training import data_commitment as dataset
from replay.training.determinism import decode_log, encode_log

from ..helpers import STEPS, copy, edit_segment


@pytest.fixture(scope="module")
def honest(transcripts):
    return transcripts["mlp", "det64"]


def dispute_of(edited, honest):
    v = verify(edited, None, Budget(segments=100), store=RecomputingStore(honest))
    assert v.verdict == "rejected"
    return v.details["dispute"]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_edited_batch_is_pinned_to_its_step_and_first_op(honest, tmp_path, seed, monkeypatch):
    """The transcript claims a different batch at a random step (re-committed); the prover's store holds what it really did.

    The dataset commitment alone rejects such a batch (test_dataset.py); it is switched off here to
    exercise the bisection, which must localise any divergence, whatever caused it.
    """
    monkeypatch.setattr(dataset, "check_batch", lambda *a: None)
    t_star = random.Random(seed).randrange(STEPS)
    start = t_star - t_star % 4
    edited = copy(honest, tmp_path / "e")

    def nudge(t):
        t[f"x:{t_star}"] = t[f"x:{t_star}"].clone()
        t[f"x:{t_star}"][0, 0] += 0.5

    edit_segment(edited, start, nudge)
    d = dispute_of(edited, honest)
    assert d["step"] == t_star
    assert d["op"] == "layers.0#0"  # the first layer's forward output is the first thing the batch touches
    assert d["fetched_states"] <= 3  # log2(4 steps per segment) + the end


def test_flipped_rounding_decision_is_pinned_to_its_op(honest, tmp_path):
    """One logged close call answered the other way: bisection names that step and that rounding point.

    Flips are tried in a random order until one changes the trajectory: a 1-ulp change of a gradient
    can be absorbed by the float32 rounding of the optimizer state, and the edited transcript then
    rightly verifies (its every bit replays).
    """
    import safetensors.torch
    import torch

    from replay.protocol.transcript_layout import segment_path

    logs = {}
    for start in (0, 4, 8):
        tensors = safetensors.torch.load(segment_path(honest, start).read_bytes())
        logs.update({t: decode_log(bytes(tensors[f"log:{t}"].numpy())) for t in range(start, start + 4)})
    flips = [
        (t, k, j)
        for t, e in logs.items()
        for k, (idx, codes) in e.items()
        for j, c in enumerate(codes)
        if isinstance(c, bool)
    ]
    random.Random(7).shuffle(flips)
    for n, (t_star, key, j) in enumerate(flips[:12]):
        entries = decode_log(encode_log(logs[t_star]))
        entries[key][1][j] = not entries[key][1][j]
        edited = copy(honest, tmp_path / f"e{n}")
        new_log = torch.frombuffer(bytearray(encode_log(entries)), dtype=torch.uint8)
        edit_segment(edited, t_star - t_star % 4, lambda t: t.update({f"log:{t_star}": new_log}))
        v = verify(edited, None, Budget(segments=100), store=RecomputingStore(honest))
        if v.verdict == "rejected":
            assert v.details["dispute"]["step"] == t_star
            assert v.details["dispute"]["key"] == key
            return
        assert v.verdict == "verified"
    pytest.fail("no flip among 12 changed the trajectory")
