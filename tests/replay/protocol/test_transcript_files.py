"""Checkpoints streamed per tensor: the same tensors as safetensors' own loader, the commitment checked
over every byte, and never a copy of the file's bytes in memory."""

from __future__ import annotations

import hashlib
import json
import tracemalloc

import pytest
import safetensors.torch
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replay import Transcript
from replay.protocol.transcript_errors import CommitmentMismatch, MalformedTranscript
from replay.protocol.transcript_files import parse_safetensors, read_safetensors

EXPECTED = {"a": ("float32", [256, 1024]), "b": ("int64", [3]), "c": ("uint8", 64)}


def tensors() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        "a": torch.randn(256, 1024, generator=gen),
        "b": torch.tensor([1, -2, 3]),
        "c": torch.arange(10, dtype=torch.uint8),
    }


def write(tmp_path, data: bytes):
    p = tmp_path / "c.safetensors"
    p.write_bytes(data)
    return p, hashlib.sha256(data).hexdigest()


def test_streamed_tensors_are_the_librarys(tmp_path):
    p, digest = write(tmp_path, safetensors.torch.save(tensors()))
    got = read_safetensors(p, tmp_path, 1 << 30, digest, EXPECTED)
    want = tensors()
    assert got.keys() == want.keys()
    assert all(got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]) for k in want)


def test_a_checkpoint_is_never_held_as_bytes(tmp_path):
    """Reading used to hold the file's bytes, then its tensors: twice a checkpoint (8 GiB at GPT-2 small)."""
    data = safetensors.torch.save(tensors())
    p, digest = write(tmp_path, data)
    del data
    tracemalloc.start()
    try:
        read_safetensors(p, tmp_path, 1 << 30, digest, EXPECTED)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < p.stat().st_size // 8  # header and bookkeeping only (tensor storage is torch's own)


def test_keep_drops_tensors_as_they_are_read_but_every_byte_is_checked(tmp_path):
    p, digest = write(tmp_path, safetensors.torch.save(tensors()))
    seen = []
    got = read_safetensors(p, tmp_path, 1 << 30, digest, EXPECTED, lambda k, t: seen.append(k) or k == "b")
    assert list(got) == ["b"] and sorted(seen) == ["a", "b", "c"]
    with pytest.raises(CommitmentMismatch):
        read_safetensors(p, tmp_path, 1 << 30, "0" * 64, EXPECTED, lambda k, t: False)


def test_a_changed_file_is_a_broken_commitment_before_it_is_malformed(tmp_path):
    data = safetensors.torch.save(tensors())
    p, digest = write(tmp_path, data[:-100])
    with pytest.raises(CommitmentMismatch, match=r"c\.safetensors does not match"):
        read_safetensors(p, tmp_path, 1 << 30, "0" * 64, EXPECTED)
    with pytest.raises(MalformedTranscript, match="truncated"):
        read_safetensors(p, tmp_path, 1 << 30, digest, EXPECTED)
    p, digest = write(tmp_path, data + b"\0")
    with pytest.raises(MalformedTranscript, match="padded"):
        read_safetensors(p, tmp_path, 1 << 30, digest, EXPECTED)
    with pytest.raises(MalformedTranscript, match="more than the 100 allowed"):
        read_safetensors(p, tmp_path, 100, digest, EXPECTED)


SMALL = {"a": ("float32", [2, 3]), "b": ("int64", [3]), "c": ("uint8", 64)}
VALID = safetensors.torch.save(
    {"a": torch.arange(6.0).reshape(2, 3), "b": torch.tensor([1, -2, 3]), "c": torch.arange(5, dtype=torch.uint8)}
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    cut=st.integers(0, len(VALID)),
    flips=st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(1, 255)), max_size=3),
    tail=st.binary(max_size=16),
)
def test_the_streamed_reader_agrees_with_the_bytes_reader(tmp_path, cut, flips, tail):
    """Any damage: both refuse it as malformed, or both read the same tensors (never another exception)."""
    data = bytearray(VALID)
    for at, x in flips:
        data[at] ^= x
    data = bytes(data[:cut]) + tail
    p, digest = write(tmp_path, data)
    try:
        want = parse_safetensors(data, "c.safetensors", SMALL)
    except MalformedTranscript:
        with pytest.raises(MalformedTranscript):
            read_safetensors(p, tmp_path, 1 << 20, digest, SMALL)
        return
    got = read_safetensors(p, tmp_path, 1 << 20, digest, SMALL)
    assert got.keys() == want.keys()
    for k in want:  # bit for bit (flipped bytes may make NaNs)
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape
        assert torch.equal(got[k].view(torch.uint8), want[k].view(torch.uint8))


def _sign_flipped(t: torch.Tensor) -> torch.Tensor:
    """t with the sign bit of its first element flipped (0.0 becomes -0.0: the same value, other bits)."""
    out = t.clone()
    bits = out.view(torch.int32).view(-1)
    bits[0] = bits[0] ^ -(2**31)
    return out


def test_params_and_differing_tensor_read_a_checkpoint_a_tensor_at_a_time(transcripts):
    tr = Transcript(transcripts["mlp", "det64"])
    state = tr.checkpoint(4)
    params = tr.params(4)
    assert list(params) == tr.names and all(torch.equal(params[k], state.params[k]) for k in params)
    assert tr.differing_tensor(4, state) is None
    assert tr.differing_tensor(8, state) == f"param:{tr.names[0]}"  # the first in state order
    last = tr.names[-1]
    state.buffers["momentum"][last] = _sign_flipped(state.buffers["momentum"][last])
    assert tr.differing_tensor(4, state) == f"momentum:{last}"
    state.params[last] = _sign_flipped(state.params[last])
    assert tr.differing_tensor(4, state) == f"param:{last}"


def test_transcript_files_are_as_readable_as_the_manifest(transcripts):
    """safetensors writes 0600 temporaries: a prover's web server (another user) could not serve them."""
    d = transcripts["mlp", "det64"]
    want = (d / "manifest.json").stat().st_mode & 0o777
    assert {p.stat().st_mode & 0o777 for p in (d / "checkpoints").iterdir()} == {want}
    assert {p.stat().st_mode & 0o777 for p in (d / "segments").iterdir()} == {want}


def test_a_header_with_an_over_long_integer_is_malformed_not_a_crash():
    data = safetensors.torch.save({"a": torch.zeros(4)}, metadata={"x": "y"})
    n = int.from_bytes(data[:8], "little")
    raw = data[8 : 8 + n].replace(b'"x":"y"', b'"x":' + b"9" * 5000)
    forged = len(raw).to_bytes(8, "little") + raw + data[8 + n :]
    with pytest.raises(MalformedTranscript, match="not JSON"):
        parse_safetensors(forged, "x", {"a": ("float32", [4])})


def test_a_header_naming_a_tensor_twice_is_malformed():
    """Which bytes a tensor named twice is would be the parser's choice (Python's keeps the last)."""
    data = safetensors.torch.save({"a": torch.zeros(4)})
    n = int.from_bytes(data[:8], "little")
    head = json.loads(data[8 : 8 + n])
    entry = json.dumps(head["a"], separators=(",", ":")).encode()
    raw = b'{"a":' + entry + b',"a":' + entry + b"}"
    raw += b" " * (n - len(raw)) if len(raw) < n else b""
    forged = len(raw).to_bytes(8, "little") + raw + data[8 + n :]
    with pytest.raises(MalformedTranscript, match="'a' appears twice"):
        parse_safetensors(forged, "x", {"a": ("float32", [4])})
