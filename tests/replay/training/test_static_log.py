"""Static replay (replay/training/static_log.py): a step's log in fixed slots gives the deferred replay's
results bit for bit, refuses what it refuses with its reasons, and turns crowded points dense.

On a CPU without the native kernel (REPLAY_NATIVE=0), the path a GPU replays through (there as one
CUDA graph, tests/replay/training/test_cuda_graphs.py)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.prover.recorder import DEFAULT_OPTIMIZER
from replay.training import architectures as models
from replay.training import determinism as det
from replay.training import native, static_log
from replay.training.bundled_data import Batches
from replay.training.determinism import LogMismatch, Rounder, decode_log, encode_log
from replay.training.train import initial_state, train_step

from ..helpers import TINY

STEPS = 5


def _recorded(arch: str, seed: int = 4):
    """(model config, optimizer, states before each step, batches, logs) of a short det64 recording."""
    cfg, opt = TINY[arch]["config"], DEFAULT_OPTIMIZER[arch]
    model = models.build(arch, cfg)
    state = initial_state(models.init_params(arch, cfg, seed), opt)
    batches = Batches(arch, cfg, TINY[arch]["batch"], seed)
    states, logs = [], []
    for t in range(STEPS):
        states.append(state)
        rounder = Rounder("record")
        state, _ = train_step(model, state, batches(t), opt, "det64", rounder)
        logs.append(encode_log(rounder.entries))
    return cfg, opt, states + [state], batches, logs


def _replay(arch, rec, monkeypatch, static: bool, logs=None, flat: bool = False):
    """Replay every step from its recorded state with a fresh model: (states after, ratios, steps static).
    flat: the entries as the verifier hands them over (a FlatLog, its lists made only where read)."""
    monkeypatch.setenv("REPLAY_STATIC", "1" if static else "0")
    cfg, opt, states, batches, recorded = rec
    model = models.build(arch, cfg)
    out, ratios, used = [], [], 0
    for t, log in enumerate(logs or recorded):
        entries = decode_log(log)
        rounder = Rounder("replay", entries=det.FlatLog.from_dict(entries) if flat else entries)
        after, _ = train_step(model, states[t], batches(t), opt, "det64", rounder)
        out.append(after)
        ratios.append(rounder.max_ratio)
        used += rounder.static is not None
    return out, ratios, used


@pytest.fixture(autouse=True)
def generic_path(monkeypatch):
    monkeypatch.setattr(native, "_LIB", False)


@pytest.mark.parametrize("flat", [False, True], ids=["dict", "flat"])
@pytest.mark.parametrize("arch", ["mlp", "cnn", "gpt"])
def test_static_replay_equals_the_deferred_replay(arch, flat, monkeypatch):
    rec = _recorded(arch)
    assert any(len(log) > 2 for log in rec[4]), "control: the steps log close calls"
    deferred = _replay(arch, rec, monkeypatch, static=False, flat=flat)
    static = _replay(arch, rec, monkeypatch, static=True, flat=flat)
    assert deferred[2] == 0 and static[2] == STEPS - 1, "control: the first step learns the layout, the rest use it"
    for t in range(STEPS):
        assert static[0][t].equal(rec[2][t + 1]) and deferred[0][t].equal(rec[2][t + 1]), f"step {t}"
    assert static[1] == deferred[1]


def _tampered(log: bytes, how: str) -> bytes:
    entries = decode_log(log)
    key = max(entries, key=lambda k: len(entries[k][0]))
    idx, codes = entries[key]
    if how == "far value":  # the prover's float far outside the verifier's window
        codes[0] = 0x7F000000
    elif how == "no such element":
        idx[-1] = 10**6
    elif how == "no such point":
        entries[10**6] = ([0], [True])
    elif how == "index past 64 bits":
        idx[-1] = 2**64
    return encode_log(entries)


@pytest.mark.parametrize("how", ["far value", "no such element", "no such point", "index past 64 bits"])
def test_a_tampered_log_is_refused_with_the_deferred_reason(how, monkeypatch):
    """An entry outside the window, past the point's outputs, at a point the step never reaches: the
    same refusal (type and words) as the deferred replay, at a step after the layout is learnt."""
    rec = _recorded("gpt")
    logs = list(rec[4])
    logs[3] = _tampered(logs[3], how)
    reasons, redone = [], []
    real = Rounder.redo_deferred
    monkeypatch.setattr(Rounder, "redo_deferred", lambda self: redone.append(1) or real(self))
    for static in (False, True):
        with pytest.raises(LogMismatch) as err:
            _replay("gpt", rec, monkeypatch, static, logs=logs)
        reasons.append(str(err.value))
    assert reasons[0] == reasons[1]
    # the static step itself found the far value (and the step was redone to name it); the others do not fit the table
    assert len(redone) == (how == "far value")


def test_a_crowded_point_turns_dense_and_replays_the_same(monkeypatch):
    """With two slots per point a step's entries overflow the layout: that step is replayed the
    deferred way, the point gets a slot per output, and later steps replay static again."""
    rec = _recorded("gpt")
    monkeypatch.setattr(det, "slots", lambda n: min(n, 2))
    static = _replay("gpt", rec, monkeypatch, static=True)
    assert 0 < static[2] < STEPS - 1, "control: some steps overflowed two slots, later ones fit"
    for t in range(STEPS):
        assert static[0][t].equal(rec[2][t + 1])


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_the_table_spreads_each_entry_to_its_slot(data):
    """Random points and entries: each real entry lies in its point's slot with its code and width,
    padding repeats the point's first entry (and takes its value), points without entries write back."""
    sizes = data.draw(st.lists(st.integers(1, 40), min_size=1, max_size=6))
    points = [(10 * j + 3, n) for j, n in enumerate(sizes)]
    layout = static_log.Layout(
        points, {k: (sum(sizes[:j]), n, n) for j, (k, n) in enumerate(points)}, sum(sizes), 64, torch.device("cpu")
    )
    entries = {}
    for key, n in points:
        idx = sorted(data.draw(st.sets(st.integers(0, n - 1), max_size=min(n, 6))))
        if idx:
            codes = [data.draw(st.one_of(st.booleans(), st.integers(0, 2**32 - 1))) for _ in idx]
            entries[key] = (idx, codes)
    assert layout.fill(det.FlatLog.from_dict(entries))
    s = layout.expand()
    for key, _n in points:
        off, k, _ = layout.points[key]
        idx, codes = entries.get(key, ([], []))
        got = slice(off, off + k)
        assert s.valid[got].tolist() == [j < len(idx) for j in range(k)]
        assert s.has[got].tolist() == [bool(idx)] * k
        assert s.idx[got].tolist() == idx + [idx[0] if idx else 0] * (k - len(idx))
        assert s.src[got].tolist() == list(range(len(idx))) + [0] * (k - len(idx))
        for j, c in enumerate(codes):
            wide = not isinstance(c, bool)
            assert bool(s.wide[off + j]) == wide
            assert int(s.code[off + j]) == ((c - 2**32 if c >= 2**31 else c) if wide else int(c))


