"""Claims tied to chips and time: what the verifier checks beyond the bits (docs/transcripts.md).

The claims file brings, from the ledger and the registry (never from the prover): each claim's
snapshot `time`, each chip's `history` (its earlier claims, any run) and `prover_chips` (the chips
the registry says the prover holds, with their peak dense 16-bit FLOP/s). Per chip, over its
history and this run's claims together, in time order:

* one counter is one snapshot: the same counter claimed with a different step, time or run is refused;
* counters increase with time (a chip's counter is monotonic);
* within one run the step never goes down as time goes on;
* two runs never share a chip at overlapping times (this run's time span against each other run's);
* pace: between two snapshots of this run, (step difference) x FLOPs per step <= elapsed seconds x
  the summed peak FLOP/s of the chips that did the work: a non-empty shard, and snapshots of this run
  logged around that interval (this chip's history, the claims, and `run_snapshots` from the ledger);
  an idle chip named with an empty shard logs nothing of the run and adds nothing (skipped when
  prover_chips is absent).

* work: the FLOPs the chip's firmware counted between consecutive snapshots of this run match the claimed
  steps; between a snapshot of this run and the chip's adjacent snapshot of another run they are at most the
  rest of the earlier run and the start of the later one (the other run's figures from `history`).

And the layout's working chips must be the prover's in the registry as it was at the run's time
(`prover_chips`: the chips it holds now and the chips whose snapshots it answered): a rule, reported as
a rule finding, not a replay mismatch. A chip sold or decommissioned after the run changes nothing.

Every reason that involves another claim (by counter) is also listed in report["conflicts"], so the
ledger can record the conflict on both claims whatever order they were filed and answered in.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left, bisect_right
from datetime import UTC, datetime
from fractions import Fraction
from itertools import accumulate

from replay.protocol.firmware import is_digest
from replay.protocol.transcript_errors import MalformedTranscript

MAX_HISTORY = 1_000_000
# The work the firmware counted between two snapshots of a run must be the FLOPs of the steps between them
# (the chip's shard's share of models.training_flops) within this relative tolerance; a parked chip (the
# step stands still) may count at most this fraction of one step. The simulator counts exactly; real
# firmware counting executed FLOPs (recomputation, communication kernels) calibrates its own overhead into
# what it reports per step. Tighter than 2x, so two-fold hidden work never hides in it.
WORK_TOLERANCE = 0.25
TIME_RESOLUTION_SECONDS = 1  # snapshot times are signed in whole seconds
MAX_WORK = 2**128 - 1
MAX_UNCHECKED = 100  # pairs across runs named in a report (a claim has at most two per chip)
_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?Z")


def parse_time(v, what: str) -> datetime:
    """RFC 3339 UTC ('Z', optional fraction up to microseconds) -> aware datetime; MalformedTranscript otherwise."""
    if not isinstance(v, str) or not _TIME.fullmatch(v):
        raise MalformedTranscript(f"{what} must be an RFC 3339 UTC time (YYYY-MM-DDTHH:MM:SS[.ffffff]Z)")
    try:
        return datetime.fromisoformat(v[:-1]).replace(tzinfo=UTC)
    except ValueError:
        raise MalformedTranscript(f"{what} is not a calendar time") from None


def parse_history(raw) -> dict[str, list[dict]]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise MalformedTranscript("history must be an object {serial: [earlier claims]}")
    out, total = {}, 0
    for serial, items in raw.items():
        if not isinstance(items, list):
            raise MalformedTranscript(f"history[{serial[:64]!r}] must be a list")
        total += len(items)
        if total > MAX_HISTORY:
            raise MalformedTranscript(f"history holds more than {MAX_HISTORY} claims")
        rows = []
        for i, h in enumerate(items):
            what = f"history[{serial[:64]!r}][{i}]"
            base = {"counter", "time", "step", "run", "manifest"}
            if not isinstance(h, dict) or not base <= set(h) <= base | WORK_KEYS | RUN_KEYS:
                raise MalformedTranscript(
                    f"{what} must have counter, time, step, run, manifest (and busy_ns, flops, run_steps, "
                    "chip_step_flops)"
                )
            check_work(h, what)
            check_run_figures(h, what)
            if type(h["counter"]) is not int or type(h["step"]) is not int or h["counter"] < 0 or h["step"] < 0:
                raise MalformedTranscript(f"{what}: counter and step must be non-negative integers")
            if not is_digest(h["manifest"]):
                raise MalformedTranscript(f"{what}.manifest must be 64 lowercase hex digits")
            rows.append({**h, "at": parse_time(h["time"], f"{what}.time")})
        out[serial] = rows
    return out


WORK_KEYS = {"busy_ns", "flops"}
# The other run's figures as our verifier counted them from its committed manifest (never the prover's word):
# its length and the FLOPs one step costs this chip's shard. They account the work across two runs.
RUN_KEYS = {"run_steps", "chip_step_flops"}


def check_run_figures(h: dict, what: str) -> None:
    """A history row's run figures, when given: both, a step count and a finite non-negative FLOP figure."""
    present = [k for k in RUN_KEYS if h.get(k) is not None]
    if present and len(present) != 2:
        raise MalformedTranscript(f"{what}: run_steps and chip_step_flops come together")
    if present:
        steps, flops = h["run_steps"], h["chip_step_flops"]
        if type(steps) is not int or not 0 <= steps <= 10**12:
            raise MalformedTranscript(f"{what}.run_steps must be an integer in 0..10^12")
        if type(flops) not in (int, float) or not math.isfinite(flops) or not 0 <= flops <= 1e30:
            raise MalformedTranscript(f"{what}.chip_step_flops must be a number in [0, 1e30]")


