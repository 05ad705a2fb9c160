"""The package as others use it: the CLI, no Django, compute counting, and the GPU leg."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from replay import Budget, verify
from replay.__main__ import main
from replay.training import architectures as models
from replay.training.ops import Plain

from .helpers import TINY, copy

ROOT = Path(__file__).resolve().parents[2]


def run(args, **env):
    e = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run(
        [sys.executable, "-m", "replay", *args], capture_output=True, text=True, cwd=ROOT, env=e, timeout=300
    )


@pytest.mark.kernel_independent
def test_replay_never_imports_django():
    code = (
        "import sys, replay, replay.protocol.verifier, replay.protocol.bisect, replay.protocol.firmware, replay.prover.recorder, replay.__main__\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'django'))"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.kernel_independent
def test_the_firmware_and_the_package_import_without_torch():
    """Django's log check needs only replay.protocol.firmware: importing it (or the package) must not load torch."""
    code = (
        "import sys, replay, replay.protocol.firmware\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))\n"
        "from replay import Budget\n"
        "assert 'torch' in sys.modules and Budget.__module__ == 'replay.protocol.engine'"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert out.returncode == 0, out.stderr


def test_cli_record_then_verify_on_other_threads(tmp_path):
    rec = run(
        [
            "record",
            "--arch",
            "mlp",
            "--steps",
            "10",
            "--checkpoint-interval",
            "5",
            "--out",
            str(tmp_path / "t"),
            "--chips",
            "3",
            "--seed",
            "5",
        ],
        OMP_NUM_THREADS="1",
    )
    assert rec.returncode == 0, rec.stderr[-2000:]
    assert "record mlp" in rec.stderr and "10/10" in rec.stderr  # the progress bar
    t = tmp_path / "t"
    for name in ("manifest.json", "snapshots.jsonl", "claims.json", "chips.json", "checkpoints/00000010.safetensors"):
        assert (t / name).exists(), name
    ver = run(
        ["verify", str(t), "--claims", str(t / "claims.json"), "--snapshots", str(t / "snapshots.jsonl"), "--json"],
        OMP_NUM_THREADS="2",
    )
    assert ver.returncode == 0, ver.stdout[-2000:] + ver.stderr[-2000:]
    out = json.loads(ver.stdout)
    assert out["verdict"] == "verified" and out["threads"] == 2 and out["steps"] == 10
    assert len(json.loads((t / "claims.json").read_text())["claims"]) == len(
        (t / "snapshots.jsonl").read_text().splitlines()
    )

    bad = copy(t, tmp_path / "bad")
    claims = json.loads((bad / "claims.json").read_text())
    claims["claims"][0]["hash"] = "0" * 64
    (bad / "claims.json").write_text(json.dumps(claims))
    assert main(["verify", str(bad), "--claims", str(bad / "claims.json"), "--json"]) == 1
    (bad / "manifest.json").write_text("{")
    assert main(["verify", str(bad), "--claims", str(bad / "claims.json")]) == 2


@pytest.mark.parametrize("arch", ["mlp", "cnn", "gpt"])
def test_flops_are_counted_from_architecture_and_shapes(arch):
    """Our count equals torch's own FLOP counter on the plain model's forward pass."""
    cfg, b = TINY[arch]["config"], TINY[arch]["batch"]
    spec = models.batch_spec(arch, cfg, b)
    model = models.build(arch, cfg)
    params = {k: v for k, v in models.init_params(arch, cfg, 0).items()}
    x = torch.zeros(spec["x"][1], dtype=torch.int64 if arch == "gpt" else torch.float32)
    y = torch.zeros(spec["y"][1], dtype=torch.int64)
    with FlopCounterMode(display=False) as fc:
        torch.func.functional_call(model, params, (x, y, Plain))
    assert models.forward_flops(arch, cfg, spec) == fc.get_total_flops()
    assert models.training_flops(arch, cfg, spec) == 3 * fc.get_total_flops()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("arch", ["mlp", "cnn", "gpt"])
def test_cpu_transcript_verifies_on_gpu(transcripts, arch):
    v = verify(
        transcripts[arch, "det64"], transcripts[arch, "det64"] / "claims.json", Budget(segments=100), device="cuda"
    )
    assert v.verdict == "verified", v.reasons
    assert v.details["device"] == "cuda"
