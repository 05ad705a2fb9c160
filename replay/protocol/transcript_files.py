"""Reading a transcript's files without trusting them: a regular file inside the transcript, size-capped
before it is read, and a safetensors file whose header (dtype, shape, offsets tiling the file) is checked
against what the manifest implies before any tensor is made. Never unpickles.

Checkpoints are streamed (`read_safetensors`): each tensor's bytes go from the file straight into its own
tensor while the file's SHA-256 is computed, so a checkpoint costs its tensors' memory once (not its bytes,
then its tensors), and a caller may drop tensors it does not need as they come (`keep`). Nothing read is
handed back before the file's digest matched its commitment."""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load as load_safetensors_bytes

from replay.protocol import json_once, safeio
from replay.protocol.transcript_errors import CommitmentMismatch, MalformedTranscript

MAX_HEADER_BYTES = 1 << 20
DTYPES = {"F32": torch.float32, "I64": torch.int64, "U8": torch.uint8}
NAMES = {"float32": "F32", "int64": "I64", "uint8": "U8"}
CHUNK = 1 << 20  # bytes hashed at a time when draining a file


def _open(path: Path, root: Path | None) -> tuple[int, str]:
    """(descriptor, path inside root) of a regular file inside root (safeio.open_inside)."""
    path = Path(path)
    root = Path(root) if root is not None else path.parent
    try:
        rel = path.relative_to(root).as_posix()
    except ValueError:
        raise MalformedTranscript(f"{path.name}: outside the transcript") from None
    try:
        return safeio.open_inside(root, rel), rel
    except safeio.Refused as e:
        raise MalformedTranscript(str(e)) from None


def read_file(path: Path, max_bytes: int, root: Path | None = None) -> bytes:
    """A regular file's bytes, refusing anything larger than max_bytes before reading it.

    With `root`, path must lie inside it and no component below root may be a symbolic link or
    anything but a directory / regular file (safeio.open_inside): a link out of the transcript could
    make the verifier hash a host file, and its verdict an oracle on that file. Reasons name only
    the path inside the transcript.
    """
    fd, rel = _open(path, root)
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > max_bytes:
            raise MalformedTranscript(f"{rel}: {size} bytes, more than the {max_bytes} allowed")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise MalformedTranscript(f"{rel}: larger than {max_bytes} bytes")
    return data


Expected = dict[str, tuple[str, list | int]]


def parse_safetensors(data: bytes, name: str, expected: Expected, optional=frozenset()) -> dict[str, torch.Tensor]:
    """Validate a safetensors file's header against `expected` {tensor: (dtype, shape)} before loading it.

    A shape given as an int n means 'one-dimensional, at most n elements' (rounding logs). Tensors named in
    `optional` may be absent; every other expected tensor must be there, and nothing else.
    """
    if len(data) < 8:
        raise MalformedTranscript(f"{name}: truncated (no safetensors header)")
    n = _header_length(data[:8], len(data), name)
    check_header(data[8 : 8 + n], len(data) - 8 - n, name, expected, optional)
    try:
        # safetensors' own parser (a JSON header and raw tensor bytes, never pickle), on bytes whose
        # header we have already checked against the manifest.
        return load_safetensors_bytes(data)
    except Exception as e:  # the library's own checks, after ours
        raise MalformedTranscript(f"{name}: unreadable safetensors ({type(e).__name__})") from None


def _header_length(prefix: bytes, size: int, name: str) -> int:
    n = int.from_bytes(prefix, "little")
    if n > min(size - 8, MAX_HEADER_BYTES):
        raise MalformedTranscript(f"{name}: not a safetensors file (header length {n})")
    return n


