"""verify(): honest transcripts verify bit-exactly on another machine configuration; every attack is caught."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from replay import Budget, verify
from replay.protocol.transcript_layout import checkpoint_path

from .. import helpers
from ..helpers import STEPS, copy, edit_checkpoint, edit_segment, manifest, save_manifest

ROOT = Path(__file__).resolve().parents[3]
ALL = Budget(segments=100)  # replay every segment: attacks are then caught deterministically
# ...and without the fused C kernel (replay/training/native.py): the torch path, as on a GPU or a machine with no compiler
OTHER_MACHINE = {
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "ATEN_CPU_CAPABILITY": "default",
    "OMP_NUM_THREADS": "2",
    "REPLAY_NATIVE": "0",
}


def run_verify(d: Path, budget=ALL, **kw):
    return verify(d, d / "claims.json", budget, snapshots=d / "snapshots.jsonl", chip_keys=d / "chips.json", **kw)


def with_threads(n: int, fn):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        return fn()
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("arch", ["mlp", "cnn", "gpt"])
def test_honest_transcript_verifies_on_another_thread_count(transcripts, arch):
    d = transcripts[arch, "det64"]  # recorded with 1 thread
    v = with_threads(2, lambda: run_verify(d))
    assert v.verdict == "verified", v.reasons
    assert v.details["threads"] == 2
    assert all(c["ok"] for c in v.details["claims"]) and len(v.details["claims"]) > 0
    assert len(v.details["segments"]) == STEPS // helpers.INTERVAL and all(s["ok"] for s in v.details["segments"])


def test_a_transcript_of_the_first_format_verifies(tmp_path, monkeypatch):
    """A chipledger-replay/1 transcript, its convolutions' weight gradients recorded under that format's wider bound
    (gamma(B * L + 2), many more close calls logged), verifies here, where a weight gradient's window is its sum's
    depth (gamma(B + L)): every entry inside the narrower windows. A format this verifier does not read is malformed."""
    from replay.prover import recorder
    from replay.training import ops
    from replay.training.determinism import Rounder, gamma

    logged, finish = set(), Rounder.finish
    with monkeypatch.context() as m:
        m.setattr(recorder, "FORMAT", "chipledger-replay/1")
        m.setattr(ops, "_weight_grad_gamma", lambda images, positions: gamma(images * positions + 2))
        m.setattr(Rounder, "finish", lambda self: logged.update(map(self.name, self.entries)) or finish(self))
        cfg = {"in_channels": 3, "image": 16, "channels": [8, 16], "classes": 4}  # (the tiny one logs none there)
        d = helpers.record(tmp_path / "v1", "cnn", config=cfg)
    assert manifest(d)["format"] == "chipledger-replay/1"
    assert {"convs.0#1", "convs.1#1"} <= logged, sorted(logged)  # not vacuous: both weight gradients logged
    v = run_verify(d)
    assert v.verdict == "verified", v.reasons
    assert all(c["ok"] for c in v.details["claims"]) and len(v.details["claims"]) > 0
    m = manifest(d)
    for other in ("chipledger-replay/3", "chipledger-replay/1\n", ["chipledger-replay/1"]):
        save_manifest(d, {**m, "format": other})
        v = run_verify(d)
        assert v.verdict == "malformed" and "format must be one of" in v.reasons[0], (other, v.reasons)


def test_other_cpu_code_path_verifies_det64(transcripts):
    """A subprocess with MKL's AVX2 kernels, ATen's scalar kernels, 2 threads and no fused kernel: det64
    verifies (float32 is refused before any replay: test_only_deterministic_precisions_are_claimable)."""
    dirs = {a: str(transcripts[a, "det64"]) for a in ("mlp", "cnn", "gpt")}
    script = (
        "import json, sys, torch\n"
        "from replay import verify, Budget\n"
        "from replay.training import native\n"
        "out = {'capability': torch.backends.cpu.get_cpu_capability(), 'threads': torch.get_num_threads(),\n"
        "       'native': native.library() is not None}\n"
        "for k, d in json.loads(sys.argv[1]).items():\n"
        "    v = verify(d, d + '/claims.json', Budget(segments=100))\n"
        "    out[k] = [v.verdict, v.reasons[:1]]\n"
        "print(json.dumps(out))\n"
    )
    env = {**os.environ, **OTHER_MACHINE, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", script, json.dumps(dirs)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["capability"] == "DEFAULT" and out["threads"] == 2 and not out["native"]
    for arch in ("mlp", "cnn", "gpt"):
        assert out[arch][0] == "verified", out[arch]


# --------------------------------------------------------------------------- attacks


@pytest.fixture
def mlp(transcripts, tmp_path):
    return copy(transcripts["mlp", "det64"], tmp_path / "t")


def rejected_because(v, *needles) -> bool:
    assert v.verdict == "rejected", (v.verdict, v.reasons)
    text = " | ".join(v.reasons)
    return all(n in text for n in needles)


def test_only_deterministic_precisions_are_claimable(transcripts, capsys):
    """Issue #19 case 9: a float32 transcript replays only on its recorder's configuration (6 of 9 honest ones
    recorded with 2 threads were rejected with 1), so it is refused as malformed, naming the precision, even
    where it would replay -- before any replay runs."""
    from replay.__main__ import main

    d = transcripts["gpt", "float32"]
    v = with_threads(1, lambda: run_verify(d))
    assert v.verdict == "malformed" and "precision 'float32' is not claimable" in v.reasons[0], v.reasons
    assert "det64" in v.reasons[0] and v.details["segments"] == [] and v.details["claims"] == []
    assert main(["verify", str(d), "--claims", str(d / "claims.json"), "--json"]) == 2
    assert "not claimable" in json.loads(capsys.readouterr().out)["reasons"][0]


def test_bits_not_values_negative_zero_checkpoint_is_caught(mlp):
    """Issue #19 case 5: the optimizer's momentum at step 0 is all zeros; a checkpoint holding -0.0 there equals
    +0.0 as a value (and replays to the same values) but is not the committed initialisation's bits."""

    def negate_zeros(t):
        for k in t:
            if k.startswith("momentum:"):
                t[k] = torch.where(t[k] == 0, torch.tensor(-0.0), t[k])

    edit_checkpoint(mlp, 0, negate_zeros)
    v = run_verify(mlp)
    assert rejected_because(v, "the checkpoint at step 0 is not the initialisation")


