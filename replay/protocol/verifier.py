"""The verifier: replay what the prover committed to, compare bits, check the rules.

    verify(transcript_dir, claims, Budget(max_seconds=60), nonce=b"...") -> Verdict

1. The manifest (the commitment) is validated; every file read later must match its hash.
2. Compute is counted from the architecture and the batch shapes, never taken from the prover:
   FLOPs, steps, examples, tokens; each rule gets a verdict, and a declaration below the count is
   under-reporting.
3. Claims (chip serial, counter, shard, hash, step, time) are checked against the chips' signed
   snapshot logs, their history and the registry's chips (chips.py: order, pace, layout), then each
   claimed step is replayed from the nearest earlier checkpoint and the shard's SHA-256 compared
   bit-exactly.
4. Segments (coverage.py) -- the one that produced each claim's starting checkpoint, then fresh ones
   drawn from the verifier's nonce until the run's coverage target is met -- are replayed from their
   checkpoint and compared bit-exactly, all parameters and optimizer state, with the next checkpoint.
5. Cheap whole-transcript checks: every data commitment, the seed-derived initial weights, update
   sizes against the learning-rate schedule (and no straight-line stretches: interpolated
   checkpoints), the loss trending down.
A replay mismatch with a prover's store at hand goes to dispute bisection (bisect.py).

Verdict: "verified" only if every check ran and passed within the budget; "malformed" for input
that is not a transcript; "rejected" otherwise, with reasons.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from nacl.signing import VerifyKey

from replay.protocol import chips, coverage, hashing
from replay.protocol.bisect import bits_equal, dispute, divergence_from_commitments, first_differing_tensor
from replay.protocol.engine import Budget, BudgetExhausted, Mismatch, Replayer
from replay.protocol.firmware import parse_record, verify_log
from replay.protocol.report import Report
from replay.protocol.screen import screen_or_reason
from replay.protocol.trajectory import trajectory_checks
from replay.protocol.transcript import CommitmentMismatch, MalformedTranscript, Transcript, canonical_json
from replay.training import architectures as models
from replay.training.determinism import REL_WINDOW
from replay.training.fenv import float_environment_problem
from replay.training.train import initial_state

DEFAULT_RULES = {"max_training_flops": 1e26}
# Only det64 replays bit for bit on every conforming machine (thread count, kernel, CPU). float32 (or any
# plain precision) depends on summation order: an honest claim could be rejected and a forged one could
# not be told from machine noise, so such transcripts are refused as not claimable (malformed).
CLAIMABLE_PRECISIONS = ("det64",)
DEFAULT_COVERAGE = 0.9
CLAIMS_KEYS = {"manifest", "claims"}
CLAIM_KEYS = {"serial", "counter", "shard", "hash", "step"}
CLAIMS_OPTIONAL = {"history", "prover_chips", "replayed_segments", "coverage_target", "run_snapshots"}
MAX_CLAIMS = 100_000


@dataclass
class Verdict:
    verdict: str
    reasons: list[str] = field(default_factory=list)
    details: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"verdict": self.verdict, "reasons": self.reasons, **self.details}

    @property
    def report(self) -> Report:
        """The typed report (replay.protocol.report): what the regulator's side records."""
        return Report.from_json(self.to_json())


