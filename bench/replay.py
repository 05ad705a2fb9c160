"""Replay benchmarks (issues 5, 10, 18), each a ratio against a baseline measured in the same run.

    .venv/bin/python bench/replay.py --device cpu [--json] [--threads 1] [--rows gpt gpt-15m ...]

issue 18 (--device given): per row (mlp, cnn, gpt 0.1M: the CLI's defaults; mlp 10.5M: the issue's own mlp
row; cnn-32: a 3x32x32 image CNN; gpt 3.3M, gpt 15M, GPT-2 small at block 64, batch 1), on the device: step time of plain float32, plain float64, det64 recording and det64
replay (warm-up, then the median of interleaved rounds, in an order that reverses every other round, a row of
steps under 0.1 s in blocks of 3 steps a precision, the first untimed: at least the row's count, and for at least
BENCH_ROW_SECONDS, default 4, up to 1,000 rounds); det64/float32 and det64/float64; host synchronisations and
ATen ops per det64 recording step on the generic torch path (what an accelerator runs: the
profiler, by difference of a 1- and a 2-step run, against float32's; see
tests/replay/training/test_device_path.py for what counts); peak memory of one step per precision (CUDA:
torch.cuda.max_memory_allocated; CPU: the process's resident peak, VmHWM, reset just before the
step through /proc/self/clear_refs, minus the resident size then, after one warm-up step, the step
allocator's free blocks given back and malloc_trim: each precision in its own process); rounding-log bytes per step over checkpoint bytes.

    TRITON_INTERPRET=1 REPLAY_TRITON=cpu REPLAY_NATIVE=0 .venv/bin/python bench/replay.py --device cpu --live-peak --rows gpt-logits

a step's peak in live tensor bytes per precision and what it holds then, on the device path (a GPU's) without a GPU;
gpt-logits is GPT-2's vocabulary on a narrow model, a step whose largest tensors are its logits, as GPT-2 small's at
block 512 on a GPU.

    .venv/bin/python bench/replay.py                  # the bundled examples, 1 thread
    .venv/bin/python bench/replay.py --threads 2 --steps 40

Per architecture (the CLI's default configs and batch sizes):
  * step time: deterministic (det64, recording: flagging and logging included) / plain float32,
    same model, batch and optimizer; interleaved repetitions, the minimum of each (goal <= 2.0);
    also the same plain ops in float64, to show how much of the ratio float64 arithmetic alone costs;
  * rounding-log bytes per step / checkpoint bytes (parameters + optimizer state) (goal <= 1%);
  * verification time for one claim (load its checkpoint and segment, replay applying the logs,
    hash the shard) / the prover's time for the same steps (deterministic steps, recording and
    encoding the logs), both on this machine and thread count, timed alternately, the minimum of
    each, median over the segments (goal <= 1.2).
Prints a markdown table; then a second one (issue 10), per architecture plus a 17M-parameter MLP:
  * verifier peak memory for one claim (a whole `verify`: manifest, whole-run checks, screen, the
    claim's replay and 2 random segments) / the prover's peak for the same steps (load the segment's
    checkpoint and batches, train them deterministically, recording and encoding the logs); each in
    its own process, resident peak (ru_maxrss) above the same process's peak right after imports
    (goal <= 1.5);
  * the screen's time per checked checkpoint (reading checkpoints and segments included) / one
    deterministic training step of the prover (median of the recording's steps) (goal <= 0.5).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from replay.protocol import hashing, limits  # noqa: E402
from replay.protocol.engine import Budget, Replayer  # noqa: E402
from replay.protocol.screen import screen  # noqa: E402
from replay.protocol.transcript import Transcript  # noqa: E402
from replay.protocol.transcript_layout import checkpoint_path  # noqa: E402
from replay.prover.recorder import DEFAULT_BATCH, DEFAULT_OPTIMIZER, Recorder  # noqa: E402
from replay.training import architectures as models  # noqa: E402
from replay.training import graphs, ops  # noqa: E402
from replay.training.bundled_data import Batches  # noqa: E402
from replay.training.determinism import Rounder, decode_log_flat, encode_log  # noqa: E402
from replay.training.train import frozen_heap, initial_state, train_step  # noqa: E402

# plain float64 (ops.Plain64: no rounding points, no log) is the part of the deterministic step's cost
# that is float64 arithmetic itself
assert "float64" in ops.OPS

# rows: the CLI's bundled examples, and one GPT four times as wide with twice the context, where
# matmuls outweigh per-op costs (how the ratio moves with size); that one is timed with fewer
# repetitions and one 10-step segment, to keep the run short
ROWS = {
    "mlp": ("mlp", None, None),
    "cnn": ("cnn", None, None),
    "gpt": ("gpt", None, None),
    "gpt-256": ("gpt", {"vocab": 32, "block": 64, "n_layer": 2, "n_head": 4, "n_embd": 256}, 16),
}
LARGE = {"gpt-256"}


def step_times(arch: str, cfg: dict, batch_size: int, reps: int, inner: int) -> dict[str, float]:
    """Minimum time of one training step per precision, the precisions interleaved."""
    opt = DEFAULT_OPTIMIZER[arch]
    model = models.build(arch, cfg)
    state = initial_state(models.init_params(arch, cfg, 0), opt)
    batch = Batches(arch, cfg, batch_size, 0)(0)
    times = {"float32": [], "float64": [], "det64": []}
    for _ in range(reps):
        for precision in times:
            started = time.perf_counter()
            for _ in range(inner):
                train_step(model, state, batch, opt, precision, Rounder("record") if precision == "det64" else None)
            times[precision].append((time.perf_counter() - started) / inner)
    return {k: min(v) for k, v in times.items()}


def prover_span(tr: Transcript, model, start: int) -> float:
    """The prover's time for the steps of one segment: deterministic training steps, recording and
    encoding their rounding logs (as Recorder.run does), from the segment's checkpoint in memory."""
    state, steps = tr.checkpoint(start), list(tr.segment(start))
    started = time.perf_counter()
    for _, batch, _ in steps:
        rounder = Rounder("record")
        state, _ = train_step(model, state, batch, tr.manifest["optimizer"], "det64", rounder)
        encode_log(rounder.entries)
    return time.perf_counter() - started


