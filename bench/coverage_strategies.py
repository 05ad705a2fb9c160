"""Coverage against an adaptive prover: how often one fabricated segment escapes while the run is declared
covered, per prover strategy, under today's rule and under the rule before it, in the same run (issue 19).

    .venv/bin/python bench/coverage_strategies.py [--trials 2000] [--segments 30 100 1000]

Each trial: a run of N segments, one fabricated (uniform), verified one verification after another as the
ledger tells them (at most 2 draws each, target 0.9, fresh nonce each). Between verifications the prover, who
sees every draw once its nonce is revealed, plays a strategy:

- none: files nothing extra;
- force-rest: once the old count would be met with only the fabrication left (9 unforced draws for
  target 0.9), files claims forcing every other never-replayed segment;
- force-random: forces 0-3 random never-replayed segments (not the fabrication) before every verification;
- slow: makes the fabricated segment slow to replay, so a budget ends the draws on it when drawn;
- force-rest+slow: both.

Rules: "product" (today: coverage = 1 - prod (pool - drawn) / pool, a draw the budget cut pending and replayed
first, replay/protocol/coverage.py) and "old" (coverage = drawn / (drawn + never replayed) over unforced draws, a
cut draw counting for nothing and not carried). Escaped = the run declared covered with the fabrication never
replayed. The guarantee: escaped <= 1 - target = 0.1 for the product rule, whatever the strategy.
Pure Python (SHA-256 draws, no replay): the draw logic is the verifier's own.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from replay.protocol import coverage  # noqa: E402

TARGET, AT_MOST = 0.9, 2
STRATEGIES = ("none", "force-rest", "force-random", "slow", "force-rest+slow")


def seed_of(*parts: int) -> bytes:
    return hashlib.sha256(b"bench-coverage" + b"".join(p.to_bytes(8, "little") for p in parts)).digest()


def old_draw(starts, must, replayed, drawn, forced, seed_):
    """The rule before: draw until unforced drawn / (unforced drawn + never replayed) meets the target."""
    done = set(replayed) | set(must)
    pool = [s for s in starts if s not in done]
    counted = len(set(drawn) - forced - set(must))
    open_ = counted + len(pool)
    out = []
    for s in coverage.order(seed_, pool)[:AT_MOST]:
        if open_ == 0 or counted / open_ >= TARGET:
            break
        out.append(s)
        counted += 1
    return out


def prover_forces(strategy, rng, starts, fabricated, replayed, drawn, forced):
    left = [s for s in starts if s not in replayed and s != fabricated]
    if strategy.startswith("force-rest") and len(drawn - forced) >= 9:
        return left
    if strategy == "force-random":
        return rng.sample(left, min(len(left), rng.randint(0, 3)))
    return []


def trial(n: int, rule: str, strategy: str, t: int) -> bool:
    """True when the fabrication escaped and the run was declared covered."""
    starts, fabricated, rng = list(range(n)), random.Random(t).randrange(n), random.Random(t + 10**9)
    slow = strategy.endswith("slow")
    replayed, drawn, forced, draws, pending = set(), set(), set(), [], set()
    for k in range(4 * n):
        must = prover_forces(strategy, rng, starts, fabricated, replayed, drawn, forced)
        if fabricated in must:
            return False
        forced |= set(must)
        seed_ = seed_of(n, t, k)
        if rule == "product":
            d = coverage.draw(starts, must, replayed, seed_, TARGET, AT_MOST, coverage.missed(draws), pending)
            todo, fresh = [*d.carried, *d.fresh], set(d.fresh)
        else:
            todo = old_draw(starts, must, replayed, drawn, forced, seed_)
            fresh = set(todo)
        replayed |= set(must)
        completed = []
        for s in todo:
            if s == fabricated and slow and s not in pending:  # the budget ends the draws on it
                if rule == "product":
                    pending.add(s)  # revealed: replayed first next time
                break
            if s == fabricated:
                return False
            completed.append(s)
        replayed |= set(completed)
        drawn |= set(completed) & fresh
        if rule == "product":
            draws.append((d.pool, len(set(completed) & fresh)))
            pending -= replayed
            met = coverage.coverage(coverage.missed(draws), n - len(replayed)) >= TARGET and not pending
        else:
            counted = len(drawn - forced)
            never = n - len(replayed)
            met = (counted / (counted + never) if counted + never else 1.0) >= TARGET
        if met:
            return fabricated not in replayed
    return False


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=2000)
    p.add_argument("--segments", type=int, nargs="+", default=[30, 100, 1000])
    args = p.parse_args()
    rows = []
    for n in args.segments:
        trials = args.trials if n <= 100 else max(args.trials // 10, 100)
        for strategy in STRATEGIES:
            row = {"segments": n, "strategy": strategy, "trials": trials}
            for rule in ("product", "old"):
                row[rule] = sum(trial(n, rule, strategy, t) for t in range(trials)) / trials
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    Path(ROOT, "bench", "out").mkdir(exist_ok=True)
    Path(ROOT, "bench", "out", "coverage_strategies.json").write_text(json.dumps(rows, indent=1))
    print("| segments | prover strategy | trials | escaped, product rule (today) | escaped, old rule | old / product |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        ratio = f"{r['old'] / r['product']:.1f}" if r["product"] else "-"
        print(f"| {r['segments']} | {r['strategy']} | {r['trials']} | {r['product']:.3f} | {r['old']:.3f} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
