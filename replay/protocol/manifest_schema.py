"""The manifest's schema and bounds: every field of manifest.json checked (types, ranges, the architecture's
allow-list, the batch shapes it implies, the shard layout, one record per step, the committed files) before
anything else of a transcript is read. Anything out of bounds raises MalformedTranscript(reason)."""

from __future__ import annotations

import math

from replay.protocol import limits
from replay.protocol.transcript_errors import MalformedTranscript
from replay.protocol.transcript_layout import FORMATS_READ, checkpoint_steps
from replay.training import architectures as models
from replay.training import data_commitment as dataset
from replay.training.train import OPTIMIZERS

MAX_STEPS = 200_000
MAX_BATCH = 4096
MAX_SHARDS = 4096
MAX_SEED = 2**63 - 1
MAX_SERIAL = 64  # characters of a chip serial
HEX = set("0123456789abcdef")

# What a transcript's `precision` may be: det64, the only claimable one, and the plain baselines `record` also writes
# for benchmarks. A plain precision's replay depends on the machine's summation order and thread count: no verdict on
# it could be exact, so the verifier refuses such a transcript as not claimable (malformed), by name.
PRECISIONS = ("det64", "float32", "float64")
CLAIMABLE_PRECISIONS = ("det64",)
MAX_LOSS = 1e6  # a step's recorded loss lies in [0, MAX_LOSS] (a diverged run is not a transcript)


def number_in(v, lo: float, hi: float, what: str, lo_open: bool = False) -> float:
    if type(v) not in (int, float) or not math.isfinite(v) or not (lo < v if lo_open else lo <= v) or v > hi:
        raise MalformedTranscript(f"{what} must be a number in {'(' if lo_open else '['}{lo}, {hi}]")
    return v


def integer_in(v, lo: int, hi: int, what: str) -> int:
    if type(v) is not int or not lo <= v <= hi:
        raise MalformedTranscript(f"{what} must be an integer in [{lo}, {hi}]")
    return v


def serial_problem(v) -> str | None:
    """Why `v` is no chip serial a manifest may name, or None (the recorder asks the same before it records)."""
    if not isinstance(v, str) or not 1 <= len(v) <= MAX_SERIAL or not v.isprintable():
        return f"must be a printable string of 1..{MAX_SERIAL} characters"
    return None


def hex_digest(v, what: str) -> str:
    if not isinstance(v, str) or len(v) != 64 or not set(v) <= HEX:
        raise MalformedTranscript(f"{what} must be 64 lowercase hex digits")
    return v


def exact_keys(d, keys: set, what: str) -> dict:
    if not isinstance(d, dict) or set(d) != keys:
        raise MalformedTranscript(f"{what} must be an object with exactly the keys {sorted(keys)}")
    return d


def validate_schedule(s: dict, steps: int) -> None:
    kind = s.get("kind") if isinstance(s, dict) else None
    if kind == "constant":
        exact_keys(s, {"kind", "lr"}, "optimizer.lr")
    elif kind == "step":
        exact_keys(s, {"kind", "lr", "gamma", "every"}, "optimizer.lr")
        number_in(s["gamma"], 0, 1, "optimizer.lr.gamma", lo_open=True)
        integer_in(s["every"], 1, MAX_STEPS, "optimizer.lr.every")
    elif kind == "linear":
        exact_keys(s, {"kind", "lr", "warmup", "total", "final"}, "optimizer.lr")
        integer_in(s["warmup"], 1, MAX_STEPS, "optimizer.lr.warmup")
        integer_in(s["total"], 1, MAX_STEPS, "optimizer.lr.total")
        number_in(s["final"], 0, 10, "optimizer.lr.final")
    else:
        raise MalformedTranscript("optimizer.lr.kind must be constant, step or linear")
    number_in(s["lr"], 0, 10, "optimizer.lr.lr", lo_open=True)


def validate_optimizer(o: dict, steps: int) -> None:
    kind = o.get("kind") if isinstance(o, dict) else None
    if kind == "sgd":
        exact_keys(o, {"kind", "lr", "momentum", "weight_decay"}, "optimizer")
        number_in(o["momentum"], 0, 0.999999, "optimizer.momentum")
    elif kind == "adamw":
        exact_keys(o, {"kind", "lr", "betas", "eps", "weight_decay"}, "optimizer")
        if not isinstance(o["betas"], list) or len(o["betas"]) != 2:
            raise MalformedTranscript("optimizer.betas must be two numbers")
        for b in o["betas"]:
            number_in(b, 0, 0.999999, "optimizer.betas[]")
        number_in(o["eps"], 0, 1, "optimizer.eps", lo_open=True)
    else:
        raise MalformedTranscript(f"optimizer.kind must be one of {sorted(OPTIMIZERS)}")
    number_in(o["weight_decay"], 0, 1, "optimizer.weight_decay")
    validate_schedule(o["lr"], steps)