def _reference_fill(layout, entries: dict):
    """The table as the per-key loop of earlier sessions laid it: (fits, host table, crowded keys);
    fields a padding entry leaves untouched compare as zero (nothing reads them)."""
    import numpy as np

    cap, p = layout.cap, len(layout.points)
    h = np.zeros(4 * cap + 2 * p, dtype=np.int64)
    h[:cap] = layout.total
    if sum(len(i) for i, _ in entries.values()) > cap or not entries.keys() <= layout.points.keys():
        return False, None, []
    at, order = 0, {key: j for j, key in enumerate(layout.points)}
    for key, (idx, codes) in entries.items():
        off, k, n = layout.points[key]
        m = len(idx)
        if m > det.entry_cap(n) or idx[-1] >= n:
            return False, None, []
        if m > k:
            return False, None, [key]
        h[at : at + m] = range(off, off + m)
        h[cap + at : cap + at + m] = idx
        for j, c in enumerate(codes):
            wide = not isinstance(c, bool)
            h[2 * cap + at + j] = (c - 2**32 if c >= 2**31 else c) if wide else int(c)
            h[3 * cap + at + j] = wide
        h[4 * cap + order[key]], h[4 * cap + p + order[key]] = idx[0], 1
        at += m
    return True, h, []


@settings(max_examples=120, deadline=None)
@given(st.data())
def test_the_vectorised_fill_lays_the_table_as_the_loop_did(data):
    """Random layouts and logs (points missing from the layout, more entries than slots or than allowed,
    an index past a point's outputs, more entries than the table holds): the same outcome, the same
    crowded point, the same table."""
    sizes = data.draw(st.lists(st.integers(1, 600), min_size=1, max_size=6))
    slots = [data.draw(st.integers(1, n)) for n in sizes]
    keys = data.draw(st.lists(st.integers(0, 2**40), min_size=len(sizes), max_size=len(sizes), unique=True))
    points = list(zip(keys, sizes))
    table = {k: (sum(slots[:j]), slots[j], n) for j, (k, n) in enumerate(points)}
    layout = static_log.Layout(points, table, sum(slots), data.draw(st.integers(1, 700)), torch.device("cpu"))
    entries = {}
    for key in sorted(data.draw(st.sets(st.sampled_from(keys + [2**41]), max_size=len(keys) + 1))):
        n = dict(points).get(key, 50)
        idx = sorted(data.draw(st.sets(st.integers(0, n + 1), min_size=1, max_size=min(n + 2, 300))))
        entries[key] = (idx, [data.draw(st.one_of(st.booleans(), st.integers(0, 2**32 - 1))) for _ in idx])
    ok, want, crowded = _reference_fill(layout, entries)
    assert layout.fill(det.FlatLog.from_dict(entries)) == ok
    assert layout.crowded == crowded
    if ok:
        got = layout.host.numpy().copy()
        t, cap = sum(len(i) for i, _ in entries.values()), layout.cap
        for part in (1, 2, 3):  # a padding entry's index, code and width: never read (its slot is the trash)
            got[part * cap + t : (part + 1) * cap] = 0
        assert got.tolist() == want.tolist()


