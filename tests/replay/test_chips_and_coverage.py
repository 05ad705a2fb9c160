"""Claims tied to chips and time; the segments every claim replays; the CLI's nonce and exit codes."""

from __future__ import annotations

import json

import pytest

from replay import Budget, verify
from replay.__main__ import main

from . import cheats
from .helpers import claims, copy, manifest, record

ALL = Budget(segments=100)


@pytest.fixture
def mlp(transcripts, tmp_path):
    return copy(transcripts["mlp", "det64"], tmp_path / "t")


def verify_with(d, **extra):
    c = {**claims(d), **extra}
    return verify(d, c, Budget(segments=0), coverage_target=0.0)


def two_on_one_chip(d):
    c = claims(d)["claims"]
    for a in c:
        for b in c:
            if a["serial"] == b["serial"] and a["step"] < b["step"]:
                return a, b
    raise AssertionError("no chip snapshotted twice")


def test_snapshot_order_must_follow_the_steps(mlp):
    """Step 20 at 00:00, step 5 a minute later: each hash replays, the order cannot be."""
    c = claims(mlp)
    a, b = two_on_one_chip(mlp)
    assert verify_with(mlp).verdict == "verified"
    for x in c["claims"]:  # swap what the two snapshots are said to be, keeping counters and times
        if x == a:
            x.update(step=b["step"], hash=b["hash"])
        elif x == b:
            x.update(step=a["step"], hash=a["hash"])
    v = verify(mlp, c, Budget(segments=0), coverage_target=0.0)
    assert v.verdict == "rejected" and any(f"comes after step {b['step']}" in r for r in v.reasons), v.reasons


def test_pace_is_bounded_by_the_registered_chips(mlp):
    layout = manifest(mlp)["shards"]
    fast = {s["serial"]: {"model": "h100", "peak_flops_16bit": 1e15} for s in layout}
    v = verify_with(mlp, prover_chips=fast)
    assert v.verdict == "verified" and v.details["checks"]["chips"]["pace_checked"]
    slow = {s: {"model": "toy", "peak_flops_16bit": 1.0} for s in fast}
    assert any("more than the layout's chips can do" in r for r in verify_with(mlp, prover_chips=slow).reasons)


def test_layout_may_name_only_the_provers_chips(mlp):
    layout = manifest(mlp)["shards"]
    some = {s["serial"]: {"model": "h100", "peak_flops_16bit": 1e15} for s in layout[1:]}
    v = verify_with(mlp, prover_chips=some)
    assert v.verdict == "rejected" and "the registry does not list for the prover" in v.reasons[0]


def test_history_counters_and_overlapping_runs(mlp):
    a, _ = two_on_one_chip(mlp)
    h = {k: a[k] for k in ("counter", "time", "step")}
    same = {**h, "run": "r", "manifest": claims(mlp)["manifest"]}
    assert verify_with(mlp, history={a["serial"]: [same]}).verdict == "verified"  # the same snapshot again
    twice = {**same, "step": a["step"] + 1}
    assert any(
        "claimed for two different snapshots" in r for r in verify_with(mlp, history={a["serial"]: [twice]}).reasons
    )
    other = {**h, "counter": 10_000, "run": "other", "manifest": "ab" * 32}
    v = verify_with(mlp, history={a["serial"]: [other]})
    assert any("overlapping times" in r for r in v.reasons), v.reasons
    back = {**h, "counter": 10_000, "time": "2024-12-31T00:00:00Z", "run": "o", "manifest": "ab" * 32}
    assert any("is after counter" in r for r in verify_with(mlp, history={a["serial"]: [back]}).reasons)


def test_a_claim_replays_the_segment_that_made_its_checkpoint(tmp_path):
    """Checkpoint 8 is the state of 10x more training done off the books; the rest is recorded honestly.
    Claims after step 8 replay from it, so segment 4..8 is replayed whatever the nonce and the budget."""
    d = record(tmp_path / "t", "mlp", recorder=cheats.HiddenCompute, at=8, extra=80, snapshot_rate=2.0)
    c = claims(d)
    c["claims"] = [x for x in c["claims"] if x["step"] > 8]
    assert c["claims"]
    for nonce in (b"\x01" * 16, b"\x02" * 16):
        v = verify(d, c, Budget(segments=0), nonce=nonce, coverage_target=0.0)
        assert v.verdict == "rejected" and v.details["segments_replayed"] == [4]
        assert any("segment 4..8: replayed state at step 8 differs" in r for r in v.reasons), v.reasons
        assert v.details["mismatch_step"] == 8


def test_segments_are_replayed_until_the_runs_coverage_target(transcripts):
    d = transcripts["mlp", "det64"]  # 3 segments: 0, 4, 8
    full = verify(d, None, Budget(segments=0), nonce=b"n" * 16)
    assert full.details["segments_replayed"] == [0, 4, 8] and full.details["coverage"] == 1.0  # default 0.9
    half = verify(d, None, Budget(segments=0), nonce=b"n" * 16, coverage_target=0.5)
    assert len(half.details["segments_replayed"]) == 2 and half.details["coverage"] == pytest.approx(2 / 3)
    later = verify(d, None, Budget(segments=0), nonce=b"n" * 16, replayed_segments=[0, 8])
    assert later.details["segments_replayed"] == [4] and later.details["coverage"] == 1.0
    picks = {
        tuple(
            verify(d, None, Budget(segments=1), nonce=bytes([n]) * 16, coverage_target=0).details["segments_replayed"]
        )
        for n in range(12)
    }
    assert len(picks) > 1
    assert verify(d, None, replayed_segments=[3]).verdict == "malformed"


def test_cli_nonce_is_required_to_be_random(mlp, capsys):
    args = ["verify", str(mlp), "--claims", str(mlp / "claims.json"), "--json"]
    assert main([*args, "--nonce", ""]) == 2
    assert "--nonce" in json.loads(capsys.readouterr().out)["reasons"][0]
    assert main([*args, "--nonce", "00" * 15]) == 2
    capsys.readouterr()
    assert main([*args, "--segments", "0"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(bytes.fromhex(out["nonce"])) == 16 and out["verdict"] == "verified"
    for key in (
        "mismatch_step",
        "segments_replayed",
        "segments_total",
        "coverage",
        "screen",
        "flops",
        "steps",
        "rules",
    ):
        assert key in out, key


def test_cli_crash_is_an_error_not_a_rejection(mlp, capsys, monkeypatch):
    import replay.__main__ as cli

    def boom(*a, **k):
        raise MemoryError

    monkeypatch.setattr(cli, "verify", boom)
    assert main(["verify", str(mlp), "--claims", str(mlp / "claims.json"), "--json"]) == 3
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "error" and "MemoryError" in out["reasons"][0]
