"""Honest sweep: how many honest runs does the replay verifier reject? (issue 19; goal: none)

    .venv/bin/python bench/false_alarms.py --runs 300            # record + verify 300 honest runs
    .venv/bin/python bench/false_alarms.py --runs 60 --seed 1    # a smaller sweep

Each run is recorded by the honest Recorder with 1 torch thread (and the fused native kernel, when it
builds) from a configuration drawn from --seed: a bundled architecture (tiny MLP / CNN / GPT configs),
a model seed, SGD without or with momentum or AdamW, a constant, step-decaying or warm-up/linear
schedule, 1 to 60 steps, a checkpoint interval of 1 to 50, a committed dataset of 1 to 10^5 examples,
and 2 to 6 chips that log Poisson snapshots with the firmware's work counters. Then every run is
verified in ANOTHER process with 2 torch threads and the native kernel off (REPLAY_NATIVE=0): all its
claims, the chips' signed logs (work accounting included), the registry's chips as the Django side
sends them after the chips were transferred (the chips whose snapshots the prover answered: its layout),
a fresh nonce, at most 2 fresh segments per verification, and then verified again with the run's
replayed segments carried over until its coverage target (0.9) is met.

Baseline in the same run: the verifier's own time on the first verification, against recording (the
ratio is printed; the count of rejected runs is the figure). Prints a markdown table and writes
bench/out/false_alarms.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TINY = {
    "mlp": {"sizes": [16, 32, 4]},
    "cnn": {"in_channels": 1, "image": 8, "channels": [4, 8], "classes": 4},
    "gpt": {"vocab": 32, "block": 8, "n_layer": 1, "n_head": 2, "n_embd": 16},
}


def schedule(rng: random.Random, steps: int) -> dict:
    lr = rng.choice([1e-3, 1e-2, 0.05, 0.1])
    kind = rng.choice(["constant", "step", "linear"])
    if kind == "constant":
        return {"kind": "constant", "lr": lr}
    if kind == "step":
        return {"kind": "step", "lr": lr, "gamma": rng.choice([0.1, 0.5, 0.9]), "every": rng.randint(1, max(1, steps))}
    return {"kind": "linear", "lr": lr, "warmup": rng.randint(1, max(1, steps // 2)), "total": steps, "final": 0.0}


def optimizer(rng: random.Random, steps: int) -> dict:
    kind = rng.choice(["sgd", "sgd-momentum", "adamw"])
    lr = schedule(rng, steps)
    if kind == "adamw":
        return {"kind": "adamw", "lr": lr, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01}
    return {"kind": "sgd", "lr": lr, "momentum": 0.9 if kind == "sgd-momentum" else 0.0, "weight_decay": 0.0}


def dataset(arch: str, size: int, seed: int):
    from replay.training import bundled_data as data
    from replay.training.data_commitment import Committed

    cfg = TINY[arch]
    if arch == "mlp":
        x, y = data.blobs(size, cfg["sizes"][0], cfg["sizes"][-1], seed)
        return Committed(x, y, "blobs", data._range(x))
    if arch == "cnn":
        x, y = data.shapes(size, cfg["image"], cfg["classes"], seed, cfg["in_channels"])
        return Committed(x, y, "shapes", data._range(x))
    block = cfg["block"]
    ids, _ = data.text(size * (block + 1), seed)
    rows = ids[: size * (block + 1)].view(size, block + 1)
    return Committed(rows[:, :-1].contiguous(), rows[:, 1:].contiguous(), "text", None)


def config(i: int, seed: int) -> dict:
    rng = random.Random(f"{seed}:{i}")
    arch = rng.choices(["mlp", "cnn", "gpt"], weights=[3, 1, 1])[0]
    steps = rng.randint(1, 60 if arch == "mlp" else 24)
    cap = 10**5 if arch == "mlp" else 10**4 if arch == "cnn" else 2000
    size = min(cap, int(10 ** rng.uniform(0, math.log10(cap))))
    return {
        "arch": arch,
        "seed": rng.randrange(2**31),
        "steps": steps,
        "interval": rng.randint(1, min(50, steps)),
        "optimizer": optimizer(rng, steps),
        "size": size,
        "batch": rng.choice([4, 8, 16]),
        "chips": rng.randint(2, 6),
    }


def record(c: dict, out: Path) -> float:
    import torch

    from replay import Recorder
    from replay.training import bundled_data as data

    torch.set_num_threads(1)
    batches = data.Batches(c["arch"], TINY[c["arch"]], c["batch"], c["seed"], dataset(c["arch"], c["size"], c["seed"]))
    started = time.perf_counter()
    Recorder(
        out,
        c["arch"],
        steps=c["steps"],
        seed=c["seed"],
        chips=c["chips"],
        config=TINY[c["arch"]],
        optimizer=c["optimizer"],
        batch=c["batch"],
        checkpoint_interval=c["interval"],
        snapshot_rate=0.3,
        batches=batches,
    ).run()
    return time.perf_counter() - started


def verify_all(dirs: list[str]) -> list[dict]:
    """In this process (started with 2 threads, native off): every run until its coverage target."""
    import secrets

    import torch

    from replay import Budget, verify
    from replay.training import native

    out = []
    for d in dirs:
        claims = json.loads(Path(d, "claims.json").read_text())
        layout = json.loads(Path(d, "manifest.json").read_text())["shards"]
        claims["prover_chips"] = {s["serial"]: {"model": "sim", "peak_flops_16bit": 1e15} for s in layout}
        done, drawn, forced, rounds, verdicts, reasons, seconds = [], [], set(), 0, [], [], 0.0
        pools: list[tuple[int, int]] = []
        while True:
            claims["replayed_segments"], claims["earlier_draws"] = sorted(set(done)), [list(p) for p in pools]
            started = time.perf_counter()
            v = verify(
                d,
                claims,
                Budget(max_seconds=600, segments=2),
                snapshots=Path(d, "snapshots.jsonl"),
                chip_keys=Path(d, "chips.json"),
                nonce=secrets.token_bytes(16),
            )
            seconds += time.perf_counter() - started
            rounds += 1
            verdicts.append(v.verdict)
            reasons += v.reasons[:3]
            done += v.details.get("segments_replayed", [])
            drawn += v.details.get("segments_drawn", [])
            forced |= set(v.details.get("segments_replayed", [])) - set(v.details.get("segments_drawn", []))
            if v.details.get("draw_pool") is not None:
                pools.append((v.details["draw_pool"], len(v.details.get("segments_drawn", []))))
            if v.verdict != "verified" or v.details["coverage"] >= 0.9 or rounds >= 50:
                break
        out.append(
            {
                "dir": d,
                "verdicts": verdicts,
                "reasons": reasons,
                "rounds": rounds,
                "verify_seconds": seconds,
                "coverage": v.details.get("coverage"),
                "work_pairs": v.details.get("checks", {}).get("chips", {}).get("work", {}).get("pairs_checked"),
                "findings": sorted({f["kind"] for f in v.details.get("findings", [])}),
                "threads": torch.get_num_threads(),
                "native": native.library() is not None,
            }
        )
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--verify-batch", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.verify_batch:
        print(json.dumps(verify_all(json.loads(args.verify_batch.read_text()))))
        return 0
    configs = [config(i, args.seed) for i in range(args.runs)]
    with tempfile.TemporaryDirectory(prefix="false-alarms-") as tmp:
        dirs, record_seconds, failed_records = [], [], []
        for i, c in enumerate(configs):
            d = Path(tmp, f"run{i:04d}")
            try:
                record_seconds.append(record(c, d))
                dirs.append(str(d))
            except Exception as e:  # a crash of the honest recorder is itself a finding of this sweep
                failed_records.append({"config": c, "error": f"{type(e).__name__}: {e}"[:300]})
        listing = Path(tmp, "dirs.json")
        listing.write_text(json.dumps(dirs))
        env = {**os.environ, "OMP_NUM_THREADS": "2", "REPLAY_NATIVE": "0", "PYTHONPATH": str(ROOT)}
        proc = subprocess.run(
            [sys.executable, __file__, "--verify-batch", str(listing)], capture_output=True, text=True, env=env
        )
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            return 1
        results = json.loads(proc.stdout.strip().splitlines()[-1])
    for r, c in zip(results, [c for c in configs]):
        r["config"] = c
    rejected = [r for r in results if r["verdicts"][-1] != "verified"]
    by_arch: dict[str, list] = {}
    for r in results:
        by_arch.setdefault(r["config"]["arch"], []).append(r)
    verify_s = sum(r["verify_seconds"] for r in results)
    summary = {
        "runs": len(configs),
        "recorded": len(results),
        "record_crashes": failed_records,
        "rejected": len(rejected),
        "rejected_runs": [
            {"config": r["config"], "verdicts": r["verdicts"], "reasons": r["reasons"]} for r in rejected
        ],
        "verifications": sum(r["rounds"] for r in results),
        "coverage_target_met": sum((r["coverage"] or 0) >= 0.9 for r in results),
        "work_pairs_checked": sum(r["work_pairs"] or 0 for r in results),
        "findings": {
            k: sum(k in r["findings"] for r in results)
            for k in ("straight_line", "update_jump", "loss_trend", "screen")
        },
        "verify_threads": results[0]["threads"] if results else None,
        "verify_native": results[0]["native"] if results else None,
        "record_seconds": sum(record_seconds),
        "verify_seconds": verify_s,
    }
    Path(ROOT, "bench", "out").mkdir(exist_ok=True)
    Path(ROOT, "bench", "out", "false_alarms.json").write_text(json.dumps(summary, indent=1, default=str))
    print("| arch | runs | rejected | verifications |")
    print("|---|---|---|---|")
    for arch, rs in sorted(by_arch.items()):
        print(
            f"| {arch} | {len(rs)} | {sum(r['verdicts'][-1] != 'verified' for r in rs)} | {sum(r['rounds'] for r in rs)} |"
        )
    print(
        f"\n{summary['rejected']} of {summary['recorded']} honest runs rejected ({len(failed_records)} recorder crashes); "
        f"verified with {summary['verify_threads']} threads, native kernel {'on' if summary['verify_native'] else 'off'}; "
        f"coverage target met in {summary['coverage_target_met']}; work pairs accounted {summary['work_pairs_checked']}; "
        f"findings (never a rejection): {summary['findings']}; verify/record time ratio "
        f"{verify_s / max(summary['record_seconds'], 1e-9):.2f}"
    )
    for r in rejected[:10]:
        print("REJECTED", json.dumps(r["config"]), r["reasons"][:2])
    for f in failed_records[:10]:
        print("RECORD CRASH", f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