def check_work(c: dict, what: str) -> None:
    """A snapshot's work counters, when given: both, integers in 0..2^128-1 (null: firmware that does not count)."""
    present = [k for k in WORK_KEYS if c.get(k) is not None]
    if present and len(present) != 2:
        raise MalformedTranscript(f"{what}: busy_ns and flops come together")
    for k in present:
        if type(c[k]) is not int or not 0 <= c[k] <= MAX_WORK:
            raise MalformedTranscript(f"{what}.{k} must be an integer in 0..2^128-1")


def parse_prover_chips(raw) -> dict[str, float] | None:
    """{serial: peak FLOP/s} or None when the registry's view was not given."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise MalformedTranscript("prover_chips must be an object {serial: {model, peak_flops_16bit}}")
    out = {}
    for serial, c in raw.items():
        if not isinstance(c, dict) or not {"peak_flops_16bit"} <= set(c) <= {"model", "peak_flops_16bit"}:
            raise MalformedTranscript(f"prover_chips[{serial[:64]!r}] must be {{model, peak_flops_16bit}}")
        p = c["peak_flops_16bit"]
        if type(p) not in (int, float) or not math.isfinite(p) or not 0 < p <= 1e21:
            raise MalformedTranscript(f"prover_chips[{serial[:64]!r}].peak_flops_16bit must be a number in (0, 1e21]")
        out[serial] = float(p)
    return out


def parse_run_snapshots(raw) -> dict[str, list[datetime]]:
    """{serial: [times]} of this run's snapshots on every chip (the ledger's claims of this manifest)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise MalformedTranscript("run_snapshots must be an object {serial: [times]}")
    out, total = {}, 0
    for serial, times in raw.items():
        if not isinstance(times, list):
            raise MalformedTranscript(f"run_snapshots[{serial[:64]!r}] must be a list of times")
        total += len(times)
        if total > MAX_HISTORY:
            raise MalformedTranscript(f"run_snapshots holds more than {MAX_HISTORY} times")
        out[serial] = [parse_time(t, f"run_snapshots[{serial[:64]!r}][]") for t in times]
    return out


