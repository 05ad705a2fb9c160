"""det64 recording through CUDA graphs (replay/training/graphs.py): the same bits as the eager path.

These need a GPU (CI has none: the eager path they compare against is what CI tests); run them with
tests/replay on a GPU machine (bench/gpu_checks.sh).
"""

from __future__ import annotations

import pytest
import torch

from replay.protocol.engine import Budget
from replay.protocol.verifier import verify
from replay.prover.recorder import DEFAULT_OPTIMIZER
from replay.training import architectures as models
from replay.training import determinism as det
from replay.training import graphs
from replay.training.bundled_data import Batches
from replay.training.determinism import Rounder, encode_log
from replay.training.train import initial_state, train_step

from ..helpers import TINY, record

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _run(arch: str, steps: int, monkeypatch, graphed: bool, optimizer=None):
    """(states, logs, losses) of `steps` det64 recording steps on CUDA, from seed 2."""
    monkeypatch.setenv("REPLAY_CUDA_GRAPHS", "1" if graphed else "0")
    graphs.release()
    cfg, opt = TINY[arch]["config"], optimizer or DEFAULT_OPTIMIZER[arch]
    model = models.build(arch, cfg)
    state = initial_state(models.init_params(arch, cfg, 2), opt).to("cuda")
    batches = Batches(arch, cfg, TINY[arch]["batch"], 2)
    states, logs, losses = [], [], []
    for t in range(steps):
        rounder = Rounder("record")
        state, loss = train_step(model, state, batches(t), opt, "det64", rounder)
        states.append(state.to("cpu"))
        logs.append(encode_log(rounder.entries))
        losses.append(loss)
    captured = len(graphs._CAPTURED)
    graphs.release()
    return states, logs, losses, captured


@pytest.mark.parametrize("arch", ["mlp", "cnn", "gpt"])
def test_graphed_steps_equal_eager_steps(arch, monkeypatch):
    """Every step's state, rounding log and loss, bit for bit, over steps whose inputs change
    (the batch, the parameters, AdamW's bias corrections), with the graph captured once."""
    eager = _run(arch, 5, monkeypatch, graphed=False)
    graphed = _run(arch, 5, monkeypatch, graphed=True)
    assert eager[3] == 0 and graphed[3] == 1, "control: only the graphed run captures, once"
    for t in range(5):
        assert graphed[0][t].equal(eager[0][t]), f"step {t}: state differs"
        assert graphed[1][t] == eager[1][t], f"step {t}: log differs"
        assert graphed[2][t] == eager[2][t]
    assert any(len(log) > 2 for log in eager[1]), "control: some step logs close calls"


def test_changing_learning_rate_is_not_baked_into_the_graph(monkeypatch):
    """A linear schedule changes the rate every step: the update runs outside the graph."""
    opt = {**DEFAULT_OPTIMIZER["mlp"], "lr": {"kind": "linear", "lr": 0.05, "warmup": 2, "total": 6, "final": 0.001}}
    eager = _run("mlp", 4, monkeypatch, graphed=False, optimizer=opt)
    graphed = _run("mlp", 4, monkeypatch, graphed=True, optimizer=opt)
    assert all(g.equal(e) for g, e in zip(graphed[0], eager[0]))


def test_overflow_inside_a_graph_falls_back_to_the_reference_path(monkeypatch):
    """One slot per rounding point overflows at the graph's flush: the step is redone eagerly on the
    reference path and gives the state and log of a roomy step."""
    cfg, opt = TINY["gpt"]["config"], DEFAULT_OPTIMIZER["gpt"]
    model = models.build("gpt", cfg)
    state = initial_state(models.init_params("gpt", cfg, 1), opt).to("cuda")
    batch = Batches("gpt", cfg, TINY["gpt"]["batch"], 1)(0)
    graphs.release()
    roomy = Rounder("record")
    s0, l0 = train_step(model, state, batch, opt, "det64", roomy)
    graphs.release()
    monkeypatch.setattr(det, "slots", lambda n: 1)
    tight = Rounder("record")
    s1, l1 = train_step(model, state, batch, opt, "det64", tight)
    assert not tight.defer, "control: one slot per point must overflow"
    assert s0.equal(s1) and l0 == l1 and roomy.entries == tight.entries
    graphs.release()


def test_graphed_cuda_recording_verifies_on_the_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("REPLAY_CUDA_GRAPHS", "1")
    graphs.release()
    out = record(tmp_path / "gpt", "gpt", device="cuda")
    assert graphs._CAPTURED, "control: the recording went through a graph"
    graphs.release()
    v = verify(out, out / "claims.json", Budget(segments=100), device="cpu")
    assert v.verdict == "verified", v.reasons