def check_header(
    raw: bytes, body: int, name: str, expected: Expected, optional=frozenset()
) -> list[tuple[str, torch.dtype, list[int]]]:
    """[(key, dtype, shape)] in the order of their bytes, which tile the `body` bytes after the header
    exactly; anything else, or a tensor the manifest does not imply, is MalformedTranscript (those named in
    `optional` may be absent)."""
    try:
        header = json_once.loads(raw.decode("utf-8"))
    except json_once.MemberTwice as e:  # (a tensor named twice: which bytes it is would be the parser's choice)
        raise MalformedTranscript(f"{name}: safetensors header: {e}") from None
    except (ValueError, RecursionError):  # (ValueError: not UTF-8, not JSON, or an integer of over 4300 digits)
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
        spans.append((offsets[0], offsets[1], key, DTYPES[dtype], shape))
    pos = 0
    for a, b, *_ in sorted(spans):
        if a != pos:
            raise MalformedTranscript(f"{name}: tensor data overlaps or leaves holes")
        pos = b
    if pos != body:
        raise MalformedTranscript(f"{name}: truncated or padded ({body} data bytes, header describes {pos})")
    return [(key, dtype, shape) for _, _, key, dtype, shape in sorted(spans)]


def read_safetensors(
    path: Path,
    root: Path,
    max_bytes: int,
    digest: str,
    expected: Expected,
    keep: Callable[[str, torch.Tensor], bool] = lambda key, tensor: True,
    optional=frozenset(),
) -> dict[str, torch.Tensor]:
    """A committed safetensors file's tensors, streamed: {key: tensor} for each tensor that `keep(key,
    tensor)` (called as each is read, in file order) wants kept.

    Each tensor is read straight from the file into its own memory while every byte goes into SHA-256:
    no copy of the file's bytes is ever held. The digest must be `digest` (else CommitmentMismatch,
    also when the file is malformed too: a changed file is a broken commitment first), and the header
    must fit `expected` (check_header). Safetensors stores little-endian bytes, as torch holds them
    on every platform it runs on.
    """
    fd, rel = _open(path, root)
    h = hashlib.sha256()
    with os.fdopen(fd, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        if size > max_bytes:
            raise MalformedTranscript(f"{rel}: {size} bytes, more than the {max_bytes} allowed")
        try:
            out = _stream(f, h, size, rel, expected, keep, optional)
        except MalformedTranscript:
            _drain(f, h, max_bytes)
            if h.hexdigest() != digest:
                raise CommitmentMismatch(f"{rel} does not match the manifest's commitment") from None
            raise
    if h.hexdigest() != digest:
        raise CommitmentMismatch(f"{rel} does not match the manifest's commitment")
    return out


def _stream(f, h, size: int, name: str, expected: Expected, keep, optional) -> dict[str, torch.Tensor]:
    if size < 8:
        _read_into(f, h, memoryview(bytearray(size)), name)
        raise MalformedTranscript(f"{name}: truncated (no safetensors header)")
    prefix = bytearray(8)
    _read_into(f, h, memoryview(prefix), name)
    n = _header_length(bytes(prefix), size, name)
    raw = bytearray(n)
    _read_into(f, h, memoryview(raw), name)
    out = {}
    for key, dtype, shape in check_header(bytes(raw), size - 8 - n, name, expected, optional):
        tensor = torch.empty(shape, dtype=dtype)
        if tensor.numel():
            _read_into(f, h, memoryview(tensor.reshape(-1).view(torch.uint8).numpy()), name)
        if keep(key, tensor):
            out[key] = tensor
    extra = f.read(1)
    if extra:  # grew since it was measured
        h.update(extra)
        raise MalformedTranscript(f"{name}: larger than its header describes")
    return out


def _read_into(f, h, view: memoryview, name: str) -> None:
    """Fill `view` from f, hashing what was read; a file that ends first is truncated."""
    pos = 0
    while pos < len(view):
        got = f.readinto(view[pos:])
        if not got:
            h.update(view[:pos])
            raise MalformedTranscript(f"{name}: truncated (ends inside its data)")
        pos += got
    h.update(view)


def _drain(f, h, max_bytes: int) -> None:
    """Hash the rest of f (at most max_bytes in all: the file was measured below that)."""
    buf = bytearray(CHUNK)
    left = max_bytes
    while left > 0:
        got = f.readinto(memoryview(buf)[: min(CHUNK, left)])
        if not got:
            return
        h.update(memoryview(buf)[:got])
        left -= got
