"""Claims tied to chips and time; the segments every claim replays; the CLI's nonce and exit codes."""

from __future__ import annotations

import json
from datetime import datetime
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replay import Budget, verify
from replay.__main__ import main

from .. import cheats
from ..helpers import STEPS, claims, copy, manifest, record, save_manifest

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
    assert any("more than the working chips" in r for r in verify_with(mlp, prover_chips=slow).reasons)


def test_layout_may_name_only_the_provers_chips(mlp):
    layout = manifest(mlp)["shards"]
    some = {s["serial"]: {"model": "h100", "peak_flops_16bit": 1e15} for s in layout[1:]}
    v = verify_with(mlp, prover_chips=some)
    assert v.verdict == "rejected" and "the registry does not list for the prover" in v.reasons[0]
    assert v.details["rules"]["layout_registered"] == {"ok": False, "unregistered": 1}


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


def test_each_claim_replays_a_bounded_number_of_segments_and_coverage_accumulates(transcripts):
    """Issue #19 case 7: a claim replays its mandatory segment and at most --segments fresh ones; the run's
    coverage grows over claims (their replayed_segments and earlier_draws) instead of one replay of 90% of the run."""
    d = transcripts["mlp", "det64"]  # 3 segments: 0, 4, 8
    none = verify(d, None, Budget(segments=0), nonce=b"n" * 16)
    assert none.verdict == "verified" and none.details["segments_replayed"] == []  # no claim, no fresh draw
    done: list[int] = []
    draws: list[list[int]] = []
    for claim_no in range(3):
        v = verify(
            d, None, Budget(segments=1), nonce=bytes([claim_no]) * 16, replayed_segments=done, earlier_draws=draws
        )
        assert v.verdict == "verified" and len(v.details["segments_replayed"]) == 1
        assert v.details["segments_drawn"] == v.details["segments_replayed"]  # no claim: every replay a draw
        assert v.details["draw_pool"] == 3 - claim_no and v.details["draw_cut"] is None
        done += v.details["segments_replayed"]
        draws.append([v.details["draw_pool"], 1])
        # one of 3, then one of the 2 left, then the last: 1/3, 2/3, 1
        assert v.details["coverage"] == pytest.approx(len(set(done)) / 3)
    assert sorted(done) == [0, 4, 8]
    again = verify(d, None, Budget(segments=5), nonce=b"z" * 16, replayed_segments=done)
    assert again.details["segments_replayed"] == []  # every segment replayed: nothing more to draw
    picks = {
        tuple(
            verify(d, None, Budget(segments=1), nonce=bytes([n]) * 16, coverage_target=1).details["segments_replayed"]
        )
        for n in range(12)
    }
    assert len(picks) > 1
    assert verify(d, None, replayed_segments=[3]).verdict == "malformed"


def test_a_fabrication_away_from_the_claims_forced_segment_is_drawn_to_the_target(tmp_path):
    """The prover knows its claims (after step 8) force segment 4..8 and fabricates 0..4 instead. Coverage counts
    draws only: at target 0.6 the draws take ceil(0.6 x 2) = 2 of the two unforced segments, so 0..4 is always
    replayed (counting the forced one, a single draw would have met 0.6 of 3 and missed it half the time)."""
    d = record(tmp_path / "t", "mlp", recorder=cheats.HiddenCompute, at=4, extra=40, snapshot_rate=2.0)
    c = claims(d)
    c["claims"] = [x for x in c["claims"] if x["step"] > 8]
    assert c["claims"]
    for n in range(6):
        v = verify(d, c, Budget(segments=5), nonce=bytes([n]) * 16, coverage_target=0.6)
        assert v.verdict == "rejected" and 0 in v.details["segments_replayed"], (n, v.details["segments_replayed"])
        assert v.details["mismatch_step"] == 4 and 4 not in v.details["segments_drawn"]
    # earlier replays with no draw listed count for nothing: the pool is what is left, the draw goes on
    v = verify(d, c, Budget(segments=5), nonce=b"x" * 16, coverage_target=0.5, replayed_segments=[0])
    assert v.details["draw_pool"] == 1 and v.details["segments_drawn"] == [8] and v.details["coverage"] == 1.0
    # one of two drawn earlier (miss 1/2) meets 0.5: nothing more is drawn
    told = verify(
        d, c, Budget(segments=5), nonce=b"x" * 16, coverage_target=0.5, replayed_segments=[0], earlier_draws=[[2, 1]]
    )
    assert told.details["segments_drawn"] == [] and told.details["coverage"] == pytest.approx(0.5)
    # a pending draw (an earlier budget cut it) is replayed first, outside the pool, and counts for nothing
    carried = verify(
        d, c, Budget(segments=1), nonce=b"x" * 16, coverage_target=0.5, replayed_segments=[8], pending_segments=[0]
    )
    assert carried.verdict == "rejected" and carried.details["mismatch_step"] == 4
    assert carried.details["segments_drawn"] == [] and carried.details["draw_pool"] == 0
    for field, bad in (
        ("earlier_draws", [[1, 2]]),
        ("earlier_draws", [[2, True]]),
        ("earlier_draws", [[2.0, 1]]),
        ("earlier_draws", "[[2, 1]]"),
        ("earlier_draws", [[2, -1]]),
        ("earlier_draws", [[2**64, 1]]),
        ("earlier_draws", [[4, 1]]),  # a pool larger than the run's 3 segments
        ("earlier_draws", [[2, 1, 0]]),
        ("pending_segments", [1]),
        ("pending_segments", [0.0]),
        ("pending_segments", "0"),
    ):
        odd = verify(d, c, nonce=b"x" * 16, **{field: bad})
        assert odd.verdict == "malformed" and field in odd.reasons[0], (bad, odd.reasons)


