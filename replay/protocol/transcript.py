"""A training transcript on disk, and its strict reader. Everything read here is hostile until verified.

Layout of a transcript directory:

    manifest.json                      the commitment (below); canonical JSON, its SHA-256 is the manifest hash
    checkpoints/<step:08d>.safetensors  float32 'param:<name>' and '<buffer>:<name>' (optimizer state)
    segments/<start:08d>.safetensors    for each step t of the segment [start, next checkpoint):
                                        'x:<t>', 'y:<t>' (the batch), 'proof:<t>' (uint8: the inclusion proofs of
                                        its examples in the committed dataset, dataset.py) and, in det64,
                                        'log:<t>' (uint8 rounding log)

manifest.json (format "chipledger-replay/1"): arch (allow-list) and config, precision ("det64" or
"float32"), seed, optimizer (sgd with momentum / adamw, hyper-parameters, learning-rate schedule),
batch (dtype and shape of x and y), steps, checkpoint_interval, shards (the layout over chip
serials), dataset (the data commitment: name, Merkle root, size, input range; dataset.py),
reported_flops (the prover's declaration), records (per step:
"data", SHA-256 of the exact batch tensors in order, and "loss", the float32 loss), checkpoints
and segments ({step: SHA-256 of the file's bytes}). The manifest hash therefore commits to every
byte of the transcript.

Reading never unpickles (JSON and safetensors only), checks every size against the manifest before
reading, parses safetensors headers itself (dtype, shape, offsets tiling the file) before handing
the bytes to safetensors, and takes architectures only from the allow-list. Anything malformed
raises MalformedTranscript(reason); a well-formed file that does not match its commitment raises
CommitmentMismatch (the prover changed something after committing).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import numpy as np
import safetensors.torch
import torch
from safetensors.torch import load as load_safetensors_bytes

from replay.protocol import limits, safeio
from replay.training import architectures as models
from replay.training import data_commitment as dataset
from replay.training.train import OPTIMIZERS, State

FORMAT = "chipledger-replay/1"
MAX_MANIFEST_BYTES = 32 << 20
MAX_STEPS = 200_000
MAX_BATCH = 4096
MAX_SHARDS = 4096
MAX_LOG_BYTES = 4 << 20  # per step
MAX_HEADER_BYTES = 1 << 20
DTYPES = {"F32": torch.float32, "I64": torch.int64, "U8": torch.uint8}
NAMES = {"float32": "F32", "int64": "I64", "uint8": "U8"}
HEX = set("0123456789abcdef")


class MalformedTranscript(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class CommitmentMismatch(Exception):
    """A file or batch differs from what the manifest committed to."""


# --------------------------------------------------------------------------- canonical bytes and digests


def canonical_json(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def batch_digest(batch: dict[str, torch.Tensor]) -> str:
    """The data commitment of one step: SHA-256 over name, dtype, shape and little-endian bytes of x, then y."""
    h = hashlib.sha256()
    for name in ("x", "y"):
        a = batch[name].detach().cpu().numpy()
        h.update(f"{name}:{a.dtype.name}:{','.join(map(str, a.shape))}\n".encode())
        h.update(np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<"), copy=False).tobytes())
    return h.hexdigest()


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
    path.write_bytes(safetensors.torch.save(tensors, metadata={"step": str(state.step)}))
    return sha256(path.read_bytes())


def write_segment(root: Path, start: int, steps: list[tuple[int, dict, bytes, bytes | None]]) -> str:
    """steps: [(t, batch, inclusion proofs, rounding log or None)]."""
    tensors = {}
    for t, batch, proofs, log in steps:
        tensors[f"x:{t}"], tensors[f"y:{t}"] = batch["x"].contiguous(), batch["y"].contiguous()
        tensors[f"proof:{t}"] = _uint8(proofs)
        if log is not None:
            tensors[f"log:{t}"] = _uint8(log)
    path = segment_path(root, start)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(safetensors.torch.save(tensors))
    return sha256(path.read_bytes())


def _uint8(data: bytes) -> torch.Tensor:
    """Bytes as a uint8 tensor, also when empty (a one-example dataset's inclusion proofs are empty:
    the tree is its leaf; torch.frombuffer refuses an empty buffer)."""
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)


def write_manifest(root: Path, manifest: dict) -> str:
    data = canonical_json(manifest)
    (Path(root) / "manifest.json").write_bytes(data)
    return sha256(data)


# --------------------------------------------------------------------------- reading (the verifier)


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


def parse_safetensors(data: bytes, name: str, expected: dict[str, tuple[str, list | int]]) -> dict[str, torch.Tensor]:
    """Validate a safetensors file's header against `expected` {tensor: (dtype, shape)} before loading it.

    A shape given as an int n means 'one-dimensional, at most n elements' (rounding logs).
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
    if set(header) != set(expected):
        extra, missing = sorted(set(header) - set(expected))[:3], sorted(set(expected) - set(header))[:3]
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


