"""A training transcript's layout on disk and its commitments: canonical JSON, digests, file paths, and the
prover's writers. The strict reader is transcript.py (docs/transcripts.md).

Layout of a transcript directory:

    manifest.json                      the commitment (below); canonical JSON, its SHA-256 is the manifest hash
    checkpoints/<step:08d>.safetensors  float32 'param:<name>' and '<buffer>:<name>' (optimizer state)
    segments/<start:08d>.safetensors    for each step t of the segment [start, next checkpoint):
                                        'x:<t>', 'y:<t>' (the batch), 'proof:<t>' (uint8: the inclusion proofs of
                                        its examples in the committed dataset, data_commitment.py) and, in det64,
                                        'log:<t>' (uint8 rounding log); optional per-step commitments for
                                        dispute bisection: 'state:<t>' (uint8[32 per tensor], state_digests of
                                        the state after step t) and 'ops:<t>' (uint8[40 per output],
                                        op_digests of every rounded output of step t in execution order)

manifest.json (format "chipledger-replay/2", or /1 read: FORMATS_READ): arch (allow-list) and config, precision ("det64", or
"float32" or "float64": plain baselines, not claimable), seed, optimizer (sgd with momentum / adamw, hyper-parameters, learning-rate schedule),
batch (dtype and shape of x and y), steps, checkpoint_interval, shards (the layout over chip
serials), dataset (the data commitment: name, Merkle root, size, input range; data_commitment.py),
reported_flops (the prover's declaration), records (per step:
"data", SHA-256 of the exact batch tensors in order, and "loss", the float32 loss), checkpoints
and segments ({step: SHA-256 of the file's bytes}). The manifest hash therefore commits to every
byte of the transcript; manifest_schema.py holds its schema and bounds.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import safetensors.torch
import torch

from replay.training.train import State

FORMAT = "chipledger-replay/2"  # what a recording writes
# What a verification reads. /2: a convolution's weight gradient's bound is its sum's depth, gamma(B + L)
# (ops._weight_grad_bound); /1 recorded it as gamma(B * L + 2), whose entries all lie inside the narrower windows
# (tests/replay/protocol/test_verifier.py): both verify here. A verifier that reads /1 alone refuses /2 by its format,
# where its 50 times wider window could refuse a narrow entry at a near-zero output (a false rejection).
FORMATS_READ = ("chipledger-replay/1", FORMAT)


# --------------------------------------------------------------------------- canonical bytes and digests


def canonical_json(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes, read in chunks."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def batch_digest(batch: dict[str, torch.Tensor]) -> str:
    """The data commitment of one step: SHA-256 over name, dtype, shape and little-endian bytes of x, then y."""
    h = hashlib.sha256()
    for name in ("x", "y"):
        a = batch[name].detach().cpu().numpy()
        h.update(f"{name}:{a.dtype.name}:{','.join(map(str, a.shape))}\n".encode())
        h.update(np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<"), copy=False).tobytes())
    return h.hexdigest()


def state_digests(state: State) -> bytes:
    """The state's per-step commitment: for each of its tensors (parameters and optimizer state) in name order, the
    SHA-256 of its name, dtype, shape and little-endian bytes (32 bytes each). A dispute bisects against it and
    names the first tensor whose bits differ."""
    tensors = state.tensors()
    out = bytearray()
    for name in sorted(tensors):
        h = hashlib.sha256()
        _tensor_into(h, name, tensors[name])
        out += h.digest()
    return bytes(out)


def _tensor_into(h, name: str, v: torch.Tensor) -> None:
    a = v.detach().cpu().contiguous().numpy()
    h.update(f"{name}:{a.dtype.name}:{','.join(map(str, a.shape))}\n".encode())
    h.update(np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<"), copy=False).tobytes())


OP_DIGEST_BYTES = 40  # a rounding point's key (int64, little-endian) and the SHA-256 of its output


def op_digests(trace: list) -> bytes:
    """A step's per-op commitment: for each rounded output (key, name, float32 tensor) of a Rounder's trace, in
    execution order, its key and the SHA-256 of its dtype, shape and bytes."""
    out = bytearray()
    for key, _name, value in trace:
        out += int(key).to_bytes(8, "little", signed=True) + op_digest(value)
    return bytes(out)


def op_digest(value: torch.Tensor) -> bytes:
    """SHA-256 of one rounded output's dtype, shape and little-endian bytes."""
    h = hashlib.sha256()
    _tensor_into(h, "", value)
    return h.digest()


def parse_op_digests(data: bytes) -> dict[int, bytes] | None:
    """{key: digest} of a step's op commitment (the first digest of a key counts); None if not well formed."""
    if len(data) % OP_DIGEST_BYTES:
        return None
    out: dict[int, bytes] = {}
    for i in range(0, len(data), OP_DIGEST_BYTES):
        key = int.from_bytes(data[i : i + 8], "little", signed=True)
        out.setdefault(key, data[i + 8 : i + OP_DIGEST_BYTES])
    return out


def checkpoint_steps(steps: int, interval: int) -> list[int]:
    return sorted(set(range(0, steps, interval)) | {steps})


def checkpoint_path(root: Path, step: int) -> Path:
    return Path(root) / "checkpoints" / f"{step:08d}.safetensors"


def segment_path(root: Path, start: int) -> Path:
    return Path(root) / "segments" / f"{start:08d}.safetensors"


# --------------------------------------------------------------------------- writing (the prover)


def write_checkpoint(root: Path, state: State) -> str:
    path = checkpoint_path(root, state.step)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in state.tensors().items()}
    # written from the tensors' own memory and hashed back from the file in chunks: no copy of the
    # checkpoint's bytes is held (the same bytes as safetensors.torch.save)
    _save(tensors, path, {"step": str(state.step)})
    return file_sha256(path)


def write_segment(root: Path, start: int, steps: list[tuple]) -> str:
    """steps: [(t, batch, inclusion proofs, rounding log or None[, state digest or None, op digests or None])]."""
    tensors = {}
    for t, batch, proofs, log, *commitments in steps:
        tensors[f"x:{t}"], tensors[f"y:{t}"] = batch["x"].contiguous(), batch["y"].contiguous()
        tensors[f"proof:{t}"] = _uint8(proofs)
        if log is not None:
            tensors[f"log:{t}"] = _uint8(log)
        state, ops = (commitments + [None, None])[:2]
        if state is not None:
            tensors[f"state:{t}"] = _uint8(state)
        if ops is not None:
            tensors[f"ops:{t}"] = _uint8(ops)
    path = segment_path(root, start)
    path.parent.mkdir(parents=True, exist_ok=True)
    _save(tensors, path)
    return file_sha256(path)


def _save(tensors: dict[str, torch.Tensor], path: Path, metadata: dict | None = None) -> None:
    """safetensors.torch.save_file, readable as an ordinary write would leave it: the library writes a
    private (0600) temporary file and renames it, and a prover serves its transcript, perhaps from a
    web server running as another user. The folder's mode (made under the umask) less execute bits."""
    safetensors.torch.save_file(tensors, path, metadata=metadata)
    os.chmod(path, path.parent.stat().st_mode & 0o666)


def _uint8(data: bytes) -> torch.Tensor:
    """Bytes as a uint8 tensor, also when empty (a one-example dataset's inclusion proofs are empty:
    the tree is its leaf; torch.frombuffer refuses an empty buffer)."""
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)


def write_manifest(root: Path, manifest: dict) -> str:
    data = canonical_json(manifest)
    (Path(root) / "manifest.json").write_bytes(data)
    return sha256(data)