def verify_span(tr: Transcript, start: int) -> float:
    """The verifier's time for one claim at the segment's last step: load the checkpoint and the
    segment, replay it applying the logs, hash the shard."""
    started = time.perf_counter()
    state = Replayer(tr, Budget(max_seconds=1e9)).run(start, tr.next_checkpoint(start))
    hashing.shard_hashes(state.params, tr.layout)
    return time.perf_counter() - started


def log_and_verify(arch: str, cfg: dict, batch_size: int, steps: int, out: Path, reps: int) -> dict:
    Recorder(out, arch, steps=steps, checkpoint_interval=10, config=cfg, batch=batch_size).run()
    tr = Transcript(out)
    log_bytes = []
    for start in tr.checkpoints[:-1]:
        log_bytes += [len(log) for _, _, log in tr.segment(start)]
    ckpt = checkpoint_path(out, 10).stat().st_size
    # one claim per segment; prover and verifier timed alternately, the minimum of each
    model = models.build(tr.arch, tr.config)
    ratios = []
    for start in tr.checkpoints[:-1]:
        prover, verifier = [], []
        for _ in range(reps):
            prover.append(prover_span(tr, model, start))
            verifier.append(verify_span(tr, start))
        ratios.append(min(verifier) / min(prover))
    return {
        "log_per_step": statistics.mean(log_bytes),
        "log_max": max(log_bytes),
        "checkpoint": ckpt,
        "verify_ratio": statistics.median(ratios),
    }


# issue 10: memory and screen rows (config, batch); the MLP is near the 20M-parameter cap
MEMORY_ROWS = {
    "mlp": ("mlp", None, None),
    "cnn": ("cnn", None, None),
    "gpt": ("gpt", None, None),
    "gpt-256": ROWS["gpt-256"],
    "mlp-17m": ("mlp", {"sizes": [512, 3072, 3072, 2048, 10]}, 64),
}

PEAK = """
import json, resource, sys
sys.path.insert(0, sys.argv[1])
import torch
torch.set_num_threads(int(sys.argv[4]))
from replay import verify, Budget
from replay.training import architectures as models  # noqa: E402
from replay.training.determinism import Rounder, encode_log
from replay.training.train import train_step
from replay.protocol.transcript import Transcript
import os
rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
base = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")  # resident now
d, start = sys.argv[2], int(sys.argv[3])
if sys.argv[5] == "prover":
    tr = Transcript(d)
    model, state = models.build(tr.arch, tr.config), tr.checkpoint(start)
    for _, batch, _ in tr.segment(start):
        rounder = Rounder("record")
        state, _ = train_step(model, state, batch, tr.manifest["optimizer"], "det64", rounder)
        encode_log(rounder.entries)
    ok = True
else:
    v = verify(d, json.loads(sys.argv[6]), Budget(max_seconds=1e9, segments=2), nonce=bytes(16))
    ok = v.verdict == "verified"
print(json.dumps({"base": base, "peak": rss(), "ok": ok}))
"""


