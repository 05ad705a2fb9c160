"""replay.protocol.report: whatever the verifier's output (or a prover's file echoed in it) holds, the summary that
goes on the public ledger is JSON its canonical form holds (no NaN, no integer past 2^53, no lone surrogate), every
string in it printable, and its size bounded: the ledger had refused such entries, and the claim stayed without a
result."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from replay.protocol.report import SUMMARY_BYTES, Report
from tlog import chain

ENVELOPE = {"claim": 1, "chip": "H000000", "counter": 0, "result": "mismatch", "mismatch_step": None}
KEYS = [
    "reasons", "nonce", "segments_replayed", "segments_drawn", "draw_pool", "draw_cut", "segments_total", "coverage",
    "screen", "flops", "steps", "rules", "findings", "dispute", "conflicts", "claims", "chip_step_flops",
    "across_runs_unchecked", "device", "torch", "mismatch_step",
]  # fmt: skip
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=50),  # (surrogates, NUL, escapes included)
)
values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5)
)


def _strings(v):
    if isinstance(v, str):
        yield v
    elif isinstance(v, dict):
        for k, x in v.items():
            yield k
            yield from _strings(x)
    elif isinstance(v, list):
        for x in v:
            yield from _strings(x)


def _on_the_ledger(summary: dict) -> bytes:
    json.dumps(summary, allow_nan=False)  # (raises on NaN or an infinity)
    return chain.canonical_leaf(
        0, "2026-01-01T00:00:00Z", "claim.verified", "system", {**ENVELOPE, **summary}, "00" * 32
    )


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(KEYS), values, max_size=8), st.sampled_from(["verified", "rejected"]))
def test_any_report_becomes_a_summary_the_ledger_holds(fields, verdict):
    summary = Report.from_json({**fields, "verdict": verdict}).summary()
    assert summary["verdict"] == verdict
    assert len(_on_the_ledger(summary)) < 65_535
    assert all(s.isprintable() for s in _strings(summary))


def test_the_probes_reports_are_held():
    """Each of these had raised in from_json or been refused by the ledger (a probe of this module)."""
    big = [
        {"chip_step_flops": {"a": 10**400}},  # OverflowError in isfinite
        {"steps": 2**60, "segments_replayed": [2**60, 3], "segments_total": 2**60},
        {"chip_step_flops": {"\x1b[31mX\u202e": 1.0, "\udcff": 2.0}, "nonce": "\ud800"},
        {"across_runs_unchecked": [{"serial": "\udcff", "counters": [2**60, 1]}]},
        {"rules": {f"r{i}": "x" * 2000 for i in range(100)}, "dispute": {f"d{i}": "y" * 2000 for i in range(100)}},
        {"conflicts": [{f"k{i}": "z" * 2000 for i in range(100)} for _ in range(10)]},
        {"nonce": "a" * 50_000},
    ]
    for fields in big:
        summary = Report.from_json({**fields, "verdict": "rejected"}).summary()
        assert len(json.dumps(summary, ensure_ascii=False).encode()) <= SUMMARY_BYTES + 100
        assert len(_on_the_ledger(summary)) < 65_535
        assert all(s.isprintable() for s in _strings(summary))
    kept = Report.from_json(
        {"verdict": "verified", "nonce": "ab" * 16, "segments_replayed": [1, 2], "segments_drawn": [2],
         "chip_step_flops": {"H1": 1.5e9}, "across_runs_unchecked": [{"serial": "H1", "counters": [3, 4]}]}
    ).summary()  # fmt: skip
    assert kept["nonce"] == "ab" * 16 and kept["segments_replayed"] == [1, 2] and kept["segments_drawn"] == [2]
    assert kept["chip_step_flops"] == {"H1": 1.5e9} and kept["across_runs_unchecked"] == [
        {"serial": "H1", "counters": [3, 4]}
    ]
    assert "trimmed" not in kept
