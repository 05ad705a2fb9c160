"""The det64 record path that accelerators run (the generic torch path; REPLAY_NATIVE=0 on a CPU).

What is counted as a host synchronisation: ATen ops whose output shape or value must be read back
on the host before the next op can be issued -- nonzero, item / _local_scalar_dense, masked_select,
unique, equal, is_nonzero, index / index_put with a bool mask (none here), and a device-to-host copy
(`to`/`copy_` to the CPU: free on a CPU, so counted by the one `_flush` per step by construction).
nonzero_static writes a fixed-size output and is not counted. ATen ops: every aten:: event the
profiler records, nested ones included (the issue's measure), per step by difference of two runs.
"""

from __future__ import annotations

import collections
import hashlib

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from replay import Recorder
from replay.protocol.transcript import Transcript, checkpoint_path
from replay.prover.recorder import DEFAULT_BATCH, DEFAULT_OPTIMIZER
from replay.training import architectures as models
from replay.training import determinism as det
from replay.training import native, train
from replay.training.bundled_data import Batches
from replay.training.determinism import Rounder
from replay.training.train import initial_state, train_step

from ..helpers import TINY

SYNCS = {
    "aten::nonzero",
    "aten::item",
    "aten::_local_scalar_dense",
    "aten::masked_select",
    "aten::unique",
    "aten::_unique",
    "aten::_unique2",
    "aten::unique_consecutive",
    "aten::equal",
    "aten::is_nonzero",
}


def _counts(precision: str, steps: int, model, state, batch, opt) -> collections.Counter:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            rounder = Rounder("record") if precision == "det64" else None
            state, _ = train_step(model, state, batch, opt, precision, rounder)
            if rounder is not None:
                det.encode_log(rounder.entries)
    return collections.Counter(e.name for e in prof.events() if e.name.startswith("aten::"))


def _per_step(precision, model, state, batch, opt):
    _counts(precision, 1, model, state, batch, opt)  # warm-up: lazy buffers, first-call paths
    short, long = (_counts(precision, n, model, state, batch, opt) for n in (1, 3))
    diff = {k: (long[k] - short[k]) / 2 for k in long}
    return sum(diff.values()), sum(v for k, v in diff.items() if k in SYNCS)


def test_det64_records_without_host_synchronisation_per_rounding_point(monkeypatch):
    """The default gpt (86 rounding points per step): det64 issues no more synchronising ops than a
    float32 step (+1 allowed: the log's one copy to the host), and a bounded multiple of its ops."""
    monkeypatch.setattr(native, "_LIB", False)
    cfg, opt = models.DEFAULTS["gpt"], DEFAULT_OPTIMIZER["gpt"]
    model = models.build("gpt", cfg)
    state = initial_state(models.init_params("gpt", cfg, 0), opt)
    batch = Batches("gpt", cfg, DEFAULT_BATCH["gpt"], 0)(0)
    ops32, syncs32 = _per_step("float32", model, state, batch, opt)
    ops64, syncs64 = _per_step("det64", model, state, batch, opt)
    assert syncs64 <= syncs32 + 1, (syncs64, syncs32)
    # before this path: +173 nonzero per step and 4.3x the ops; now 1.93x with 1 thread, 1.98x with 2
    # (bench/RESULTS.md, session 31): the goal, 2x, held here
    assert ops64 <= 2.0 * ops32, (ops64, ops32)


@pytest.mark.parametrize("use_native", [True, False])
def test_checkpoints_and_logs_are_pinned(tmp_path, use_native, monkeypatch):
    """The same seed gives the same checkpoint and rounding-log bytes as before the device path (and
    on any machine: det64's whole point), with the native kernel on and off."""
    if use_native and native.library() is None:
        pytest.skip("no C compiler")
    monkeypatch.setattr(native, "_LIB", native.library() if use_native else False)
    pinned = {
        "gpt": ("f4ebffee0e2ec5d408bcca37c1568c28dff74b75c812b8b47b04af80ea807a4a", "86fd56fdc6cc5b84"),
        "mlp": ("ebc20b96f2ebf898d6d2e4dfacd08993a6167b3952a474fa8988ed9d25001945", "36575458588235e3"),
    }
    for arch, (ckpt, logs) in pinned.items():
        out = tmp_path / arch
        cfg, batch = TINY[arch]["config"], TINY[arch]["batch"]
        Recorder(out, arch, steps=4, checkpoint_interval=4, config=cfg, batch=batch, seed=5).run()
        assert hashlib.sha256(checkpoint_path(out, 4).read_bytes()).hexdigest() == ckpt
        got = b"".join(log for _, _, log in Transcript(out).segment(0))
        assert hashlib.sha256(got).hexdigest()[:16] == logs


def _overflow_setup(seed: int):
    cfg, opt = TINY["gpt"]["config"], DEFAULT_OPTIMIZER["gpt"]
    state = initial_state(models.init_params("gpt", cfg, seed), opt)
    return cfg, opt, state, Batches("gpt", cfg, TINY["gpt"]["batch"], seed)