def test_a_spent_budget_is_incomplete_never_a_rejection(transcripts):
    """Issue #19 case 7: a budget spent before the claim's own checks finish is ours ("incomplete", retried);
    spent during fresh draws it ends them and the claim still verifies."""
    d = transcripts["mlp", "det64"]
    c = claims(d)
    c["claims"] = [x for x in c["claims"] if x["step"] > 8][:1]
    v = verify(d, c, Budget(max_steps=1), nonce=b"q" * 16)
    assert v.verdict == "incomplete" and v.details["budget_exhausted"] and "budget" in v.reasons[0]
    full = verify(d, c, Budget(segments=2, max_steps=4 + 4), nonce=b"q" * 16)  # mandatory 4..8 + the claim
    assert full.verdict == "verified" and "budget_spent" in full.details, full.reasons
    assert full.details["segments_replayed"] == [4]
    # the draw being replayed when the budget ran out is named: the next verification replays it first
    cut = full.details["draw_cut"]
    assert cut in (0, 8) and full.details["segments_drawn"] == [] and full.details["draw_pool"] == 2
    after = verify(d, c, Budget(segments=1), nonce=b"r" * 16, replayed_segments=[4], pending_segments=[cut])
    assert after.verdict == "verified" and after.details["segments_replayed"] == sorted({4, cut})
    assert after.details["segments_drawn"] == [] and after.details["draw_pool"] == 1  # carried: no coverage


def test_filing_a_later_snapshot_first_does_not_skip_the_order_check(mlp):
    """Issue #19 case 2: the client files the chip's later snapshot (step 30) first and the earlier one (step 10)
    an hour later; the verifier must see both whatever the filing order (history holds all the chip's claims)."""
    a, b = two_on_one_chip(mlp)  # a: earlier counter and time, lower step
    c = claims(mlp)
    m = c["manifest"]
    # the cheat: the earlier snapshot is said to be the later step (hash re-pointed), the later one filed first
    filed_first = {"counter": b["counter"], "time": b["time"], "step": a["step"], "run": "r", "manifest": m}
    c["claims"] = [{**a, "step": b["step"], "hash": b["hash"]}]
    v = verify(mlp, {**c, "history": {a["serial"]: [filed_first]}}, Budget(segments=0), coverage_target=0.0)
    assert v.verdict == "rejected" and any("comes after step" in r for r in v.reasons), v.reasons
    assert {x["counter"] for x in v.details["conflicts"]} == {b["counter"]}
    assert v.details["conflicts"][0]["kind"] == "order"


def test_two_runs_interleaved_on_one_chip_conflict_whatever_the_order(mlp):
    a, b = two_on_one_chip(mlp)
    c = claims(mlp)
    c["claims"] = [a]
    other = {"counter": b["counter"] + 1, "time": b["time"], "step": 3, "run": "x", "manifest": "cd" * 32}
    later = {"counter": b["counter"], "time": b["time"], "step": b["step"], "run": "r", "manifest": c["manifest"]}
    v = verify(mlp, {**c, "history": {a["serial"]: [later, other]}}, Budget(segments=0), coverage_target=0.0)
    assert any("overlapping times" in r for r in v.reasons), v.reasons
    assert other["counter"] in {x["counter"] for x in v.details["conflicts"]}


