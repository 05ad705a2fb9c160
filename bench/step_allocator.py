"""Resident memory of a run of det64 steps, with the step allocator and with glibc's heap tuned instead
(`REPLAY_ALLOCATOR=0`), each in its own process, as a ratio against the same row's plain float32 steps.

    .venv/bin/python bench/step_allocator.py [--rows cnn-32 gpt-3.3m] [--steps 30] [--threads 1]

Per row and mode: the process's resident peak (VmHWM) over its size before the first step, after step 1 and after
the last (the same step from the same state, as bench/replay.py's rows: the same allocations every step); the
median step time of steps 3 on; the step allocator's own bytes mapped at the end. float32 runs untuned (no det64
step in its process), as a user's plain training would.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

RUN = """
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
import torch
torch.set_num_threads(int(sys.argv[2]))
from bench.replay import SCALE_ROWS, one_step_setup
from replay.prover.recorder import DEFAULT_BATCH
from replay.training import architectures as models, step_allocator
from replay.training.train import frozen_heap
arch, cfg, batch, _ = SCALE_ROWS[sys.argv[3]]
cfg, batch = cfg or models.DEFAULTS[arch], batch or DEFAULT_BATCH[arch]
run = one_step_setup(arch, cfg, batch, "cpu", sys.argv[4])
def status(key):
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(key + ":"))
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
base, peaks, times = status("VmRSS"), [], []
with frozen_heap():
    for _ in range(int(sys.argv[5])):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
        peaks.append(status("VmHWM") - base)
    mapped = (step_allocator.stats() or {}).get("mapped", 0)
print(json.dumps({"first": peaks[0], "last": peaks[-1], "step_s": statistics.median(times[2:]), "mapped": mapped}))
"""

MODES = {  # name: (precision, environment)
    "float32": ("float32", {}),
    "det64 glibc tuned": ("det64", {"REPLAY_ALLOCATOR": "0"}),
    "det64 step allocator": ("det64", {}),
}


def measure(row: str, mode: str, steps: int, threads: int) -> dict:
    precision, env = MODES[mode]
    args = [sys.executable, "-c", RUN, str(ROOT), str(threads), row, precision, str(steps)]
    done = subprocess.run(args, capture_output=True, text=True, env={**os.environ, **env}, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", nargs="+", default=["cnn-32", "gpt-3.3m", "mlp-10m"])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    mib = lambda n: f"{n / 2**20:,.0f}"
    print(f"steps {args.steps}, threads {args.threads}: resident MiB after step 1 / after the last, x float32's")
    print("| row | mode | step | after step 1 | after the last | last / float32's last | mapped |")
    print("|---|---|---|---|---|---|---|")
    for row in args.rows:
        got = {mode: measure(row, mode, args.steps, args.threads) for mode in MODES}
        plain = got["float32"]["last"]
        for mode, m in got.items():
            ratio = m["last"] / plain
            cells = [row, mode, f"{m['step_s'] * 1e3:,.1f} ms", mib(m["first"]), mib(m["last"]), f"{ratio:.2f}"]
            print("| " + " | ".join(cells + [mib(m["mapped"]) if m["mapped"] else ""]) + " |")


if __name__ == "__main__":
    main()
