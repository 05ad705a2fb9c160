"""Snapshot hashes: what a chip's firmware logs and the verifier recomputes (docs/transcripts.md, The transcript).

The parameters, flattened in state_dict order into one float32 vector, are split over the chips
of the shard layout in contiguous, equal-ish slices: shard i is [i*P//n, (i+1)*P//n). A chip's
snapshot hash is SHA-256 over the little-endian float32 bytes of its slice.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch


def flatten(params: dict[str, torch.Tensor]) -> np.ndarray:
    """All parameters in state_dict order as one little-endian float32 vector."""
    parts = [p.detach().to("cpu", torch.float32).reshape(-1).numpy() for p in params.values()]
    return np.concatenate(parts).astype("<f4", copy=False)


def same_bits(u: torch.Tensor, v: torch.Tensor) -> bool:
    """Same dtype, shape and bit patterns (-0.0 is not +0.0; NaN payloads count)."""
    if u.dtype != v.dtype or u.shape != v.shape:
        return False
    u, v = u.detach().cpu().contiguous(), v.detach().cpu().contiguous()
    if u.is_floating_point():
        as_int = {torch.float32: torch.int32, torch.float64: torch.int64, torch.float16: torch.int16}[u.dtype]
        u, v = u.view(as_int), v.view(as_int)
    return torch.equal(u, v)


def shard_layout(n_params: int, serials: list[str]) -> list[dict]:
    """Contiguous, equal-ish slices of the flat parameters, one per chip serial."""
    n = len(serials)
    return [{"serial": s, "start": i * n_params // n, "end": (i + 1) * n_params // n} for i, s in enumerate(serials)]


def shard_hash(flat: np.ndarray, start: int, end: int) -> str:
    return hashlib.sha256(flat[start:end]).hexdigest()


def shard_hashes(params: dict[str, torch.Tensor], layout: list[dict]) -> list[str]:
    """`shard_hash` of every shard, streamed a tensor at a time: the same digests as over `flatten`,
    without a second copy of all parameters (a 124M-parameter model's would be 0.5 GB)."""
    hashers = [hashlib.sha256() for _ in layout]
    offset = 0
    for p in params.values():
        part = p.detach().to("cpu", torch.float32).reshape(-1).numpy().astype("<f4", copy=False)
        lo, hi = offset, offset + part.size
        for h, s in zip(hashers, layout):
            a, b = max(s["start"], lo), min(s["end"], hi)
            if a < b:
                h.update(part[a - lo : b - lo])  # the array's own bytes (contiguous), not a copy
        offset = hi
    return [h.hexdigest() for h in hashers]