def test_bits_not_values_compares_bit_patterns():
    """States compare by bit pattern: -0.0 is not +0.0, and NaNs with other payloads differ."""
    from replay.protocol.bisect import bits_equal
    from replay.training.train import State

    a = State(1, {"w": torch.tensor([0.0, 1.0])}, {})
    assert bits_equal(a, State(1, {"w": torch.tensor([0.0, 1.0])}, {}))
    assert not bits_equal(a, State(1, {"w": torch.tensor([-0.0, 1.0])}, {}))
    nan1 = torch.tensor([0x7FC00001], dtype=torch.int32).view(torch.float32)
    nan2 = torch.tensor([0x7FC00002], dtype=torch.int32).view(torch.float32)
    assert not bits_equal(State(1, {"w": nan1}, {}), State(1, {"w": nan2}, {}))
    assert bits_equal(State(1, {"w": nan1}, {}), State(1, {"w": nan1.clone()}, {}))


def test_swapped_batches_are_caught(mlp):
    def swap(t):
        t["x:5"], t["x:6"], t["y:5"], t["y:6"] = t["x:6"], t["x:5"], t["y:6"], t["y:5"]

    edit_segment(mlp, 4, swap, recommit=False)  # the file is no longer the committed one
    assert rejected_because(run_verify(mlp), "segments/00000004.safetensors does not match the manifest's commitment")
    edit_segment(mlp, 4, lambda t: None, recommit="file")  # file hash fixed up, data commitments not
    assert rejected_because(run_verify(mlp), "step 5 does not match its data commitment")
    edit_segment(mlp, 4, lambda t: None)  # the prover re-commits to the swapped order: replay then diverges
    assert rejected_because(run_verify(mlp), "segment 4..8", "step 5")


def test_one_perturbed_batch_value_is_caught(mlp):
    def nudge(t):
        t["x:9"] = t["x:9"].clone()
        t["x:9"][3, 7] += 1e-3

    edit_segment(mlp, 8, nudge, recommit="file")
    assert rejected_because(run_verify(mlp), "step 9 does not match its data commitment")
    edit_segment(mlp, 8, lambda t: None)
    assert rejected_because(run_verify(mlp), "segment 8..12", "step 9")


def test_edited_checkpoint_is_caught(mlp):
    def edit(t):
        k = next(k for k in t if k.startswith("param:"))
        t[k] = t[k].clone()
        t[k].view(-1)[0] += 1e-6

    edit_checkpoint(mlp, 8, edit, recommit=False)
    assert rejected_because(run_verify(mlp), "checkpoints/00000008.safetensors does not match")
    edit_checkpoint(mlp, 8, lambda t: None)
    assert rejected_because(run_verify(mlp), "segment 4..8: replayed state at step 8 differs")


