"""Hostile transcripts cannot hurt the worker: step cost bounded before running, rounding logs capped
and their bounds computed in bounded memory, no link followed out of the transcript, and no
verification on a CPU that flushes subnormals."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from replay import Budget, verify
from replay.__main__ import main
from replay.protocol import limits
from replay.protocol.engine import Replayer
from replay.protocol.manifest_schema import validate_manifest
from replay.protocol.transcript import Transcript
from replay.protocol.transcript_errors import BeyondThisVerifier, MalformedTranscript
from replay.protocol.transcript_layout import checkpoint_path, segment_path
from replay.training.determinism import decode_log, encode_log, entry_cap, in_chunks

from ..helpers import copy, edit_segment, manifest, save_manifest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def mlp(transcripts, tmp_path):
    return copy(transcripts["mlp", "det64"], tmp_path / "t")


def run(d: Path, segments: int = 100):
    return verify(d, d / "claims.json", Budget(segments=segments))


# --------------------------------------------------------------------------- step cost, before running


def _huge_gpt(m: dict) -> dict:
    """GPT-2 small's shape at block 1024, batch 4096: every config bound holds, one step needs ~10^12 attention
    scores (35 TiB), beyond what any verifier may hold."""
    m["config"].update(block=1024, n_layer=12, n_head=12, n_embd=768)
    m["batch"] = {"x": {"dtype": "int64", "shape": [4096, 1024]}, "y": {"dtype": "int64", "shape": [4096, 1024]}}
    return m


def test_allow_listed_gpt_with_huge_activations_is_malformed_naming_the_field(transcripts):
    m = _huge_gpt(manifest(transcripts["gpt", "det64"]))
    with pytest.raises(MalformedTranscript) as e:
        validate_manifest(m)
    assert "batch.x.shape [4096, 1024]" in e.value.reason and "GiB of activations" in e.value.reason
    assert "any verifier may hold" in e.value.reason


def test_huge_activations_are_refused_by_verify_before_anything_runs(transcripts, tmp_path):
    d = copy(transcripts["gpt", "det64"], tmp_path / "g")
    save_manifest(d, _huge_gpt(manifest(d)))
    v = run(d)
    assert v.verdict == "malformed" and "batch.x.shape" in v.reasons[0], v.reasons


def test_flops_per_step_above_this_verifiers_budget_are_its_error(mlp, monkeypatch):
    """Beyond this machine's budget, within what a verifier may hold: "error" (retried), not "malformed"."""
    monkeypatch.setattr(limits, "MAX_STEP_FLOPS", 1e5)
    tr = Transcript(mlp)  # read: what needs no replay is still checked
    assert "batch.x.shape" in tr.beyond_budget and "FLOPs per training step" in tr.beyond_budget
    with pytest.raises(BeyondThisVerifier):
        Replayer(tr, Budget())
    v = run(mlp)
    assert v.verdict == "error" and "FLOPs per training step" in v.reasons[0], v.reasons


def test_evidence_that_needs_no_replay_still_decides_beyond_this_verifiers_budget(mlp, monkeypatch):
    """Over this worker's budget, the checks that read no step still run: claims for another transcript are
    rejected (exact evidence), not left as the verifier's error for a prover to stall on."""
    claims = json.loads((mlp / "claims.json").read_text())
    claims["manifest"] = "0" * 64
    (mlp / "claims.json").write_text(json.dumps(claims))
    monkeypatch.setattr(limits, "MAX_STEP_FLOPS", 1e5)
    v = run(mlp)
    assert v.verdict == "rejected" and v.reasons == [
        "the claims answer for a different transcript (manifest hash differs)"
    ]
    assert v.details["segments_replayed"] == []


