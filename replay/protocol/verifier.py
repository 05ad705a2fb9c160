"""The verifier: replay what the prover committed to, compare bits, check the rules.

    verify(transcript_dir, claims, Budget(max_seconds=60), nonce=b"...") -> Verdict

1. The manifest (the commitment) is validated (transcript.py); every file read later must match its hash.
2. Compute is counted from the architecture and the batch shapes, never taken from the prover:
   FLOPs, steps, examples, tokens; each rule gets a verdict, and a declaration below the count is
   under-reporting (compute_rules.py).
3. Claims (chip serial, counter, shard, hash, step, time; claims_file.py) are checked against the chips' signed
   snapshot logs (snapshot_logs.py), their history and the registry's chips (chips_and_time.py: order, pace, layout), then each
   claimed step is replayed from the nearest earlier checkpoint and the shard's SHA-256 compared
   bit-exactly (segment_replay.py).
4. Segments (coverage.py) -- the one that produced each claim's starting checkpoint, then fresh ones
   drawn from the verifier's nonce until the run's coverage target is met -- are replayed from their
   checkpoint and compared bit-exactly, all parameters and optimizer state, with the next checkpoint.
5. Cheap whole-transcript checks: every data commitment, the seed-derived initial weights, update
   sizes against the learning-rate schedule (and no straight-line stretches: interpolated
   checkpoints), the loss trending down (transcript_checks.py).
A replay mismatch is bisected to its first divergent step and operation against the transcript's per-step
commitments (or a prover's store, in tests): the report's "dispute" (bisect.py).

Verdict: "verified" only if every check ran and passed within the budget; "malformed" for input
that is not a transcript; "rejected" otherwise, with reasons.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from replay.protocol import chips_and_time, coverage, limits
from replay.protocol.claims_file import coverage_context, parse_claims, read_json, read_lines
from replay.protocol.compute_rules import DEFAULT_RULES, count_compute
from replay.protocol.engine import Budget, BudgetExhausted, Replayer
from replay.protocol.manifest_schema import CLAIMABLE_PRECISIONS
from replay.protocol.report import Report
from replay.protocol.screen import screen_or_reason
from replay.protocol.segment_replay import replay_claims, replay_segments
from replay.protocol.snapshot_logs import check_keys, check_snapshots, work_from_logs
from replay.protocol.transcript import Transcript
from replay.protocol.transcript_checks import data_commitment_checks, whole_transcript_checks
from replay.protocol.transcript_errors import BeyondThisVerifier, CommitmentMismatch, MalformedTranscript
from replay.protocol.transcript_layout import canonical_json
from replay.training.determinism import REL_WINDOW
from replay.training.fenv import float_environment_problem

MAX_SHOWN_REASONS = 100  # a verdict's reasons as it reports them; the ledger's summary keeps fewer (report.MAX_REASONS)


@dataclass
class Verdict:
    verdict: str
    reasons: list[str] = field(default_factory=list)
    details: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"verdict": self.verdict, "reasons": _bounded(self.reasons), **self.details}

    @property
    def report(self) -> Report:
        """The typed report (replay.protocol.report): what the regulator's side records."""
        return Report.from_json(self.to_json())


def _bounded(reasons: list[str]) -> list[str]:
    """The first MAX_SHOWN_REASONS reasons, and how many more there are: a snapshots file of 10 MB of noise gave a
    reason a line, 29 MB of output."""
    if len(reasons) <= MAX_SHOWN_REASONS:
        return list(reasons)
    rest = len(reasons) - MAX_SHOWN_REASONS + 1
    return [*reasons[: MAX_SHOWN_REASONS - 1], f"... and {rest:,} more reasons"]


def _beyond_this_verifier(e: BeyondThisVerifier, report: dict) -> Verdict:
    """The verdict on a transcript one step of which costs more than this verifier's budgets: "error", this
    machine's limit (retried, where a worker with larger budgets can take it), never held against the prover."""
    why = f"{e.reason}; a verifier with larger budgets can replay it (docs/replay-limits.md)"
    report["beyond_budget"] = True  # for the regulator's side: a retry goes to a larger worker where there is one
    return Verdict("error", [f"the verifier cannot replay this transcript on this machine: {why}"], report)


