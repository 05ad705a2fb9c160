"""Two versions of the replay code on this CPU, side by side: this tree against a git revision.

    .venv/bin/python bench/replay_ab.py --base <rev> [--rows mlp cnn gpt] [--rounds 2] [--threads 1]

For each row, float64, det64 recording and det64 replay steps of one tree are timed interleaved in a process of
its own (warm-up, then at least BENCH_ROW_SECONDS, default 4, of rounds, medians, as bench/replay.py's rows), the two trees alternating
round after round (this tree's row shapes for both): a change's effect on the ratios det64 / float64 and replay / float64, on a host whose
timings drift by a third within minutes (the ratio is taken within one process; each tree's ratios are listed
per round). The base revision is checked out with `git worktree` into a temporary folder, removed after.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.replay import DEFAULT_BATCH, MAX_ROUNDS, ROW_SECONDS, SCALE_ROWS  # noqa: E402
from replay.training import architectures as models  # noqa: E402

CHILD = """
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
import torch
torch.set_num_threads(int(sys.argv[2]))
seconds, most = float(sys.argv[3]), int(sys.argv[4])
sys.argv = sys.argv[:1] + sys.argv[5:]
from bench.replay import one_step_setup
try:  # each tree's steps as its `record` and `verify` run them
    from replay.training.train import frozen_heap
except ImportError:
    from contextlib import nullcontext as frozen_heap
out = {}
for row, (arch, cfg, batch) in json.loads(sys.argv[1]).items():
    runs = {p: one_step_setup(arch, cfg, batch, "cpu", p) for p in ("float64", "det64", "replay")}
    for run in runs.values():
        run(); run()
    times, started = {p: [] for p in runs}, time.perf_counter()
    with frozen_heap():
        while len(times["det64"]) < 5 or (time.perf_counter() - started < seconds and len(times["det64"]) < most):
            for p, run in runs.items():
                t = time.perf_counter(); run(); times[p].append(time.perf_counter() - t)
    out[row] = {p: statistics.median(v) for p, v in times.items()}
print(json.dumps(out))
"""


def _measure(tree: Path, rows: list[str], threads: int) -> dict:
    # this tree's rows and rounds for both (the base's bench may predate them)
    shapes = {}
    for row in rows:
        arch, cfg, batch, _ = SCALE_ROWS[row]
        shapes[row] = (arch, cfg or models.DEFAULTS[arch], batch or DEFAULT_BATCH[arch])
    args = [sys.executable, "-c", CHILD, str(tree), str(threads), str(ROW_SECONDS), str(MAX_ROUNDS), json.dumps(shapes)]
    done = subprocess.run(args, capture_output=True, text=True, cwd=tree, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="git revision to compare this tree against")
    p.add_argument("--rows", nargs="*", default=["mlp", "cnn", "gpt"], choices=list(SCALE_ROWS))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(base), args.base], check=True)
        try:
            results = {"base": [], "this": []}
            for _ in range(args.rounds):
                for name, tree in (("base", base), ("this", ROOT)):
                    results[name].append(_measure(tree, args.rows, args.threads))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=False)
    print("| row | tree | det64 / float64 (per round) | replay / float64 (per round) | float64 ms (per round) |")
    print("|---|---|---|---|---|")
    for row in args.rows:
        for name in ("base", "this"):
            rounds = [r[row] for r in results[name]]
            rec = ", ".join(f"{r['det64'] / r['float64']:.2f}" for r in rounds)
            rep = ", ".join(f"{r['replay'] / r['float64']:.2f}" for r in rounds)
            f64 = ", ".join(f"{r['float64'] * 1e3:.2f}" for r in rounds)
            label = args.base if name == "base" else "this tree"
            print(f"| {row} | {label} | {rec} | {rep} | {f64} |", flush=True)


if __name__ == "__main__":
    main()