def test_changed_learning_rate_is_caught(mlp):
    m = manifest(mlp)
    m["optimizer"]["lr"]["lr"] *= 1.5
    save_manifest(mlp, m)
    # the first update (step 0) already differs, so step 1 no longer replays
    assert rejected_because(run_verify(mlp), "segment 0..4: step 1")


def test_snapshot_claimed_for_the_wrong_step_is_caught(mlp):
    c = helpers.claims(mlp)
    victim = next(x for x in c["claims"] if 0 < x["step"] < STEPS)
    victim["step"] += 1
    (mlp / "claims.json").write_text(json.dumps(c))
    assert rejected_because(
        run_verify(mlp), f"claim {victim['serial']}#{victim['counter']}", f"at step {victim['step']} replays"
    )


def test_interpolated_trajectory_is_caught(mlp):
    """Checkpoints 4 and 8 replaced by points on the line from checkpoint 0 to 12 ('infinitesimal updates'):
    the replay rejects it; the straight line is a finding shown with its evidence, never itself the reason."""
    import safetensors.torch

    ends = [dict(safetensors.torch.load(checkpoint_path(mlp, s).read_bytes())) for s in (0, STEPS)]
    for step in (4, 8):
        w = step / STEPS
        edit_checkpoint(mlp, step, lambda t, w=w: t.update({k: ends[0][k] * (1 - w) + ends[1][k] * w for k in t}))
    v = run_verify(mlp)
    assert rejected_because(v, "segment 0..4: replayed state at step 4 differs")
    assert not any("straight line" in r for r in v.reasons)
    found = {f["kind"]: f for f in v.details["findings"]}
    assert found["straight_line"]["evidence"]["collinear_at"]


def test_heuristics_flag_replay_decides(transcripts, monkeypatch):
    """Issue #19 case 6: momentum and convergence make honest trajectories straight (5 of 10 honest seeds were
    rejected as 'interpolated'). With the straight-line and jump rules tripped on an honest run, it verifies
    and the findings carry their evidence."""
    from replay.protocol import trajectory

    monkeypatch.setattr(trajectory, "COLLINEAR", -1.0)  # every stretch looks straight
    monkeypatch.setattr(trajectory, "UPDATE_JUMP", 0.0)  # every change of update size looks like a jump
    v = run_verify(transcripts["mlp", "det64"])
    assert v.verdict == "verified", v.reasons
    kinds = {f["kind"] for f in v.details["findings"]}
    assert {"straight_line", "update_jump"} <= kinds
    assert all(f["detail"] and isinstance(f["evidence"], dict) for f in v.details["findings"])


def test_a_one_example_dataset_records_and_verifies(tmp_path):
    """Issue #10 case 10: with one example the Merkle tree is its leaf and every inclusion proof is empty;
    `replay record` crashed writing the empty proof tensor."""
    from replay import Recorder
    from replay.training import bundled_data as data
    from replay.training.data_commitment import Committed

    cfg = helpers.TINY["mlp"]["config"]
    x, y = data.blobs(1, cfg["sizes"][0], cfg["sizes"][-1], 0)
    batches = data.Batches("mlp", cfg, 8, 0, Committed(x, y, "one", data._range(x)))
    d = Recorder(tmp_path / "one", "mlp", steps=4, checkpoint_interval=2, config=cfg, batch=8, batches=batches).run()
    v = verify(d, d / "claims.json", ALL)
    assert v.verdict == "verified", v.reasons
    assert manifest(d)["dataset"]["size"] == 1


def test_disputes_are_bisected_without_a_prover_store(mlp, capsys):
    """The production path names the first divergent step and operation from the transcript's commitments,
    and `python -m replay verify` prints them."""
    from replay.__main__ import main

    m = manifest(mlp)
    m["records"][6]["loss"] = m["records"][6]["loss"] * 1.5 + 0.125  # the recorded loss of step 6 is made up
    save_manifest(mlp, m)
    v = run_verify(mlp)
    assert v.verdict == "rejected" and v.details["mismatch_step"] == 6
    assert v.details["dispute"]["step"] == 6 and v.details["dispute"]["op"] == "loss"
    main(["verify", str(mlp), "--claims", str(mlp / "claims.json"), "--segments", "100"])
    out = capsys.readouterr().out
    assert "first divergent step: 6" in out and "operation: loss" in out