def check(
    run: str,
    layout: list[dict],
    claims: list[dict],
    history: dict,
    prover_chips,
    flops_per_step: float,
    run_snapshots: dict | None = None,
    steps: int | None = None,
) -> tuple[list[str], dict]:
    """Reasons to reject (empty if none) and a report. `run` is this transcript's manifest hash.

    report["rule"]: the layout rule ({"ok", ...}: a broken rule, not a replay mismatch); report["conflicts"]:
    the other claims (by counter) a reason involves, so the ledger can record the conflict on both."""
    reasons = []
    working = [s["serial"] for s in layout if s["end"] > s["start"]]  # an empty shard does no work
    rule = None
    if prover_chips is not None:
        foreign = [s for s in working if s not in prover_chips]
        rule = {"ok": not foreign, "unregistered": len(foreign)}
        if foreign:
            reasons.append(
                f"rule violated: the shard layout names {len(foreign)} working chip(s) the registry does not list "
                f"for the prover at the run's time, e.g. {foreign[0][:64]!r}"
            )
    share = {s["serial"]: (s["end"] - s["start"]) / max(1, layout[-1]["end"]) for s in layout}
    events: dict[str, list[dict]] = {}
    for serial, rows in history.items():
        ours = {"run_steps": steps, "chip_step_flops": flops_per_step * share.get(serial, 0.0)}
        events.setdefault(serial, []).extend(
            {**h, **(ours if h["manifest"] == run else {}), "run": h["manifest"], "mine": False} for h in rows
        )
    untimed = sum(c["at"] is None for c in claims)
    for c in claims:
        if c["at"] is None:
            continue
        events.setdefault(c["serial"], []).append(
            {
                "counter": c["counter"],
                "step": c["step"],
                "at": c["at"],
                "time": c["time"],
                "run": run,
                "mine": True,
                "flops": c.get("flops"),
                "run_steps": steps,
                "chip_step_flops": flops_per_step * share.get(c["serial"], 0.0),
            }
        )
    spans = _run_spans(run, events, run_snapshots or {}, set(working))
    peaks = None if prover_chips is None else {s: prover_chips.get(s, 0.0) for s in working}
    capacity = None if peaks is None else _Capacity(peaks, spans)
    bottleneck = None if prover_chips is None else _bottleneck(prover_chips, share, working)
    conflicts: list[dict] = []
    for serial, evs in sorted(events.items()):
        why, involved = _chip(serial[:64], evs, run, capacity, flops_per_step, bottleneck)
        reasons += why
        conflicts += involved
    unaccounted, counted = [], {"pairs": 0, "across_runs": 0, "across_runs_unchecked": 0, "unchecked": []}
    for serial, evs in sorted(events.items()):
        why, involved, pairs = _work(serial[:64], evs, run, share.get(serial, 0.0), flops_per_step)
        reasons += why
        conflicts += involved
        unaccounted += why
        for k, n in pairs.items():
            counted[k] += n
    report = {
        "work": {
            "pairs_checked": counted["pairs"],
            "across_runs": counted["across_runs"],
            "across_runs_unchecked": counted["across_runs_unchecked"],
            # which pairs: the regulator's side re-checks them once both runs have figures of ours (docs/claims.md §4)
            "unchecked": counted["unchecked"][:MAX_UNCHECKED],
            "tolerance": WORK_TOLERANCE,
            "problems": unaccounted[:20],
        },
        "chips": len(events),
        "pace_checked": peaks is not None,
        "peak_flops": None if peaks is None else sum(peaks.values()),
        "untimed": untimed,
        "rule": rule,
        "conflicts": conflicts,
    }
    return reasons, report


def _run_spans(run: str, events: dict, run_snapshots: dict, working: set) -> dict[str, tuple]:
    """(first, last) time each working chip logged a snapshot of this run: a chip counts towards the pace
    only over the time it demonstrably worked on the run (an idle chip logs nothing of it)."""
    times: dict[str, list] = {s: list(run_snapshots.get(s, [])) for s in working}
    for serial, evs in events.items():
        if serial in times:
            times[serial] += [e["at"] for e in evs if e["run"] == run]
    return {s: (min(t), max(t)) for s, t in times.items() if t}