def peak_bytes(d: Path, start: int, threads: int, who: str, claims: dict | None = None) -> dict:
    args = [sys.executable, "-c", PEAK, str(ROOT), str(d), str(start), str(threads), who, json.dumps(claims)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-2000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def memory_and_screen(arch: str, cfg: dict, batch_size: int, steps: int, out: Path, threads: int) -> dict:
    rec = Recorder(out, arch, steps=steps, checkpoint_interval=10, config=cfg, batch=batch_size)
    rec.run()
    tr = Transcript(out)
    start, end = tr.checkpoints[-2], tr.checkpoints[-1]  # one claim: shard 0 at the last checkpoint
    h = hashing.shard_hashes(tr.checkpoint(end).params, tr.layout)[0]
    claim = {"serial": tr.layout[0]["serial"], "counter": 0, "shard": 0, "hash": h, "step": end}
    verifier = peak_bytes(out, start, threads, "verifier", {"manifest": tr.hash, "claims": [claim]})
    prover = peak_bytes(out, start, threads, "prover")
    if not verifier["ok"]:
        raise RuntimeError("the honest transcript did not verify")
    started = time.perf_counter()
    r = screen(tr)
    per_checkpoint = (time.perf_counter() - started) / max(r["checked"], 1)
    return {
        "verifier_mib": (verifier["peak"] - verifier["base"]) / 2**20,
        "prover_mib": (prover["peak"] - prover["base"]) / 2**20,
        "verifier_total": verifier["peak"] / 2**20,
        "prover_total": prover["peak"] / 2**20,
        "screen_s": per_checkpoint,
        "step_s": statistics.median(rec.step_seconds),
        "checked": r["checked"],
    }


def memory_table(rows: list[str], threads: int) -> None:
    print(
        "\n| arch | params | verifier peak MiB (total) | prover peak MiB (total) | verifier/prover (goal <= 1.5) "
        "| screen per checkpoint | det64 step | screen/step (goal <= 0.5) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        arch, cfg, batch_size = MEMORY_ROWS[row]
        cfg, batch_size = cfg or models.DEFAULTS[arch], batch_size or DEFAULT_BATCH[arch]
        with tempfile.TemporaryDirectory() as d:
            r = memory_and_screen(arch, cfg, batch_size, 20, Path(d) / arch, threads)
        n = sum(p.numel() for p in models.init_params(arch, cfg, 0).values())
        # below ~8 MiB of work the peak is the interpreter's own (imports): no meaningful ratio
        ratio = f"{r['verifier_mib'] / r['prover_mib']:.2f}" if r["prover_mib"] > 8 else "n/a (tiny)"
        print(
            f"| {row} | {n:,} | {r['verifier_mib']:.0f} ({r['verifier_total']:.0f}) | {r['prover_mib']:.0f} "
            f"({r['prover_total']:.0f}) | {ratio} | {r['screen_s'] * 1e3:.1f} ms "
            f"| {r['step_s'] * 1e3:.1f} ms | {r['screen_s'] / r['step_s']:.2f} |",
            flush=True,
        )


# issue 18 rows: (arch, config, batch, timed repetitions)
SCALE_ROWS = {
    "mlp": ("mlp", None, None, 5),
    "cnn": ("cnn", None, None, 5),
    "gpt": ("gpt", None, None, 5),
    # the issue's own mlp row (1024-2048x3-16, batch 256: 10.5M), and a CNN of a real image's size
    "mlp-10m": ("mlp", {"sizes": [1024, 2048, 2048, 2048, 16]}, 256, 3),
    "cnn-32": ("cnn", {"in_channels": 3, "image": 32, "channels": [32, 64], "classes": 10}, 64, 3),
    "gpt-3.3m": ("gpt", {"vocab": 256, "block": 128, "n_layer": 4, "n_head": 4, "n_embd": 256}, 16, 3),
    "gpt-15m": ("gpt", {"vocab": 256, "block": 256, "n_layer": 8, "n_head": 6, "n_embd": 384}, 8, 3),
    "gpt2-small": ("gpt", {**models.PRESETS["gpt2-small"][1], "block": 64}, 1, 1),
    # GPT-2's vocabulary on a narrow model: a step whose largest tensors are its logits, as GPT-2 small's at block 512
    "gpt-logits": ("gpt", {"vocab": 50257, "block": 64, "n_layer": 1, "n_head": 2, "n_embd": 16}, 4, 1),
    # the issue's own GPU row: GPT-2 small's shape at block 512, batch 8 (a GPU's; the CPU takes block 64)
    "gpt2-small-512": ("gpt", {**models.PRESETS["gpt2-small"][1], "block": 512}, 8, 2),
}
PRECISIONS = ("float32", "float64", "det64", "replay")
ROW_SECONDS = float(os.environ.get("BENCH_ROW_SECONDS", 4))  # a row's timed rounds run at least this long
MAX_ROUNDS = 1000

STEP_PEAK = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
import torch
torch.set_num_threads(int(sys.argv[2]))
sys.argv = sys.argv[:1] + sys.argv[3:]
from bench.replay import one_step_setup
device, precision = sys.argv[1], sys.argv[2]
run = one_step_setup(*json.loads(sys.argv[3]), device, precision)
run()  # warm: lazily made buffers (scratch, the native library) are not one step's peak
def status(key):
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key + ":"))
if device == "cuda":
    torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats(); base = torch.cuda.memory_allocated()
    run(); torch.cuda.synchronize(); peak = torch.cuda.max_memory_allocated()
else:
    import ctypes
    from replay.training import step_allocator
    step_allocator.release()  # its blocks, free after the warm-up: the step maps its own again
    ctypes.CDLL(None).malloc_trim(0)  # memory kept from setting up (a replay's recording) is not the step's
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current resident size
    base = status("VmRSS"); run(); peak = status("VmHWM")