def verify(
    transcript,
    claims=None,
    budget: Budget | None = None,
    *,
    snapshots=None,
    chip_keys=None,
    nonce: bytes = b"",
    rules: dict | None = None,
    device="cpu",
    store=None,
    coverage_target: float | None = None,
    replayed_segments: list[int] | None = None,
    earlier_draws: list[list[int]] | None = None,
    pending_segments: list[int] | None = None,
) -> Verdict:
    """Verify a transcript directory against claims (a dict or a path to claims.json). See the module docstring.

    The claims' optional fields (history, prover_chips, replayed_segments, earlier_draws, pending_segments,
    coverage_target; the CLI contract) come from the ledger and the registry; the coverage fields given as
    arguments override the file's.
    """
    budget, rules = budget or Budget(), {**DEFAULT_RULES, **(rules or {})}
    report = {
        "checks": {},
        "claims": [],
        "segments": [],
        "threads": torch.get_num_threads(),
        "device": str(device),
        "nonce": nonce.hex(),
        "mismatch_step": None,
        "segments_replayed": [],
        "segments_drawn": [],
        "draw_pool": None,
        "draw_cut": None,
        "segments_total": 0,
        "coverage": 0.0,
        "screen": None,
        "flops": 0.0,
        "steps": 0,
        "rules": {},
    }
    reasons: list[str] = []
    started = time.monotonic()
    problem = float_environment_problem()
    if problem:  # this machine, not the prover, is at fault: retry elsewhere
        return Verdict("error", [f"the verifier's floating-point environment is unfit: {problem}"], report)
    try:  # also this machine's: a worker told REPLAY_DEVICE=cuda on a host without a card, or a budget of 0
        device = limits.resolve_device(str(device))
        limits.check_budget_settings()
    except ValueError as e:
        return Verdict("error", [f"the verifier cannot replay on this machine: {e}"], report)
    report["device"] = str(device)
    try:
        tr = Transcript(transcript, device)
        report.update(manifest=tr.hash, arch=tr.arch, precision=tr.precision)
        # only det64 replays bit for bit on every conforming machine: in a plain precision an honest claim could be
        # rejected and a forged one not told from the machine's noise
        if tr.precision not in CLAIMABLE_PRECISIONS:
            raise MalformedTranscript(
                f"precision {tr.precision!r} is not claimable: its replay depends on the machine's summation "
                f"order and thread count, so no verdict on it could be exact; record with precision "
                f"{' or '.join(CLAIMABLE_PRECISIONS)}"
            )
        report["segments_total"] = len(tr.checkpoints) - 1
        raw = read_json(claims, "claims")
        claim_list = parse_claims(raw, tr)
        context = coverage_context(raw, tr, coverage_target, replayed_segments, earlier_draws, pending_segments)
        never = set(tr.checkpoints[:-1]) - context.replayed
        report["coverage"] = coverage.coverage(context.missed, len(never))
        if raw is not None and raw["manifest"] != tr.hash:
            reasons.append("the claims answer for a different transcript (manifest hash differs)")
        compute, why = count_compute(tr, rules)
        report.update(compute)
        reasons += why
        if snapshots is not None:
            lines = snapshots if isinstance(snapshots, list) else read_lines(snapshots)
            # none given: no keys; a file of null, false, 0, "" or [] is no keys object (malformed), not an empty one
            keys = check_keys({} if chip_keys is None else read_json(chip_keys, "chip keys"))
            lines = [line for line in lines if line.strip()]
            reasons += check_snapshots(lines, keys, claim_list, tr)
            work_from_logs(lines, claim_list)
        why, report["checks"]["chips"] = chips_and_time.check(
            tr.hash,
            tr.layout,
            claim_list,
            chips_and_time.parse_history((raw or {}).get("history")),
            chips_and_time.parse_prover_chips((raw or {}).get("prover_chips")),
            compute["flops_per_step"],
            chips_and_time.parse_run_snapshots((raw or {}).get("run_snapshots")),
            tr.steps,
        )
        report["chip_step_flops"] = chips_and_time.chip_step_flops(tr.layout, compute["flops_per_step"], claim_list)
        reasons += why
        report["conflicts"] = report["checks"]["chips"]["conflicts"][:100]
        if report["checks"]["chips"]["rule"] is not None:  # a broken registry rule is a rule finding
            report["rules"]["layout_registered"] = report["checks"]["chips"]["rule"]
        work = report["checks"]["chips"]["work"]
        report["across_runs_unchecked"] = work["unchecked"]
        if work["pairs_checked"]:  # the firmware's counters account for the claimed steps, or a rule is broken
            report["rules"]["work_accounted"] = {"ok": not work["problems"], "pairs_checked": work["pairs_checked"]}
        if work["problems"]:
            report.setdefault("findings", []).append(
                {
                    "kind": "unaccounted_work",
                    "detail": work["problems"][0],
                    "evidence": {"problems": work["problems"], "tolerance": work["tolerance"]},
                }
            )

        def tick():
            if time.monotonic() - started > budget.max_seconds:
                raise BudgetExhausted(f"time budget ({budget.max_seconds} s) spent")

        try:
            replayer = Replayer(tr, budget, device, started)
        except BeyondThisVerifier:
            try:  # no model, no step: within any worker's means
                reasons += data_commitment_checks(tr, report, tick)
            except BudgetExhausted:  # what was checked decides below; the rest waits for a larger worker
                pass
            if reasons:  # exact evidence that needed no replay still decides (as a spent budget's does)
                report["seconds"] = round(time.monotonic() - started, 3)
                return Verdict("rejected", reasons, report)
            raise
        claims_bytes = canonical_json([{k: v for k, v in c.items() if k != "at"} for c in claim_list])
        seed = coverage.seed(nonce, tr.hash, claims_bytes)
        starts = tr.checkpoints[:-1]
        must = coverage.mandatory(tr.checkpoints, [c["step"] for c in claim_list])
        draw = coverage.draw(
            starts, must, context.replayed, seed, context.target, budget.segments, context.missed, context.pending
        )
        report["draw_pool"] = draw.pool
        try:
            reasons += whole_transcript_checks(tr, report, tick)
            report["checks"]["screen"], why = screen_or_reason(tr, tick)  # reported, not a reason: see screen.py
            report["screen"] = report["checks"]["screen"] and {
                k: report["checks"]["screen"][k] for k in ("checked", "flagged")
            }
            reasons += why
            if report["screen"] and report["screen"]["flagged"]:
                report.setdefault("findings", []).append(
                    {
                        "kind": "screen",
                        "detail": f"no evidence in the losses that checkpoints {report['screen']['flagged'][:20]} "
                        "trained on their declared batches (Proof-of-Training-Data screen)",
                        "evidence": {
                            "flagged": report["screen"]["flagged"][:100],
                            "z": {k: v for k, v in report["checks"]["screen"]["z"].items()},
                        },
                    }
                )
            # the segments that made the claims' starting checkpoints first: a divergence is named where it begins
            reasons += replay_segments(tr, replayer, must, report, store)
            reasons += replay_claims(tr, replayer, claim_list, report)
        except BudgetExhausted as e:  # the mandatory work did not fit: ours to finish later, never a verdict
            report["budget_exhausted"] = True
            report["incomplete"] = f"the replay budget was spent before this claim's own checks were done: {e}"
        if not report.get("budget_exhausted"):
            todo, before = [*draw.carried, *draw.fresh], len(report["segments"])
            try:  # draws add coverage; a budget spent here ends them, it is no finding against anyone
                reasons += replay_segments(tr, replayer, todo, report, store)
            except BudgetExhausted as e:
                report["budget_spent"] = str(e)
                # the draw being replayed when the budget ran out was revealed: the next verification replays it
                # first (pending), so a segment made slow to replay cannot end the draws just before it is checked
                cut = len(report["segments"]) - before
                report["draw_cut"] = todo[cut] if cut < len(todo) else None
        done = {s["start"] for s in report["segments"]}
        drawn = done & set(draw.fresh)  # completed random draws (the budget may end the draws early)
        report["segments_replayed"] = sorted(done)
        report["segments_drawn"] = sorted(drawn)
        missed = context.missed * coverage.missed([(draw.pool, len(drawn))])
        report["coverage"] = coverage.coverage(missed, len(set(starts) - context.replayed - done))
        report["replayed_steps"] = replayer.steps
        report["checks"]["rounding_window"] = {"max_ratio": replayer.max_window, "threshold": REL_WINDOW}
    except MalformedTranscript as e:
        report["seconds"] = round(time.monotonic() - started, 3)
        return Verdict("malformed", [e.reason], report)
    except BeyondThisVerifier as e:
        return _beyond_this_verifier(e, report)
    except CommitmentMismatch as e:
        reasons.append(str(e))
    report["seconds"] = round(time.monotonic() - started, 3)
    if reasons:  # exact evidence found before any budget ran out still decides
        return Verdict("rejected", reasons, report)
    if report.get("budget_exhausted"):
        return Verdict("incomplete", [report["incomplete"]], report)
    return Verdict("verified", reasons, report)
