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
from replay.training.determinism import LogMismatch, Rounder, decode_log, encode_log
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


def test_a_step_above_the_graph_flops_runs_eagerly(monkeypatch):
    """A step over GRAPH_MAX_FLOPS (GPU work, not launches) captures nothing: the eager path's bits."""
    eager = _run("gpt", 2, monkeypatch, graphed=False)
    monkeypatch.setattr(graphs, "GRAPH_MAX_FLOPS", 0)
    big = _run("gpt", 2, monkeypatch, graphed=True)
    assert big[3] == 0, "no capture"
    assert all(b.equal(e) for b, e in zip(big[0], eager[0])) and big[1] == eager[1]


def test_changing_learning_rate_is_not_baked_into_the_graph(monkeypatch):
    """A linear schedule changes the rate every step: the update runs outside the graph."""
    opt = {**DEFAULT_OPTIMIZER["mlp"], "lr": {"kind": "linear", "lr": 0.05, "warmup": 2, "total": 6, "final": 0.001}}
    eager = _run("mlp", 4, monkeypatch, graphed=False, optimizer=opt)
    graphed = _run("mlp", 4, monkeypatch, graphed=True, optimizer=opt)
    assert all(g.equal(e) for g, e in zip(graphed[0], eager[0]))


def test_overflow_inside_a_graph_is_redone_dense(monkeypatch):
    """One slot per rounding point overflows at the graph's flush: the step is redone with the crowded
    points dense (a second capture) and gives the state and log of a roomy step."""
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
    assert tight.defer and tight.dense, "control: one slot per point must overflow"
    assert any(k[1] == "record" for k in graphs._CAPTURED), "control: the dense step ran in a graph"
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


def _replays(logs, states, monkeypatch, graphed: bool, arch="gpt"):
    """Each recorded step replayed from its recorded state on CUDA: (states after, ratios, graphed at the end)."""
    monkeypatch.setenv("REPLAY_CUDA_GRAPHS", "1" if graphed else "0")
    monkeypatch.setenv("REPLAY_STATIC", "1" if graphed else "0")
    graphs.release()
    cfg, opt = TINY[arch]["config"], DEFAULT_OPTIMIZER[arch]
    model, batches = models.build(arch, cfg), Batches(arch, cfg, TINY[arch]["batch"], 2)
    out, ratios = [], []
    for t, log in enumerate(logs):
        rounder = Rounder("replay", entries=decode_log(log))
        after, _ = train_step(model, states[t].to("cuda"), batches(t), opt, "det64", rounder)
        out.append(after.to("cpu"))
        ratios.append(rounder.max_ratio)
    captured = any(k[1] == "replay" for k in graphs._CAPTURED)
    graphs.release()
    return out, ratios, captured


@pytest.mark.parametrize("arch", ["mlp", "cnn", "gpt"])
def test_graphed_replay_equals_the_deferred_replay(arch, monkeypatch):
    """The recorded states, bit for bit, and the same widest windows, replayed through a graph (the
    log in fixed slots) and the deferred way; the graph captured once the layout is learnt."""
    states, logs, _, _ = _run(arch, 6, monkeypatch, graphed=True)
    cfg, opt = TINY[arch]["config"], DEFAULT_OPTIMIZER[arch]
    before = [initial_state(models.init_params(arch, cfg, 2), opt)] + states[:-1]
    graphed = _replays(logs, before, monkeypatch, graphed=True, arch=arch)
    deferred = _replays(logs, before, monkeypatch, graphed=False, arch=arch)
    assert graphed[2] and not deferred[2], "control: only the graphed replay captures"
    for t in range(6):
        assert graphed[0][t].equal(states[t]) and deferred[0][t].equal(states[t]), f"step {t}"
    assert graphed[1] == deferred[1]


def test_graphed_replay_refuses_a_far_entry_as_the_deferred_replay_does(monkeypatch):
    states, logs, _, _ = _run("gpt", 6, monkeypatch, graphed=True)
    cfg, opt = TINY["gpt"]["config"], DEFAULT_OPTIMIZER["gpt"]
    before = [initial_state(models.init_params("gpt", cfg, 2), opt)] + states[:-1]
    entries = decode_log(logs[4])
    key = max(entries, key=lambda k: len(entries[k][0]))
    entries[key][1][0] = 0x7F000000  # the prover's float far outside any window
    logs[4] = encode_log(entries)
    reasons = []
    for graphed in (True, False):
        with pytest.raises(LogMismatch) as err:
            _replays(logs, before, monkeypatch, graphed=graphed)
        reasons.append(str(err.value))
    assert reasons[0] == reasons[1] and "not a close call" in reasons[0]