class _Capacity:
    """FLOP/s of the working chips that logged snapshots of this run around [a, b] (their span meets it), a <= b: all of
    them, less those whose span ended before a, less those whose span began after b (no span does both). Sorted once,
    each question two bisections, where summing every chip for every pair of a chip's snapshots took (snapshots x
    chips): 58 s for 4,096 chips' 98,304 claims, past any --max-seconds. Summed exactly (the floats as Fractions) and
    rounded once, so the figure is the same in any order of the chips."""

    def __init__(self, peaks: dict, spans: dict):
        held = [(spans[s], Fraction(p)) for s, p in peaks.items() if s in spans]
        self.total = sum((p for _, p in held), Fraction(0))
        self.lasts, self.ended = _sorted_sums([(span[1], p) for span, p in held])
        self.firsts, self.begun = _sorted_sums([(span[0], p) for span, p in held])

    def __call__(self, a, b) -> float:
        ended_before_a = self.ended[bisect_left(self.lasts, a)]
        begun_after_b = self.total - self.begun[bisect_right(self.firsts, b)]
        return float(self.total - ended_before_a - begun_after_b)


def _sorted_sums(points: list) -> tuple[list, list]:
    """(the times sorted, sums[i]: the sum of the first i weights in that order) of [(time, weight)]."""
    points.sort(key=lambda tp: tp[0])
    return [t for t, _ in points], list(accumulate((p for _, p in points), initial=Fraction(0)))


def _bottleneck(prover_chips: dict, share: dict, working: list[str]) -> tuple[str, float] | None:
    """(serial, FLOP/s of the whole step) of the working chip that limits the run's pace: every step needs each
    shard's share of its FLOPs, done by the chip holding it at no more than its peak, so the run steps at most at
    min(peak / share) of its registered working chips (a chip holding a sliver of the model adds nothing to the
    pace of the chips holding the rest: a fast chip padded in with one parameter is no capacity). Unregistered
    chips are a broken rule, checked apart."""
    rates = [(prover_chips[s] / share[s], s) for s in working if s in prover_chips and share.get(s, 0.0) > 0]
    if not rates:
        return None
    rate, serial = min(rates)
    return serial, rate


def _chip(
    serial: str, evs: list[dict], run: str, capacity, flops_per_step: float, bottleneck=None
) -> tuple[list[str], list]:
    reasons, seen, uniq, conflicts = [], {}, [], []

    def involve(kind: str, detail: str, *pair) -> None:
        reasons.append(detail)
        for e in pair:
            if not e.get("mine") and type(e.get("counter")) is int:
                conflicts.append({"counter": e["counter"], "kind": kind, "detail": detail})

    for e in evs:
        key = (e["step"], e["at"], e["run"])
        if e["counter"] in seen:
            if seen[e["counter"]][0] != key:  # the same snapshot reported twice is not a second claim
                involve(
                    "counter",
                    f"chip {serial}: counter {e['counter']} is claimed for two different snapshots",
                    e,
                    seen[e["counter"]][1],
                )
            continue
        seen[e["counter"]] = (key, e)
        uniq.append(e)
    uniq.sort(key=lambda e: (e["at"], e["counter"]))
    for a, b in zip(uniq, uniq[1:]):
        if b["counter"] < a["counter"] and b["at"] > a["at"]:
            involve(
                "counter", f"chip {serial}: counter {b['counter']} at {b['time']} is after counter {a['counter']}", a, b
            )
    mine = [e for e in uniq if e["run"] == run]
    for a, b in zip(mine, mine[1:]):
        if b["step"] < a["step"]:
            involve(
                "order",
                f"chip {serial}: step {b['step']} at {b['time']} comes after step {a['step']} at {a['time']}",
                a,
                b,
            )
        elif capacity is not None and b["step"] > a["step"]:
            need = (b["step"] - a["step"]) * flops_per_step
            can = _elapsed(a, b) * capacity(a["at"], b["at"])
            if need > can:
                involve(
                    "pace",
                    f"chip {serial}: steps {a['step']}..{b['step']} need {need:.3e} FLOPs between {a['time']} and "
                    f"{b['time']}, more than the working chips that logged this run can do ({can:.3e})",
                    a,
                    b,
                )
            elif bottleneck is not None and need > _elapsed(a, b) * bottleneck[1]:
                slow, rate = bottleneck
                involve(
                    "pace",
                    f"chip {serial}: steps {a['step']}..{b['step']} need {need:.3e} FLOPs between {a['time']} and "
                    f"{b['time']}; chip {slow[:64]} must do its shard's share of every step, so the run can do at "
                    f"most {_elapsed(a, b) * rate:.3e} (its peak over its share)",
                    a,
                    b,
                )
    if mine:
        lo, hi = mine[0]["at"], mine[-1]["at"]
        others: dict[str, list] = {}
        for e in uniq:
            if e["run"] != run:
                others.setdefault(e["run"], []).append(e)
        for other, evs_other in sorted(others.items()):
            inside = [e for e in evs_other if lo <= e["at"] <= hi]
            a, b = min(e["at"] for e in evs_other), max(e["at"] for e in evs_other)
            if a <= hi and lo <= b:
                involve(
                    "overlap",
                    f"chip {serial}: run {other[:16]}... used it at overlapping times (e.g. {evs_other[0]['time']})",
                    *(inside or evs_other),
                )
    return reasons, conflicts


