"""Detection: one fabricated segment per run, caught once coverage reaches its target; the firmware's work
counters catch hidden work and parked snapshots in every run (issue 19).

    .venv/bin/python bench/detection.py --runs 100

Each run (seed i): a tiny MLP of 20 steps with a checkpoint every 2 (10 segments) recorded by a cheating
prover: at a random checkpoint it swaps in the state of 20 more steps trained off the books (2x the run's
declared compute) and records honestly from there, so exactly ONE segment (the one ending there) does not
replay. The chips' firmware counts every FLOP it executes, the hidden steps included.

1. Random draws: verifications with fresh nonces and no claims (so no mandatory segment helps), at most 2
   fresh segments each, the run's replayed segments carried over, until the run's coverage reaches the
   target 0.9 or a verification rejects. Caught = rejected. Expected >= 0.9 (= the coverage reached). A
   rejection's dispute, bisected against the transcript's step commitments, must name the step after which
   the state was swapped.
2. Hidden work: the run's claims verified with the chips' signed logs, then the chips' next run (honest, on the
   same chips, their firmware carrying on: counters, keys, log chain) verified with the first run's claims and
   figures in its history, as the ledger gives them: rejected for unaccounted work by either? (Hidden steps after
   every chip's last snapshot of the run lie between two runs' snapshots: only the pair across them shows them.)
3. Parked snapshots: an HONEST run of the same seed whose first chip goes on logging every six hours
   after the run, its counters advancing (it works on something else), each snapshot answered as the
   run's last step: rejected for unaccounted work? (Control: the same with still counters verifies.)

Baseline in the same run: the honest control of 3 and its own next run, back to back (must verify). Prints a markdown table and writes
bench/out/detection.json.
"""

from __future__ import annotations

import argparse
import json
import math
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
ADVERSARY_STEPS = 40  # 20 segments: with 10, ceil(0.9 (10 - m)) = 10 - m would replay every unforced one
SEGMENTS = STEPS // INTERVAL


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


def kept(firmware_class, made: list):
    """A firmware factory that keeps what it made (the chips carry on into the next run)."""

    def make(layout, seed, rate):
        made.append(firmware_class(layout, seed, rate))
        return made[-1]

    return make


def next_run(Recorder, out: Path, first: Path, made: list, common: dict) -> Path:
    """The same chips' next run, honest, an hour after the first ended: their firmware carries on."""
    from replay.protocol.firmware import EPOCH, Firmware

    start = EPOCH + timedelta(seconds=60 * STEPS + 3600)

    def carry_on(layout, seed, rate):
        return Firmware(layout, seed, rate, chips=made[0].chips, start=start)

    serials = [c.serial for c in made[0].chips]
    options = {**common, "seed": common["seed"] + 100_000}
    return Recorder(out, "mlp", serials=serials, firmware=carry_on, **options).run()


def after(second: Path, first: Path, first_verdict) -> object:
    """The second run's claims as the regulator's side sends them: each with its snapshot's signed work counters,
    the chips' claims of the first run in its history with the first run's figures (its verdict's count)."""
    from replay import Budget, verify

    def signed(d):
        out = {}
        for line in (d / "snapshots.jsonl").read_text().splitlines():
            rec = json.loads(line)
            out[rec["serial"], rec["counter"]] = (rec["busy_ns"], rec["flops"])
        return out

    c, work = json.loads((second / "claims.json").read_text()), signed(second)
    for x in c["claims"]:
        x["busy_ns"], x["flops"] = work[x["serial"], x["counter"]]
    earlier, work = json.loads((first / "claims.json").read_text()), signed(first)
    history: dict[str, list] = {}
    for x in earlier["claims"]:
        busy, flops = work[x["serial"], x["counter"]]
        history.setdefault(x["serial"], []).append(
            {
                **{k: x[k] for k in ("counter", "time", "step")},
                "run": "first",
                "manifest": earlier["manifest"],
                "busy_ns": busy,
                "flops": flops,
                "run_steps": first_verdict.details["steps"],
                "chip_step_flops": first_verdict.details["chip_step_flops"][x["serial"]],
            }
        )
    c["history"] = history
    return verify(second, c, Budget(segments=0), coverage_target=0.0, nonce=secrets.token_bytes(16))


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


