"""Hostile transcripts: anything malformed gives verdict 'malformed' with a reason, never a crash or a hang."""

from __future__ import annotations

import json
import pickle
import re

import pytest
import safetensors.torch
import torch

from replay import Budget, Transcript, verify
from replay.protocol import limits
from replay.protocol.transcript_errors import MalformedTranscript
from replay.protocol.transcript_files import parse_safetensors
from replay.protocol.transcript_layout import canonical_json, checkpoint_path, segment_path
from replay.training import architectures as models

from ..helpers import copy, manifest, save_manifest


@pytest.fixture
def t(transcripts, tmp_path):
    return copy(transcripts["mlp", "det64"], tmp_path / "t")


def malformed(d, claims=None) -> str:
    v = verify(d, claims if claims is not None else d / "claims.json", Budget(segments=100))
    assert v.verdict == "malformed", (v.verdict, v.reasons)
    assert len(v.reasons) == 1 and v.reasons[0]
    return v.reasons[0]


def edit_manifest(d, fn):
    m = manifest(d)
    fn(m)
    save_manifest(d, m)


def test_honest_manifest_round_trips(t):
    tr = Transcript(t)
    assert tr.arch == "mlp" and tr.checkpoints == [0, 4, 8, 12]
    assert (t / "manifest.json").read_bytes() == canonical_json(tr.manifest)


def test_bad_json(t):
    (t / "manifest.json").write_text('{"format": "chipledger-replay/2", ')
    assert "not JSON" in malformed(t)


def test_non_canonical_json_is_refused(t):
    (t / "manifest.json").write_text(json.dumps(manifest(t), indent=1))
    assert "canonical" in malformed(t)


def test_nan_is_refused(t):
    (t / "manifest.json").write_bytes((t / "manifest.json").read_bytes().replace(b'"seed":0', b'"seed":NaN'))
    assert "not JSON" in malformed(t)


def test_unknown_arch(t):
    edit_manifest(t, lambda m: m.update(arch="resnet152"))
    assert "not on the allow-list" in malformed(t)


def test_oversize_shapes(t, monkeypatch):
    """No parameter cap of its own: a model's state counts against the memory budget (replay/protocol/limits.py)."""
    edit_manifest(t, lambda m: m["config"].update(sizes=[16, 10**9, 4]))
    assert "config.sizes" in malformed(t)


def test_a_step_beyond_this_workers_budget_is_its_error_and_beyond_any_verifiers_malformed(t, monkeypatch):
    """The tiny MLP on a worker with 1 KB to spend: this machine's limit, the verdict "error" (retried, for a larger
    worker), never "malformed", which is final and blames the prover. A step beyond what any verifier may hold
    (limits.ANY_VERIFIER) is malformed wherever it is read."""
    monkeypatch.setenv("REPLAY_MEMORY_BUDGET_BYTES", "1000")
    v = verify(t, t / "claims.json", Budget(segments=100))
    assert v.verdict == "error" and len(v.reasons) == 1, (v.verdict, v.reasons)
    assert "cannot replay this transcript on this machine" in v.reasons[0]
    # in the units the figures fill (a 1 KB budget's breakdown had read "0.0 GiB of activations, 0.0 GiB of ...")
    assert re.search(r"\(\d+\.\d KiB of activations, \d+\.\d (KiB|MiB) of training state\)", v.reasons[0]), v.reasons
    assert "more than the replay memory budget of 1,000 bytes on cpu (REPLAY_MEMORY_BUDGET_BYTES)" in v.reasons[0]
    assert v.details["segments_replayed"] == [] and v.details["beyond_budget"] is True  # a larger worker can
    monkeypatch.delenv("REPLAY_MEMORY_BUDGET_BYTES")
    assert verify(t, t / "claims.json", Budget(segments=1)).verdict == "verified"
    monkeypatch.setattr(limits, "ANY_VERIFIER", (1000, 1e17))
    assert "more than the 1,000 bytes a step any verifier may hold" in malformed(t)  # (not "0.0 GiB": as the step)
    with pytest.raises(MalformedTranscript):
        Transcript(t, "cuda")  # whatever the device


def test_this_workers_budget_is_checked_only_once_the_manifest_is_well_formed(t, monkeypatch):
    """A manifest both beyond this worker's budget and malformed is malformed: the prover's fault comes first."""
    monkeypatch.setenv("REPLAY_MEMORY_BUDGET_BYTES", str(1 << 30))
    edit_manifest(t, lambda m: (_mlp_of_50m_parameters(m), m.update(steps=-1)))
    assert "steps" in malformed(t)


def _mlp_of_50m_parameters(m: dict) -> None:
    """A well-formed manifest of a 50M-parameter MLP: its shards tile the new parameter count."""
    m["config"].update(sizes=[16, 4096, 4096, 4096, 4096, 4])
    m["shards"][-1]["end"] = models.param_count("mlp", m["config"])


def test_batch_shape_must_follow_the_architecture(t):
    edit_manifest(t, lambda m: m["batch"]["x"].update(shape=[32, 17]))
    assert "batch.x must be float32 of shape [32, 16]" in malformed(t)
    edit_manifest(t, lambda m: m["batch"]["x"].update(shape=[10**9, 16]))
    assert "batch size" in malformed(t)


def test_missing_and_extra_keys(t):
    edit_manifest(t, lambda m: m.pop("records"))
    assert "manifest must be an object" in malformed(t)