def test_a_checkpoint_that_no_step_explains_is_pinned_to_the_checkpoint_after_the_last_step(mlp):
    """Every step of the segment replays to the state the transcript committed for it; the checkpoint is not that
    state: the segment's last step, op "checkpoint", and the first tensor whose bits differ."""

    def edit(t):
        k = next(k for k in t if k.startswith("param:"))
        t[k] = t[k].clone()
        t[k].view(-1)[0] += 1e-3

    edit_checkpoint(mlp, 8, edit)
    v = run_verify(mlp)
    d = v.details["dispute"]
    assert d["step"] == 7 and d["op"] == "checkpoint" and d["tensor"].startswith("param:"), d
    assert d["source"] == "step commitments"


def test_under_reported_compute_is_caught(mlp):
    m = manifest(mlp)
    counted = verify(mlp, mlp / "claims.json", Budget(segments=0)).details["flops"]
    m["reported_flops"] = counted // 2
    save_manifest(mlp, m)
    v = run_verify(mlp)
    assert rejected_because(v, "compute under-reported")
    assert v.details["flops"] == counted and v.details["rules"]["compute_reported"]["ok"] is False


def test_rule_threshold_is_enforced_on_counted_compute(mlp):
    v = run_verify(mlp, rules={"max_training_flops": 1e6})
    assert rejected_because(v, "rule violated")
    assert v.details["rules"]["max_training_flops"] == {"threshold": 1e6, "value": v.details["flops"], "ok": False}
    assert v.details["examples"] == STEPS * helpers.TINY["mlp"]["batch"] and v.details["steps"] == STEPS


def test_tampered_snapshot_log_is_caught(mlp):
    lines = (mlp / "snapshots.jsonl").read_text().splitlines()
    del lines[1]
    (mlp / "snapshots.jsonl").write_text("\n".join(lines) + "\n")
    v = run_verify(mlp)
    assert rejected_because(v, "has no logged snapshot")


def test_budget_exhaustion_is_not_verified_nor_rejected(mlp):
    v = run_verify(mlp, Budget(max_steps=1))
    assert v.verdict == "incomplete" and v.details["budget_exhausted"]


