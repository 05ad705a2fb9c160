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
  the summed peak FLOP/s of the chips in the shard layout (skipped when prover_chips is absent).

And the shard layout may name only chips in prover_chips (when given).
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime

from .transcript import MalformedTranscript

MAX_HISTORY = 1_000_000
_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?Z")
_HEX = re.compile(r"[0-9a-f]{64}")


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
            if not isinstance(h, dict) or set(h) != {"counter", "time", "step", "run", "manifest"}:
                raise MalformedTranscript(f"{what} must have counter, time, step, run, manifest")
            if type(h["counter"]) is not int or type(h["step"]) is not int or h["counter"] < 0 or h["step"] < 0:
                raise MalformedTranscript(f"{what}: counter and step must be non-negative integers")
            if not isinstance(h["manifest"], str) or not _HEX.fullmatch(h["manifest"]):
                raise MalformedTranscript(f"{what}.manifest must be 64 lowercase hex digits")
            rows.append({**h, "at": parse_time(h["time"], f"{what}.time")})
        out[serial] = rows
    return out


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


def check(
    run: str, layout: list[dict], claims: list[dict], history: dict, prover_chips, flops_per_step: float
) -> tuple[list[str], dict]:
    """Reasons to reject (empty if none) and a report. `run` is this transcript's manifest hash."""
    reasons = []
    serials = [s["serial"] for s in layout]
    peak = None
    if prover_chips is not None:
        foreign = [s for s in serials if s not in prover_chips]
        if foreign:
            reasons.append(
                f"the shard layout names {len(foreign)} chip(s) the registry does not list for the prover, "
                f"e.g. {foreign[0][:64]!r}"
            )
        else:
            peak = sum(prover_chips[s] for s in serials)
    events: dict[str, list[dict]] = {}
    for serial, rows in history.items():
        events.setdefault(serial, []).extend({**h, "run": h["manifest"]} for h in rows)
    untimed = sum(c["at"] is None for c in claims)
    for c in claims:
        if c["at"] is None:
            continue
        events.setdefault(c["serial"], []).append(
            {"counter": c["counter"], "step": c["step"], "at": c["at"], "time": c["time"], "run": run}
        )
    for serial, evs in sorted(events.items()):
        reasons += _chip(serial[:64], evs, run, peak, flops_per_step)
    return reasons, {"chips": len(events), "pace_checked": peak is not None, "peak_flops": peak, "untimed": untimed}


def _chip(serial: str, evs: list[dict], run: str, peak, flops_per_step: float) -> list[str]:
    reasons, seen, uniq = [], {}, []
    for e in evs:
        key = (e["step"], e["at"], e["run"])
        if e["counter"] in seen:
            if seen[e["counter"]] != key:  # the same snapshot reported twice is not a second claim
                reasons.append(f"chip {serial}: counter {e['counter']} is claimed for two different snapshots")
            continue
        seen[e["counter"]] = key
        uniq.append(e)
    uniq.sort(key=lambda e: (e["at"], e["counter"]))
    for a, b in zip(uniq, uniq[1:]):
        if b["counter"] < a["counter"] and b["at"] > a["at"]:
            reasons.append(f"chip {serial}: counter {b['counter']} at {b['time']} is after counter {a['counter']}")
    mine = [e for e in uniq if e["run"] == run]
    for a, b in zip(mine, mine[1:]):
        if b["step"] < a["step"]:
            reasons.append(
                f"chip {serial}: step {b['step']} at {b['time']} comes after step {a['step']} at {a['time']}"
            )
        elif peak is not None and b["step"] > a["step"]:
            need = (b["step"] - a["step"]) * flops_per_step
            can = (b["at"] - a["at"]).total_seconds() * peak
            if need > can:
                reasons.append(
                    f"chip {serial}: steps {a['step']}..{b['step']} need {need:.3e} FLOPs between {a['time']} and "
                    f"{b['time']}, more than the layout's chips can do ({can:.3e})"
                )
    if mine:
        lo, hi = mine[0]["at"], mine[-1]["at"]
        spans: dict[str, list] = {}
        for e in uniq:
            if e["run"] != run:
                s = spans.setdefault(e["run"], [e["at"], e["at"], e["time"]])
                s[0], s[1] = min(s[0], e["at"]), max(s[1], e["at"])
        for other, (a, b, when) in sorted(spans.items()):
            if a <= hi and lo <= b:
                reasons.append(f"chip {serial}: run {other[:16]}... used it at overlapping times (e.g. {when})")
    return reasons