def one(i: int, tmp: Path, draws_only: bool = False, adversary: bool = False, adaptive: bool = False) -> dict:
    import torch

    from replay import Budget, verify
    from replay.protocol import coverage
    from replay.protocol.firmware import Firmware
    from replay.protocol.transcript_layout import canonical_json

    torch.set_num_threads(1)
    Recorder, HiddenCompute, truthful = recorders()
    rng = random.Random(i)
    steps = ADVERSARY_STEPS if adversary else STEPS
    at = INTERVAL * rng.randint(1, steps // INTERVAL - 1)
    common = {
        "steps": steps,
        "seed": i,
        "chips": 3,
        "config": CONFIG,
        "batch": 16,
        "checkpoint_interval": INTERVAL,
        "snapshot_rate": 0.5,
    }
    made: list = []
    cheat = HiddenCompute(tmp / f"c{i}", "mlp", at=at, extra=STEPS, firmware=kept(truthful(at, STEPS), made), **common)
    cheat = cheat.run()
    done, drawn, rounds, caught, dispute, failed, nonces, recomputed = [], [], 0, False, {}, [], [], True
    starts = list(range(0, steps, INTERVAL))
    answers = away_from(cheat, at - INTERVAL, steps) if adversary else [None]
    forced: set[int] = set()
    pools: list[tuple[int, int]] = []
    old_rule_fooled = False  # drawn / (drawn + never replayed) >= target with the fabrication unreplayed
    while True:
        nonces.append(secrets.token_bytes(16))
        answer = answers[rounds % len(answers)]  # one claim per verification, as the ledger sends them
        # having seen the draws, the old rule's best attack: once 9 unforced draws would meet the target with
        # only the fabrication left unreplayed, file claims forcing every other never-replayed segment it can
        if adaptive and len(set(drawn) - forced) >= 9:
            answer = forcing(answers, set(done), steps) or answer
        v = verify(
            cheat,
            answer,
            Budget(segments=2),
            nonce=nonces[-1],
            replayed_segments=sorted(done),
            earlier_draws=[list(p) for p in pools],  # as the ledger sends it: each verification's (pool, drawn)
            coverage_target=TARGET,
        )
        rounds += 1
        if answer is None:  # what an outside verifier recomputes from the nonce (docs/transcripts.md §4)
            seed = coverage.seed(nonces[-1], v.details["manifest"], canonical_json([]))
            planned = coverage.draw(starts, [], set(done), seed, TARGET, 2, coverage.missed(pools))
            recomputed &= list(planned.fresh) == [x["start"] for x in v.details["segments"]]
        failed += [x["start"] for x in v.details["segments"] if not x["ok"]]
        if v.verdict == "rejected":
            caught, dispute = True, v.details.get("dispute") or {}
            break
        done += v.details["segments_replayed"]
        drawn += v.details["segments_drawn"]
        forced |= set(v.details["segments_replayed"]) - set(v.details["segments_drawn"])
        pools.append((v.details["draw_pool"], len(v.details["segments_drawn"])))
        unforced = set(drawn) - forced
        old_rule_fooled |= len(unforced) / (len(unforced) + len(set(starts) - set(done))) >= TARGET
        if v.details["coverage"] >= TARGET or rounds > 40:
            break
    draws = {
        "seed": i,
        "fabricated_segment": at - INTERVAL,
        "draw_caught": caught,
        "draw_rounds": rounds,
        "nonces": [n.hex() for n in nonces],  # each verification's draw, recomputable offline
        "draw_recomputed": recomputed,
        "old_rule_fooled": old_rule_fooled,  # only ever set before the fabrication was replayed
        # every segment a verification replayed: the fabricated one must be the only one failing, and a run
        # that verified must never have replayed it (a miss is a fabricated segment the draw left out)
        "failed_segments": sorted(set(failed)),
        "fabricated_replayed": caught or (at - INTERVAL) in done,
        # the swap follows step at-1: the bisection against the transcript's step commitments must name it
        "dispute_step_named": caught and dispute.get("step") == at - 1,
        "dispute": {k: dispute.get(k) for k in ("step", "op", "source")} if caught else None,
        "coverage_at_stop": coverage.coverage(coverage.missed(pools), len(set(starts) - set(done))),
        "forced": sorted(forced),
    }
    if draws_only:
        return draws
    work = with_logs(cheat)
    following = after(next_run(Recorder, tmp / f"n{i}", cheat, made, common), cheat, work)
    hidden_caught = any(
        v.verdict == "rejected" and any(r.startswith("unaccounted work") for r in v.reasons) for v in (work, following)
    )
    made = []
    honest = Recorder(tmp / f"h{i}", "mlp", firmware=kept(Firmware, made), **common).run()
    control = with_logs(honest)
    control_next = after(next_run(Recorder, tmp / f"m{i}", honest, made, common), honest, control)
    still = Path(shutil.copytree(honest, tmp / f"s{i}"))
    park(still, advancing=False)
    parked_still = with_logs(still)
    busy = Path(shutil.copytree(honest, tmp / f"b{i}"))
    park(busy, advancing=True)
    parked = with_logs(busy)
    return {
        **draws,
        "hidden_work_caught": hidden_caught,
        "hidden_caught_by": "run" if work.verdict == "rejected" else ("next run" if hidden_caught else None),
        "parked_caught": parked.verdict == "rejected" and any(r.startswith("unaccounted work") for r in parked.reasons),
        "parked_still_verified": parked_still.verdict == "verified",
        "honest_verified": control.verdict == "verified" and control_next.verdict == "verified",
        "honest_reasons": control.reasons[:2] + control_next.reasons[:2] + parked_still.reasons[:2],
    }


def forcing(answers: list[dict | None], replayed: set[int], steps: int) -> dict | None:
    """One claims file holding every claim (away from the fabrication) whose forced segment was never replayed:
    the prover that files claims after seeing the draws, to shrink what a fabrication must escape."""
    from replay.protocol import coverage

    checkpoints = list(range(0, steps + 1, INTERVAL))
    chosen, seen = [], set()
    for a in answers:
        if a is None:
            continue
        [x] = a["claims"]
        segment = coverage.mandatory(checkpoints, [x["step"]])
        if segment and segment[0] not in replayed and segment[0] not in seen:
            seen.add(segment[0])
            chosen.append(x)
    return {**answers[0], "claims": chosen} if chosen else None


def away_from(d: Path, fabricated: int, steps: int) -> list[dict]:
    """The run's claims (one per verification) a prover answers knowing where it fabricated: only those whose
    forced segment (the one before the checkpoint the claim replays from) is not the fabricated one, and whose
    own replay (from that checkpoint to its step) does not run through it either: the draws alone must catch it."""
    from replay.protocol import coverage

    c = json.loads((d / "claims.json").read_text())
    checkpoints = list(range(0, steps + 1, INTERVAL))
    start = lambda step: max(k for k in checkpoints if k <= max(step - 1, 0))
    out = [
        {**c, "claims": [x]}
        for x in c["claims"]
        if fabricated not in coverage.mandatory(checkpoints, [x["step"]]) and start(x["step"]) != fabricated
    ]
    return out or [None]


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact two-sided binomial confidence interval for k successes of n (bisection on the binomial tails)."""

    def at_least(j, p):  # P(X >= j), increasing in p (terms in logs: no overflow for large n)
        if p <= 0.0 or p >= 1.0:
            return float(p >= 1.0 or j <= 0)
        log = lambda i: math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
        return sum(math.exp(log(i) + i * math.log(p) + (n - i) * math.log1p(-p)) for i in range(j, n + 1))

    def solve(f, want):
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) < want else (lo, mid)
        return (lo + hi) / 2

    a = (1 - level) / 2
    low = 0.0 if k == 0 else solve(lambda p: at_least(k, p), a)  # P(X >= k) = a/2
    high = 1.0 if k == n else solve(lambda p: at_least(k + 1, p), 1 - a)  # P(X <= k) = a/2
    return low, high


def draw_failures(rows: list[dict]) -> list[dict]:
    """Runs that break the premise of the figure: a segment other than the fabricated one failed, or a run
    verified although its fabricated segment was replayed (the catch would then not be the draw's alone)."""
    return [
        r
        for r in rows
        if set(r["failed_segments"]) - {r["fabricated_segment"]}
        or r["fabricated_replayed"] != r["draw_caught"]
        or not r["draw_recomputed"]
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--draws-only", action="store_true", help="only measure 1 (the fabricated segment's draw)")
    p.add_argument(
        "--adversary",
        action="store_true",
        help="measure 1 only, on 40-step runs whose claims force segments away from the fabricated one (each "
        "verification answers one such claim): the prover that knows its claims",
    )
    p.add_argument(
        "--adaptive",
        action="store_true",
        help="as --adversary, but once 9 segments were drawn the prover files claims forcing every never-replayed "
        "segment it can (other than its fabrication): the old rule drawn / (drawn + never replayed) is counted beside",
    )
    args = p.parse_args()
    args.adversary |= args.adaptive
    with tempfile.TemporaryDirectory(prefix="detection-") as tmp:
        rows = []
        for i in range(args.first_seed, args.first_seed + args.runs):
            rows.append(one(i, Path(tmp), args.draws_only or args.adversary, args.adversary, args.adaptive))
            for k in ("c", "n", "h", "m", "s", "b"):
                shutil.rmtree(Path(tmp, f"{k}{i}"), ignore_errors=True)
    n = len(rows)
    caught = sum(r["draw_caught"] for r in rows)
    summary = {
        "runs": n,
        "draw_caught": caught,
        "draw_caught_ci95": clopper_pearson(caught, n),
        "forced_per_run": sum(len(r["forced"]) for r in rows) / n,
        "old_rule_fooled": sum(r["old_rule_fooled"] for r in rows),
        "mean_verifications": sum(r["draw_rounds"] for r in rows) / n,
        "dispute_step_named": sum(r["dispute_step_named"] for r in rows),
        "draw_failures": draw_failures(rows)[:10],
    }
    if not (args.draws_only or args.adversary):
        summary.update(
            {
                k: sum(r[k] for r in rows)
                for k in ("hidden_work_caught", "parked_caught", "parked_still_verified", "honest_verified")
            }
        )
        summary["hidden_caught_by_next_run"] = sum(r["hidden_caught_by"] == "next run" for r in rows)
        summary["failures"] = [
            r
            for r in rows
            if not (
                r["hidden_work_caught"] and r["parked_caught"] and r["honest_verified"] and r["parked_still_verified"]
            )
        ][:10]
    Path(ROOT, "bench", "out").mkdir(exist_ok=True)
    name = (
        "detection-adaptive.json"
        if args.adaptive
        else "detection-adversary.json"
        if args.adversary
        else "detection-draws.json"
        if args.draws_only
        else "detection.json"
    )
    Path(ROOT, "bench", "out", name).write_text(json.dumps({"summary": summary, "runs": rows}, indent=1))
    low, high = summary["draw_caught_ci95"]
    print("| measure | caught / runs | rate |")
    print("|---|---|---|")
    print(
        f"| one fabricated segment, random draws until coverage {TARGET} | {caught} / {n} | {caught / n:.3f} "
        f"(95% CI {low:.3f}-{high:.3f}; >= {TARGET} by construction: docs/transcripts.md §4) |"
    )
    print(f"segments forced by the claims, per run: {summary['forced_per_run']:.2f}")
    print(
        f"runs the count drawn / (drawn + never replayed) would have declared covered with the fabrication "
        f"unreplayed: {summary['old_rule_fooled']} of {n}"
    )
    for k, label in (
        ("hidden_work_caught", "2x hidden work, firmware counters (the run, then the chips' next run)"),
        ("parked_caught", "parked snapshots with advancing counters"),
        ("parked_still_verified", "control: parked with still counters (verified)"),
        ("honest_verified", "control: honest run and its chips' next run, back to back (both verified)"),
    ):
        if k in summary:
            print(f"| {label} | {summary[k]} / {n} | {summary[k] / n:.3f} |")
    print(f"\nmean verifications per run until caught or target: {summary['mean_verifications']:.2f}")
    if "hidden_caught_by_next_run" in summary:
        print(f"hidden work caught only across the two runs: {summary['hidden_caught_by_next_run']}")
    print(f"caught fabrications whose dispute names the swapped step: {summary['dispute_step_named']} of {caught}")
    print(
        f"missed runs whose fabricated segment was never replayed: {sum(not r['fabricated_replayed'] for r in rows)} of {n - caught}"
    )
    for f in summary["draw_failures"] + summary.get("failures", []):
        print("FAILURE", f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