def test_idle_chips_do_not_pad_the_pace(mlp):
    """Issue #19 case 3: the layout names 30 idle chips of the prover with empty shards (re-committed, as a
    cheating recorder would); capacity counts only working chips that logged this run, so they add nothing."""
    m = manifest(mlp)
    n = m["shards"][-1]["end"]
    working = {s["serial"]: {"model": "toy", "peak_flops_16bit": 1.0} for s in m["shards"]}
    idle = {f"IDLE-{i}": {"model": "h100", "peak_flops_16bit": 1e18} for i in range(30)}
    m["shards"] += [{"serial": s, "start": n, "end": n} for s in idle]
    save_manifest(mlp, m)
    a, b = two_on_one_chip(mlp)
    c = claims(mlp)
    c["claims"] = [a, b]
    padded = verify(mlp, {**c, "prover_chips": {**working, **idle}}, Budget(segments=0), coverage_target=0.0)
    assert any("more than the working chips" in r for r in padded.reasons), padded.reasons
    assert padded.details["checks"]["chips"]["peak_flops"] == len(working)  # 1 FLOP/s each, the idle ones left out


def test_two_snapshots_signed_in_the_same_second_keep_up_with_a_fast_chip(mlp):
    """Issue #19, re-probed: the firmware signs whole seconds, and a fast chip logs a random snapshot and the
    run's closing one within a second. Zero seconds apart is not zero time: the pace allows the second."""
    a, b = two_on_one_chip(mlp)
    c = claims(mlp)
    same = {**b, "time": a["time"]}
    c["claims"] = [a, same]
    layout = manifest(mlp)["shards"]
    fast = {s["serial"]: {"model": "h100", "peak_flops_16bit": 1e15} for s in layout}
    v = verify(mlp, {**c, "prover_chips": fast}, Budget(segments=0), coverage_target=0.0)
    assert v.verdict == "verified" and v.details["checks"]["chips"]["pace_checked"], v.reasons
    slow = {s: {"model": "toy", "peak_flops_16bit": 1.0} for s in fast}
    v = verify(mlp, {**c, "prover_chips": slow}, Budget(segments=0), coverage_target=0.0)
    assert v.verdict == "rejected" and any("pace" in x or "more than" in x for x in v.reasons), v.reasons


def test_chips_with_a_sliver_of_the_model_do_not_pad_the_pace(mlp):
    """Issue #19 case 3, re-probed: the padding chips hold ONE parameter each (a non-empty shard) and log snapshots
    of the run all along (their sliver's hashes, answered by the prover), so they count as working. Their peak
    adds nothing: each step needs every shard's share of its FLOPs, so each working chip must do its own share
    at its own peak, and the chips holding the model are too slow."""
    m = manifest(mlp)
    a, b = two_on_one_chip(mlp)
    assert a["serial"] != m["shards"][0]["serial"]
    seconds = (datetime.fromisoformat(b["time"][:-1]) - datetime.fromisoformat(a["time"][:-1])).total_seconds()
    need = (b["step"] - a["step"]) * verify_with(mlp).details["flops_per_step"]
    # each working chip at half the pace its quarter of the model needs (a clear margin: snapshot times are
    # whole seconds, so the pace allows one second more than the signed times say)
    working = {s["serial"]: {"model": "toy", "peak_flops_16bit": need / seconds / 8} for s in m["shards"]}
    pads = [f"PAD-{i}" for i in range(30)]
    m["shards"][0]["start"] = len(pads)  # the slivers come off the first chip's shard (its claims are left out)
    m["shards"] = [{"serial": s, "start": i, "end": i + 1} for i, s in enumerate(pads)] + m["shards"]
    save_manifest(mlp, m)
    c = claims(mlp)
    c["claims"] = [{**x, "shard": x["shard"] + len(pads)} for x in (a, b)]
    prover = {**working, **{s: {"model": "h100", "peak_flops_16bit": 1e18} for s in pads}}
    logged = {s: [a["time"], b["time"]] for s in pads}  # the slivers' snapshots, all through the interval
    padded = verify(mlp, {**c, "prover_chips": prover, "run_snapshots": logged}, Budget(segments=0))
    assert padded.verdict == "rejected" and any("its peak over its share" in r for r in padded.reasons), padded.reasons
    fast = {s: {"model": "toy", "peak_flops_16bit": need / seconds} for s in working}  # each can do all of it
    fine = verify(mlp, {**c, "prover_chips": {**prover, **fast}, "run_snapshots": logged}, Budget(segments=0))
    assert fine.verdict == "verified", fine.reasons