print(json.dumps({"peak": peak - base}))
"""


def one_step_setup(arch: str, cfg: dict, batch_size: int, device: str, precision: str):
    """A closure running one training step of `precision` (det64 recording, or `replay` applying a
    recorded log) from the initial state on `device`; the state, the batch and the log are made first."""
    opt = DEFAULT_OPTIMIZER[arch]
    model = models.build(arch, cfg)
    state = initial_state(models.init_params(arch, cfg, 0), opt).to(device)
    batch = {k: v.to(device) for k, v in Batches(arch, cfg, batch_size, 0)(0).items()}
    if precision == "det64_eager":  # CUDA: det64 recording without graphs (replay/training/graphs.py)
        return lambda: _without_graphs(lambda: train_step(model, state, batch, opt, "det64", Rounder("record")))
    if precision == "det64_torch":  # CUDA: through graphs, without the Triton kernels (replay/training/kernels.py)
        return lambda: _with_env(
            {"REPLAY_TRITON": "0"}, lambda: train_step(model, state, batch, opt, "det64", Rounder("record"))
        )
    if precision not in ("replay", "replay_eager", "replay_torch"):
        return lambda: train_step(
            model, state, batch, opt, precision, Rounder("record") if precision == "det64" else None
        )
    rounder = Rounder("record")
    train_step(model, state, batch, opt, "det64", rounder)
    log = encode_log(rounder.entries)
    # decoded under the caps `verify` derives from a step's outputs (a large step logs over 2^20 entries)
    cap = limits.log_caps(arch, cfg, models.batch_spec(arch, cfg, batch_size))[1]
    run = lambda: train_step(model, state, batch, opt, "det64", Rounder("replay", entries=decode_log_flat(log, cap)))
    if precision == "replay_torch":
        return lambda: _with_env({"REPLAY_TRITON": "0"}, run)
    return run if precision == "replay" else lambda: _without_graphs(run)  # replay_eager: deferred, per point


def _without_graphs(run):
    """run() with CUDA graphs and the static replay layout off: the eager, per-point path."""
    return _with_env(dict.fromkeys(("REPLAY_CUDA_GRAPHS", "REPLAY_STATIC"), "0"), run)


def _with_env(values: dict, run):
    """run() with these environment variables set, restored after."""
    names = tuple(values)
    before = {n: os.environ.get(n) for n in names}
    os.environ.update(values)
    try:
        return run()
    finally:
        for n, v in before.items():
            if v is None:
                del os.environ[n]
            else:
                os.environ[n] = v


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _op_counts(run, steps: int) -> tuple[int, int]:
    import collections

    from torch.profiler import ProfilerActivity, profile

    syncs = {
        "aten::nonzero", "aten::item", "aten::_local_scalar_dense", "aten::masked_select", "aten::unique",
        "aten::_unique", "aten::_unique2", "aten::unique_consecutive", "aten::equal", "aten::is_nonzero",
    }  # fmt: skip
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            run()
    c = collections.Counter(e.name for e in prof.events() if e.name.startswith("aten::"))
    return sum(c.values()), sum(v for k, v in c.items() if k in syncs)


def per_step_counts(arch, cfg, batch_size, device, precision) -> tuple[float, float]:
    """(ATen ops, host syncs) per step, by difference of a 1- and a 2-step run, on the generic path."""
    from replay.training import native

    lib = native._LIB
    native._LIB = False  # the generic torch path: what CUDA runs
    try:
        run = one_step_setup(arch, cfg, batch_size, device, precision)
        run()  # a replay learns its layout, then captures its graph: neither is a step's count
        run()
        (o1, s1), (o2, s2) = _op_counts(run, 1), _op_counts(run, 2)
        return o2 - o1, s2 - s1
    finally:
        native._LIB = lib


def cuda_step_peak(arch, cfg, batch_size, device, precision) -> int:
    """Peak bytes the CUDA allocator held during one warm step, above what was allocated before it; a
    graphed step (det64 recording) also holds its graph's whole memory pool, for good."""
    graphs.release()
    torch.cuda.empty_cache()
    run = one_step_setup(arch, cfg, batch_size, device, precision)
    run()  # a replay learns its layout here, and captures its graph in the next
    run()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    run()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base + graph_pool_bytes()
    graphs.release()
    del run
    torch.cuda.empty_cache()
    return peak


def graph_pool_bytes() -> int:
    """Bytes of CUDA memory held by captured graphs' private pools (replay/training/graphs.py)."""
    return sum(
        seg["total_size"] for seg in torch.cuda.memory_snapshot() if tuple(seg.get("segment_pool_id", (0, 0))) != (0, 0)
    )


SHORT_STEP = 0.1  # s: a row whose steps are all shorter runs each precision in blocks of BLOCK steps
BLOCK = 3