@pytest.mark.parametrize(
    "device,why",
    [
        ("cuda", "device 'cuda': no CUDA device is available to this torch"),
        ("tpu", "device 'tpu': use cpu, cuda or auto"),
        ("cuda:x", "device 'cuda:x': use cpu, cuda or auto"),
        ("cpu\n", "device 'cpu\\n': use cpu, cuda or auto"),
    ],
)
def test_a_device_this_machine_cannot_run_is_the_verifiers_error_not_the_provers(mlp, device, why, monkeypatch):
    """A worker told REPLAY_DEVICE=cuda on a host without a card: the verdict is "error" (retry elsewhere), with
    the reason, before the transcript is read; never "malformed" or "rejected", which would blame the prover."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    v = run_verify(mlp, device=device)
    assert (v.verdict, v.reasons) == ("error", [f"the verifier cannot replay on this machine: {why}"])
    assert "manifest" not in v.details and "beyond_budget" not in v.details  # no larger worker helps here


def test_auto_replays_where_it_can_and_the_verdict_says_where(mlp):
    v = run_verify(mlp, device="auto")
    assert v.verdict == "verified" and v.details["device"] == ("cuda" if torch.cuda.is_available() else "cpu")


def test_random_segments_depend_on_the_nonce(transcripts):
    d = transcripts["mlp", "det64"]
    picks = {
        tuple(s["start"] for s in verify(d, None, Budget(segments=1), nonce=bytes([n])).details["segments"])
        for n in range(12)
    }
    assert len(picks) > 1


def test_unusable_chip_keys_are_malformed_and_a_missing_one_a_reason_not_a_crash(mlp):
    """A key that is no key is a malformed input (the keys file's, not the chip's: probe #17); a chip whose log
    no key checks is a reason against the run."""
    keys = json.loads((mlp / "chips.json").read_text())
    (mlp / "chips.json").write_text(json.dumps({s: "not base64!" for s in keys}))
    v = run_verify(mlp)
    assert v.verdict == "malformed" and "is not a base64 Ed25519 public key" in v.reasons[0]
    (mlp / "chips.json").write_text(json.dumps(dict(list(keys.items())[1:])))
    assert rejected_because(run_verify(mlp), "no usable public key")
    (mlp / "chips.json").write_text("[1, 2]")
    assert run_verify(mlp).verdict == "malformed"


def test_a_claims_or_keys_file_naming_a_member_twice_is_malformed(mlp):
    """A claim that quotes two hashes, or a keys file that gives a chip two keys, is one document to Python's parser
    (the last wins) and another to one that keeps the first: malformed, naming the member, before anything is read."""
    claims = (mlp / "claims.json").read_text()
    assert '"hash": ' in claims or '"hash":' in claims
    twice = claims.replace('"hash":', '"hash": "' + "0" * 64 + '", "hash":', 1)
    (mlp / "claims.json").write_text(twice)
    v = run_verify(mlp)
    assert v.verdict == "malformed" and "claims is not readable JSON: member 'hash' appears twice" in v.reasons[0]
    (mlp / "claims.json").write_text(claims)
    assert run_verify(mlp).verdict == "verified"
    keys = json.loads((mlp / "chips.json").read_text())
    serial = next(iter(keys))
    body = json.dumps(keys)[:-1] + f', "{serial}": "{keys[serial]}"}}'
    (mlp / "chips.json").write_text(body)
    v = run_verify(mlp)
    assert v.verdict == "malformed" and f"member '{serial}' appears twice" in v.reasons[0]


def test_a_claimed_hash_not_written_as_a_sha256_is_malformed_not_a_mismatch(mlp):
    """A claim's hash or the claims' manifest hash in capitals, cut short or padded is a slip in the file, which no
    replay can answer: malformed, naming the field, where a claim had been rejected ("replays to ..., not the claimed
    ...") and the whole file answered for "a different transcript", verdicts against an honest run."""
    claims = json.loads((mlp / "claims.json").read_text())
    for spelling in (str.upper, lambda h: h[:-1], lambda h: h + "\n", lambda h: " " + h):
        bad = {**claims, "claims": [{**claims["claims"][0], "hash": spelling(claims["claims"][0]["hash"])}]}
        (mlp / "claims.json").write_text(json.dumps(bad))
        v = run_verify(mlp)
        assert v.verdict == "malformed" and v.reasons == [
            "claims[0].hash must be a snapshot hash, 64 lowercase hex digits"
        ], v.reasons
    (mlp / "claims.json").write_text(json.dumps({**claims, "manifest": claims["manifest"].upper()}))
    v = run_verify(mlp)
    assert v.verdict == "malformed" and "claims.manifest must be the transcript's manifest hash" in v.reasons[0]
    (mlp / "claims.json").write_text(json.dumps(claims))
    assert run_verify(mlp).verdict == "verified"


def test_a_claim_without_a_time_takes_its_chips_signed_time_where_the_logs_are_given(mlp):
    """Untimed, a claim skips the order and pace checks; with the chips' signed logs at hand its time is the one its
    chip signed, so they run (and without the logs it stays untimed, as documented)."""
    claims = json.loads((mlp / "claims.json").read_text())
    for c in claims["claims"]:
        del c["time"]
    (mlp / "claims.json").write_text(json.dumps(claims))
    v = run_verify(mlp)
    assert v.verdict == "verified", v.reasons
    assert v.details["checks"]["chips"]["untimed"] == 0
    alone = verify(mlp, mlp / "claims.json", ALL)
    assert alone.verdict == "verified" and alone.details["checks"]["chips"]["untimed"] == len(claims["claims"])


def test_a_fifo_as_the_keys_file_is_read_not_waited_on(mlp):
    """A FIFO a prover leaves as chips.json (no process writes it) gives nothing, so malformed at once, where open() had
    waited for a writer for ever; one a process writes, as `--keys <(...)` makes, is read as it comes."""
    keys = (mlp / "chips.json").read_text()
    (mlp / "chips.json").unlink()
    os.mkfifo(mlp / "chips.json")
    said = []
    checker = threading.Thread(target=lambda: said.append(run_verify(mlp)), daemon=True)
    checker.start()
    checker.join(60)  # (a regression waits in open(): the test fails, not hangs)
    assert (
        said
        and said[0].verdict == "malformed"
        and "chip keys is a pipe that gave nothing to read" in said[0].reasons[0]
    )
    (mlp / "chips.json").unlink()
    (mlp / "keys.json").write_text(keys)
    d = str(mlp)
    verify_cli = f"{sys.executable} -m replay verify {d} --claims {d}/claims.json --snapshots {d}/snapshots.jsonl"
    done = subprocess.run(
        ["bash", "-c", verify_cli + f" --keys <(cat {d}/keys.json) --segments 0 --json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert json.loads(done.stdout)["verdict"] == "verified", done.stderr[-2000:]


def test_the_verifier_returns_a_typed_report(mlp):
    """Issue #17/#19: both ends read one typed Report (replay.protocol.report), not a dict key by key; untrusted JSON
    with wrong types loses those fields, never crashes the reader."""
    from replay.protocol.report import Report

    m = manifest(mlp)
    m["records"][6]["loss"] = m["records"][6]["loss"] * 1.5 + 0.125
    save_manifest(mlp, m)
    report = run_verify(mlp).report
    assert isinstance(report, Report) and report.verdict == "rejected" and report.failing_step == 6
    assert report.dispute["op"] == "loss" and not report.rule_broken and report.segments_total == 3
    assert set(report.summary()) >= {"verdict", "reasons", "nonce", "coverage", "findings", "dispute", "conflicts"}
    odd = Report.from_json(
        {"verdict": "verified", "reasons": "x", "mismatch_step": "7", "segments_replayed": [1, "a", 1]}
    )
    assert odd.reasons == () and odd.mismatch_step is None and odd.segments_replayed == (1,)
    # drawn segments count as coverage: only those the report also replayed, as integers (a bool is no step)
    drawn = Report.from_json({"verdict": "verified", "segments_replayed": [0, 4], "segments_drawn": [4, 8, True, "0"]})
    assert drawn.segments_drawn == (4,) and drawn.summary()["segments_drawn"] == [4]
    assert Report.from_json({"verdict": "verified", "segments_drawn": [0]}).segments_drawn == ()
    for bad in (True, -1, 2**53, 1.0, "3", None):
        odd = Report.from_json({"verdict": "verified", "draw_pool": bad, "draw_cut": bad})
        assert odd.draw_pool is None and odd.draw_cut is None, bad
    kept = Report.from_json({"verdict": "verified", "draw_pool": 7, "draw_cut": 0}).summary()
    assert kept["draw_pool"] == 7 and kept["draw_cut"] == 0
    labelled = Report.from_json({"verdict": "verified", "device": "cuda:0", "torch": "2.13.0", "x": 1})
    assert (labelled.device, labelled.torch) == ("cuda:0", "2.13.0")
    assert Report.from_json({"verdict": "verified", "device": "x" * 65, "torch": ["2"]}).summary()["device"] == ""
    with pytest.raises(ValueError):
        Report.from_json({"verdict": "fine"})


def test_a_diverged_recording_stops_naming_its_step(tmp_path):
    """A run whose loss leaves [0, 1e6] (NaN included: SGD at the largest learning rate the recorder takes)
    stops at that step with the reason, not with a manifest that cannot be written (a half-made
    transcript and a JSON error); the CLI exits 2 with it."""
    from replay.prover.recorder import Recorder

    sgd = {"kind": "sgd", "lr": {"kind": "constant", "lr": 10.0}, "momentum": 0.9, "weight_decay": 0.0}
    recorder = Recorder(tmp_path / "run", "mlp", steps=12, checkpoint_interval=4, optimizer=sgd, progress=False)
    recorder.check()
    with pytest.raises(ValueError, match=r"step \d+: the loss is .*training diverged"):
        recorder.run()
    assert not (tmp_path / "run" / "manifest.json").exists()


@pytest.mark.parametrize("bad", [float("nan"), float("-inf")])
@pytest.mark.parametrize("at", [2, 5])
def test_an_update_that_leaves_a_non_finite_parameter_is_refused(tmp_path, monkeypatch, bad, at):
    """A NaN's sign and payload differ between machines: a checkpoint or snapshot holding one would not verify
    elsewhere. The next loss does not always show it (the last update has none; an embedding row no batch reads
    stays out of the loss): the recorder refuses the update itself, mid-run as at the last step."""
    from replay.prover import recorder as module

    real, calls = module.train_step, []

    def diverges_at(*args, **kwargs):
        state, loss = real(*args, **kwargs)
        calls.append(loss)
        if len(calls) == at + 1:
            next(iter(state.params.values())).view(-1)[3] = bad
        return state, loss

    monkeypatch.setattr(module, "train_step", diverges_at)
    run = module.Recorder(tmp_path / "run", "mlp", steps=6, checkpoint_interval=3, progress=False)
    with pytest.raises(ValueError, match=rf"step {at}: the update left non-finite parameters.*training diverged"):
        run.run()
    assert len(calls) == at + 1 and not (tmp_path / "run" / "manifest.json").exists()