def test_a_chip_sold_after_the_run_is_a_rule_finding_only_if_never_the_provers(mlp):
    """Issue #19 case 8: the registry as it was: the Django side lists the chips whose snapshots the prover
    answered; a layout chip missing from it is a broken rule (rules.layout_registered), not a replay mismatch."""
    layout = manifest(mlp)["shards"]
    some = {s["serial"]: {"model": "h100", "peak_flops_16bit": 1e15} for s in layout[1:]}
    v = verify_with(mlp, prover_chips=some)
    assert v.verdict == "rejected" and v.details["rules"]["layout_registered"]["ok"] is False
    assert v.details["mismatch_step"] is None
    every = {s["serial"]: {"model": "h100", "peak_flops_16bit": 1e15} for s in layout}
    assert verify_with(mlp, prover_chips=every).details["rules"]["layout_registered"]["ok"] is True


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


# --- issue #19 case 4: a lower bound on work, from the chips' own counters ---------------------------------


def _extend_log(d, serial: str, records: int, flops_each: int, step: int, shard_hash: str, minutes: int = 360):
    """The chip's firmware goes on logging after the run (every six hours); each record's counters advance by
    `flops_each`; the prover answers every snapshot as `step` of the finished run (its claims.json)."""
    from datetime import datetime, timedelta

    from replay.protocol.firmware import Chip, chip_key, parse_record, record_hash

    lines = (d / "snapshots.jsonl").read_text().splitlines()
    mine = [parse_record(x) for x in lines if json.loads(x)["serial"] == serial]
    last = mine[-1]
    chip = Chip(serial, last["shard"], chip_key(0, serial), busy_ns=last["busy_ns"], flops=last["flops"])
    chip.counter, chip.prev = last["counter"] + 1, record_hash(last)
    when = datetime.fromisoformat(last["time"][:-1])
    c = claims(d)
    for k in range(records):
        chip.work(3600.0 if flops_each else 0.0, flops_each)
        line = chip.snapshot(when + timedelta(minutes=minutes * (k + 1)), shard_hash)
        lines.append(line)
        rec = json.loads(line)
        c["claims"].append({k2: rec[k2] for k2 in ("serial", "counter", "shard", "hash", "time")} | {"step": step})
    (d / "snapshots.jsonl").write_text("\n".join(lines) + "\n")
    (d / "claims.json").write_text(json.dumps(c))


def _final_claim(d):
    last = max(claims(d)["claims"], key=lambda x: (x["step"], x["counter"]))
    return last


def test_parked_snapshots_of_a_finished_run_need_still_counters(mlp):
    """A chip parked after its run (counters still) may be answered as the run's last step forever; the same
    answers while its counters advance (the chip did something else meanwhile) are unaccounted work."""
    from replay.training.architectures import batch_spec, training_flops  # noqa: F401 -- the figure the firmware counts

    last = _final_claim(mlp)
    parked = copy(mlp, mlp.parent / "parked")
    _extend_log(parked, last["serial"], 20, 0, last["step"], last["hash"])
    v = verify(
        parked,
        parked / "claims.json",
        Budget(segments=0),
        snapshots=parked / "snapshots.jsonl",
        chip_keys=parked / "chips.json",
        coverage_target=0.0,
    )
    assert v.verdict == "verified", v.reasons
    assert v.details["rules"]["work_accounted"]["ok"] is True
    busy = copy(mlp, mlp.parent / "busy")
    _extend_log(busy, last["serial"], 20, 10**12, last["step"], last["hash"])
    v = verify(
        busy,
        busy / "claims.json",
        Budget(segments=0),
        snapshots=busy / "snapshots.jsonl",
        chip_keys=busy / "chips.json",
        coverage_target=0.0,
    )
    assert v.verdict == "rejected" and any(r.startswith("unaccounted work") for r in v.reasons), v.reasons
    assert v.details["rules"]["work_accounted"]["ok"] is False
    assert [f for f in v.details["findings"] if f["kind"] == "unaccounted_work"]