def test_a_batch_not_as_committed_is_rejected_beyond_this_verifiers_budget(mlp, monkeypatch):
    """The data commitments need no model and no step: checked there too, a batch swapped after committing
    rejects, not left as the verifier's error."""

    def nudge(t):
        t["x:9"] = t["x:9"].clone()
        t["x:9"][3, 7] += 1e-3

    edit_segment(mlp, 8, nudge, recommit="file")
    monkeypatch.setattr(limits, "MAX_STEP_FLOPS", 1e5)
    v = run(mlp)
    assert v.verdict == "rejected" and any("step 9 does not match its data commitment" in r for r in v.reasons)
    assert v.details["checks"]["data_commitments"] is False and v.details["segments_replayed"] == []
    edit_segment(mlp, 8, lambda t: None)  # re-committed: the batch is still not the dataset's (no replay needed)
    v = run(mlp)
    assert v.verdict == "rejected" and v.details["segments_replayed"] == [], v.reasons
    assert v.reasons == [
        "the batch of step 9 is not the committed sampler's: example 3 of the batch is not example 3741 of the "
        "committed dataset (the sampler's draw)"
    ]


def test_bundled_examples_are_within_the_limits():
    from replay.prover.recorder import DEFAULT_BATCH
    from replay.training import architectures as models

    for arch in ("mlp", "cnn", "gpt"):
        spec = models.batch_spec(arch, models.DEFAULTS[arch], DEFAULT_BATCH[arch])
        assert limits.step_limits(arch, models.DEFAULTS[arch], spec) is None


# --------------------------------------------------------------------------- rounding logs


def test_log_entries_beyond_a_points_cap_are_rejected(mlp):
    """A prover floods one rounding point with entries: rejected for the count, before any bound is formed."""

    def flood(tensors):
        entries = decode_log(bytes(tensors["log:5"].numpy()))
        key = min(entries) if entries else 0
        entries[key] = (list(range(2000)), [False] * 2000)
        tensors["log:5"] = torch.frombuffer(bytearray(encode_log(entries)), dtype=torch.uint8)

    edit_segment(mlp, 4, flood, recommit="file")
    v = run(mlp)
    assert v.verdict == "rejected"
    assert any("log entries, more than the" in r and "allowed" in r for r in v.reasons), v.reasons


