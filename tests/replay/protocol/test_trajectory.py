"""Whole-run checks never fail an honest prover: every schedule the manifest allows verifies, in
memory that does not grow with the number of checkpoints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replay import Budget, verify

from ..helpers import record

ROOT = Path(__file__).resolve().parents[3]
SGD = {"kind": "sgd", "momentum": 0.9, "weight_decay": 0.0}


def verdict(d: Path, segments: int = 100):
    return verify(d, d / "claims.json", Budget(segments=segments))


def test_linear_schedule_decaying_to_zero_verifies(tmp_path):
    """lr reaches 0 after step 5: the intervals after it have no update size per unit of rate."""
    sched = {"kind": "linear", "lr": 0.05, "warmup": 1, "total": 5, "final": 0.0}
    d = record(tmp_path / "t", "mlp", optimizer={**SGD, "lr": sched})
    v = verdict(d)
    assert v.verdict == "verified", v.reasons
    assert v.details["checks"]["update_sizes"]["per_lr"][-1] is None


def test_step_schedule_decaying_below_float32_resolution_verifies(tmp_path):
    """Updates that round away (lr 1e-3 * 1e-6^k) leave some parameters still, others one ulp apart."""
    sched = {"kind": "step", "lr": 0.05, "gamma": 1e-6, "every": 2}
    d = record(tmp_path / "t", "mlp", optimizer={**SGD, "lr": sched})
    v = verdict(d)
    assert v.verdict == "verified", v.reasons


def test_parameters_moving_at_zero_learning_rate_are_rejected(tmp_path):
    from ..helpers import edit_checkpoint

    sched = {"kind": "linear", "lr": 0.05, "warmup": 1, "total": 4, "final": 0.0}
    d = record(tmp_path / "t", "mlp", optimizer={**SGD, "lr": sched})
    edit_checkpoint(d, 12, lambda t: t["param:layers.0.bias"].add_(1e-3))
    v = verdict(d, segments=0)
    assert v.verdict == "rejected"
    assert any("learning rate is 0" in r for r in v.reasons), v.reasons


schedules = st.one_of(
    st.builds(lambda lr: {"kind": "constant", "lr": lr}, st.sampled_from([1e-30, 1e-8, 0.01, 0.1])),
    st.builds(
        lambda lr, gamma, every: {"kind": "step", "lr": lr, "gamma": gamma, "every": every},
        st.sampled_from([1e-6, 0.01, 0.1]),
        st.sampled_from([5e-324, 1e-300, 1e-9, 0.1, 0.5, 1.0]),
        st.integers(1, 13),
    ),
    st.builds(
        lambda lr, warmup, total, final: {"kind": "linear", "lr": lr, "warmup": warmup, "total": total, "final": final},
        st.sampled_from([1e-6, 0.01, 0.1]),
        st.integers(1, 14),
        st.integers(1, 14),
        st.sampled_from([0.0, 5e-324, 1e-12, 0.001, 0.1]),
    ),
)
optimizers = st.one_of(
    st.builds(lambda m: {**SGD, "momentum": m}, st.sampled_from([0.0, 0.9])),
    st.just({"kind": "adamw", "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01}),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schedule=schedules, opt=optimizers)
def test_every_allowed_schedule_verifies(tmp_path_factory, schedule, opt):
    d = record(tmp_path_factory.mktemp("s"), "mlp", optimizer={**opt, "lr": schedule})
    v = verdict(d, segments=1)
    assert v.verdict == "verified", (schedule, opt, v.reasons)


MEASURE = """
import json, resource, sys
sys.path.insert(0, sys.argv[2])
from tests.replay.helpers import ManyCheckpoints
from replay.protocol.transcript_checks import whole_transcript_checks
tr = ManyCheckpoints(int(sys.argv[1]))
report = {"checks": {}}
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
reasons = whole_transcript_checks(tr, report, lambda: None)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"growth_kib": peak - base, "reasons": reasons}))
"""


def peak_growth_kib(n: int) -> int:
    proc = subprocess.run(
        [sys.executable, "-c", MEASURE, str(n), str(ROOT)], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["reasons"] == [], out["reasons"]
    return out["growth_kib"]


def test_whole_transcript_checks_memory_does_not_grow_with_checkpoints():
    """~0.66M parameters: each float64 copy held per checkpoint would add 5 MiB; 60 more checkpoints
    would add 300 MiB. Streaming holds three float32 copies whatever the count."""
    few, many = peak_growth_kib(4), peak_growth_kib(64)
    assert many - few < 40 * 1024, (few, many)


def test_non_finite_checkpoint_is_a_reason_not_a_crash(transcripts, tmp_path):
    from ..helpers import copy, edit_checkpoint

    d = copy(transcripts["mlp", "det64"], tmp_path / "t")
    edit_checkpoint(d, 8, lambda t: t["param:layers.0.bias"].fill_(float("nan")))
    v = verdict(d, segments=0)
    assert v.verdict == "rejected"
    assert "the checkpoint at step 8 holds non-finite parameters" in v.reasons, v.reasons