def validate_dataset(d, arch: str) -> None:
    exact_keys(d, {"name", "root", "size", "x_range"}, "dataset")
    if not isinstance(d["name"], str) or not 1 <= len(d["name"]) <= 64 or not d["name"].isprintable():
        raise MalformedTranscript("dataset.name must be a printable string of 1..64 characters")
    hex_digest(d["root"], "dataset.root")
    integer_in(d["size"], 1, dataset.MAX_SIZE, "dataset.size")
    r = d["x_range"]
    if arch == "gpt":
        if r is not None:
            raise MalformedTranscript("dataset.x_range must be null for token inputs (the vocab bounds them)")
        return
    if not isinstance(r, list) or len(r) != 2:
        raise MalformedTranscript("dataset.x_range must be [low, high]")
    for v in r:
        number_in(v, -dataset.MAX_INPUT, dataset.MAX_INPUT, "dataset.x_range[]")
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
    """Schema and bounds of a parsed manifest; returns the batch spec {x: (dtype, shape), y: ...}. A step beyond
    what any verifier may hold is malformed here; this verifier's own budgets are `Transcript`'s to check, once
    the manifest is known to be well formed (a limit of this machine, not the prover's fault)."""
    exact_keys(m, MANIFEST_KEYS, "manifest")
    if not isinstance(m["format"], str) or m["format"] not in FORMATS_READ:
        raise MalformedTranscript(f"format must be one of {list(FORMATS_READ)}")
    if not isinstance(m["arch"], str) or m["arch"] not in models.ARCHS:
        raise MalformedTranscript(
            f"architecture {str(m['arch'])[:40]!r} is not on the allow-list {sorted(models.ARCHS)}"
        )
    try:
        shapes = models.param_shapes(m["arch"], m["config"])
    except ValueError as e:
        raise MalformedTranscript(str(e)) from None
    if m["precision"] not in PRECISIONS:  # (a plain one is read on, and refused by the verifier as not claimable)
        shown = repr(m["precision"][:40]) if isinstance(m["precision"], str) else f"a {type(m['precision']).__name__}"
        raise MalformedTranscript(f"precision must be one of {', '.join(PRECISIONS)}, not {shown}")
    integer_in(m["seed"], 0, MAX_SEED, "seed")
    steps = integer_in(m["steps"], 1, MAX_STEPS, "steps")
    interval = integer_in(m["checkpoint_interval"], 1, steps, "checkpoint_interval")
    validate_optimizer(m["optimizer"], steps)
    validate_dataset(m["dataset"], m["arch"])
    integer_in(m["reported_flops"], 0, 10**40, "reported_flops")

    b = exact_keys(m["batch"], {"x", "y"}, "batch")
    for k in ("x", "y"):
        exact_keys(b[k], {"dtype", "shape"}, f"batch.{k}")
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
        shape = b[k]["shape"]  # (integers only: 32.0 == 32 would give one run several manifests' hashes)
        typed = isinstance(shape, list) and all(type(d) is int for d in shape)
        if not typed or [b[k]["dtype"], shape] != [spec[k][0], spec[k][1]]:
            raise MalformedTranscript(f"batch.{k} must be {spec[k][0]} of shape {spec[k][1]} for this architecture")
    too_big = limits.beyond_any_verifier(m["arch"], m["config"], spec)
    if too_big:
        raise MalformedTranscript(too_big)

    n_params = sum(math.prod(s) for s in shapes.values())
    shards = m["shards"]
    if not isinstance(shards, list) or not 1 <= len(shards) <= MAX_SHARDS:
        raise MalformedTranscript(f"shards must list 1..{MAX_SHARDS} chips")
    pos, serials = 0, set()
    for i, s in enumerate(shards):
        exact_keys(s, {"serial", "start", "end"}, f"shards[{i}]")
        problem = serial_problem(s["serial"])
        if problem:
            raise MalformedTranscript(f"shards[{i}].serial {problem}")
        if s["serial"] in serials:
            raise MalformedTranscript(f"shards[{i}].serial repeats {s['serial']!r}")
        serials.add(s["serial"])
        if (
            type(s["start"]) is not int
            or s["start"] != pos
            or type(s["end"]) is not int
            or not pos <= s["end"] <= n_params
        ):
            raise MalformedTranscript(f"shards must tile the {n_params} parameters contiguously (shard {i})")
        pos = s["end"]
    if pos != n_params:
        raise MalformedTranscript(f"shards cover {pos} of {n_params} parameters")

    recs = m["records"]
    if not isinstance(recs, list) or len(recs) != steps:
        raise MalformedTranscript("records must have one entry per step")
    for t, r in enumerate(recs):
        exact_keys(r, {"data", "loss"}, f"records[{t}]")
        hex_digest(r["data"], f"records[{t}].data")
        number_in(r["loss"], 0, MAX_LOSS, f"records[{t}].loss")
    want_ckpt = checkpoint_steps(steps, interval)
    for field, want in (("checkpoints", want_ckpt), ("segments", want_ckpt[:-1])):
        d = exact_keys(m[field], {str(s) for s in want}, field)
        for k, v in d.items():
            hex_digest(v, f"{field}[{k}]")
    return spec