def test_crowded_points_are_redone_dense_and_stay_dense(monkeypatch):
    """With one slot per rounding point the candidates overflow; the step is redone with the crowded
    points dense (still the device path), gives the same state and log as with room for all, and the
    model's next step starts dense (no second overflow)."""
    monkeypatch.setattr(native, "_LIB", False)
    cfg, opt, state, batches = _overflow_setup(1)
    roomy = Rounder("record")
    s0, l0 = train_step(models.build("gpt", cfg), state, batches(0), opt, "det64", roomy)
    assert roomy.defer and roomy.entries and not roomy.dense
    monkeypatch.setattr(det, "slots", lambda n: 1)
    model = models.build("gpt", cfg)
    runs = []
    real = train._train_step
    monkeypatch.setattr(train, "_train_step", lambda *a: runs.append(set(a[-1].dense)) or real(*a))
    tight = Rounder("record")
    s1, l1 = train_step(model, state, batches(0), opt, "det64", tight)
    assert tight.defer and tight.dense and len(runs) == 2, "control: one slot per point must overflow once"
    assert s0.equal(s1) and l0 == l1 and roomy.entries == tight.entries
    dense = set(tight.dense)
    again = Rounder("record")
    train_step(model, s1, batches(1), opt, "det64", again)
    assert runs[2] == dense and again.defer, "the next step starts with the crowded points dense"


def test_overflow_past_the_dense_retries_falls_back_to_the_reference_path(monkeypatch):
    monkeypatch.setattr(native, "_LIB", False)
    cfg, opt, state, batches = _overflow_setup(3)
    roomy = Rounder("record")
    s0, l0 = train_step(models.build("gpt", cfg), state, batches(0), opt, "det64", roomy)
    monkeypatch.setattr(det, "slots", lambda n: 1)
    monkeypatch.setattr(train, "DENSE_RETRIES", 0)
    tight = Rounder("record")
    s1, l1 = train_step(models.build("gpt", cfg), state, batches(0), opt, "det64", tight)
    assert not tight.defer, "control: with no dense retry the step goes to the reference path"
    assert s0.equal(s1) and l0 == l1 and roomy.entries == tight.entries


@pytest.mark.parametrize("topk", [True, False], ids=["topk", "nonzero_static"])
def test_deferred_and_reference_paths_log_the_same_close_calls(monkeypatch, topk):
    """Random values near rounding midpoints, full and per-row bounds: the device path's decisions
    equal the reference path's, entry for entry (zero and NaN widths, -0 values included), whether
    a large point picks its candidates by top-k (a CPU) or by compaction (what CUDA runs)."""
    monkeypatch.setattr(native, "_LIB", False)
    monkeypatch.setattr(det, "PICK_BY_TOPK", {"cpu"} if topk else set())
    g = torch.Generator().manual_seed(3)
    base = torch.randint(-(2**20), 2**20, (64, 48), generator=g).double() * 2.0**-10
    v = base + (torch.rand(64, 48, generator=g, dtype=torch.float64) - 0.5) * 2.0**-30
    v[0, :8] = -0.0
    err = torch.rand(64, 48, generator=g, dtype=torch.float64) * 2.0**-33
    err[1, :4] = 0.0
    err[2, :2] = float("nan")
    a = torch.randn(256, 512, generator=g, dtype=torch.float64).float().double()
    b = torch.randn(512, 128, generator=g, dtype=torch.float64).float().double()
    # a large point (top-k slots, fillers, host-side sorting): the same near-midpoint values tiled
    big, big_err = v.repeat(4, 2), err.repeat(4, 2)
    assert big.numel() > det.SMALL_POINT
    cases = ((v, det.full_bound(err, v.shape)), (big, det.full_bound(big_err, big.shape)), (a @ b, det.dot_bound(a, b)))
    for w, bound in cases:
        ref, dev = Rounder("record", defer=False), Rounder("record")
        r0, r1 = ref(0, w, bound), dev(0, w, bound)
        assert torch.equal(r0.view(torch.int64), r1.view(torch.int64))
        assert ref.entries == dev.entries and ref.entries[0][0], "control: some close calls"


def test_more_close_calls_than_the_compact_copy_holds_are_all_copied(monkeypatch):
    """The flush copies at most flush_cap close calls in its one copy; a step with more copies them all
    in a second one, and logs exactly what a roomy flush logs."""
    monkeypatch.setattr(native, "_LIB", False)
    cfg, opt, state, batches = _overflow_setup(2)
    model = models.build("gpt", cfg)
    roomy = Rounder("record")
    s0, _ = train_step(model, state, batches(0), opt, "det64", roomy)
    assert sum(len(i) for i, _ in roomy.entries.values()) > 2, "control: more close calls than the cap below"
    monkeypatch.setattr(det, "flush_cap", lambda n: 2)
    small = Rounder("record")
    s1, _ = train_step(model, state, batches(0), opt, "det64", small)
    assert s0.equal(s1) and small.entries == roomy.entries and small.defer


def test_only_steps_small_enough_for_launches_to_matter_get_a_graph():
    """graphs.worth_a_graph: the bench's GPU rows up to GPT-2 small at block 64 are launch-bound (a graph
    took the 15M GPT from 117 to 43 ms a step); block 512, batch 8 is GPU work (graphed or not, 515 ms)."""
    from replay.training import graphs

    def worth(arch, cfg, batch):
        shape = models.batch_spec(arch, cfg, batch)["x"][1]
        x = torch.zeros(shape, dtype=torch.long if arch == "gpt" else torch.float32)
        return graphs.worth_a_graph(models.build(arch, cfg), x)

    gpt2 = models.PRESETS["gpt2-small"][1]
    assert worth("gpt", {"vocab": 256, "block": 256, "n_layer": 8, "n_head": 6, "n_embd": 384}, 8)
    assert worth("gpt", {**gpt2, "block": 64}, 1) and worth("mlp", models.DEFAULTS["mlp"], 256)
    assert not worth("gpt", {**gpt2, "block": 512}, 8) and not worth("gpt", gpt2, 4)
    assert graphs.worth_a_graph(torch.nn.Linear(2, 2), torch.zeros(10**6, 2)), "no size known: a graph"
