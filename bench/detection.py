"""Detection: one fabricated segment per run, caught once coverage reaches its target; the firmware's work
counters catch hidden work and parked snapshots in every run (issue 19).

    .venv/bin/python bench/detection.py --runs 100

Each run (seed i): a tiny MLP of 20 steps with a checkpoint every 2 (10 segments) recorded by a cheating
prover: at a random checkpoint it swaps in the state of 20 more steps trained off the books (2x the run's
declared compute) and records honestly from there, so exactly ONE segment (the one ending there) does not
replay. The chips' firmware counts every FLOP it executes, the hidden steps included.

1. Random draws: verifications with fresh nonces and no claims (so no mandatory segment helps), at most 2
   fresh segments each, the run's replayed segments carried over, until the run's coverage reaches the
   target 0.9 or a verification rejects. Caught = rejected. Expected >= 0.9 (= the coverage reached).
2. Hidden work: the run's claims verified with the chips' signed logs: rejected for unaccounted work?
3. Parked snapshots: an HONEST run of the same seed whose first chip goes on logging every six hours
   after the run, its counters advancing (it works on something else), each snapshot answered as the
   run's last step: rejected for unaccounted work? (Control: the same with still counters verifies.)

Baseline in the same run: the honest control of 3 (must verify). Prints a markdown table and writes
bench/out/detection.json.
"""

from __future__ import annotations

import argparse
import json
import random
import secrets
import shutil
import sys
import tempfile
from datetime import datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONFIG = {"sizes": [16, 32, 4]}
STEPS, INTERVAL, TARGET = 20, 2, 0.9


def recorders():
    from replay import Recorder
    from replay.protocol.firmware import Firmware
    from replay.training.train import train_step

    class HiddenCompute(Recorder):
        """At checkpoint `at`: the state of `extra` steps trained off the books; honest from there."""

        def __init__(self, *a, at: int, extra: int, **kw):
            super().__init__(*a, **kw)
            self.at, self.extra = at, extra

        def after_step(self, model, state):
            if state.step != self.at:
                return state
            hidden, step = state, state.step
            for k in range(self.extra):
                hidden, _ = train_step(model, hidden, self.batches(10_000 + k), self.optimizer, "float32")
            hidden.step = step
            return hidden

    def truthful(at: int, extra: int):
        class TruthfulChips(Firmware):
            def tick(self, step, hashes):
                if step == at:  # the chips count the hidden steps they executed
                    for chip, share in zip(self.chips, self.share):
                        chip.work(60.0 * extra, round(extra * self.step_flops * share))
                return super().tick(step, hashes)

        return TruthfulChips

    return Recorder, HiddenCompute, truthful


def park(d: Path, advancing: bool) -> None:
    """The first chip logs 8 more snapshots, six hours apart, answered as the run's last step."""
    from replay.protocol.firmware import Chip, chip_key, parse_record, record_hash

    lines = (d / "snapshots.jsonl").read_text().splitlines()
    claims = json.loads((d / "claims.json").read_text())
    last_claim = max(claims["claims"], key=lambda c: (c["step"], c["counter"]))
    serial = last_claim["serial"]
    mine = [parse_record(x) for x in lines if json.loads(x)["serial"] == serial]
    seed = json.loads((d / "manifest.json").read_text())["seed"]
    last = mine[-1]
    chip = Chip(serial, last["shard"], chip_key(seed, serial), busy_ns=last["busy_ns"], flops=last["flops"])
    chip.counter, chip.prev = last["counter"] + 1, record_hash(last)
    when = datetime.fromisoformat(last["time"][:-1])
    for k in range(8):
        chip.work(3600.0, 10**9 if advancing else 0)
        line = chip.snapshot(when + timedelta(hours=6 * (k + 1)), last_claim["hash"])
        lines.append(line)
        rec = json.loads(line)
        claims["claims"].append(
            {**{f: rec[f] for f in ("serial", "counter", "shard", "hash", "time")}, "step": last_claim["step"]}
        )
    (d / "snapshots.jsonl").write_text("\n".join(lines) + "\n")
    (d / "claims.json").write_text(json.dumps(claims))


def with_logs(d: Path):
    from replay import Budget, verify

    return verify(
        d,
        d / "claims.json",
        Budget(segments=0),
        snapshots=d / "snapshots.jsonl",
        chip_keys=d / "chips.json",
        coverage_target=0.0,
        nonce=secrets.token_bytes(16),
    )