def _num(v, lo: float, hi: float, what: str, lo_open: bool = False) -> float:
    if type(v) not in (int, float) or not math.isfinite(v) or not (lo < v if lo_open else lo <= v) or v > hi:
        raise MalformedTranscript(f"{what} must be a number in {'(' if lo_open else '['}{lo}, {hi}]")
    return v


def _int(v, lo: int, hi: int, what: str) -> int:
    if type(v) is not int or not lo <= v <= hi:
        raise MalformedTranscript(f"{what} must be an integer in [{lo}, {hi}]")
    return v


def _hex(v, what: str) -> str:
    if not isinstance(v, str) or len(v) != 64 or not set(v) <= HEX:
        raise MalformedTranscript(f"{what} must be 64 lowercase hex digits")
    return v


def _keys(d, keys: set, what: str) -> dict:
    if not isinstance(d, dict) or set(d) != keys:
        raise MalformedTranscript(f"{what} must be an object with exactly the keys {sorted(keys)}")
    return d


def validate_schedule(s: dict, steps: int) -> None:
    kind = s.get("kind") if isinstance(s, dict) else None
    if kind == "constant":
        _keys(s, {"kind", "lr"}, "optimizer.lr")
    elif kind == "step":
        _keys(s, {"kind", "lr", "gamma", "every"}, "optimizer.lr")
        _num(s["gamma"], 0, 1, "optimizer.lr.gamma", lo_open=True)
        _int(s["every"], 1, MAX_STEPS, "optimizer.lr.every")
    elif kind == "linear":
        _keys(s, {"kind", "lr", "warmup", "total", "final"}, "optimizer.lr")
        _int(s["warmup"], 1, MAX_STEPS, "optimizer.lr.warmup")
        _int(s["total"], 1, MAX_STEPS, "optimizer.lr.total")
        _num(s["final"], 0, 10, "optimizer.lr.final")
    else:
        raise MalformedTranscript("optimizer.lr.kind must be constant, step or linear")
    _num(s["lr"], 0, 10, "optimizer.lr.lr", lo_open=True)


def validate_optimizer(o: dict, steps: int) -> None:
    kind = o.get("kind") if isinstance(o, dict) else None
    if kind == "sgd":
        _keys(o, {"kind", "lr", "momentum", "weight_decay"}, "optimizer")
        _num(o["momentum"], 0, 0.999999, "optimizer.momentum")
    elif kind == "adamw":
        _keys(o, {"kind", "lr", "betas", "eps", "weight_decay"}, "optimizer")
        if not isinstance(o["betas"], list) or len(o["betas"]) != 2:
            raise MalformedTranscript("optimizer.betas must be two numbers")
        for b in o["betas"]:
            _num(b, 0, 0.999999, "optimizer.betas[]")
        _num(o["eps"], 0, 1, "optimizer.eps", lo_open=True)
    else:
        raise MalformedTranscript(f"optimizer.kind must be one of {sorted(OPTIMIZERS)}")
    _num(o["weight_decay"], 0, 1, "optimizer.weight_decay")
    validate_schedule(o["lr"], steps)


def validate_dataset(d, arch: str) -> None:
    _keys(d, {"name", "root", "size", "x_range"}, "dataset")
    if not isinstance(d["name"], str) or not 1 <= len(d["name"]) <= 64 or not d["name"].isprintable():
        raise MalformedTranscript("dataset.name must be a printable string of 1..64 characters")
    _hex(d["root"], "dataset.root")
    _int(d["size"], 1, dataset.MAX_SIZE, "dataset.size")
    r = d["x_range"]
    if arch == "gpt":
        if r is not None:
            raise MalformedTranscript("dataset.x_range must be null for token inputs (the vocab bounds them)")
        return
    if not isinstance(r, list) or len(r) != 2:
        raise MalformedTranscript("dataset.x_range must be [low, high]")
    for v in r:
        _num(v, -dataset.MAX_INPUT, dataset.MAX_INPUT, "dataset.x_range[]")
    if r[0] > r[1]:
        raise MalformedTranscript("dataset.x_range must have low <= high")


MANIFEST_KEYS = {
    "format",
    "arch",
    "config",
    "precision",
    "seed",
    "optimizer",
    "batch",
    "steps",
    "checkpoint_interval",
    "shards",
    "dataset",
    "reported_flops",
    "records",
    "checkpoints",
    "segments",
}


