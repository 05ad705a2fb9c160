"""verify(): honest transcripts verify bit-exactly on another machine configuration; every attack is caught."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from replay import Budget, verify
from replay.transcript import checkpoint_path

from . import helpers
from .helpers import STEPS, copy, edit_checkpoint, edit_segment, manifest, save_manifest

ROOT = Path(__file__).resolve().parents[2]
ALL = Budget(segments=100)  # replay every segment: attacks are then caught deterministically
# ...and without the fused C kernel (replay/native.py): the torch path, as on a GPU or a machine with no compiler
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


def test_other_cpu_code_path_verifies_det64_and_breaks_float32(transcripts):
    """A subprocess with MKL's AVX2 kernels, ATen's scalar kernels, 2 threads and no fused kernel: det64
    verifies; float32 (control) is rejected exactly where that configuration trains float32 to other
    bits. Whether it does is a property of the CPU (on a machine whose own kernels are MKL AVX2 and
    ATen's scalar ones, as on many ARM64 and AVX2 machines, it may not), so the subprocess also records
    each float32 transcript itself and the control asserts the verdict follows from those bits."""
    dirs = {f"{a}-{p}": str(transcripts[a, p]) for a in ("mlp", "cnn", "gpt") for p in ("det64", "float32")}
    script = (
        "import hashlib, json, sys, tempfile, torch\n"
        "from pathlib import Path\n"
        "from replay import verify, Budget\n"
        "from replay import native\n"
        "from tests.replay.helpers import record\n"
        "out = {'capability': torch.backends.cpu.get_cpu_capability(), 'threads': torch.get_num_threads(),\n"
        "       'native': native.library() is not None}\n"
        "digest = lambda d: sorted(hashlib.sha256(f.read_bytes()).hexdigest() for f in Path(d, 'checkpoints').iterdir())\n"
        "for k, d in json.loads(sys.argv[1]).items():\n"
        "    v = verify(d, d + '/claims.json', Budget(segments=100))\n"
        "    out[k] = [v.verdict, v.reasons[:1]]\n"
        "    if k.endswith('-float32'):\n"
        "        here = record(Path(tempfile.mkdtemp()) / 't', k.split('-')[0], 'float32', threads=2)\n"
        "        out[k].append(digest(here) == digest(d))\n"
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
        assert out[f"{arch}-det64"][0] == "verified", out[f"{arch}-det64"]
        verdict, reasons, same_bits_here = out[f"{arch}-float32"]
        if same_bits_here:
            assert verdict == "verified", out[f"{arch}-float32"]
        else:
            assert verdict == "rejected", out[f"{arch}-float32"]
            assert any(w in reasons[0] for w in ("differs", "replays to")), out[f"{arch}-float32"]


def test_float32_transcript_verifies_only_on_the_same_configuration(transcripts):
    """The control is not simply broken: on the prover's own configuration plain float32 replays exactly."""
    d = transcripts["gpt", "float32"]
    assert with_threads(1, lambda: run_verify(d)).verdict == "verified"


# --------------------------------------------------------------------------- attacks


@pytest.fixture
def mlp(transcripts, tmp_path):
    return copy(transcripts["mlp", "det64"], tmp_path / "t")


def rejected_because(v, *needles) -> bool:
    assert v.verdict == "rejected", (v.verdict, v.reasons)
    text = " | ".join(v.reasons)
    return all(n in text for n in needles)


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
    """Checkpoints 4 and 8 replaced by points on the line from checkpoint 0 to 12 ('infinitesimal updates')."""
    import safetensors.torch

    ends = [dict(safetensors.torch.load(checkpoint_path(mlp, s).read_bytes())) for s in (0, STEPS)]
    for step in (4, 8):
        w = step / STEPS
        edit_checkpoint(mlp, step, lambda t, w=w: t.update({k: ends[0][k] * (1 - w) + ends[1][k] * w for k in t}))
    v = run_verify(mlp)
    assert rejected_because(v, "segment 0..4: replayed state at step 4 differs", "straight line")
    # with no replay budget at all the geometry alone still gives it away
    v = run_verify(mlp, Budget(segments=0))
    assert rejected_because(v, "interpolated")


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


def test_budget_exhaustion_is_not_verified(mlp):
    v = run_verify(mlp, Budget(max_steps=1))
    assert v.verdict == "rejected" and v.details["budget_exhausted"]


def test_random_segments_depend_on_the_nonce(transcripts):
    d = transcripts["mlp", "det64"]
    picks = {
        tuple(s["start"] for s in verify(d, None, Budget(segments=1), nonce=bytes([n])).details["segments"])
        for n in range(12)
    }
    assert len(picks) > 1


def test_unusable_chip_keys_are_a_reason_not_a_crash(mlp):
    (mlp / "chips.json").write_text(
        json.dumps({s: "not base64!" for s in json.loads((mlp / "chips.json").read_text())})
    )
    assert rejected_because(run_verify(mlp), "no usable public key")
    (mlp / "chips.json").write_text("[1, 2]")
    assert run_verify(mlp).verdict == "malformed"
