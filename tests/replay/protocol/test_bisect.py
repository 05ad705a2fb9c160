"""Dispute bisection finds the exact first divergent step, then the exact op, of an edited transcript."""

from __future__ import annotations

import random

import pytest

from replay import Budget, verify
from replay.protocol.bisect import RecomputingStore
from replay.training import data_commitment as dataset
from replay.training.determinism import decode_log, encode_log

from .. import cheats
from ..helpers import STEPS, copy, edit_segment, record


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


# --- in production: bisected against the transcript's own per-step commitments (no store) ------------------


def _an_op_of_step(transcript, t: int, index: int) -> tuple[int, str]:
    """(key, name) of the index-th rounded output of step t, as the verifier traces it."""
    from replay.protocol.bisect import step_trace
    from replay.protocol.transcript import Transcript
    from replay.training import architectures as models

    tr = Transcript(transcript)
    start = tr.segment_start(t)
    state = RecomputingStore(transcript).state(t)
    _, batch, log = tr.segment(start)[t - start]
    trace = step_trace(tr, models.build(tr.arch, tr.config), state, batch, log)
    return trace[index][0], trace[index][1]


@pytest.mark.parametrize("commitments", ["ops", "steps"])
def test_a_doctored_op_is_bisected_to_its_step_and_op_from_the_transcript_alone(honest, tmp_path, commitments):
    """A cheating prover's kernel computes one operation of step 5 0.1% off and records everything that follows
    from it (per-step commitments included). With no prover to ask, the verifier bisects against what the
    transcript committed: step 5, and with per-op commitments the doctored operation by name."""
    from replay.protocol.firmware import Firmware  # noqa: F401 -- the cheat records with the usual chips

    key, name = _an_op_of_step(honest, 5, 2)
    cheat = record(tmp_path / "c", "mlp", recorder=cheats.SkewedOp, at=5, key=key, commitments=commitments)
    v = verify(cheat, None, Budget(segments=100))
    assert v.verdict == "rejected", v.reasons
    d = v.details["dispute"]
    assert d["step"] == 5 and d["source"] == "step commitments", d
    if commitments == "ops":
        assert d["op"] == name and d["key"] == key, d
    else:
        assert d["op"], d  # the rounding point or the loss of the step that does not replay


@pytest.mark.parametrize("commitments", ["ops", "steps"])
def test_a_swapped_state_is_bisected_to_the_step_after_which_it_was_swapped(tmp_path, commitments):
    """Hidden compute swapped in after step 7 (the state at checkpoint 8 trained elsewhere): every operation of
    step 7 is as committed, the committed state after it is not their result."""
    cheat = record(tmp_path / "c", "mlp", recorder=cheats.HiddenCompute, at=8, extra=4, commitments=commitments)
    v = verify(cheat, None, Budget(segments=100))
    assert v.verdict == "rejected", v.reasons
    d = v.details["dispute"]
    assert d["step"] == 7 and d["source"] == "step commitments" and d["tensor"], d
    assert d["op"] == (f"state after the step ({d['tensor']})" if commitments == "ops" else f"update of {d['tensor']}")


def test_without_step_commitments_the_losses_and_logs_still_name_the_step(honest, tmp_path):
    key, _ = _an_op_of_step(honest, 5, 2)
    cheat = record(tmp_path / "c", "mlp", recorder=cheats.SkewedOp, at=5, key=key, commitments="none")
    d = verify(cheat, None, Budget(segments=100)).details["dispute"]
    assert d["step"] == 5 and d["source"] == "commitments", d


def test_commitments_never_decide_an_honest_run(honest, tmp_path):
    """Per-step commitments only locate a divergence the replay already found: garbage in them leaves an honest
    transcript verified (its every bit replays)."""
    import torch

    edited = copy(honest, tmp_path / "e")
    edit_segment(edited, 4, lambda t: t.update({"state:5": torch.zeros_like(t["state:5"])}))
    assert verify(edited, None, Budget(segments=100)).verdict == "verified"


def test_the_cli_names_the_first_divergent_step_and_op(honest, tmp_path, capsys):
    """`python -m replay verify` prints the bisection's step and operation."""
    import json

    from replay.__main__ import main

    key, name = _an_op_of_step(honest, 5, 2)
    cheat = record(tmp_path / "c", "mlp", recorder=cheats.SkewedOp, at=5, key=key, commitments="ops")
    (tmp_path / "none.json").write_text(
        json.dumps({"manifest": json.loads((cheat / "claims.json").read_text())["manifest"], "claims": []})
    )
    code = main(
        ["verify", str(cheat), "--claims", str(tmp_path / "none.json"), "--segments", "100", "--nonce", "00" * 16]
    )
    assert code == 1
    assert f"first divergent step: 5, operation: {name}" in capsys.readouterr().out


def test_a_claim_whose_replay_does_not_reach_its_step_is_bisected_too(honest, tmp_path):
    """A claim at step 6 replays from checkpoint 4 through the doctored step 5: that replay's failure is bisected
    against the same commitments (no segment of the run need fail first)."""
    import json

    key, name = _an_op_of_step(honest, 5, 2)
    cheat = record(tmp_path / "c", "mlp", recorder=cheats.SkewedOp, at=5, key=key, commitments="ops", snapshot_rate=2.0)
    c = json.loads((cheat / "claims.json").read_text())
    c["claims"] = [x for x in c["claims"] if x["step"] == 6][:1]
    assert c["claims"]
    v = verify(cheat, c, Budget(segments=0), coverage_target=0.0)
    assert v.verdict == "rejected"
    assert any(r.startswith("replay from checkpoint 4 failed") for r in v.reasons), v.reasons
    d = v.details["dispute"]
    assert d["step"] == 5 and d["op"] == name and d["source"] == "step commitments", d