def validate_manifest(m) -> dict:
    """Schema and bounds of a parsed manifest; returns the batch spec {x: (dtype, shape), y: ...}."""
    _keys(m, MANIFEST_KEYS, "manifest")
    if m["format"] != FORMAT:
        raise MalformedTranscript(f"format must be {FORMAT!r}")
    if not isinstance(m["arch"], str) or m["arch"] not in models.ARCHS:
        raise MalformedTranscript(
            f"architecture {str(m['arch'])[:40]!r} is not on the allow-list {sorted(models.ARCHS)}"
        )
    try:
        shapes = models.param_shapes(m["arch"], m["config"])
    except ValueError as e:
        raise MalformedTranscript(str(e)) from None
    if m["precision"] not in ("det64", "float32"):
        raise MalformedTranscript("precision must be det64 or float32")
    _int(m["seed"], 0, 2**63 - 1, "seed")
    steps = _int(m["steps"], 1, MAX_STEPS, "steps")
    interval = _int(m["checkpoint_interval"], 1, steps, "checkpoint_interval")
    validate_optimizer(m["optimizer"], steps)
    validate_dataset(m["dataset"], m["arch"])
    _int(m["reported_flops"], 0, 10**40, "reported_flops")

    b = _keys(m["batch"], {"x", "y"}, "batch")
    for k in ("x", "y"):
        _keys(b[k], {"dtype", "shape"}, f"batch.{k}")
    xs = b["x"]["shape"]
    if not isinstance(xs, list) or not xs or type(xs[0]) is not int or not 1 <= xs[0] <= MAX_BATCH:
        raise MalformedTranscript(f"batch.x.shape[0] must be a batch size in [1, {MAX_BATCH}]")
    seq = None
    if m["arch"] == "gpt":
        seq = xs[1] if len(xs) == 2 and type(xs[1]) is int else None
        if seq is None or not 1 <= seq <= m["config"]["block"]:
            raise MalformedTranscript("batch.x.shape[1] must be a sequence length in [1, block]")
    spec = models.batch_spec(m["arch"], m["config"], xs[0], seq)
    for k in ("x", "y"):
        if [b[k]["dtype"], b[k]["shape"]] != [spec[k][0], spec[k][1]]:
            raise MalformedTranscript(f"batch.{k} must be {spec[k][0]} of shape {spec[k][1]} for this architecture")
    too_big = limits.step_limits(m["arch"], m["config"], spec)
    if too_big:
        raise MalformedTranscript(too_big)

    n_params = sum(math.prod(s) for s in shapes.values())
    shards = m["shards"]
    if not isinstance(shards, list) or not 1 <= len(shards) <= MAX_SHARDS:
        raise MalformedTranscript(f"shards must list 1..{MAX_SHARDS} chips")
    pos, serials = 0, set()
    for i, s in enumerate(shards):
        _keys(s, {"serial", "start", "end"}, f"shards[{i}]")
        if not isinstance(s["serial"], str) or not 1 <= len(s["serial"]) <= 64 or not s["serial"].isprintable():
            raise MalformedTranscript(f"shards[{i}].serial must be a printable string of 1..64 characters")
        if s["serial"] in serials:
            raise MalformedTranscript(f"shards[{i}].serial repeats {s['serial']!r}")
        serials.add(s["serial"])
        if s["start"] != pos or type(s["end"]) is not int or not pos <= s["end"] <= n_params:
            raise MalformedTranscript(f"shards must tile the {n_params} parameters contiguously (shard {i})")
        pos = s["end"]
    if pos != n_params:
        raise MalformedTranscript(f"shards cover {pos} of {n_params} parameters")

    recs = m["records"]
    if not isinstance(recs, list) or len(recs) != steps:
        raise MalformedTranscript("records must have one entry per step")
    for t, r in enumerate(recs):
        _keys(r, {"data", "loss"}, f"records[{t}]")
        _hex(r["data"], f"records[{t}].data")
        _num(r["loss"], 0, 1e6, f"records[{t}].loss")
    want_ckpt = checkpoint_steps(steps, interval)
    for field, want in (("checkpoints", want_ckpt), ("segments", want_ckpt[:-1])):
        d = _keys(m[field], {str(s) for s in want}, field)
        for k, v in d.items():
            _hex(v, f"{field}[{k}]")
    return spec


