"""The verifier's report, typed: what `python -m replay verify --json` prints and the regulator records.

    Report.from_json(obj) -> Report     # the CLI's JSON (untrusted: a bad field is left out, never a crash)
    report.summary() -> dict            # the bounded part that goes on the ledger (claim.verified)

Both ends read this one type: the verifier builds it (`Verdict.report`), the Django worker parses the
subprocess's output into it (inspections/verification.py) instead of reading a dict key by key.
Torch-free: the worker imports it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

VERDICTS = ("verified", "rejected", "malformed", "error", "incomplete", "unavailable")
MAX_REASONS, MAX_FINDINGS, MAX_CONFLICTS, MAX_SEGMENTS, MAX_CHIPS = 20, 50, 100, 100_000, 1000


MAX_TEXT, MAX_ITEMS, MAX_DEPTH = 2000, 100, 6  # a free-form field's strings, members a level, and levels
SUMMARY_BYTES = 40_000  # a summary's JSON at most: a ledger entry holds 65,535 bytes, the claim's own fields the rest
SAFE_INTEGER = 2**53  # the integers I-JSON (RFC 7493) and so the ledger's canonical JSON can hold


def clean(v, depth: int = 0):
    """A JSON value a public ledger can hold and a page can show, from one the verifier's output or a prover's file
    shaped: NaN and the infinities as null (a screen's z of a constant sample; the ledger's canonical JSON holds no
    such number, and the entry was refused, the claim left without a verdict), integers past 2^53 as null, text with
    its unprintable characters escaped (NUL, terminal escapes, bidirectional overrides, a non-UTF-8 file name's lone
    surrogates) and cut at MAX_TEXT, at most MAX_ITEMS members a level and MAX_DEPTH levels."""
    if v is None or type(v) is bool:
        return v
    if type(v) is int:
        return v if -SAFE_INTEGER < v < SAFE_INTEGER else None
    if type(v) is float:
        return v if math.isfinite(v) else None
    if isinstance(v, str):
        return printable(v)
    if depth >= MAX_DEPTH:
        return None
    if isinstance(v, (list, tuple)):
        return [clean(x, depth + 1) for x in v[:MAX_ITEMS]]
    if isinstance(v, dict):
        return {printable(str(k), 64): clean(x, depth + 1) for k, x in list(v.items())[:MAX_ITEMS]}
    return None


def printable(text: str, limit: int = MAX_TEXT) -> str:
    """text with each character that is not printable written as its escape (\\x1b, \\u202e, \\udcff), cut to limit."""
    if text.isprintable():
        return text[:limit]
    return "".join(c if c.isprintable() else _escape(c) for c in text[:limit])[:limit]


def _escape(c: str) -> str:
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def _int(v) -> int | None:
    """An integer the ledger's canonical JSON can hold (|v| < 2^53), or None."""
    return v if type(v) is int and -SAFE_INTEGER < v < SAFE_INTEGER else None


def _index(v) -> bool:
    """A segment's or a counter's number: a non-negative integer the ledger can hold."""
    return type(v) is int and 0 <= v < SAFE_INTEGER


def _serial(v) -> bool:
    """A chip's serial as the registry spells one: printable, at most 64 characters."""
    return isinstance(v, str) and 0 < len(v) <= 64 and v.isprintable()


def _figure(x) -> bool:
    """A non-negative finite number the ledger can hold (no OverflowError from isfinite on a 400-digit integer)."""
    return (type(x) is float and math.isfinite(x) and x >= 0) or _index(x)


def _count(v) -> int | None:
    """A non-negative integer a JSON reader can hold exactly, or None."""
    return v if type(v) is int and 0 <= v < 2**53 else None


def _label(v) -> str:
    """A short printable label (device, version), or "" for anything else."""
    return v if isinstance(v, str) and len(v) <= 64 and v.isprintable() else ""


def _figures(v) -> dict:
    """{serial: non-negative finite number} (at most MAX_CHIPS of them); anything else left out."""
    if not isinstance(v, dict):
        return {}
    good = {k: x for k, x in v.items() if _serial(k) and _figure(x)}
    return dict(list(good.items())[:MAX_CHIPS])


def _pairs(v) -> tuple[dict, ...]:
    """[{serial, counters: [a, a + 1]}]: the chip's pairs of snapshots across two runs left unchecked."""
    good = (
        {"serial": x["serial"], "counters": list(x["counters"])}
        for x in _objects(v, MAX_CONFLICTS)
        if _serial(x.get("serial"))
        and isinstance(x.get("counters"), list)
        and len(x["counters"]) == 2
        and all(_index(c) for c in x["counters"])
    )
    return tuple(good)