def _median_steps(runs: dict, reps: int, device: str) -> dict[str, float]:
    """Each precision's median step time, the precisions interleaved (the host's slow spells hit every one
    alike): at least `reps` rounds, and more for a small row until ROW_SECONDS have passed (a median of five
    1-ms steps is mostly the host's noise). With the heap frozen, as `record` and `verify` run their steps.

    A step right after another precision's pays for the caches that one left (its code, the interpreter's
    objects): on a small row that is a tenth of a step, and in a fixed order it fell on the same precision every
    round (det64, after float64: the tiny mlp 1.43 x float64 in that order, 1.32 in float64, det64, replay).
    So the order reverses every other round, and a small row runs each precision in blocks of BLOCK steps,
    timing all but the first, as a run does its steps one after another."""
    times = {p: [] for p in runs}
    block = BLOCK if max(_one_step(run, device) for run in runs.values()) < SHORT_STEP else 1
    with frozen_heap():
        started_all, rounds = time.perf_counter(), 0
        while len(times["det64"]) < reps or (
            time.perf_counter() - started_all < ROW_SECONDS and len(times["det64"]) < MAX_ROUNDS
        ):
            rounds += 1
            for p in list(runs) if rounds % 2 else list(runs)[::-1]:
                for i in range(block):
                    took = _one_step(runs[p], device)
                    if i or block == 1:
                        times[p].append(took)
    return {p: statistics.median(v) for p, v in times.items()}


def _one_step(run, device: str) -> float:
    _sync(device)
    started = time.perf_counter()
    run()
    _sync(device)
    return time.perf_counter() - started


def scale_row(row: str, device: str, threads: int, counts: bool) -> dict:
    arch, cfg, batch_size, reps = SCALE_ROWS[row]
    cfg, batch_size = cfg or models.DEFAULTS[arch], batch_size or DEFAULT_BATCH[arch]
    out = {"row": row, "params": models.param_count(arch, cfg), "batch": batch_size, "config": cfg}
    precisions = PRECISIONS + (
        ("det64_eager", "replay_eager", "det64_torch", "replay_torch") if device == "cuda" else ()
    )
    graphs.KEEP = max(graphs.KEEP, 4)  # det64 and replay, with and without the Triton kernels: four captures
    runs = {p: one_step_setup(arch, cfg, batch_size, device, p) for p in precisions}
    for p in precisions:  # warm-up: a replay learns its layout in the first step, captures its graph in the second
        runs[p]()
        runs[p]()
    t = _median_steps(runs, reps, device)
    out["graphed"] = bool(graphs._CAPTURED)
    out.update({f"{p}_s": t[p] for p in precisions})
    if "det64_eager" in t:
        out["eager_over_float32"] = t["det64_eager"] / t["float32"]
        out["replay_eager_over_float32"] = t["replay_eager"] / t["float32"]
        out["det64_torch_over_float32"] = t["det64_torch"] / t["float32"]
        out["replay_torch_over_float32"] = t["replay_torch"] / t["float32"]
    out["det64_over_float32"], out["det64_over_float64"] = t["det64"] / t["float32"], t["det64"] / t["float64"]
    out["replay_over_float32"], out["replay_over_float64"] = t["replay"] / t["float32"], t["replay"] / t["float64"]
    rounder = Rounder("record")
    opt = DEFAULT_OPTIMIZER[arch]
    state = initial_state(models.init_params(arch, cfg, 0), opt).to(device)
    batch = Batches(arch, cfg, batch_size, 0)(0)
    train_step(models.build(arch, cfg), state, batch, opt, "det64", rounder)
    ckpt = 4 * out["params"] * (1 + len(state.buffers))
    out["log_bytes"], out["checkpoint_bytes"] = len(encode_log(rounder.entries)), ckpt
    out["log_over_checkpoint"] = out["log_bytes"] / ckpt
    del runs, state
    if counts:
        out["ops_float32"], out["syncs_float32"] = per_step_counts(arch, cfg, batch_size, device, "float32")
        out["ops_det64"], out["syncs_det64"] = per_step_counts(arch, cfg, batch_size, device, "det64")
        out["ops_replay"], out["syncs_replay"] = per_step_counts(arch, cfg, batch_size, device, "replay")
    for p in precisions:
        if p.endswith("_torch"):  # timed only: the kernels change a step's time, not what it holds
            continue
        if device != "cpu":  # the CUDA allocator counts a step's own peak in-process: no fresh process needed
            out[f"peak_{p}_bytes"] = cuda_step_peak(arch, cfg, batch_size, device, p)
            continue
        args = [
            sys.executable,
            "-c",
            STEP_PEAK,
            str(ROOT),
            str(threads),
            device,
            p,
            json.dumps([arch, cfg, batch_size]),
        ]
        proc = subprocess.run(args, capture_output=True, text=True, timeout=1800)
        if proc.returncode:
            raise RuntimeError(proc.stderr[-2000:])
        out[f"peak_{p}_bytes"] = json.loads(proc.stdout.strip().splitlines()[-1])["peak"]
    out["peak_det64_over_float32"] = out["peak_det64_bytes"] / out["peak_float32_bytes"]
    return out