class Transcript:
    """A transcript directory opened for verification: the manifest validated, files read on demand."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        data = read_file(self.root / "manifest.json", MAX_MANIFEST_BYTES, self.root)
        try:
            m = json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError) as e:
            raise MalformedTranscript(f"manifest.json is not JSON ({type(e).__name__})") from None
        self.spec = validate_manifest(m)
        if canonical_json(m) != data:
            raise MalformedTranscript("manifest.json is not in canonical form (sorted keys, no spaces, no duplicates)")
        self.manifest, self.hash = m, sha256(data)
        self.arch, self.config, self.precision = m["arch"], m["config"], m["precision"]
        self.shapes = models.param_shapes(self.arch, self.config)
        self.names = list(self.shapes)
        self.buffers = OPTIMIZERS[m["optimizer"]["kind"]]
        self.steps = m["steps"]
        self.checkpoints = checkpoint_steps(self.steps, m["checkpoint_interval"])
        self.layout = m["shards"]

    def segment_start(self, step: int) -> int:
        """The checkpoint at or before `step` (for step < steps: the start of the segment holding step)."""
        return max(c for c in self.checkpoints if c <= step)

    def next_checkpoint(self, step: int) -> int:
        return min(c for c in self.checkpoints if c > step)

    def _committed(self, path: Path, want: str, max_bytes: int) -> bytes:
        data = read_file(path, max_bytes, self.root)
        if sha256(data) != want:
            raise CommitmentMismatch(f"{path.parent.name}/{path.name} does not match the manifest's commitment")
        return data

    def checkpoint(self, step: int) -> State:
        expected = {}
        for k, s in self.shapes.items():
            for prefix in ("param", *self.buffers):
                expected[f"{prefix}:{k}"] = ("float32", s)
        limit = sum(4 * math.prod(s) for s in self.shapes.values()) * (1 + len(self.buffers)) + MAX_HEADER_BYTES + 8
        path = checkpoint_path(self.root, step)
        data = self._committed(path, self.manifest["checkpoints"][str(step)], limit)
        tensors = parse_safetensors(data, f"checkpoints/{path.name}", expected)
        return State.from_tensors(step, tensors, self.names, self.buffers)

    def segment(self, start: int) -> list[tuple[int, dict, bytes | None]]:
        """[(t, batch, rounding log bytes or None)] for the steps of the segment starting at `start`.

        Every batch must be the sampler's draw from the committed dataset (inclusion proofs checked)
        with its inputs inside the declared range."""
        end = self.next_checkpoint(start)
        expected, limit = {}, MAX_HEADER_BYTES + 8
        d, batch = self.manifest["dataset"], self.spec["y"][1][0]
        seed, root = self.manifest["seed"], bytes.fromhex(d["root"])
        for t in range(start, end):
            for k in ("x", "y"):
                dtype, shape = self.spec[k]
                expected[f"{k}:{t}"] = (dtype, shape)
                limit += math.prod(shape) * DTYPES[NAMES[dtype]].itemsize
            n = dataset.proof_bytes(seed, root, t, batch, d["size"])
            expected[f"proof:{t}"] = ("uint8", [n])
            limit += n
            if self.precision == "det64":
                expected[f"log:{t}"] = ("uint8", MAX_LOG_BYTES)
                limit += MAX_LOG_BYTES
        path = segment_path(self.root, start)
        data = self._committed(path, self.manifest["segments"][str(start)], limit)
        tensors = parse_safetensors(data, f"segments/{path.name}", expected)
        out = []
        for t in range(start, end):
            batch = {"x": tensors[f"x:{t}"], "y": tensors[f"y:{t}"]}
            if batch_digest(batch) != self.manifest["records"][t]["data"]:
                raise CommitmentMismatch(f"the batch of step {t} does not match its data commitment")
            _check_labels(self, batch, t)
            why = dataset.check_batch(batch, bytes(tensors[f"proof:{t}"].numpy()), seed, root, d["size"], t)
            if why is not None:
                raise CommitmentMismatch(f"the batch of step {t} is not the committed sampler's: {why}")
            log = bytes(tensors[f"log:{t}"].numpy()) if self.precision == "det64" else None
            out.append((t, batch, log))
        return out


def _check_labels(tr: Transcript, batch: dict, t: int) -> None:
    """Token ids and class labels must be in range (an out-of-range index would crash the replay)."""
    hi = (
        tr.config["vocab"]
        if tr.arch == "gpt"
        else (tr.config["sizes"][-1] if tr.arch == "mlp" else tr.config["classes"])
    )
    for k in ("y",) + (("x",) if tr.arch == "gpt" else ()):
        v = batch[k]
        if v.numel() and (int(v.min()) < 0 or int(v.max()) >= hi):
            raise MalformedTranscript(f"step {t}: {k} holds ids outside [0, {hi})")
    if batch["x"].is_floating_point():
        lo, hi = tr.manifest["dataset"]["x_range"]
        x = batch["x"]
        if not bool(torch.isfinite(x).all()):
            raise MalformedTranscript(f"step {t}: x holds non-finite values")
        if x.numel() and (float(x.min()) < lo or float(x.max()) > hi):
            raise MalformedTranscript(f"step {t}: x holds values outside the declared dataset.x_range [{lo}, {hi}]")


def _reject_constant(name: str):
    raise ValueError(f"{name} is not allowed")