def test_hidden_work_is_counted_by_the_chips(tmp_path):
    """2x hidden work (12 off-the-books steps inside a 12-step run): the chips' firmware counts every FLOP it
    executes, so the snapshots around the hidden work show more work than the claimed steps need."""
    from replay.protocol.firmware import Firmware

    class TruthfulChips(Firmware):
        def tick(self, step, hashes):
            if step == 8:  # the firmware counts the hidden steps the recorder trained at checkpoint 8
                for chip, share in zip(self.chips, self.share):
                    chip.work(60.0 * 12, round(12 * self.step_flops * share))
            return super().tick(step, hashes)

    d = record(
        tmp_path / "t", "mlp", recorder=cheats.HiddenCompute, at=8, extra=12, snapshot_rate=2.0, firmware=TruthfulChips
    )
    v = verify(
        d,
        d / "claims.json",
        Budget(segments=0),
        snapshots=d / "snapshots.jsonl",
        chip_keys=d / "chips.json",
        coverage_target=0.0,
    )
    assert v.verdict == "rejected"
    assert any(r.startswith("unaccounted work") for r in v.reasons), v.reasons
    honest = record(tmp_path / "h", "mlp", snapshot_rate=2.0)
    v = verify(
        honest,
        honest / "claims.json",
        Budget(segments=0),
        snapshots=honest / "snapshots.jsonl",
        chip_keys=honest / "chips.json",
        coverage_target=0.0,
    )
    assert v.verdict == "verified" and v.details["rules"]["work_accounted"]["pairs_checked"] > 0, v.reasons


def test_work_before_a_chips_first_snapshot_is_accounted_from_fabrication():
    """The counters count from fabrication: a chip whose first record ever (counter 0) already shows more work
    than the run's steps so far did that work for no claim; less is work the chip never did (the layout is fixed
    for the whole run: a chip holding a shard computes it from step 0)."""
    from replay.protocol.chips_and_time import _work

    def ev(counter, step, flops):
        return {"counter": counter, "step": step, "flops": flops, "run": "r", "mine": True}

    ok, _, pairs = _work("c", [ev(0, 4, 400), ev(1, 6, 600)], "r", 1.0, 100.0)
    assert ok == [] and pairs["pairs"] == 2
    never, _, _ = _work("c", [ev(0, 4, 100), ev(1, 6, 300)], "r", 1.0, 100.0)
    assert len(never) == 1 and "work not done" in never[0] and "since fabrication" in never[0]
    within, _, _ = _work("c", [ev(0, 4, 320), ev(1, 6, 520)], "r", 1.0, 100.0)  # within the tolerance
    assert within == []
    hidden, _, _ = _work("c", [ev(0, 4, 900), ev(1, 6, 1100)], "r", 1.0, 100.0)
    assert len(hidden) == 1 and "since fabrication" in hidden[0]
    again, _, _ = _work("c", [ev(3, 4, 900), ev(4, 6, 1100)], "r", 1.0, 100.0)
    assert again == []  # not its first record: earlier work belongs to earlier snapshots


def test_a_copied_transcript_answered_with_a_chips_own_snapshots_is_work_not_done():
    """Issue #19, re-probed: a prover copies another run's transcript, writes its own chips into the layout
    and answers a snapshot its chip logged at rest with the copied run's last step. Its counters did none of the
    run: between its last snapshot of another run and its first of this one they must have counted this run's
    steps so far (snapshots between, unknown yet, only add work)."""
    from replay.protocol.chips_and_time import _work

    def ev(counter, run, step, flops, mine):
        return {"counter": counter, "step": step, "flops": flops, "run": run, "mine": mine}

    before = {**ev(6, "q", 10, 5000, False), "run_steps": 10, "chip_step_flops": 100.0}
    stolen, _, _ = _work("c", [before, ev(7, "r", 20, 5000, True)], "r", 1.0, 100.0)
    assert len(stolen) == 1 and "work not done" in stolen[0] and "counter 6" in stolen[0]
    gap, _, _ = _work("c", [before, ev(9, "r", 20, 5000, True)], "r", 1.0, 100.0)  # 7 and 8 not claimed yet
    assert len(gap) == 1 and "work not done" in gap[0]
    honest, _, _ = _work("c", [before, ev(7, "r", 20, 7000, True)], "r", 1.0, 100.0)
    assert honest == []
    first_ever, _, _ = _work("c", [ev(0, "r", 20, 0, True)], "r", 1.0, 100.0)
    assert len(first_ever) == 1 and "since fabrication" in first_ever[0]
    # seen from the other run's verification: the later run's figures come from the ledger (history)
    later = {**ev(7, "r", 20, 5000, False), "run_steps": 20, "chip_step_flops": 100.0}
    seen, _, _ = _work("c", [{**before, "mine": True}, later], "q", 1.0, 100.0)
    assert len(seen) == 1 and "work not done" in seen[0]