def _elapsed(a: dict, b: dict) -> float:
    """The most time that can have passed between two signed snapshot times: the firmware signs whole seconds
    (firmware.py), so two snapshots logged in the same second may lie up to a second apart."""
    return (b["at"] - a["at"]).total_seconds() + TIME_RESOLUTION_SECONDS


def _work(serial: str, evs: list[dict], run: str, share: float, flops_per_step: float) -> tuple[list, list, dict]:
    """Work the chip's firmware counted between consecutive snapshots against the FLOPs of the steps between
    them (its shard's share): within this run, more is unaccounted work, less is work claimed but not done, and
    a parked chip (the step stands still) counts nothing; between this run and another (no snapshot of the chip
    in between), more than the rest of the earlier run and the start of the later one is unaccounted work.
    (reasons, conflicts, {"pairs", "across_runs", "across_runs_unchecked", "unchecked": [{serial, counters}]})."""
    by_counter = {}
    for e in evs:
        if e.get("flops") is not None:
            by_counter.setdefault(e["counter"], e)
    ordered = [by_counter[c] for c in sorted(by_counter)]
    if ordered and ordered[0]["counter"] == 0 and ordered[0]["run"] == run:
        # the chip's first record ever: its counters count from fabrication, so everything it did before that
        # snapshot must be this run's steps so far (work before a chip's first snapshot hides nowhere)
        ordered.insert(0, {"counter": -1, "flops": 0, "step": 0, "run": run, "mine": True})
    reasons, conflicts, pairs = [], [], {"pairs": 0, "across_runs": 0, "across_runs_unchecked": 0, "unchecked": []}
    seen_runs: set[str] = set()
    for a, b in zip(ordered, ordered[1:]):
        first_of_run = b["run"] not in seen_runs and b["run"] != a["run"]
        seen_runs.add(a["run"])
        if a["run"] != b["run"]:
            if run in (a["run"], b["run"]):
                flops_b = flops_per_step * share if b["run"] == run else b.get("chip_step_flops")
                detail = _across_runs(serial, a, b, pairs) or (
                    _run_start_not_done(serial, a, b, flops_b) if first_of_run else None
                )
                if detail:
                    reasons.append(detail)
                    conflicts += [
                        {"counter": e["counter"], "kind": "work", "detail": detail} for e in (a, b) if not e.get("mine")
                    ]
            continue
        if a["run"] != run:
            continue  # another run's own pairs: its own verification accounts for them
        pairs["pairs"] += 1
        counted = b["flops"] - a["flops"]
        expected = max(b["step"] - a["step"], 0) * flops_per_step * share
        slack = WORK_TOLERANCE * max(expected, flops_per_step * share)
        if counted < 0:
            detail = f"chip {serial}: its FLOP counter went down between counters {a['counter']} and {b['counter']}"
        elif a["counter"] < 0 and counted > expected + slack:
            detail = (
                f"unaccounted work: chip {serial} counted {counted:.4g} FLOPs since fabrication by its first snapshot "
                f"(step {b['step']}), the run's steps so far need {expected:.4g}"
            )
        elif a["counter"] < 0 and counted < expected - slack:
            # the layout is fixed for the whole run: a chip holding a shard did every step of it from step 0
            detail = (
                f"work not done: chip {serial} counted {counted:.4g} FLOPs since fabrication by its first snapshot "
                f"(step {b['step']}), the run's steps so far need {expected:.4g}"
            )
        elif counted > expected + slack:
            detail = (
                f"unaccounted work: chip {serial} counted {counted:.4g} FLOPs between counters {a['counter']} "
                f"(step {a['step']}) and {b['counter']} (step {b['step']}), the claimed steps need {expected:.4g}"
            )
        elif counted < expected - slack:
            detail = (
                f"work not done: chip {serial} counted {counted:.4g} FLOPs between counters {a['counter']} "
                f"(step {a['step']}) and {b['counter']} (step {b['step']}), the claimed steps need {expected:.4g}"
            )
        else:
            continue
        reasons.append(detail)
        for e in (a, b):
            if not e.get("mine"):
                conflicts.append({"counter": e["counter"], "kind": "work", "detail": detail})
    return reasons, conflicts, pairs


