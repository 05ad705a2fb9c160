"""What one training step of a manifest costs, bounded before anything runs.

    reason = step_limits(arch, config, spec)   # None, or why the manifest is refused

Two budgets, from the environment (config/settings.py documents them), defaulting by the device
the replay runs on (REPLAY_DEVICE, cpu unless set): memory, REPLAY_MEMORY_BUDGET_BYTES (cpu 8 GiB,
the worker's limit; cuda 80% of the card's memory), and FLOPs per training step,
REPLAY_FLOP_BUDGET (cpu 1e12; cuda 1e15). The prover's `record` checks the same limits for its
own device before it trains, so what it records is what a verifier of that kind can replay.

The allow-list bounds config fields, not cost: a GPT with block 1024 and batch 4096 passes every
config bound yet needs ~10^11 float64 attention scores at step 0. So one deterministic step's
working set and FLOPs are estimated from the architecture config and the batch shape, and a
manifest above either budget is malformed (the reason names the batch shape and the figure).

Memory: the training state at STATE_BYTES per parameter (float32 parameters and two optimizer
buffers, the old and the new state both live during the update: 24; the float64 copy of the
parameters and their float64 gradients: 16), plus the float64 elements a step keeps for backward
(outputs of every op, the attention score and probability matrices, im2col columns of
convolutions, the logits and their softmax) at ACT_FACTOR bytes each: 8 for the value, 8 for its
gradient or a rounding-point temporary of the same size. An estimate of scale (within ~2x), not an
allocator's figure.
"""

from __future__ import annotations

import math
import os

from replay.training import architectures as models
from replay.training.determinism import MAX_LOG_ENTRIES

ACT_FACTOR = 16
STATE_BYTES = 40
MAX_STEP_MEMORY_BYTES: int | None = None  # set to override the environment (tests)
MAX_STEP_FLOPS: float | None = None
DEFAULTS = {"cpu": (8 << 30, 1e12), "cuda": (None, 1e15)}
# What no verifier is expected to hold, whatever its budgets: 1 TiB and 1e17 FLOPs a step (a hundred times an
# H100's default FLOP budget; a CPU host's memory budget may be raised to several hundred GiB). A step beyond
# these is malformed; one within them but beyond this device's budgets is this verifier's limit (`step_limits`).
ANY_VERIFIER = (1 << 40, 1e17)
LOG_FLOOR_BYTES = 4 << 20  # a step's rounding log may always hold this much (the cap of small models)
ROUNDED_PER_LOG_BYTE = 32  # and beyond it, one byte per 32 outputs the step rounds


def resolve_device(device: str):
    """cpu, cuda[:n] or auto (cuda where there is one) as a torch.device; ValueError says why a name is not
    one this machine can run on (not cpu or cuda, or a card this torch cannot reach)."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r}: use cpu, cuda or auto")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: no CUDA device is available to this torch")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return dev


def device_kind(device=None) -> str:
    kind = str(device or os.environ.get("REPLAY_DEVICE") or "cpu").split(":")[0]
    return kind if kind in DEFAULTS else "cpu"


def budgets(device=None) -> tuple[int, float]:
    """(memory bytes, FLOPs) one training step may cost on `device` (default: REPLAY_DEVICE)."""
    kind = device_kind(device)
    memory, flops = DEFAULTS[kind]
    if memory is None:  # cuda: the card's own memory, leaving a fifth to the allocator and the context
        import torch

        memory = int(torch.cuda.get_device_properties(0).total_memory * 0.8) if torch.cuda.is_available() else 8 << 30
    memory = int(_from_environment("REPLAY_MEMORY_BUDGET_BYTES", int, memory))
    flops = _from_environment("REPLAY_FLOP_BUDGET", float, flops)
    if MAX_STEP_MEMORY_BYTES is not None:
        memory = MAX_STEP_MEMORY_BYTES
    if MAX_STEP_FLOPS is not None:
        flops = MAX_STEP_FLOPS
    return memory, flops


def check_budget_settings() -> None:
    """ValueError naming a budget set in the environment that is not a positive number; touches no device (a
    worker's start: `budgets` on cuda reads the card's memory, which opens a CUDA context in the caller)."""
    _from_environment("REPLAY_MEMORY_BUDGET_BYTES", int, None)
    _from_environment("REPLAY_FLOP_BUDGET", float, None)


def _from_environment(name: str, kind: type, default):
    """A budget set in the environment, else `default`; ValueError names a value that is not a positive (finite)
    number: a budget of 0, -1 or NaN would call every honest transcript too large, or none."""
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = kind(raw)
    except ValueError:
        value = None
    # (a whole number of bytes past 2^63 is no machine's, and past 1e308 it overflows isfinite)
    if value is None or not (0 < value < 2**63 if kind is int else math.isfinite(value) and value > 0):
        what = "a positive whole number of bytes (under 2^63)" if kind is int else "a positive, finite number of FLOPs"
        shown = repr(raw) if len(raw) <= 40 else f"{raw[:40]!r}... ({len(raw):,} characters)"
        raise ValueError(f"{name}={shown} is not {what}")
    return value


def activation_elements(arch: str, config: dict, spec: dict) -> int:
    """Float64 elements one step keeps live for backward, from the config and the batch shape."""
    shape = spec["x"][1]
    b = shape[0]
    if arch == "mlp":
        return 2 * b * sum(config["sizes"])
    if arch == "cnn":
        side, chans, total = config["image"], [config["in_channels"], *config["channels"]], 0
        total = b * chans[0] * side * side
        for i, (ci, co) in enumerate(zip(chans[:-1], chans[1:])):
            side = (side + 2 - 3) // (1 if i == 0 else 2) + 1
            total += b * side * side * (9 * ci + 2 * co)  # im2col columns, conv output, relu
        return total + 2 * b * config["classes"]
    t, c, h = shape[1], config["n_embd"], config["n_head"]
    per_layer = b * t * c * 17 + 2 * b * h * t * t  # ln, qkv, heads, proj, mlp 4c x2, residuals; scores, probs
    return b * t * c * 3 + config["n_layer"] * per_layer + 2 * b * t * config["vocab"]


def step_memory(arch: str, config: dict, spec: dict) -> tuple[int, int]:
    """(activation bytes, state bytes) of one deterministic step."""
    return activation_elements(arch, config, spec) * ACT_FACTOR, models.param_count(arch, config) * STATE_BYTES


def step_limits(arch: str, config: dict, spec: dict, device=None) -> str | None:
    """Why one step of this manifest is beyond the budgets of `device` (default REPLAY_DEVICE), or None."""
    memory, max_flops = budgets(device)
    where = device_kind(device)
    hold = f"the replay memory budget of {{}} on {where} (REPLAY_MEMORY_BUDGET_BYTES)"
    run = f"the replay budget of {{}} on {where} (REPLAY_FLOP_BUDGET)"
    return _over(arch, config, spec, memory, max_flops, hold, run)


def beyond_any_verifier(arch: str, config: dict, spec: dict) -> str | None:
    """Why one step of this manifest is beyond what any verifier is expected to hold (ANY_VERIFIER), or None: such
    a transcript is malformed wherever it is read; one within it but beyond this device's budgets
    (`step_limits`) is this verifier's limit, for a larger worker to take."""
    memory, max_flops = ANY_VERIFIER
    hold, run = "the {} a step any verifier may hold", "the {} a step any verifier may run"
    return _over(arch, config, spec, memory, max_flops, hold, run)