@settings(max_examples=50, deadline=None)
@given(n=st.integers(0, 5000), terms=st.integers(1, 1 << 23), chunk=st.sampled_from([1, 7, 1024, 1 << 22]))
def test_bounds_in_chunks_are_the_same_values(n, terms, chunk):
    import replay.training.determinism as det

    before = det.CHUNK_TERMS
    det.CHUNK_TERMS = chunk
    try:
        idx = torch.arange(n)
        seen = []

        def fn(i):
            seen.append(i.numel())
            return i.double() * 2

        out = in_chunks(fn, idx, terms)
        assert torch.equal(out, idx.double() * 2)
        assert max(seen) <= max(1, chunk // terms)
    finally:
        det.CHUNK_TERMS = before


def test_entry_cap_covers_the_honest_maximum():
    """Measured on honest runs (docs/replay-limits.md): 65 entries at a point of 192 outputs, 257 of
    768 (a third: the key bias's gradient, exactly 0 in exact arithmetic), 1,891 of 524,288."""
    assert entry_cap(192) >= 65 and entry_cap(768) >= 257 and entry_cap(524288) >= 1891
    assert all(entry_cap(3 * c) >= c for c in range(1, 1025))
    assert entry_cap(1 << 20) < 1 << 20


BOUND_MEMORY = """
import json, resource, sys, torch
sys.path.insert(0, sys.argv[1])
from replay.training.determinism import dot_bound
torch.manual_seed(0)
a, b = torch.randn(4096, 1024, dtype=torch.float64), torch.randn(1024, 4096, dtype=torch.float64)
idx = torch.randperm(4096 * 4096)[:40000]
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
e = dot_bound(a, b).at(idx)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
i, j = idx // 4096, idx % 4096
ref = (a[i[:50]].abs() * b[:, j[:50]].T.abs()).sum(-1)
print(json.dumps({"growth_mib": (peak - base) / 1024, "close": bool(torch.allclose(e[:50], ref * e[0] / ref[0]))}))
"""


def test_exact_bounds_of_many_log_entries_stay_in_bounded_memory():
    """40,000 scattered entries at a K = 1024 product: gathering their rows at once takes ~1 GiB."""
    proc = subprocess.run(
        [sys.executable, "-c", BOUND_MEMORY, str(ROOT)], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["close"] and out["growth_mib"] < 256, out


# --------------------------------------------------------------------------- links out of the transcript


def test_symlinked_checkpoint_with_its_hash_committed_is_refused_naming_only_the_path(mlp, tmp_path):
    """The oracle: a link to a host file whose hash the prover committed. Refused outright, whatever it holds."""
    host = tmp_path / "host-secret.bin"
    path = checkpoint_path(mlp, 4)
    host.write_bytes(path.read_bytes())  # the committed hash matches the host file
    path.unlink()
    path.symlink_to(host)
    v = run(mlp)
    assert v.verdict == "malformed", v.reasons
    assert v.reasons == [
        "checkpoints/00000004.safetensors: a symbolic link (transcript files must be regular files inside the transcript)"
    ]
    assert "host-secret" not in json.dumps(v.to_json())


def test_symlinked_directory_is_refused(mlp, tmp_path):
    outside = tmp_path / "elsewhere"
    (mlp / "segments").rename(outside)
    (mlp / "segments").symlink_to(outside)
    v = run(mlp)
    assert v.verdict == "malformed" and v.reasons[0].startswith(
        "segments/00000000.safetensors: segments is a symbolic link"
    )
    assert "elsewhere" not in json.dumps(v.to_json())


def test_symlinked_manifest_is_refused(mlp, tmp_path):
    outside = tmp_path / "m.json"
    (mlp / "manifest.json").rename(outside)
    (mlp / "manifest.json").symlink_to(outside)
    v = run(mlp)
    assert v.verdict == "malformed" and v.reasons[0].startswith("manifest.json: a symbolic link")


def test_fifo_in_place_of_a_segment_is_refused_without_blocking(mlp):
    path = segment_path(mlp, 4)
    path.unlink()
    os.mkfifo(path)
    v = run(mlp)
    assert v.verdict == "malformed" and v.reasons[0] == "segments/00000004.safetensors: not a regular file"


# --------------------------------------------------------------------------- flush-to-zero


def test_flush_to_zero_gives_verdict_error_and_exit_3(mlp, capsys):
    torch.set_flush_denormal(True)
    try:
        if not torch.set_flush_denormal(True):
            pytest.skip("this CPU has no flush-to-zero mode")
        v = run(mlp)
        code = main(["verify", str(mlp), "--claims", str(mlp / "claims.json"), "--json", "--nonce", "00" * 16])
    finally:
        torch.set_flush_denormal(False)
    assert v.verdict == "error" and "denormals-are-zero" in v.reasons[0], v.reasons
    assert code == 3 and json.loads(capsys.readouterr().out)["verdict"] == "error"
    assert run(mlp).verdict == "verified"


# --------------------------------------------------------------------------- budgets and the prover's CLI


def test_budgets_come_from_the_environment_and_the_device(monkeypatch):
    from replay.training import architectures as models

    spec = models.batch_spec("mlp", models.DEFAULTS["mlp"], 64)
    monkeypatch.delenv("REPLAY_MEMORY_BUDGET_BYTES", raising=False)
    monkeypatch.delenv("REPLAY_FLOP_BUDGET", raising=False)
    assert limits.budgets("cpu") == (8 << 30, 1e12) and limits.budgets("cuda:1")[1] == 1e15
    monkeypatch.setenv("REPLAY_FLOP_BUDGET", "1e5")
    assert "REPLAY_FLOP_BUDGET" in limits.step_limits("mlp", models.DEFAULTS["mlp"], spec)
    monkeypatch.setenv("REPLAY_FLOP_BUDGET", "1e12")
    monkeypatch.setenv("REPLAY_MEMORY_BUDGET_BYTES", "1000")
    assert "MiB of training state" in limits.step_limits("mlp", models.DEFAULTS["mlp"], spec)  # (2.9 MiB: in MiB)


@pytest.mark.parametrize(
    "name,raw",
    [
        ("REPLAY_FLOP_BUDGET", "nan"),
        ("REPLAY_FLOP_BUDGET", "inf"),
        ("REPLAY_FLOP_BUDGET", "-1"),
        ("REPLAY_FLOP_BUDGET", "0"),
        ("REPLAY_FLOP_BUDGET", "1e12x"),
        ("REPLAY_MEMORY_BUDGET_BYTES", "8G"),
        ("REPLAY_MEMORY_BUDGET_BYTES", "0"),
        ("REPLAY_MEMORY_BUDGET_BYTES", "-8589934592"),
        ("REPLAY_MEMORY_BUDGET_BYTES", "8e9"),
        ("REPLAY_MEMORY_BUDGET_BYTES", str(2**63)),  # no machine's, and past 1e308 isfinite overflowed (a traceback)
        ("REPLAY_MEMORY_BUDGET_BYTES", "9" * 40),
    ],
)
def test_a_budget_that_is_not_a_positive_number_is_refused_naming_it(
    name, raw, monkeypatch, transcripts, tmp_path, capsys
):
    """A budget of 0 or -1 would call every honest transcript too large (malformed: the prover blamed), NaN none:
    the verifier's own misconfiguration is its error, named; record refuses to start."""
    d = transcripts["mlp", "det64"]  # recorded (on first use) under the default budgets
    monkeypatch.setenv(name, raw)
    with pytest.raises(ValueError, match=re.escape(f"{name}={raw!r} is not a positive")):
        limits.budgets("cpu")
    v = verify(d, d / "claims.json", Budget(segments=1))
    assert v.verdict == "error" and v.reasons == [
        f"the verifier cannot replay on this machine: {name}={raw!r}"
        + (
            " is not a positive whole number of bytes (under 2^63)"
            if "MEMORY" in name
            else " is not a positive, finite number of FLOPs"
        )
    ]
    assert main(["record", "--arch", "mlp", "--steps", "1", "--out", str(tmp_path / "never")]) == 2
    assert f"{name}={raw!r}" in capsys.readouterr().err and not (tmp_path / "never").exists()


def test_record_refuses_beyond_the_budget_before_anything_runs(tmp_path, capsys):
    """GPT-2 small at block 1024 and the default batch of 16: ~141 GiB a step; nothing is written."""
    out = tmp_path / "t"
    assert main(["record", "--preset", "gpt2-small", "--steps", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "batch.x.shape [16, 1024]" in err and "REPLAY_MEMORY_BUDGET_BYTES" in err
    assert not out.exists()


@pytest.mark.parametrize(
    "argv,reason",
    [
        (["--arch", "gpt", "--config", "{"], "--config is not JSON"),
        (["--arch", "gpt", "--config", "[1]"], "JSON object"),
        (["--arch", "gpt", "--config", '{"block": 8, "block": 4096}'], "--config gives block more than once"),
        (["--arch", "gpt", "--config", '{"block": 4096, "block": 8}'], "--config gives block more than once"),
        (["--arch", "gpt", "--config", "[" * 50000 + "]" * 50000], "nested too deeply"),
        (["--arch", "gpt", "--config", '{"block": 2048}'], "config.block must be an integer in [1, 1024], not 2048"),
        # the value, and its kind where the kind is what is wrong
        (
            ["--arch", "gpt", "--config", '{"block": 64.0}'],
            "config.block must be an integer in [1, 1024], not 64.0 (wr",
        ),
        (["--arch", "gpt", "--config", '{"block": true}'], "not true (a boolean)"),
        (["--arch", "gpt", "--config", '{"block": "16"}'], 'not "16" (a string)'),
        (["--arch", "gpt", "--config", '{"block": NaN}'], "not NaN (written as a float)"),
        (["--arch", "gpt", "--config", '{"block": null}'], "config.block must be an integer in [1, 1024], not null"),
        (["--arch", "gpt", "--config", '{"block": ' + "9" * 4000 + "}"], "not an integer of 4000 digits"),
        (["--arch", "mlp", "--config", '{"sizes": [8, 2.5]}'], "config.sizes must be a list of 2..13 integers in"),
        (["--arch", "mlp", "--config", '{"sizes": [8, 2.5]}'], "its [1] is 2.5 (written as a float)"),
        (["--arch", "mlp", "--config", '{"sizes": 8}'], "not the single number 8"),
        (["--arch", "gpt", "--config", '{"vocab": 24}'], "config.vocab must be at least 25 for the bundled text"),
        (["--arch", "gpt", "--device", "cuda:7"], "device 'cuda:7'"),
        (["--arch", "gpt", "--config", '{"depth": 2}'], "unknown or missing keys"),
        (["--arch", "mlp", "--preset", "gpt2-small"], "does not match"),
        (["--arch", "gpt", "--batch", "0"], "--batch"),
        (["--arch", "gpt", "--device", "tpu"], "device"),
        ([], "--arch or --preset"),
    ],
)
def test_record_refuses_bad_arguments_naming_them(argv, reason, tmp_path, capsys):
    assert main(["record", *argv, "--steps", "1", "--out", str(tmp_path / "t")]) == 2
    assert reason in capsys.readouterr().err
    assert not (tmp_path / "t").exists()


def test_record_takes_a_shape_a_batch_and_a_plain_precision(tmp_path):
    out = tmp_path / "t"
    cfg = '{"block": 8, "n_layer": 1, "n_embd": 16, "n_head": 2}'
    argv = ["record", "--arch", "gpt", "--config", cfg, "--batch", "2", "--steps", "2", "--out", str(out)]
    assert main([*argv, "--precision", "float64", "--checkpoint-interval", "2"]) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["precision"] == "float64" and m["config"]["block"] == 8 and m["config"]["vocab"] == 32
    assert m["batch"]["x"]["shape"] == [2, 8]


@settings(max_examples=30, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=6),
    chips=st.integers(1, 7),
)
def test_streamed_shard_hashes_equal_the_hashes_of_the_flat_vector(sizes, chips):
    from replay.protocol import hashing

    g = torch.Generator().manual_seed(sum(sizes) + chips)
    params = {f"p{i}": torch.randn(n, generator=g) for i, n in enumerate(sizes)}
    flat = hashing.flatten(params)
    layout = hashing.shard_layout(flat.size, [f"c{i}" for i in range(chips)])
    assert hashing.shard_hashes(params, layout) == [hashing.shard_hash(flat, s["start"], s["end"]) for s in layout]


# --------------------------------------------------------------------------- found on a GPU (H200, 2026-11-26)


def test_the_transcript_is_bounded_by_the_budgets_of_the_device_it_is_replayed_on(transcripts, monkeypatch):
    """`verify --device cuda` checked the step against the CPU's 8 GiB: a GPT-2-small run at block 1024
    recorded on a GPU was `malformed` on the GPU that could replay it. Beyond the CPU's budget it is the CPU
    verifier's limit (BeyondThisVerifier: the verdict "error"), not the prover's fault."""
    d = transcripts["mlp", "det64"]  # recorded first, under the real budgets
    monkeypatch.delenv("REPLAY_DEVICE", raising=False)
    monkeypatch.setitem(limits.DEFAULTS, "cpu", (1 << 10, 1e12))  # a step of the tiny mlp is over it
    monkeypatch.setitem(limits.DEFAULTS, "cuda", (1 << 40, 1e15))
    assert "on cpu" in Transcript(d).beyond_budget
    assert Transcript(d, "cuda:0").steps == Transcript(d, "cuda").steps > 0


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 64), st.integers(1, 1024), st.sampled_from([(1, 2, 32), (12, 12, 768), (4, 4, 256)]))
def test_log_caps_cover_the_floor_and_grow_with_the_outputs_a_step_rounds(batch, seq, shape):
    from replay.training import architectures as models
    from replay.training.determinism import MAX_LOG_ENTRIES

    n_layer, n_head, n_embd = shape
    cfg = {"vocab": 50257, "block": 1024, "n_layer": n_layer, "n_head": n_head, "n_embd": n_embd}
    small, big = models.batch_spec("gpt", cfg, batch, seq), models.batch_spec("gpt", cfg, 2 * batch, seq)
    (b1, e1), (b2, e2) = limits.log_caps("gpt", cfg, small), limits.log_caps("gpt", cfg, big)
    assert b1 >= limits.LOG_FLOOR_BYTES and e1 >= MAX_LOG_ENTRIES
    assert b2 >= b1 and e2 >= e1
    rounded = limits.activation_elements("gpt", cfg, small) + models.param_count("gpt", cfg)
    assert b1 >= rounded // limits.ROUNDED_PER_LOG_BYTE


def test_gpt2_small_at_block_1024_batch_4_admits_its_honest_log():
    """Measured on the H200: 4.25 MB of rounding log a step (9,722,096 bytes for a 2-step segment), which the
    fixed 4 MiB cap refused as `malformed`; the entries, at one byte or more each, fit the entry cap too."""
    from replay.training import architectures as models

    cfg = models.PRESETS["gpt2-small"][1]
    max_bytes, max_entries = limits.log_caps("gpt", cfg, models.batch_spec("gpt", cfg, 4))
    assert max_bytes >= 4 * 4_250_000 and max_entries >= 4_250_000


def test_a_log_beyond_the_caps_is_refused_by_the_verifier_and_never_recorded(tmp_path, monkeypatch):
    from replay.prover.recorder import Recorder

    from ..helpers import record

    d = record(tmp_path / "t", "mlp")
    assert run(d).verdict == "verified"
    monkeypatch.setattr(limits, "LOG_FLOOR_BYTES", 8)
    monkeypatch.setattr(limits, "ROUNDED_PER_LOG_BYTE", 10**9)
    v = run(d)
    assert v.verdict == "malformed" and "segments/" in v.reasons[0] and "more than 8" in v.reasons[0], v.reasons
    with pytest.raises(ValueError, match=r"rounding log holds .* more than a verifier reads"):
        record(tmp_path / "u", "mlp", recorder=Recorder)


@settings(max_examples=300, deadline=None)
@given(limit=st.integers(1, 10**16), over=st.integers(1, 10**16))
def test_a_budget_refusal_shows_the_step_above_the_budget(limit, over):
    """The short forms (2.910e+07 FLOPs, 8.0 GiB) where they show the step as the larger, else both exact: never
    "2.910e+07 ... more than ... 3e+07"."""

    def shown(text: str) -> Decimal:  # (exact: a float would make 10**16 and 10**16 - 1 one number)
        return Decimal(text.split()[0].replace(",", ""))

    for short, exact in (
        (lambda f: f"{f:.3e}", lambda f: f"{int(f):,}"),
        (lambda b: f"{b / 2**30:.1f} GiB", lambda b: f"{int(b):,} bytes"),
    ):
        need, budget = limits._apart(limit + over, limit, short, exact)
        assert shown(need) > shown(budget), (need, budget)


def test_a_budget_of_hundreds_of_digits_is_refused_and_shown_cut(monkeypatch):
    """Such a value had overflowed float() (OverflowError: a traceback at a worker's start), and its message had
    echoed every digit."""
    monkeypatch.setenv("REPLAY_MEMORY_BUDGET_BYTES", "9" * 500)
    with pytest.raises(ValueError) as refused:
        limits.check_budget_settings()
    assert str(refused.value) == (
        f"REPLAY_MEMORY_BUDGET_BYTES={'9' * 40!r}... (500 characters) is not a positive whole number of bytes (under 2^63)"
    )


def test_a_figure_and_its_limit_read_in_units_only_where_the_units_show_which_is_larger():
    """Just over 1 GiB against just under it had read "1.0 GiB, more than 1024.0 MiB"; two figures that read alike
    are written in bytes."""
    exact = lambda b: f"{int(b):,} bytes"
    assert limits._apart(2**30 + 1, 2**30 - 1, limits._in_units, exact) == (
        "1,073,741,825 bytes",
        "1,073,741,823 bytes",
    )
    assert limits._apart(3 * 2**30, 2**30, limits._in_units, exact) == ("3.0 GiB", "1.0 GiB")
    assert limits._apart(1.5 * 2**20, 900 * 2**10, limits._in_units, exact) == ("1.5 MiB", "900.0 KiB")