def test_unknown_optimizer_and_bad_schedule(t):
    edit_manifest(t, lambda m: m["optimizer"].update(kind="lion"))
    assert "optimizer.kind" in malformed(t)


def test_pickle_in_place_of_safetensors(t):
    checkpoint_path(t, 4).write_bytes(pickle.dumps({"param:layers.0.weight": torch.zeros(3)}))
    edit_manifest(
        t,
        lambda m: m["checkpoints"].update(
            {"4": __import__("hashlib").sha256(checkpoint_path(t, 4).read_bytes()).hexdigest()}
        ),
    )
    assert "not a safetensors file" in malformed(t)


def test_truncated_safetensors(t):
    p = segment_path(t, 4)
    p.write_bytes(p.read_bytes()[:-100])
    edit_manifest(t, lambda m: m["segments"].update({"4": __import__("hashlib").sha256(p.read_bytes()).hexdigest()}))
    assert "truncated" in malformed(t)


def test_missing_file(t):
    segment_path(t, 8).unlink()
    assert "missing" in malformed(t)


def test_wrong_tensor_shape_is_refused_before_loading(t):
    p = checkpoint_path(t, 8)
    tensors = dict(safetensors.torch.load(p.read_bytes()))
    tensors["param:layers.0.weight"] = torch.zeros(48, 17)
    p.write_bytes(safetensors.torch.save(tensors))
    edit_manifest(t, lambda m: m["checkpoints"].update({"8": __import__("hashlib").sha256(p.read_bytes()).hexdigest()}))
    assert "the manifest implies [48, 16]" in malformed(t)


def test_out_of_range_labels_are_malformed_not_a_crash(t):
    from ..helpers import edit_segment

    def bad(x):
        x["y:5"] = x["y:5"].clone()
        x["y:5"][0] = 99

    edit_segment(t, 4, bad)
    assert "outside [0, 4)" in malformed(t)


def test_garbage_rounding_log_is_malformed(t):
    from ..helpers import edit_segment

    edit_segment(t, 0, lambda x: x.update({"log:1": torch.tensor([1, 0xFF, 0xFF], dtype=torch.uint8)}))
    assert "rounding log" in malformed(t)


def test_malformed_claims(t):
    (t / "claims.json").write_text("[1, 2")
    assert "claims" in malformed(t)
    (t / "claims.json").write_text(
        json.dumps(
            {
                "manifest": "ab" * 32,
                "claims": [
                    {
                        "serial": "nobody",
                        "counter": 0,
                        "shard": 0,
                        "hash": "0" * 64,
                        "step": 1,
                        "time": "2025-01-01T00:00:00Z",
                    }
                ],
            }
        )
    )
    assert "does not hold shard" in malformed(t)


def test_header_parser_refuses_overlaps_and_dtype_tricks():
    data = safetensors.torch.save({"a": torch.zeros(4), "b": torch.zeros(4)})
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    header["b"]["data_offsets"] = header["a"]["data_offsets"]  # two tensors on the same bytes
    raw = json.dumps(header).encode()
    forged = len(raw).to_bytes(8, "little") + raw + data[8 + n :]
    with pytest.raises(MalformedTranscript, match=r"overlaps|truncated"):
        parse_safetensors(forged, "x", {"a": ("float32", [4]), "b": ("float32", [4])})
    with pytest.raises(MalformedTranscript, match="dtype"):
        parse_safetensors(data, "x", {"a": ("int64", [4]), "b": ("float32", [4])})
    with pytest.raises(MalformedTranscript, match="header length"):
        parse_safetensors(b"\xff" * 16, "x", {})


WEIRD = [None, -1, 0, 2**70, 1e308, "x", "", [], {}, True, [1, 2], {"kind": "x"}]


def _paths(m):
    yield from ([k] for k in m)
    yield from (["config", k] for k in m["config"])
    yield from (["optimizer", k] for k in m["optimizer"])
    yield from (["optimizer", "lr", k] for k in m["optimizer"]["lr"])
    yield from (["batch", "x", k] for k in ("dtype", "shape"))
    yield from (["batch", "x", "shape", i] for i in range(len(m["batch"]["x"]["shape"])))
    yield ["shards", 0, "end"]
    yield ["shards", len(m["shards"]) - 1, "start"]
    yield from (["dataset", k] for k in m["dataset"])
    yield ["records", 3, "loss"]
    yield ["records", 3, "data"]


def test_any_field_replaced_by_anything_is_never_a_crash(t):
    original = manifest(t)
    for path in _paths(original):
        node = original
        for k in path:
            node = node[k]
        # and an integer's own value as a float (19074.0 for 19074): equal in Python, yet another manifest; a shard's
        # float start once slipped through to the replay's slicing (a TypeError: `error`, its rejections lost)
        for value in WEIRD + ([float(node)] if type(node) is int else []):
            m = json.loads(json.dumps(original))
            target = m
            for k in path[:-1]:
                target = target[k]
            old = target[path[-1]]
            if json.dumps(old) == json.dumps(value) or (
                type(old) in (int, float) and type(value) is int and old == value
            ):
                continue  # not a change
            target[path[-1]] = value
            try:
                data = canonical_json(m)
            except ValueError:
                continue
            (t / "manifest.json").write_bytes(data)
            v = verify(t, None, Budget(segments=100, max_seconds=30))
            assert v.verdict in ("malformed", "rejected", "verified"), (path, value)
            if v.verdict == "verified":  # only harmless fields may change without consequence
                assert path in (["dataset", "name"], ["reported_flops"]), (path, value)
