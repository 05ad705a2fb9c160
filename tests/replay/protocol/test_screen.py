"""The Proof-of-Training-Data screen: reported per checkpoint in the verifier's output; the statistic on
constructed cases. bench/screen.py measures its false-alarm and detection rates (bench/RESULTS.md)."""

from __future__ import annotations

import math

import torch

from replay import Budget, verify
from replay.protocol.screen import Z_FLAG, plan, sample, screen, welch_z
from replay.protocol.transcript import Transcript


def test_verifier_reports_the_screen_per_contract(transcripts):
    d = transcripts["mlp", "det64"]  # checkpoints 0, 4, 8, 12: 4 and 8 against the next segment, 12 against 0..4
    v = verify(d, d / "claims.json", Budget(segments=1))
    assert v.verdict == "verified", v.reasons  # flags are reported, never a reason
    out = v.to_json()
    assert set(out["screen"]) == {"checked", "flagged"} and out["screen"]["checked"] == 3
    assert set(out["screen"]["flagged"]) <= {4, 8, 12}
    assert set(out["checks"]["screen"]["z"]) == {"4", "8", "12"}


def test_plan_pairs_each_checkpoint_with_unseen_data_and_skips_what_it_cannot_judge():
    assert plan([0, 4]) == {}  # one segment: nothing unseen to compare with
    assert plan([0, 4, 8]) == {1: (0, 1), 2: (1, 0)}
    assert plan([0, 4, 8, 12]) == {1: (0, 1), 2: (1, 2), 3: (2, 1)}


def test_sample_takes_one_batch_worth_from_across_the_segment():
    seg = [(t, {"x": torch.full((8, 2), float(t)), "y": torch.full((8,), t)}, None) for t in range(4)]
    s = sample(seg)
    assert s["x"].shape == (8, 2) and sorted(set(s["y"].tolist())) == [0, 1, 2, 3]


def test_welch_z_signs_and_degenerate_samples():
    d, e = torch.tensor([1.0, 1.2, 0.8, 1.1]), torch.tensor([0.1, -0.1, 0.0, 0.05])
    assert welch_z(d, e) > Z_FLAG and welch_z(e, d) < -Z_FLAG
    assert welch_z(torch.ones(3), torch.zeros(3)) == math.inf
    assert welch_z(torch.ones(3), torch.ones(3)) == 0.0
    assert math.isnan(welch_z(torch.tensor([math.nan, 1.0]), torch.zeros(2)))  # NaN flags (not z >= Z_FLAG)


def test_screen_flags_a_checkpoint_that_did_not_learn_its_batches(transcripts):
    """Checkpoint 8 replaced by checkpoint 4 (no training at all in 4..8): its own data did not improve."""
    tr = Transcript(transcripts["mlp", "det64"])

    class Stale:
        def __getattr__(self, name):
            return getattr(tr, name)

        def params(self, step):
            return tr.params(4 if step == 8 else step)

    r = screen(Stale())
    assert 8 in r["flagged"] and r["z"]["8"] == 0.0