def scale_table(rows: list[str], device: str, threads: int, as_json: bool) -> None:
    header = {
        "device": device if device == "cpu" else torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "native": bool(__import__("replay.training.native", fromlist=["x"]).library()),
    }
    results = []
    if not as_json:
        print(
            "| row | params | float32 | float64 | det64 rec | det64 replay | rec/f32 | rec/f64 | replay/f64 "
            "| ops f32 / det64 (syncs) | peak MiB f32 / f64 / det64 / replay | det64/f32 peak | log/ckpt |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        r = scale_row(row, device, threads, counts=not row.startswith("gpt2-small"))
        results.append(r)
        print(json.dumps(r), file=sys.stderr, flush=True)  # each row as it ends: a run cut short keeps them
        if not as_json:
            ms = lambda k: f"{r[k] * 1e3:,.0f} ms"
            ops = (
                f"{r['ops_float32']:,.0f} / {r['ops_det64']:,.0f} ({r['syncs_float32']:.0f} / {r['syncs_det64']:.0f})"
                if "ops_det64" in r
                else "n/a"
            )
            mib = " / ".join(f"{r[f'peak_{p}_bytes'] / 2**20:,.0f}" for p in PRECISIONS)
            print(
                f"| {row} | {r['params'] / 1e6:.1f}M | {ms('float32_s')} | {ms('float64_s')} | {ms('det64_s')} "
                f"| {ms('replay_s')} | {r['det64_over_float32']:.2f} | {r['det64_over_float64']:.2f} "
                f"| {r['replay_over_float64']:.2f} | {ops} | {mib} | {r['peak_det64_over_float32']:.2f} "
                f"| {100 * r['log_over_checkpoint']:.4f}% |",
                flush=True,
            )
    if as_json:
        print(json.dumps({**header, "rows": results}, indent=1))
    else:
        print(f"\n{header}")


def _warm_steps(rows: list[str], device: str, env: str, default: str):
    """(row, precision, a one-step closure warmed by two steps) for each row and each precision named in
    the environment variable `env` (else `default`); graphs released after each."""
    for row in rows:
        arch, cfg, batch_size, _ = SCALE_ROWS[row]
        cfg, batch_size = cfg or models.DEFAULTS[arch], batch_size or DEFAULT_BATCH[arch]
        for p in os.environ.get(env, default).split():
            run = one_step_setup(arch, cfg, batch_size, device, p)
            run()
            run()
            _sync(device)
            yield row, p, run
            del run
            graphs.release()


def live_peaks(rows: list[str], device: str, top: int = int(os.environ.get("PROFILE_TOP", 6))) -> None:
    """A step's peak in live tensor bytes, per precision, and the largest tensors held then (each named by the op that
    first read or made it): what a device's allocator peaks at, counted on any device (every storage over 1 MiB an op
    reads or makes, held while it lives). Run on a CPU as a GPU records (`REPLAY_NATIVE=0`, and Triton's kernels under
    its interpreter: `TRITON_INTERPRET=1 REPLAY_TRITON=cpu`), it measures the device path without a GPU."""
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils import _pytree as pytree
    from torch.utils._python_dispatch import TorchDispatchMode

    class Live(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.alive, self.peak, self.held = {}, 0, []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in pytree.tree_leaves((args, kwargs, out)):
                if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes() > 1 << 20:
                    storage = t.untyped_storage()
                    self.alive.setdefault(storage._cdata, (StorageWeakRef(storage), storage.nbytes(), str(func)))
            self.alive = {k: v for k, v in self.alive.items() if not v[0].expired()}
            now = sum(v[1] for v in self.alive.values())
            if now > self.peak:
                self.peak, self.held = now, sorted(((v[1], v[2]) for v in self.alive.values()), reverse=True)
            return out

    peaks = {}
    for row, p, run in _warm_steps(rows, device, "MEMORY_PRECISIONS", "float32 float64 det64"):
        with Live() as live:
            run()
        peaks[row, p] = live.peak
        held = ", ".join(f"{b / 2**20:,.0f} MiB ({op})" for b, op in live.held[:top])
        print(f"{row} {p}: peak {live.peak / 2**20:,.0f} MiB live; largest held: {held}", flush=True)
        if (row, "float32") in peaks and p != "float32":
            print(f"{row} {p} / float32: {live.peak / peaks[row, 'float32']:.2f}", flush=True)


def profile_rows(rows: list[str], device: str, top: int = int(os.environ.get("PROFILE_TOP", 12))) -> None:
    """Where a step's time goes on a GPU: per precision, one warm step's wall time, its kernels' count
    and summed device time, and the kernels that take most of it."""
    from torch.profiler import ProfilerActivity, profile

    every = "float32 float64 det64_eager det64 replay_eager replay"
    for row, p, run in _warm_steps(rows, device, "PROFILE_PRECISIONS", every):
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            started = time.perf_counter()
            run()
            _sync(device)
            wall = time.perf_counter() - started
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        busy = sum(e.device_time for e in kernels) / 1e6
        print(f"{row} {p}: wall {wall * 1e3:.1f} ms, {len(kernels)} kernels, device busy {busy * 1e3:.1f} ms")
        table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=top, max_name_column_width=60)
        print(table, flush=True)
        del run


def memory_trace(rows: list[str], device: str, top: int = int(os.environ.get("PROFILE_TOP", 12))) -> None:
    """Where a det64 step's memory peaks on a GPU, eager (no graph pool): at each rounding point the
    allocator's bytes in use and its peak since the point before (the point's own work included), so a
    peak is named by the point that ends its interval; the float32 and float64 peaks beside them."""
    for row, p, run in _warm_steps(rows, device, "MEMORY_PRECISIONS", "float32 float64 det64_eager replay_eager"):
        points = []
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        call = Rounder.__call__

        def traced(self, key, v, bound):
            r = call(self, key, v, bound)  # the peak since the point before, this one's own work included
            peak = torch.cuda.max_memory_allocated()
            points.append((peak - base, torch.cuda.memory_allocated() - base, self.name(key), tuple(v.shape)))
            torch.cuda.reset_peak_memory_stats()
            return r

        Rounder.__call__ = traced
        try:
            _without_graphs(run) if p == "det64" else run()
        finally:
            Rounder.__call__ = call
        _sync(device)
        tail = torch.cuda.max_memory_allocated() - base
        peak = max([tail] + [q[0] for q in points])
        print(f"{row} {p}: step peak {peak / 2**30:.2f} GiB above the {base / 2**30:.2f} GiB held before it")
        gib = lambda b: f"{b / 2**30:.2f}"
        for before, held, name, shape in sorted(points, reverse=True)[:top]:
            print(f"  peak {gib(before)} GiB up to {name} {shape}, in use after it {gib(held)} GiB", flush=True)
        del run  # before the next precision is set up (the generator's own reference goes when it resumes)
        torch.cuda.empty_cache()


def host_profile(rows: list[str], device: str, top: int = int(os.environ.get("PROFILE_TOP", 25))) -> None:
    """Where a warm step's host time goes (cProfile, by own time): what keeps a GPU idle in a step
    whose kernels take less than its wall time."""
    import cProfile
    import pstats

    for row, p, run in _warm_steps(rows, device, "PROFILE_PRECISIONS", "det64 replay"):
        prof = cProfile.Profile()
        started = time.perf_counter()
        prof.enable()
        run()
        _sync(device)
        prof.disable()
        print(f"{row} {p}: wall {(time.perf_counter() - started) * 1e3:.1f} ms (profiled)", flush=True)
        pstats.Stats(prof).sort_stats("tottime").print_stats(top)
        del run


def saved_for_backward(rows: list[str]) -> None:
    """Bytes a det64 step keeps for its backward (distinct storages reaching save_for_backward, the
    float64 parameters included), with rounding points' outputs kept as float32 (ops.PACK) and without:
    the activations part of a step's peak, counted exactly on any device."""
    print("| row | saved, float64 | saved, float32 where exact | ratio |")
    print("|---|---|---|---|")
    for row in rows:
        arch, cfg, batch_size, _ = SCALE_ROWS[row]
        cfg, batch_size = cfg or models.DEFAULTS[arch], batch_size or DEFAULT_BATCH[arch]
        model, opt = models.build(arch, cfg), DEFAULT_OPTIMIZER[arch]
        state = initial_state(models.init_params(arch, cfg, 0), opt)
        batch = Batches(arch, cfg, batch_size, 0)(0)
        sizes = {}
        for pack in (False, True):
            seen = {}

            def keep(t, seen=seen):
                seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
                return t

            ops.PACK = pack
            try:
                with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
                    graphs.eager_forward_backward(
                        model, state.params, batch["x"], batch["y"], ops.Det, Rounder("record")
                    )
            finally:
                ops.PACK = True
            sizes[pack] = sum(seen.values())
        print(
            f"| {row} | {sizes[False] / 2**20:,.0f} MiB | {sizes[True] / 2**20:,.0f} MiB | {sizes[True] / sizes[False]:.2f} |"
        )


def log_host_costs(rows: list[str], reps: int = 5) -> None:
    """The host's share of a replayed step on a GPU (the graph itself waits on it): decoding the step's
    rounding log (the Python reference against the C decoder) and laying it into the static table; and
    the recorder's encoding of it (the Python reference against the C encoder of a flat log); one
    recorded step per row on this CPU, medians of `reps`."""
    from replay.training import static_log
    from replay.training.determinism import FlatLog, decode_log_flat, decode_log_reference, encode_log_reference

    print(
        "| row | log bytes | entries | decode, Python | decode, C (flat) | Python / C | table fill "
        "| encode, Python | encode, C (flat) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        arch, cfg, batch_size, _ = SCALE_ROWS[row]
        cfg, batch_size = cfg or models.DEFAULTS[arch], batch_size or DEFAULT_BATCH[arch]
        opt, model = DEFAULT_OPTIMIZER[arch], models.build(arch, cfg)
        state = initial_state(models.init_params(arch, cfg, 0), opt)
        batch = Batches(arch, cfg, batch_size, 0)(0)
        rounder = Rounder("record", trace=[])
        train_step(model, state, batch, opt, "det64", rounder)
        log = encode_log(rounder.entries)
        points = [(k, r.numel()) for k, name, r in rounder.trace if not name.startswith("update.")]
        layout = static_log.layout_for(model, ("bench", row), points, "cpu", set())

        def median(fn):
            times = []
            for _ in range(reps):
                started = time.perf_counter()
                fn()
                times.append(time.perf_counter() - started)
            return statistics.median(times)

        ref, fast = median(lambda: decode_log_reference(log)), median(lambda: decode_log_flat(log))
        entries = decode_log_flat(log)
        if not isinstance(entries, FlatLog):  # no native kernel: the reference's dict
            entries = FlatLog.from_dict(entries)
        fill = median(lambda: layout.fill(entries))
        as_dict = entries.as_dict()
        enc_ref, enc = median(lambda: encode_log_reference(as_dict)), median(lambda: encode_log(entries))
        n = entries.total
        print(
            f"| {row} | {len(log):,} | {n:,} | {ref * 1e3:.1f} ms | {fast * 1e3:.2f} ms | {ref / fast:.0f} "
            f"| {fill * 1e3:.2f} ms | {enc_ref * 1e3:.1f} ms | {enc * 1e3:.2f} ms |",
            flush=True,
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cpu", "cuda"], help="the issue-18 table on this device")
    p.add_argument("--json", action="store_true", help="issue 18: print the rows as JSON")
    p.add_argument("--rows", nargs="*", choices=list(SCALE_ROWS), help="default: every row (a CPU: not gpt2-small-512)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--steps", type=int, default=30, help="steps recorded per architecture for the log and verify ratios"
    )
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--arch", nargs="*", default=list(ROWS), choices=list(ROWS))
    p.add_argument("--memory", nargs="*", default=list(MEMORY_ROWS), choices=list(MEMORY_ROWS))
    p.add_argument("--memory-only", action="store_true", help="only the memory and screen table (issue 10)")
    p.add_argument("--profile", action="store_true", help="with --device: where each row's step time goes")
    p.add_argument("--log-host", action="store_true", help="with --rows: a replayed step's host work on its log")
    p.add_argument("--memory-trace", action="store_true", help="with --device cuda: where a det64 step's memory peaks")
    p.add_argument("--live-peak", action="store_true", help="with --device: a step's peak in live tensor bytes")
    p.add_argument("--host-profile", action="store_true", help="with --device: a warm step's host time (cProfile)")
    p.add_argument("--saved", action="store_true", help="with --rows: bytes a det64 step keeps for backward")
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error(f"--device cuda: no CUDA device is available to this torch ({torch.__version__})")
    torch.set_num_threads(args.threads)
    if args.rows is None:  # block 512, batch 8 at GPT-2 size is a GPU's row: hours a step on a CPU
        args.rows = [r for r in SCALE_ROWS if args.device == "cuda" or r != "gpt2-small-512"]
    if args.log_host:
        log_host_costs(args.rows)
        return
    if args.saved:
        saved_for_backward(args.rows)
        return
    if args.device == "cuda" and args.memory_trace:
        memory_trace(args.rows, args.device)
        return
    if args.device and args.live_peak:
        live_peaks(args.rows, args.device)
        return
    if args.device and args.host_profile:
        host_profile(args.rows, args.device)
        return
    if args.device and args.profile:
        profile_rows(args.rows, args.device)
        return
    if args.device:
        scale_table(args.rows, args.device, args.threads, args.json)
        return
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), CPU capability "
        f"{torch.backends.cpu.get_cpu_capability()}\n"
    )
    if args.memory_only:
        memory_table(args.memory, args.threads)
        return
    print(
        "| arch | params | det64 step | float32 step | det/plain (goal <= 2.0) | float64 step | float64/plain "
        "| log B/step (max) | checkpoint B | log/checkpoint (goal <= 1%) | verify/prover (goal <= 1.2) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in args.arch:
        arch, cfg, batch_size = ROWS[row]
        cfg, batch_size = cfg or models.DEFAULTS[arch], batch_size or DEFAULT_BATCH[arch]
        large = row in LARGE
        # one step of each precision in turn, many times: the host's slow spells hit all three alike
        t = step_times(arch, cfg, batch_size, max(3, args.reps // 2) if large else 5 * args.reps, 1)
        det, plain, f64 = t["det64"], t["float32"], t["float64"]
        with tempfile.TemporaryDirectory() as d:
            r = log_and_verify(
                arch,
                cfg,
                batch_size,
                10 if large else args.steps,
                Path(d) / arch,
                2 if large else max(3, args.reps // 3),
            )
        n = sum(p.numel() for p in models.init_params(arch, cfg, 0).values())
        print(
            f"| {row} | {n:,} | {det * 1e3:.1f} ms | {plain * 1e3:.1f} ms | {det / plain:.2f} | "
            f"{f64 * 1e3:.1f} ms | {f64 / plain:.2f} | "
            f"{r['log_per_step']:.0f} ({r['log_max']}) | {r['checkpoint']:,} | {100 * r['log_per_step'] / r['checkpoint']:.3f}% | "
            f"{r['verify_ratio']:.2f} |",
            flush=True,
        )
    memory_table(args.memory, args.threads)


if __name__ == "__main__":
    main()
