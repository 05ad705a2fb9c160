"""Whole-run trajectory checks, streamed checkpoint by checkpoint in bounded memory.

    reasons = trajectory_checks(tr, report, tick)

Update sizes against the learning-rate schedule, and no straight-line stretches (interpolated
checkpoints). Memory: the flat float32 parameters of the last three checkpoints (12 bytes per
parameter) plus one checkpoint being read, whatever the number of checkpoints; the float64
arithmetic runs over slices of CHUNK elements.

Straight lines and jumps are *findings* (report["findings"], with their evidence), never reasons:
momentum and convergence make honest trajectories straight (5 of 10 seeds of a small SGD MLP with
momentum 0.9 tripped the old rule). Only movement where the rates sum to 0 is a reason (exact).

Never fails an honest prover for its schedule. A stretch whose learning rates sum to 0 must not
move the parameters (p - u * 0 is p, bit for bit) and has no update size per unit of rate; it is
left out of the jump comparison. Elsewhere each interval's movement M is known only up to float32
rounding: every step rounds every parameter once, by at most one ulp of its magnitude, so the true
movement lies within M +- E, E = steps * ||ulp(max(|a|, |b|))||. A jump is reported only if it
exceeds UPDATE_JUMP for every movement inside those bounds, and a straight line only where both
movements are resolved (M > RESOLVED * E): with learning rates so small that updates round away
(a step schedule decaying to nothing), quantized moves can repeat exactly and would look linear.
"""

from __future__ import annotations

import math

import numpy as np

from replay.protocol import hashing
from replay.protocol.transcript_errors import CommitmentMismatch
from replay.training.train import lr_at

COLLINEAR = 0.99999  # cosine of consecutive checkpoint deltas above which a stretch is a straight line
UPDATE_JUMP = 100.0  # max factor between neighbouring intervals' update size per unit of learning rate
RESOLVED = 10.0  # movement / rounding bound above which an interval's direction is trusted
CHUNK = 1 << 20


def _sums(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """(||b - a||^2, ||ulp(max(|a|, |b|))||^2) in float64 over chunks."""
    mm = ee = 0.0
    for i in range(0, a.size, CHUNK):
        x, y = a[i : i + CHUNK], b[i : i + CHUNK]
        d = y.astype(np.float64) - x
        mm += float(d @ d)
        ulp = np.spacing(np.maximum(np.abs(x), np.abs(y))).astype(np.float64)
        ee += float(ulp @ ulp)
    return mm, ee


def _dot(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> float:
    """(b - a).(c - b) in float64 over chunks."""
    out = 0.0
    for i in range(0, a.size, CHUNK):
        y = b[i : i + CHUNK].astype(np.float64)
        out += float((y - a[i : i + CHUNK]) @ (c[i : i + CHUNK] - y))
    return out


def _interval(tr, a: int, b: int, fa: np.ndarray, fb: np.ndarray) -> dict:
    """Movement, its rounding bound, and the learning rates' sum over checkpoints a..b."""
    mm, ee = _sums(fa, fb)
    return {
        "start": a,
        "end": b,
        "moved": math.sqrt(mm),
        "slack": (b - a) * math.sqrt(ee),
        "lr": math.fsum(lr_at(tr.manifest["optimizer"]["lr"], t) for t in range(a, b)),
    }


def _jump(x: dict, y: dict) -> float:
    """The smallest factor between two intervals' update size per unit of rate that rounding allows."""
    lo = lambda i: max(i["moved"] - i["slack"], 0.0) / i["lr"]
    hi = lambda i: (i["moved"] + i["slack"]) / i["lr"]
    return max(lo(x) / hi(y) if hi(y) > 0 else 0.0, lo(y) / hi(x) if hi(x) > 0 else 0.0)


def trajectory_checks(tr, report: dict, tick) -> list[str]:
    """Update sizes vs. the learning-rate schedule and collinearity, streamed; fills report['checks']['update_sizes']."""
    reasons, intervals, collinear, still = [], [], [], []
    flats: list[np.ndarray] = []
    for i, c in enumerate(tr.checkpoints):
        tick()
        try:
            flat = hashing.flatten(tr.params(c))
        except CommitmentMismatch as e:
            reasons.append(str(e))
            break
        if not np.isfinite(flat).all():  # no honest run gets here: its losses would not be finite
            reasons.append(f"the checkpoint at step {c} holds non-finite parameters")
            break
        flats = [*flats[-2:], flat]
        if len(flats) < 2:
            continue
        iv = _interval(tr, tr.checkpoints[i - 1], c, flats[-2], flats[-1])
        intervals.append(iv)
        if iv["lr"] == 0 and iv["moved"] > 0:
            still.append(iv["start"])
        if len(flats) == 3:
            prev = intervals[-2]
            dot = _dot(flats[0], flats[1], flats[2])
            resolved = all(x["moved"] > RESOLVED * x["slack"] for x in (prev, iv))
            if resolved and dot / max(prev["moved"] * iv["moved"], 1e-300) > COLLINEAR:
                collinear.append(prev["end"])
    jumps = [_jump(x, y) for x, y in zip(intervals, intervals[1:]) if x["lr"] > 0 and y["lr"] > 0]
    big = max(jumps, default=1.0)
    ok = not still
    report["checks"]["update_sizes"] = {
        "ok": ok,
        "per_lr": [round(x["moved"] / x["lr"], 6) if x["lr"] > 0 else None for x in intervals],
        "max_jump": big,
        "collinear_at": collinear,
    }
    findings = []
    if collinear:  # momentum and convergence make honest trajectories straight: evidence, not a verdict
        findings.append(
            {
                "kind": "straight_line",
                "detail": f"checkpoints around steps {collinear[:20]} lie nearly on a straight line "
                "(interpolated checkpoints look like this; so do converging honest runs with momentum)",
                "evidence": {"collinear_at": collinear[:100], "cosine_above": COLLINEAR},
            }
        )
    if big > UPDATE_JUMP:
        findings.append(
            {
                "kind": "update_jump",
                "detail": f"update size per unit of learning rate jumps by {big:.1f}x between checkpoint intervals",
                "evidence": {"max_jump": big, "allowed": UPDATE_JUMP},
            }
        )
    report.setdefault("findings", []).extend(findings)
    if still:  # exact: p - u*0 is p bit for bit, so any movement there is a broken rule of the arithmetic
        reasons.append(
            f"parameters moved in checkpoint intervals starting at {still[:10]}, where the learning rate is 0"
        )
    return reasons