def _drawn(segments, drawn) -> tuple[int, ...]:
    """Drawn segments are replayed ones: anything else in the list is dropped (it would inflate coverage)."""
    if not isinstance(segments, list) or not isinstance(drawn, list):
        return ()
    replayed = {s for s in segments if _index(s)}
    return tuple(sorted({s for s in drawn if _index(s) and s in replayed}))[:MAX_SEGMENTS]


def _nonce(v) -> str:
    """The verification's nonce as the verifier writes it (hex), or "" (a lone surrogate had broken the ledger's
    canonical JSON, and a 50,000-character one its size)."""
    ok = isinstance(v, str) and len(v) <= 256 and all(c in "0123456789abcdefABCDEF" for c in v)
    return v if ok else ""


def _objects(v, limit: int) -> tuple[dict, ...]:
    return tuple(x for x in v if isinstance(x, dict))[:limit] if isinstance(v, list | tuple) else ()


@dataclass(frozen=True)
class Report:
    verdict: str
    reasons: tuple[str, ...] = ()
    mismatch_step: int | None = None
    nonce: str = ""
    segments_replayed: tuple[int, ...] = ()
    segments_drawn: tuple[int, ...] = ()  # those of them a random draw chose (the rest a claim forced)
    draw_pool: int | None = None  # how many never-replayed segments the draws were taken from (coverage.py)
    draw_cut: int | None = None  # the draw the budget cut while it was replayed: the next verification's first
    segments_total: int | None = None
    coverage: float | None = None
    screen: dict | None = None
    flops: float | None = None
    steps: int | None = None
    rules: dict = field(default_factory=dict)
    findings: tuple[dict, ...] = ()  # heuristics with their evidence: shown, never a reason by themselves
    dispute: dict | None = None  # first divergent step and operation of a failed replay
    conflicts: tuple[dict, ...] = ()  # the chip's other claims (by counter) a reason involves
    claims: tuple[dict, ...] = ()  # per claimed snapshot: serial, counter, step, ok
    budget_exhausted: bool = False  # the claim's own checks did not finish (verdict "incomplete")
    # serial -> FLOPs one step of this run costs the chip's shard (counted, not declared): a later run's
    # verification accounts the work between the two runs' snapshots with it (chips_and_time.py)
    chip_step_flops: dict = field(default_factory=dict)
    # pairs of a chip's snapshots across two runs not judged (the other run had no figures of ours yet): the
    # regulator's side re-checks such a pair once both runs have them (inspections.selectors.cross_run_rechecks_due)
    across_runs_unchecked: tuple[dict, ...] = ()
    device: str = ""  # where the verdict was reached ("cpu", "cuda:0")
    torch: str = ""  # and with which torch

    @classmethod
    def from_json(cls, obj: dict) -> Report:
        """A report from the CLI's JSON; raises ValueError only when there is no verdict to speak of."""
        if not isinstance(obj, dict) or obj.get("verdict") not in VERDICTS:
            raise ValueError("not a verifier report")
        segments, drawn = obj.get("segments_replayed"), obj.get("segments_drawn")
        coverage = obj.get("coverage")
        flops = obj.get("flops")
        return cls(
            verdict=obj["verdict"],
            reasons=tuple(printable(str(r)) for r in obj.get("reasons") or [] if r is not None)
            if isinstance(obj.get("reasons"), list)
            else (),
            mismatch_step=_int(obj.get("mismatch_step")),
            nonce=_nonce(obj.get("nonce")),
            segments_replayed=tuple(sorted({s for s in segments if _index(s)}))[:MAX_SEGMENTS]
            if isinstance(segments, list)
            else (),
            segments_drawn=_drawn(segments, drawn),
            draw_pool=_count(obj.get("draw_pool")),
            draw_cut=_count(obj.get("draw_cut")),
            segments_total=_int(obj.get("segments_total")),
            coverage=clean(coverage) if type(coverage) in (int, float) else None,
            screen=clean(obj.get("screen")) if isinstance(obj.get("screen"), dict) else None,
            flops=clean(float(flops)) if type(flops) in (int, float) and abs(flops) < 1e308 else None,
            steps=_int(obj.get("steps")),
            rules=clean(obj.get("rules")) if isinstance(obj.get("rules"), dict) else {},
            findings=tuple(clean(x) for x in _objects(obj.get("findings"), MAX_FINDINGS)),
            dispute=clean(obj.get("dispute")) if isinstance(obj.get("dispute"), dict) else None,
            conflicts=tuple(clean(x) for x in _objects(obj.get("conflicts"), MAX_CONFLICTS)),
            claims=_objects(obj.get("claims"), 10_000),
            budget_exhausted=obj.get("budget_exhausted") is True,
            chip_step_flops=_figures(obj.get("chip_step_flops")),
            across_runs_unchecked=_pairs(obj.get("across_runs_unchecked")),
            device=_label(obj.get("device")),
            torch=_label(obj.get("torch")),
        )

    @property
    def rule_broken(self) -> bool:
        return any(isinstance(r, dict) and r.get("ok") is False for r in self.rules.values())

    @property
    def failing_step(self) -> int | None:
        """The first step that did not replay: the mismatch, else the dispute's step, else the first failed claim."""
        if self.mismatch_step is not None:
            return self.mismatch_step
        if self.dispute and type(self.dispute.get("step")) is int:
            return self.dispute["step"]
        failing = [c["step"] for c in self.claims if type(c.get("step")) is int and c.get("ok") is False]
        return min(failing, default=None)

    def summary(self) -> dict:
        """What of the report goes on the ledger (and to the prover): bounded, field by field (`clean`) and in all
        (SUMMARY_BYTES, `_within`)."""
        return _within(self._summary())

    def _summary(self) -> dict:
        return {
            "verdict": self.verdict,
            "reasons": list(self.reasons[:MAX_REASONS]),
            "flops": self.flops,
            "steps": self.steps,
            "rules": self.rules,
            "nonce": self.nonce,
            "segments_replayed": list(self.segments_replayed),
            "segments_drawn": list(self.segments_drawn),
            "draw_pool": self.draw_pool,
            "draw_cut": self.draw_cut,
            "segments_total": self.segments_total,
            "coverage": self.coverage,
            "screen": self.screen,
            "findings": list(self.findings),
            "dispute": self.dispute,
            "conflicts": list(self.conflicts),
            "device": self.device,
            "torch": self.torch,
            "chip_step_flops": self.chip_step_flops,
            "across_runs_unchecked": list(self.across_runs_unchecked),
        }