def _json(obj_or_path, what: str):
    if obj_or_path is None or isinstance(obj_or_path, (dict, list)):
        return obj_or_path
    try:
        return json.loads(Path(obj_or_path).read_bytes()[: 64 << 20].decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise MalformedTranscript(f"{what} is not readable JSON ({type(e).__name__})") from None


def _lines(path) -> list[str]:
    try:
        return Path(path).read_bytes()[: 64 << 20].decode("utf-8", errors="replace").splitlines()
    except OSError as e:
        raise MalformedTranscript(f"snapshots are not readable ({type(e).__name__})") from None


def _claims(raw, tr: Transcript) -> list[dict]:
    if raw is None:
        return []
    if (
        not isinstance(raw, dict)
        or not CLAIMS_KEYS <= set(raw) <= CLAIMS_KEYS | CLAIMS_OPTIONAL
        or not isinstance(raw["claims"], list)
    ):
        raise MalformedTranscript('claims must be {"manifest": <hash>, "claims": [...]} (optional: history, ...)')
    if len(raw["claims"]) > MAX_CLAIMS:
        raise MalformedTranscript(f"more than {MAX_CLAIMS} claims")
    shard_of = {s["serial"]: i for i, s in enumerate(tr.layout)}
    out = []
    for i, c in enumerate(raw["claims"]):
        # time is part of the contract; a caller that omits it loses the order and pace checks of that
        # claim (reported as untimed), never the replay
        if not isinstance(c, dict) or not CLAIM_KEYS <= set(c) <= CLAIM_KEYS | {"time"} | chips.WORK_KEYS:
            raise MalformedTranscript(f"claims[{i}] must have serial, counter, shard, hash, step, time")
        chips.check_work(c, f"claims[{i}]")
        if not all(type(c[k]) is int for k in ("counter", "shard", "step")) or not isinstance(c["hash"], str):
            raise MalformedTranscript(f"claims[{i}] has fields of the wrong type")
        if c["serial"] not in shard_of or c["shard"] != shard_of[c["serial"]]:
            raise MalformedTranscript(
                f"claims[{i}]: chip {str(c['serial'])[:64]!r} does not hold shard {c['shard']} in the layout"
            )
        if not 0 <= c["step"] <= tr.steps:
            raise MalformedTranscript(f"claims[{i}]: step {c['step']} outside the run (0..{tr.steps})")
        out.append({**c, "at": chips.parse_time(c["time"], f"claims[{i}].time") if "time" in c else None})
    return out


def _context(raw, tr: Transcript, coverage_target, replayed_segments) -> tuple[float, set[int]]:
    """(coverage target, segments of this run replayed earlier): arguments win over the claims file's fields."""
    raw = raw or {}
    target = raw.get("coverage_target", DEFAULT_COVERAGE) if coverage_target is None else coverage_target
    if type(target) not in (int, float) or not 0 <= target <= 1:
        raise MalformedTranscript("coverage_target must be a number in [0, 1]")
    earlier = raw.get("replayed_segments", []) if replayed_segments is None else replayed_segments
    starts = set(tr.checkpoints[:-1])
    if not isinstance(earlier, list) or not all(type(s) is int and s in starts for s in earlier):
        raise MalformedTranscript("replayed_segments must list start steps of this run's segments")
    return float(target), set(earlier)


def _check_snapshots(lines: list[str], keys: dict, claims: list[dict], tr: Transcript) -> list[str]:
    """The chips' signed logs must be intact, and every snapshot claimed with the same hash (and vice versa)."""
    reasons, by_serial = [], {}
    serials = {s["serial"] for s in tr.layout}
    for n, line in enumerate(lines):
        try:
            serial = parse_record(line)["serial"]
        except ValueError as e:
            reasons.append(f"snapshots line {n}: malformed ({e})")
            continue
        if serial not in serials:
            reasons.append(f"snapshots line {n}: chip {serial[:64]!r} is not in the transcript's shard layout")
            continue
        by_serial.setdefault(serial, []).append(line)
    claimed = {(c["serial"], c["counter"]): c for c in claims}
    logged = set()
    for serial, chip_lines in sorted(by_serial.items()):
        try:
            key = base64.b64decode(keys[serial], validate=True)
            VerifyKey(key)
        except (KeyError, TypeError, ValueError, binascii.Error):
            reasons.append(f"chip {serial}: no usable public key to check its log")
            continue
        for p in verify_log(chip_lines, key, serial=serial):
            reasons.append(
                f"chip {serial}: {p['kind']} at its log line {p['line']} (counter {p['counter']}): {p['detail']}"
            )
        for line in chip_lines:
            rec = json.loads(line)
            logged.add((serial, rec["counter"]))
            c = claimed.get((serial, rec["counter"]))
            if c is None:
                reasons.append(f"snapshot {serial}#{rec['counter']} is not explained by any claim")
            elif c["hash"] != rec["hash"]:
                reasons.append(
                    f"claim {serial}#{rec['counter']} quotes hash {c['hash'][:16]}..., the chip logged {rec['hash'][:16]}..."
                )
            elif c.get("time", rec["time"]) != rec["time"]:
                reasons.append(
                    f"claim {serial}#{rec['counter']} quotes time {c['time']}, the chip logged {rec['time']}"
                )
    for key in sorted(set(claimed) - logged):
        reasons.append(f"claim {key[0]}#{key[1]} has no logged snapshot")
    return reasons


def _work_from_logs(lines: list[str], claims: list[dict]) -> None:
    """The work counters of each claimed snapshot, from the chip's signed log (the log, checked above, is the
    authority; a claims file's own counters are replaced by the signed ones)."""
    by_key = {(c["serial"], c["counter"]): c for c in claims}
    for line in lines:
        try:
            rec = parse_record(line)
        except ValueError:
            continue
        c = by_key.get((rec["serial"], rec["counter"]))
        if c is not None and "flops" in rec:
            c["flops"], c["busy_ns"] = rec["flops"], rec["busy_ns"]


def _compute(tr: Transcript, rules: dict) -> tuple[dict, list[str]]:
    spec = tr.spec
    per_step = models.training_flops(tr.arch, tr.config, spec)
    total = per_step * tr.steps
    batch = spec["x"][1][0]
    out = {
        "flops_per_step": per_step,
        "flops": total,
        "steps": tr.steps,
        "examples": tr.steps * batch,
        "tokens": tr.steps * batch * spec["x"][1][1] if tr.arch == "gpt" else None,
        "reported_flops": tr.manifest["reported_flops"],
        "rules": {},
    }
    reasons = []
    limit = rules["max_training_flops"]
    ok = total <= limit
    out["rules"]["max_training_flops"] = {"threshold": limit, "value": total, "ok": ok}
    if not ok:
        reasons.append(f"rule violated: training compute {total:.3e} FLOPs exceeds the threshold {limit:.3e}")
    ok = tr.manifest["reported_flops"] >= total
    out["rules"]["compute_reported"] = {"reported": tr.manifest["reported_flops"], "counted": total, "ok": ok}
    if not ok:
        reasons.append(
            f"compute under-reported: declared {tr.manifest['reported_flops']:.3e} FLOPs, "
            f"the architecture and batch shapes give {total:.3e}"
        )
    return out, reasons


def _whole_transcript_checks(tr: Transcript, report: dict, tick) -> list[str]:
    """Data commitments, seed-derived init, update sizes vs. the LR schedule, loss trend. tick() enforces the budget."""
    reasons = []
    for start in tr.checkpoints[:-1]:
        tick()
        try:
            tr.segment(start)
        except CommitmentMismatch as e:
            reasons.append(str(e))
    report["checks"]["data_commitments"] = not reasons

    first = tr.checkpoint(0)
    init = initial_state(models.init_params(tr.arch, tr.config, tr.manifest["seed"]), tr.manifest["optimizer"])
    ok = bits_equal(first, init)
    report["checks"]["initialisation"] = ok
    if not ok:
        reasons.append("the checkpoint at step 0 is not the initialisation derived from the committed seed")

    reasons += trajectory_checks(tr, report, tick)

    losses = [r["loss"] for r in tr.manifest["records"]]
    q = max(1, len(losses) // 4)
    head, tail = sum(losses[:q]) / q, sum(losses[-q:]) / q
    # informational only: a schedule the manifest allows may barely move the weights (the screen tests learning)
    report["checks"]["loss_trend"] = {"ok": tail < head, "first_quarter": head, "last_quarter": tail}
    if not tail < head:
        report.setdefault("findings", []).append(
            {
                "kind": "loss_trend",
                "detail": "the loss did not go down from the run's first quarter to its last",
                "evidence": {"first_quarter": head, "last_quarter": tail},
            }
        )
    return reasons


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
) -> Verdict:
    """Verify a transcript directory against claims (a dict or a path to claims.json). See the module docstring.

    The claims' optional fields (history, prover_chips, replayed_segments, coverage_target; the CLI
    contract) come from the ledger and the registry; the keyword arguments override the last two.
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
    try:
        tr = Transcript(transcript)
        report.update(manifest=tr.hash, arch=tr.arch, precision=tr.precision)
        if tr.precision not in CLAIMABLE_PRECISIONS:
            raise MalformedTranscript(
                f"precision {tr.precision!r} is not claimable: its replay depends on the machine's summation "
                f"order and thread count, so no verdict on it could be exact; record with precision "
                f"{' or '.join(CLAIMABLE_PRECISIONS)}"
            )
        report["segments_total"] = len(tr.checkpoints) - 1
        raw = _json(claims, "claims")
        claim_list = _claims(raw, tr)
        target, earlier = _context(raw, tr, coverage_target, replayed_segments)
        report["coverage"] = coverage.coverage(tr.checkpoints[:-1], earlier)
        if raw is not None and raw["manifest"] != tr.hash:
            reasons.append("the claims answer for a different transcript (manifest hash differs)")
        compute, why = _compute(tr, rules)
        report.update(compute)
        reasons += why
        if snapshots is not None:
            lines = snapshots if isinstance(snapshots, list) else _lines(snapshots)
            keys = _json(chip_keys, "chip keys") or {}
            if not isinstance(keys, dict):
                raise MalformedTranscript("chip keys must be an object {serial: base64 public key}")
            lines = [line for line in lines if line.strip()]
            reasons += _check_snapshots(lines, keys, claim_list, tr)
            _work_from_logs(lines, claim_list)
        why, report["checks"]["chips"] = chips.check(
            tr.hash,
            tr.layout,
            claim_list,
            chips.parse_history((raw or {}).get("history")),
            chips.parse_prover_chips((raw or {}).get("prover_chips")),
            compute["flops_per_step"],
            chips.parse_run_snapshots((raw or {}).get("run_snapshots")),
        )
        reasons += why
        report["conflicts"] = report["checks"]["chips"]["conflicts"][:100]
        if report["checks"]["chips"]["rule"] is not None:  # a broken registry rule is a rule finding
            report["rules"]["layout_registered"] = report["checks"]["chips"]["rule"]
        work = report["checks"]["chips"]["work"]
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

        replayer = Replayer(tr, budget, device, started)
        claims_bytes = canonical_json([{k: v for k, v in c.items() if k != "at"} for c in claim_list])
        seed = coverage.seed(nonce, tr.hash, claims_bytes)
        starts = tr.checkpoints[:-1]
        must = coverage.mandatory(tr.checkpoints, [c["step"] for c in claim_list])
        fresh = coverage.plan(starts, must, earlier, seed, target, budget.segments)[len(must) :]
        try:
            reasons += _whole_transcript_checks(tr, report, tick)
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
            reasons += _replay_segments(tr, replayer, must, report, store)
            reasons += _replay_claims(tr, replayer, claim_list, report)
        except BudgetExhausted as e:  # the mandatory work did not fit: ours to finish later, never a verdict
            report["budget_exhausted"] = True
            report["incomplete"] = f"the replay budget was spent before this claim's own checks were done: {e}"
        if not report.get("budget_exhausted"):
            try:  # fresh draws add coverage; a budget spent here ends them, it is no finding against anyone
                reasons += _replay_segments(tr, replayer, fresh, report, store)
            except BudgetExhausted as e:
                report["budget_spent"] = str(e)
        done = {s["start"] for s in report["segments"]}
        report["segments_replayed"] = sorted(done)
        report["coverage"] = coverage.coverage(starts, earlier | done)
        report["replayed_steps"] = replayer.steps
        report["checks"]["rounding_window"] = {"max_ratio": replayer.max_window, "threshold": REL_WINDOW}
    except MalformedTranscript as e:
        report["seconds"] = round(time.monotonic() - started, 3)
        return Verdict("malformed", [e.reason], report)
    except CommitmentMismatch as e:
        reasons.append(str(e))
    report["seconds"] = round(time.monotonic() - started, 3)
    if reasons:  # exact evidence found before any budget ran out still decides
        return Verdict("rejected", reasons, report)
    if report.get("budget_exhausted"):
        return Verdict("incomplete", [report["incomplete"]], report)
    return Verdict("verified", reasons, report)


def _replay_claims(tr: Transcript, replayer: Replayer, claims: list[dict], report: dict) -> list[str]:
    reasons, by_start = [], {}
    for c in claims:  # strictly earlier checkpoint: a claim at a checkpoint step replays the segment before it
        by_start.setdefault(tr.segment_start(max(c["step"] - 1, 0)), []).append(c)
    for start, group in sorted(by_start.items()):
        until = max(c["step"] for c in group)
        hashes = {}

        def each(state):
            if any(c["step"] == state.step for c in group):
                hashes[state.step] = hashing.shard_hashes(state.params, tr.layout)

        try:
            replayer.run(start, until, each)
        except (Mismatch, CommitmentMismatch) as e:
            reasons.append(f"replay from checkpoint {start} failed: {e}")
            if isinstance(e, Mismatch) and report["mismatch_step"] is None:
                report["mismatch_step"] = e.step
            if isinstance(e, Mismatch) and "dispute" not in report:
                report["dispute"] = divergence_from_commitments(start, until, e, None, None, first_differing_tensor)
            continue
        for c in group:
            ok = hashes[c["step"]][c["shard"]] == c["hash"]
            report["claims"].append({"serial": c["serial"], "counter": c["counter"], "step": c["step"], "ok": ok})
            if not ok:
                reasons.append(
                    f"claim {c['serial']}#{c['counter']}: shard {c['shard']} at step {c['step']} replays to "
                    f"{hashes[c['step']][c['shard']][:16]}..., not the claimed {c['hash'][:16]}..."
                )
    return reasons


def _replay_segments(tr: Transcript, replayer: Replayer, todo: list[int], report: dict, store) -> list[str]:
    reasons = []
    for start in todo:
        end = tr.next_checkpoint(start)
        failure, replayed = None, None
        try:
            replayed = replayer.run(start, end)
            ok = bits_equal(replayed, tr.checkpoint(end))
            what = f"replayed state at step {end} differs from its checkpoint"
            if not ok and report["mismatch_step"] is None:
                report["mismatch_step"] = end
        except (Mismatch, CommitmentMismatch) as e:
            ok, what, failure = False, str(e), e
            if isinstance(e, Mismatch) and report["mismatch_step"] is None:
                report["mismatch_step"] = e.step
        report["segments"].append({"start": start, "end": end, "ok": ok})
        if not ok:
            reasons.append(f"segment {start}..{end}: {what}")
            if "dispute" not in report and not isinstance(failure, CommitmentMismatch):
                report["dispute"] = _dispute(tr, start, end, store, replayer, failure, replayed)
    return reasons


def _dispute(tr: Transcript, start: int, end: int, store, replayer, failure, replayed) -> dict:
    """First divergent step and operation of a failed segment: against the prover's store when one answers
    (Verde's refereed bisection), else against the transcript's own per-step commitments (bisect.py)."""
    if store is not None:
        try:
            return dispute(tr, start, end, store, replayer)
        except (BudgetExhausted, MalformedTranscript, CommitmentMismatch):
            raise
        except Exception as e:
            return {"error": f"the prover's store failed: {type(e).__name__}: {str(e)[:200]}"}
    checkpoint = None if replayed is None else tr.checkpoint(end)
    return divergence_from_commitments(start, end, failure, replayed, checkpoint, first_differing_tensor)