def _over(arch: str, config: dict, spec: dict, memory: int, max_flops: float, memory_name: str, flops_name: str):
    shape = spec["x"][1]
    act, state = step_memory(arch, config, spec)
    if act + state > memory:
        need, limit = _apart(act + state, memory, _in_units, lambda b: f"{int(b):,} bytes")
        return (
            f"batch.x.shape {shape} with this config needs about {need} per step "
            f"({_in_units(act)} of activations, {_in_units(state)} of training state), more than "
            + memory_name.format(limit)
        )
    flops = models.training_flops(arch, config, spec)
    if flops > max_flops:
        need, limit = _apart(flops, max_flops, lambda f: f"{f:.3e}", lambda f: f"{int(f):,}")
        return (
            f"batch.x.shape {shape} with this config is {need} FLOPs per training step, more than "
            + flops_name.format(limit)
        )
    return None


def _in_units(size: float) -> str:
    """Bytes in the largest binary unit they fill, to a tenth (a small budget's breakdown read 0.0 GiB and 0.0 GiB)."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift:
            return f"{size / (1 << shift):.1f} {unit}"
    return f"{int(size):,} bytes"


def _apart(value, limit, short, exact) -> tuple[str, str]:
    """value and the limit it is over, each written `short`, or both `exact` where the short forms would not show
    value as the larger (2.910e+07 over a budget of 3e+07, or 8.0 GiB over 8.0 GiB)."""
    if _magnitude(short(value)) > _magnitude(short(limit)):
        return short(value), short(limit)
    return exact(value), exact(limit)


_UNITS = ("bytes", "KiB", "MiB", "GiB")


def _magnitude(text: str) -> float:
    """What a short form reads as, to order two of them as a reader would ("1.0 GiB" is "1024.0 MiB", not more)."""
    number, _, unit = text.partition(" ")
    return float(number.replace(",", "")) * 1024 ** (_UNITS.index(unit) if unit in _UNITS else 0)


def log_caps(arch: str, config: dict, spec: dict) -> tuple[int, int]:
    """(bytes, entries) one step's rounding log may hold. Close calls grow with the outputs a step rounds
    (activations and gradients), so a fixed cap refuses honest logs of large steps (GPT-2 small at block
    1024, batch 4: 4.25 MB a step, over a 4 MiB cap). The caps bound the verifier's reading and decoding,
    not soundness: every logged entry must still be a close call at its point (entry_cap bounds those)."""
    rounded = activation_elements(arch, config, spec) + models.param_count(arch, config)
    max_bytes = max(LOG_FLOOR_BYTES, rounded // ROUNDED_PER_LOG_BYTE)
    return max_bytes, max(MAX_LOG_ENTRIES, max_bytes // 2)