def _relaid(rec, monkeypatch, points):
    """A fresh model whose layout was learnt from step 0, then replaced by points(learnt order, step 1's
    entries): (model, step 1's entries)."""
    monkeypatch.setenv("REPLAY_STATIC", "1")
    cfg, opt, states, batches, logs = rec
    model = models.build("gpt", cfg)
    train_step(model, states[0], batches(0), opt, "det64", Rounder("replay", entries=decode_log(logs[0])))
    ((shape, dense), layout), *_ = static_log._LAYOUTS[model].items()
    entries = decode_log(logs[1])
    static_log._LAYOUTS[model].clear()
    static_log.layout_for(model, shape, points(layout.order, entries), "cpu", set(dense))
    return model, entries


def test_an_entry_at_a_layout_point_the_step_never_reaches_is_not_dropped(monkeypatch):
    """Guard: a static step applies entries only at the points it reaches; were the layout to name one
    more, its entries would go unapplied. The step is then replayed the deferred way, which refuses them."""
    rec = _recorded("gpt")
    ghost = 10**6  # a point no step reaches
    model, entries = _relaid(rec, monkeypatch, lambda order, _: order + [(ghost, 10)])
    _, opt, states, batches, _ = rec
    entries[ghost] = ([3], [True])
    rounder = Rounder("replay", entries=entries)
    with pytest.raises(LogMismatch, match="never reached"):
        train_step(model, states[1], batches(1), opt, "det64", rounder)
    assert not rounder.allow_static, "control: the static step was redone the deferred way"


def test_a_refused_log_makes_no_point_dense(monkeypatch):
    """Crowding a point (more entries than its slots) turns it dense for the model's later steps only
    once the step is accepted: a refused log leaves the verifier as it was."""
    rec = _recorded("gpt")
    monkeypatch.setattr(det, "slots", lambda n: min(n, 2))
    monkeypatch.setenv("REPLAY_STATIC", "1")
    cfg, opt, states, batches, logs = rec
    model = models.build("gpt", cfg)
    train_step(model, states[0], batches(0), opt, "det64", Rounder("replay", entries=decode_log(logs[0])))
    bad = decode_log(_tampered(logs[1], "far value"))
    with pytest.raises(LogMismatch):
        train_step(model, states[1], batches(1), opt, "det64", Rounder("replay", entries=bad))
    assert not static_log.dense_points(model), "a refused step changed the layout"
    train_step(model, states[1], batches(1), opt, "det64", Rounder("replay", entries=decode_log(logs[1])))
    assert static_log.dense_points(model), "control: the same step, honest, crowds a point"


def test_out_of_memory_in_a_static_step_replays_it_the_deferred_way(monkeypatch):
    """A static step that runs out of device memory (it forms every point's bound) is replayed the
    deferred way, with the same state, and the model stays on the deferred way."""
    rec = _recorded("gpt")
    deferred = _replay("gpt", rec, monkeypatch, static=False)

    tried = []

    def no_memory(self):
        tried.append(1)
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(static_log.Layout, "expand", no_memory)
    static = _replay("gpt", rec, monkeypatch, static=True)
    assert len(tried) == 1, "control: the first static step ran out of memory, the rest were deferred"
    assert all(s.equal(d) for s, d in zip(static[0], deferred[0])) and static[1] == deferred[1]


@pytest.mark.parametrize("which", ["forward", "backward"])
def test_a_point_outside_the_layout_replays_the_step_the_deferred_way(which, monkeypatch):
    """Guard: a layout that lacks one of the step's rounding points (never so for one model and shape;
    here the first or the last point, reached in the forward or in the backward pass) sends the step
    to the deferred replay, with the recorded state, rather than failing."""
    rec = _recorded("gpt")

    def without_one(order, entries):  # the first or last point without entries this step
        dropped = next(k for k, _ in (order if which == "forward" else order[::-1]) if k not in entries)
        return [(k, n) for k, n in order if k != dropped]

    model, entries = _relaid(rec, monkeypatch, without_one)
    _, opt, states, batches, _ = rec
    rounder = Rounder("replay", entries=entries)
    after, _ = train_step(model, states[1], batches(1), opt, "det64", rounder)
    assert not rounder.allow_static, "control: the static step was redone the deferred way"
    assert after.equal(states[2])