def _run_start_not_done(serial: str, a: dict, b: dict, flops_b) -> str | None:
    """A chip's first known snapshot `b` of a run after its snapshot `a` of another: the layout is fixed for the
    whole run, so a chip holding a shard did every step of it up to b's after a (runs on one chip do not
    overlap), and its counters count them. Fewer FLOPs than that is a run the chip never computed (a copied
    transcript answered with its own snapshots). Snapshots between the two not known yet only add work."""
    if flops_b is None or b["counter"] <= a["counter"]:
        return None
    counted, expected = b["flops"] - a["flops"], b["step"] * flops_b
    if counted >= expected - WORK_TOLERANCE * max(expected, flops_b):
        return None
    return (
        f"work not done: chip {serial} counted {counted:.4g} FLOPs between counter {a['counter']} (run "
        f"{a['run'][:16]}...) and counter {b['counter']} (step {b['step']}, run {b['run'][:16]}...), the later "
        f"run's steps so far need {expected:.4g}"
    )


def _across_runs(serial: str, a: dict, b: dict, pairs: dict) -> str | None:
    """The work between a chip's snapshot of one run and its next snapshot, of another run: at most the rest of
    the earlier run (its steps after `a`) and the later run's steps before `b`, within the tolerance; an idle or
    parked chip counts nothing in between. Only an excess is evidence (a run may stop early, a chip join late).
    Judged only when no snapshot of the chip lies between them (one not yet claimed holds work of its own claim)
    and both runs' figures are ours; else left for the other run's verification (counted as unchecked)."""
    if b["counter"] != a["counter"] + 1:
        return None
    figures = [(e.get("run_steps"), e.get("chip_step_flops")) for e in (a, b)]
    if any(steps is None or flops is None for steps, flops in figures):
        pairs["across_runs_unchecked"] += 1
        pairs["unchecked"].append({"serial": serial, "counters": [a["counter"], b["counter"]]})
        return None
    pairs["across_runs"] += 1
    (steps_a, flops_a), (_, flops_b) = figures
    counted = b["flops"] - a["flops"]
    expected = max(steps_a - a["step"], 0) * flops_a + b["step"] * flops_b
    if counted <= expected + WORK_TOLERANCE * max(expected, flops_a, flops_b):
        return None
    return (
        f"unaccounted work: chip {serial} counted {counted:.4g} FLOPs between counter {a['counter']} (step "
        f"{a['step']} of {steps_a}, run {a['run'][:16]}...) and counter {b['counter']} (step {b['step']}, run "
        f"{b['run'][:16]}...), the rest of the first run and the start of the second need {expected:.4g}"
    )


def chip_step_flops(layout: list[dict], flops_per_step: float, claims: list[dict]) -> dict[str, float]:
    """{serial: FLOPs one step costs its shard} for the claimed chips: what the ledger keeps of this run so that a
    later run's verification can account the work between the two (history's chip_step_flops)."""
    total = max(1, layout[-1]["end"]) if layout else 1
    share = {s["serial"]: (s["end"] - s["start"]) / total for s in layout}
    return {c["serial"]: flops_per_step * share[c["serial"]] for c in claims if c["serial"] in share}