def _two_runs(tmp_path, hidden_after_first: int, gap_hours: float = 0.0, first_rate: float = 0.5):
    """Run A then run B on the same three chips, their firmware carrying on (counters, keys, log chain), as a
    prover's chips do. With ``hidden_after_first`` > 0 the chips train that many steps off the books right
    after run A's last tick: after every chip's last snapshot of A, before B's first."""
    from datetime import timedelta

    from replay.protocol.firmware import EPOCH, Firmware

    serials = ["X-0", "X-1", "X-2"]
    made: list[Firmware] = []

    class HiddenAfterTheRun(Firmware):
        def finish(self, step, hashes):
            out = super().finish(step, hashes)
            if hidden_after_first:  # after the run's closing snapshots: no pair of run A's brackets it
                for chip, share in zip(self.chips, self.share):
                    chip.work(60.0 * hidden_after_first, round(hidden_after_first * self.step_flops * share))
            return out

    def first(layout, seed, rate):
        made.append(HiddenAfterTheRun(layout, seed, rate))
        return made[-1]

    def second(layout, seed, rate):
        start = EPOCH + timedelta(seconds=60 * STEPS + 60 + 3600 * gap_hours)
        made.append(Firmware(layout, seed, rate, chips=made[0].chips, start=start))
        for chip, item in zip(made[-1].chips, layout):
            assert chip.serial == item["serial"]
        return made[-1]

    a = record(tmp_path / "a", "mlp", serials=serials, snapshot_rate=first_rate, firmware=first, seed=1)
    b = record(tmp_path / "b", "mlp", serials=serials, snapshot_rate=0.5, firmware=second, seed=2)
    return a, b


def _ledger_history(other, report):
    """The history the ledger gives for ``other``'s chips: its claims, with the run's length and each chip's FLOPs
    per step as the verifier counted them when it verified that run (``report``)."""
    c = claims(other)
    rows = {}
    for x in c["claims"]:
        rows.setdefault(x["serial"], []).append(
            {
                "counter": x["counter"],
                "time": x["time"],
                "step": x["step"],
                "run": "other",
                "manifest": c["manifest"],
                "run_steps": report["steps"],
                "chip_step_flops": report["chip_step_flops"][x["serial"]],
            }
        )
    flops = _signed_work(other)
    for serial, items in rows.items():
        for h in items:
            h["busy_ns"], h["flops"] = flops[serial, h["counter"]]
    return rows


def _signed_work(d):
    """{(serial, counter): (busy_ns, flops)} of the chips' signed records of run ``d``."""
    out = {}
    for line in (d / "snapshots.jsonl").read_text().splitlines():
        rec = json.loads(line)
        out[rec["serial"], rec["counter"]] = (rec["busy_ns"], rec["flops"])
    return out


def _with_work(d, **extra):
    """Run ``d``'s claims as the regulator's side sends them: each with its snapshot's signed work counters (read
    off the chip's log by the inspector), the other runs' claims in ``history``."""
    c = {**claims(d), **extra}
    work = _signed_work(d)
    for x in c["claims"]:
        x["busy_ns"], x["flops"] = work[x["serial"], x["counter"]]
    return verify(d, c, Budget(segments=0), coverage_target=0.0)


@pytest.mark.parametrize("hidden", [0, STEPS])
def test_work_between_two_runs_is_accounted_by_their_claims(tmp_path, hidden):
    """2x hidden work after every chip's last snapshot of run A and before its first of run B: no pair of one
    run's snapshots brackets it, the pair across the two runs does. Whichever run is verified second (with the
    other's claims in its history) finds it; honest back-to-back runs verify both ways."""
    a, b = _two_runs(tmp_path, hidden)
    alone_a, alone_b = _with_work(a), _with_work(b)
    assert alone_a.verdict == "verified" and alone_b.verdict == "verified", alone_a.reasons + alone_b.reasons
    b_after_a = _with_work(b, history=_ledger_history(a, alone_a.details))
    a_after_b = _with_work(a, history=_ledger_history(b, alone_b.details))
    for v in (b_after_a, a_after_b):
        if hidden:
            assert v.verdict == "rejected" and any(r.startswith("unaccounted work") for r in v.reasons), v.reasons
            assert [f for f in v.details["findings"] if f["kind"] == "unaccounted_work"]
            assert v.details["conflicts"] and {x["kind"] for x in v.details["conflicts"]} == {"work"}
        else:
            assert v.verdict == "verified", v.reasons
            assert v.details["checks"]["chips"]["work"]["across_runs"] > 0