def one(i: int, tmp: Path) -> dict:
    import torch

    from replay import Budget, verify

    torch.set_num_threads(1)
    Recorder, HiddenCompute, truthful = recorders()
    rng = random.Random(i)
    at = INTERVAL * rng.randint(1, STEPS // INTERVAL - 1)
    common = {
        "steps": STEPS,
        "seed": i,
        "chips": 3,
        "config": CONFIG,
        "batch": 16,
        "checkpoint_interval": INTERVAL,
        "snapshot_rate": 0.5,
    }
    cheat = HiddenCompute(tmp / f"c{i}", "mlp", at=at, extra=STEPS, firmware=truthful(at, STEPS), **common).run()
    done, rounds, caught = [], 0, False
    while True:
        v = verify(
            cheat,
            None,
            Budget(segments=2),
            nonce=secrets.token_bytes(16),
            replayed_segments=sorted(done),
            coverage_target=TARGET,
        )
        rounds += 1
        if v.verdict == "rejected":
            caught = True
            break
        done += v.details["segments_replayed"]
        if v.details["coverage"] >= TARGET or rounds > 20:
            break
    work = with_logs(cheat)
    hidden_caught = work.verdict == "rejected" and any(r.startswith("unaccounted work") for r in work.reasons)
    honest = Recorder(tmp / f"h{i}", "mlp", **common).run()
    control = with_logs(honest)
    still = Path(shutil.copytree(honest, tmp / f"s{i}"))
    park(still, advancing=False)
    parked_still = with_logs(still)
    busy = Path(shutil.copytree(honest, tmp / f"b{i}"))
    park(busy, advancing=True)
    parked = with_logs(busy)
    return {
        "seed": i,
        "fabricated_segment": at - INTERVAL,
        "draw_caught": caught,
        "draw_rounds": rounds,
        "coverage_at_stop": len(set(done)) / (STEPS // INTERVAL),
        "hidden_work_caught": hidden_caught,
        "parked_caught": parked.verdict == "rejected" and any(r.startswith("unaccounted work") for r in parked.reasons),
        "parked_still_verified": parked_still.verdict == "verified",
        "honest_verified": control.verdict == "verified",
        "honest_reasons": control.reasons[:2] + parked_still.reasons[:2],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=100)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="detection-") as tmp:
        rows = []
        for i in range(args.runs):
            rows.append(one(i, Path(tmp)))
            for k in ("c", "h", "s", "b"):
                shutil.rmtree(Path(tmp, f"{k}{i}"), ignore_errors=True)
    n = len(rows)
    summary = {
        "runs": n,
        "draw_caught": sum(r["draw_caught"] for r in rows),
        "mean_verifications": sum(r["draw_rounds"] for r in rows) / n,
        "hidden_work_caught": sum(r["hidden_work_caught"] for r in rows),
        "parked_caught": sum(r["parked_caught"] for r in rows),
        "parked_still_verified": sum(r["parked_still_verified"] for r in rows),
        "honest_verified": sum(r["honest_verified"] for r in rows),
        "failures": [
            r
            for r in rows
            if not (
                r["hidden_work_caught"] and r["parked_caught"] and r["honest_verified"] and r["parked_still_verified"]
            )
        ][:10],
    }
    Path(ROOT, "bench", "out").mkdir(exist_ok=True)
    Path(ROOT, "bench", "out", "detection.json").write_text(json.dumps({"summary": summary, "runs": rows}, indent=1))
    print("| measure | caught / runs | rate |")
    print("|---|---|---|")
    for k, label in (
        ("draw_caught", f"one fabricated segment, random draws until coverage {TARGET}"),
        ("hidden_work_caught", "2x hidden work, firmware counters"),
        ("parked_caught", "parked snapshots with advancing counters"),
        ("parked_still_verified", "control: parked with still counters (verified)"),
        ("honest_verified", "control: honest run (verified)"),
    ):
        print(f"| {label} | {summary[k]} / {n} | {summary[k] / n:.3f} |")
    print(f"\nmean verifications per run until caught or target: {summary['mean_verifications']:.2f}")
    for f in summary["failures"]:
        print("FAILURE", f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