def _json_bytes(obj) -> int:
    return len(json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8", "replace"))


# What gives way, in this order, where a summary is over SUMMARY_BYTES: each field's own bulk (evidence, nested
# detail, long text), then the field, never the verdict, its figures, the segments, or what later verifications read
# (chip_step_flops, across_runs_unchecked). The report kept whole is the worker's: the ledger's copy says what it
# left out. (Each conflict keeps its own claim.conflict entry, written from the full report.)
_SHEDDING = (
    ("findings", lambda v: [{"kind": x.get("kind"), "detail": str(x.get("detail", ""))[:300]} for x in v]),
    ("screen", lambda v: v and _cut({k: x for k, x in v.items() if not isinstance(x, (dict, list))}, 200)),
    ("dispute", lambda v: v and _cut({k: x for k, x in v.items() if not isinstance(x, (dict, list))}, 300)),
    ("reasons", lambda v: [r[:300] for r in v[:5]]),
    ("conflicts", lambda v: [_cut(x, 300) for x in v[:10]]),
    ("rules", lambda v: _cut(v, 200)),
    ("findings", lambda v: []),
    ("screen", lambda v: None),
    ("dispute", lambda v: v and {k: v[k] for k in ("step", "op") if k in v}),
    ("conflicts", lambda v: []),
    ("rules", lambda v: {}),
)


def _cut(v, limit: int):
    """v with every string in it cut to `limit` characters, and no container deeper than two levels."""
    if isinstance(v, str):
        return v[:limit]
    if isinstance(v, dict):
        return {k: _cut(x, limit) for k, x in v.items()}
    if isinstance(v, list):
        return [_cut(x, limit) for x in v]
    return v


def _within(summary: dict) -> dict:
    """The summary under SUMMARY_BYTES, shedding bulk in `_SHEDDING`'s order, and naming what it shed ("trimmed")."""
    trimmed = []
    for name, shed in _SHEDDING:
        if _json_bytes(summary) <= SUMMARY_BYTES:
            break
        shed_value = shed(summary[name])
        if shed_value != summary[name] and name not in trimmed:  # (named only where something went)
            trimmed.append(name)
        summary[name] = shed_value
    return {**summary, "trimmed": trimmed} if trimmed else summary