def test_a_run_whose_chips_logged_nothing_at_random_still_closes_with_a_snapshot(tmp_path):
    """Snapshots come at random: a chip may draw none in a whole run. The firmware logs one at the run's end
    (replay.protocol.firmware.Firmware.finish), so that run's work is its own claims' and never falls on the
    next run's first snapshot as unaccounted work (an honest prover accused)."""
    a, b = _two_runs(tmp_path, 0, first_rate=0.0)
    closing = claims(a)["claims"]
    assert sorted(c["serial"] for c in closing) == ["X-0", "X-1", "X-2"] and {c["step"] for c in closing} == {STEPS}
    alone_a = _with_work(a)
    assert alone_a.verdict == "verified", alone_a.reasons
    v = _with_work(b, history=_ledger_history(a, alone_a.details))
    assert v.verdict == "verified", v.reasons
    assert v.details["checks"]["chips"]["work"]["across_runs"] > 0


def test_an_idle_gap_between_two_runs_is_no_work(tmp_path):
    """Counters still for two days between two honest runs: nothing to account."""
    a, b = _two_runs(tmp_path, 0, gap_hours=48)
    v = _with_work(b, history=_ledger_history(a, _with_work(a).details))
    assert v.verdict == "verified", v.reasons
    assert v.details["checks"]["chips"]["work"]["across_runs"] > 0


def test_a_pair_across_runs_without_the_other_runs_figures_is_left_for_later(tmp_path):
    """The other run not verified yet (no figures of ours for it): the pair is not judged now, and counted as
    unchecked; the other run's own verification, with this one's claims in its history, judges it."""
    a, b = _two_runs(tmp_path, STEPS)
    history = _ledger_history(a, _with_work(a).details)
    for items in history.values():
        for h in items:
            del h["run_steps"], h["chip_step_flops"]
    v = _with_work(b, history=history)
    assert v.verdict == "verified", v.reasons
    assert v.details["checks"]["chips"]["work"]["across_runs_unchecked"] > 0
    # named in the report, pair by pair, for the regulator's side to re-check once run A has figures of ours
    first_of_b = {}
    for x in claims(b)["claims"]:
        first_of_b[x["serial"]] = min(first_of_b.get(x["serial"], x["counter"]), x["counter"])
    named = v.report.summary()["across_runs_unchecked"]
    assert named and all(p["counters"] == [first_of_b[p["serial"]] - 1, first_of_b[p["serial"]]] for p in named)
    judged = _with_work(b, history=_ledger_history(a, _with_work(a).details))
    assert judged.verdict == "rejected" and judged.report.summary()["across_runs_unchecked"] == []


@given(
    st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50), st.floats(1e-3, 1e21, allow_nan=False)), max_size=12),
    st.lists(st.tuples(st.integers(-5, 55), st.integers(0, 60)), min_size=1, max_size=8),
)
def test_the_pace_capacity_is_the_exact_sum_of_the_chips_whose_span_meets_the_interval(chips, questions):
    """The sorted, bisected capacity (two bisections a question, where a sum over every chip for every pair of a chip's
    snapshots took minutes at 4,096 chips) equals the sum over the chips whose span meets [a, b], exactly rounded."""
    from replay.protocol.chips_and_time import _Capacity

    spans = {f"c{i}": (min(x, y), max(x, y)) for i, (x, y, _) in enumerate(chips)}
    peaks = {f"c{i}": p for i, (*_, p) in enumerate(chips)} | {"idle": 5.0}  # a working chip that logged nothing
    capacity = _Capacity(peaks, spans)
    for a, width in questions:
        b = a + width
        meets = [Fraction(peaks[s]) for s, (first, last) in spans.items() if first <= b and a <= last]
        assert capacity(a, b) == float(sum(meets, Fraction(0)))
