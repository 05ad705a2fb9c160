"""Reading a transcript's files without trusting them: a regular file inside the transcript, size-capped
before it is read, and a safetensors file whose header (dtype, shape, offsets tiling the file) is checked
against what the manifest implies before the bytes go to safetensors. Never unpickles."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch
from safetensors.torch import load as load_safetensors_bytes

from replay.protocol import safeio
from replay.protocol.transcript_errors import MalformedTranscript

MAX_HEADER_BYTES = 1 << 20
DTYPES = {"F32": torch.float32, "I64": torch.int64, "U8": torch.uint8}
NAMES = {"float32": "F32", "int64": "I64", "uint8": "U8"}


def read_file(path: Path, max_bytes: int, root: Path | None = None) -> bytes:
    """A regular file's bytes, refusing anything larger than max_bytes before reading it.

    With `root`, path must lie inside it and no component below root may be a symbolic link or
    anything but a directory / regular file (safeio.open_inside): a link out of the transcript could
    make the verifier hash a host file, and its verdict an oracle on that file. Reasons name only
    the path inside the transcript.
    """
    path = Path(path)
    root = Path(root) if root is not None else path.parent
    try:
        rel = path.relative_to(root).as_posix()
    except ValueError:
        raise MalformedTranscript(f"{path.name}: outside the transcript") from None
    try:
        fd = safeio.open_inside(root, rel)
    except safeio.Refused as e:
        raise MalformedTranscript(str(e)) from None
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > max_bytes:
            raise MalformedTranscript(f"{rel}: {size} bytes, more than the {max_bytes} allowed")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise MalformedTranscript(f"{rel}: larger than {max_bytes} bytes")
    return data


def parse_safetensors(
    data: bytes, name: str, expected: dict[str, tuple[str, list | int]], optional=frozenset()
) -> dict[str, torch.Tensor]:
    """Validate a safetensors file's header against `expected` {tensor: (dtype, shape)} before loading it.

    A shape given as an int n means 'one-dimensional, at most n elements' (rounding logs). Tensors named in
    `optional` may be absent; every other expected tensor must be there, and nothing else.
    """
    if len(data) < 8:
        raise MalformedTranscript(f"{name}: truncated (no safetensors header)")
    n = int.from_bytes(data[:8], "little")
    if n > min(len(data) - 8, MAX_HEADER_BYTES):
        raise MalformedTranscript(f"{name}: not a safetensors file (header length {n})")
    try:
        header = json.loads(data[8 : 8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise MalformedTranscript(f"{name}: safetensors header is not JSON") from None
    if not isinstance(header, dict):
        raise MalformedTranscript(f"{name}: safetensors header is not an object")
    meta = header.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise MalformedTranscript(f"{name}: bad safetensors metadata")
    if not set(expected) - set(optional) <= set(header) <= set(expected):
        extra = sorted(set(header) - set(expected))[:3]
        missing = sorted(set(expected) - set(optional) - set(header))[:3]
        raise MalformedTranscript(f"{name}: tensors do not match the manifest (unexpected {extra}, missing {missing})")
    spans = []
    for key, info in header.items():
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise MalformedTranscript(f"{name}: bad header entry for {key}")
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        want_dtype, want_shape = expected[key]
        if dtype != NAMES[want_dtype]:
            raise MalformedTranscript(f"{name}: {key} has dtype {dtype!r}, expected {NAMES[want_dtype]}")
        if not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape):
            raise MalformedTranscript(f"{name}: {key} has a bad shape")
        if isinstance(want_shape, int):
            if len(shape) != 1 or shape[0] > want_shape:
                raise MalformedTranscript(f"{name}: {key} has shape {shape}, more than {want_shape} elements")
        elif shape != list(want_shape):
            raise MalformedTranscript(f"{name}: {key} has shape {shape}, the manifest implies {list(want_shape)}")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
            raise MalformedTranscript(f"{name}: {key} has bad data offsets")
        size = math.prod(shape) * DTYPES[dtype].itemsize
        if offsets[1] - offsets[0] != size or offsets[0] < 0:
            raise MalformedTranscript(f"{name}: {key} offsets do not match its shape")
        spans.append(offsets)
    body = len(data) - 8 - n
    pos = 0
    for a, b in sorted(spans):
        if a != pos:
            raise MalformedTranscript(f"{name}: tensor data overlaps or leaves holes")
        pos = b
    if pos != body:
        raise MalformedTranscript(f"{name}: truncated or padded ({body} data bytes, header describes {pos})")
    try:
        # safetensors' own parser (a JSON header and raw tensor bytes, never pickle), on bytes whose
        # header we have already checked against the manifest.
        return load_safetensors_bytes(data)
    except Exception as e:  # the library's own checks, after ours
        raise MalformedTranscript(f"{name}: unreadable safetensors ({type(e).__name__})") from None
