"""The allow-list: architectures a transcript may name, built from its manifest config.

Each model is an nn.Module whose forward(x, y, ops) returns the mean loss; `ops` is ops.Det or
ops.Plain. Parameters are only read through ops (never through a broadcasting torch op), so every
gradient reduction is a rounding point. Configs are bounded here, before anything is allocated;
shapes come from a build on the meta device.
"""

from __future__ import annotations

import json
import math

import torch
from torch import nn

LIMITS = {"width": 4096, "layers": 12, "classes": 1024, "image": 64, "channels": 256, "vocab": 65536, "block": 1024}
# No parameter cap of its own: what a model may cost is the memory and FLOP budget of replay/protocol/limits.py
# (the config bounds above keep any model under ~0.3G parameters).
# GPT-2 small's shape (124M parameters with a tied head; this GPT's head is untied: 163M)
PRESETS = {"gpt2-small": ("gpt", {"vocab": 50257, "block": 1024, "n_layer": 12, "n_head": 12, "n_embd": 768})}


class MLP(nn.Module):
    def __init__(self, sizes: list[int]):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))

    def forward(self, x, y, ops):
        for i, layer in enumerate(self.layers):
            x = ops.linear(x, layer.weight, layer.bias, f"layers.{i}")
            if i < len(self.layers) - 1:
                x = ops.relu(x)
        return ops.cross_entropy(x, y, "loss")


class CNN(nn.Module):
    """conv 3x3 -> relu -> conv 3x3 stride 2 (each) -> linear head."""

    def __init__(self, in_channels: int, image: int, channels: list[int], classes: int):
        super().__init__()
        chans = [in_channels, *channels]
        self.convs = nn.ModuleList(nn.Conv2d(a, b, 3) for a, b in zip(chans[:-1], chans[1:]))
        self.strides = [1] + [2] * (len(channels) - 1)
        side = image
        for s in self.strides:
            side = (side + 2 - 3) // s + 1
        self.head = nn.Linear(chans[-1] * side * side, classes)

    def forward(self, x, y, ops):
        for i, (conv, s) in enumerate(zip(self.convs, self.strides)):
            x = ops.relu(ops.conv2d(x, conv.weight, conv.bias, s, 1, f"convs.{i}"))
        x = ops.linear(x.flatten(1), self.head.weight, self.head.bias, "head")
        return ops.cross_entropy(x, y, "loss")


class Embedding(nn.Module):
    """A bare lookup table (nn.Embedding's normal_ init is slow on the meta device; init_params sets weights)."""

    def __init__(self, rows: int, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(rows, dim))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.c_attn, self.c_proj = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)
        self.c_fc, self.mlp_proj = nn.Linear(n_embd, 4 * n_embd), nn.Linear(4 * n_embd, n_embd)

    def forward(self, x, ops, name):
        b, t, c = x.shape
        h = ops.layer_norm(x, self.ln_1.weight, self.ln_1.bias, f"{name}.ln_1")
        q, k, v = ops.linear(h, self.c_attn.weight, self.c_attn.bias, f"{name}.c_attn").split(c, dim=2)
        q, k, v = (z.reshape(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        a = ops.attention(q, k, v, f"{name}.attn").transpose(1, 2).reshape(b, t, c)
        x = x + ops.linear(a, self.c_proj.weight, self.c_proj.bias, f"{name}.c_proj")
        h = ops.layer_norm(x, self.ln_2.weight, self.ln_2.bias, f"{name}.ln_2")
        h = ops.relu(ops.linear(h, self.c_fc.weight, self.c_fc.bias, f"{name}.c_fc"))
        return x + ops.linear(h, self.mlp_proj.weight, self.mlp_proj.bias, f"{name}.mlp_proj")


class GPT(nn.Module):
    """nanoGPT in miniature: learned positions, pre-LN blocks, ReLU MLP, untied head."""

    def __init__(self, vocab: int, block: int, n_layer: int, n_head: int, n_embd: int):
        super().__init__()
        self.wte, self.wpe = Embedding(vocab, n_embd), Embedding(block, n_embd)
        self.h = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab)

    def forward(self, x, y, ops):
        b, t = x.shape
        pos = torch.arange(t, device=x.device).expand(b, t)
        x = ops.embedding(x, self.wte.weight, "wte") + ops.embedding(pos, self.wpe.weight, "wpe")
        for i, block in enumerate(self.h):
            x = block(x, ops, f"h.{i}")
        x = ops.layer_norm(x, self.ln_f.weight, self.ln_f.bias, "ln_f")
        logits = ops.linear(x, self.lm_head.weight, self.lm_head.bias, "lm_head")
        return ops.cross_entropy(logits.reshape(b * t, -1), y.reshape(b * t), "loss")


ARCHS = {"mlp": MLP, "cnn": CNN, "gpt": GPT}
DEFAULTS = {
    "mlp": {"sizes": [32, 256, 256, 8]},
    "cnn": {"in_channels": 1, "image": 16, "channels": [8, 16], "classes": 4},
    "gpt": {"vocab": 32, "block": 32, "n_layer": 2, "n_head": 4, "n_embd": 64},
}


_MISSING = object()


def _int(cfg: dict, key: str, lo: int, hi: int) -> int:
    v = cfg.get(key, _MISSING)
    if type(v) is not int or not lo <= v <= hi:
        raise ValueError(f"config.{key} must be an integer in [{lo}, {hi}], not {_shown(v)}")
    return v


def _ints(cfg: dict, key: str, n_lo: int, n_hi: int, lo: int, hi: int) -> list[int]:
    v = cfg.get(key, _MISSING)
    what = f"config.{key} must be a list of {n_lo}..{n_hi} integers in [{lo}, {hi}]"
    if not isinstance(v, list):
        raise ValueError(f"{what}, not {'the single number ' if type(v) is int else ''}{_shown(v)}")
    if not n_lo <= len(v) <= n_hi:
        raise ValueError(f"{what}, not {len(v)} of them")
    for i, s in enumerate(v):
        if type(s) is not int or not lo <= s <= hi:
            raise ValueError(f"{what}: its [{i}] is {_shown(s)}")
    return v


def _shown(v) -> str:
    """A config value as a message shows it, in JSON's spelling: short, with its kind where the kind is what is
    wrong (64.0, true, "16")."""
    if v is _MISSING:
        return "missing"
    if type(v) is int:  # (by size: str() of a 5,000-digit integer raises)
        if abs(v) < 10**24:
            return str(v)
        digits = int(v.bit_length() * 0.30103) + 1  # (at most one over: 10^(n-1) <= |v| < 10^n)
        return f"an integer of {digits - (10 ** (digits - 1) > abs(v))} digits"
    if isinstance(v, (dict, list)):
        return "an object" if isinstance(v, dict) else "a list"
    kinds = {type(None): "", bool: " (a boolean)", float: " (written as a float)", str: " (a string)"}
    text = json.dumps(v) if type(v) in kinds else repr(v)
    return f"{text[:24]}{'...' if len(text) > 24 else ''}{kinds.get(type(v), f' (a {type(v).__name__})')}"


def validate_config(arch: str, config) -> dict:
    """Bounds-check a manifest's architecture config; raises ValueError. Returns the kwargs for the class."""
    if arch not in ARCHS:
        raise ValueError(f"architecture {arch!r} is not on the allow-list {sorted(ARCHS)}")
    if not isinstance(config, dict):
        raise ValueError("config must be an object")
    L = LIMITS
    if arch == "mlp":
        kw = {"sizes": _ints(config, "sizes", 2, L["layers"] + 1, 1, L["width"])}
    elif arch == "cnn":
        kw = {
            "in_channels": _int(config, "in_channels", 1, 16),
            "image": _int(config, "image", 4, L["image"]),
            "channels": _ints(config, "channels", 1, 4, 1, L["channels"]),
            "classes": _int(config, "classes", 2, L["classes"]),
        }
    else:
        kw = {
            "vocab": _int(config, "vocab", 2, L["vocab"]),
            "block": _int(config, "block", 1, L["block"]),
            "n_layer": _int(config, "n_layer", 1, L["layers"]),
            "n_head": _int(config, "n_head", 1, 64),
            "n_embd": _int(config, "n_embd", 1, L["width"] // 4),
        }
        if kw["n_embd"] % kw["n_head"]:
            raise ValueError("config.n_embd must be a multiple of config.n_head")
    if set(config) != set(kw):
        raise ValueError(f"config has unknown or missing keys: {sorted(set(config) ^ set(kw))}")
    return kw


def param_shapes(arch: str, config: dict) -> dict[str, tuple[int, ...]]:
    """Parameter names (state_dict order) and shapes, built on the meta device: nothing allocated."""
    kw = validate_config(arch, config)
    with torch.device("meta"):
        model = ARCHS[arch](**kw)
    return {k: tuple(p.shape) for k, p in model.named_parameters()}


def param_count(arch: str, config: dict) -> int:
    return sum(math.prod(s) for s in param_shapes(arch, config).values())


def build(arch: str, config: dict) -> nn.Module:
    """The module, on the meta device: its parameters are placeholders that training replaces via
    functional_call with the state's tensors (which decide the device)."""
    param_shapes(arch, config)
    with torch.device("meta"):
        model = ARCHS[arch](**validate_config(arch, config))
    model.arch, model.config = arch, dict(config)  # what sizes a step of it (graphs.worth_a_graph)
    return model


def batch_spec(arch: str, config: dict, batch: int, seq: int | None = None) -> dict:
    """Expected dtypes and shapes of one step's batch {x, y}."""
    if arch == "mlp":
        return {"x": ("float32", [batch, config["sizes"][0]]), "y": ("int64", [batch])}
    if arch == "cnn":
        c, s = config["in_channels"], config["image"]
        return {"x": ("float32", [batch, c, s, s]), "y": ("int64", [batch])}
    t = seq or config["block"]
    return {"x": ("int64", [batch, t]), "y": ("int64", [batch, t])}


def init_params(arch: str, config: dict, seed: int) -> dict[str, torch.Tensor]:
    """Seed-derived initial weights, the same bits on every machine.

    One CPU torch.Generator seeded with `seed` draws float64 uniforms (53 random bits each, exact)
    in state_dict order; scaling uses only IEEE ops and Python's correctly rounded sqrt, then one
    rounding to float32. Weights: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (PyTorch's default bound);
    embeddings: uniform with std 0.02; biases 0; LayerNorm weights 1. (No normal draws: torch's
    normal sampler depends on the CPU kernel path.)
    """
    gen = torch.Generator(device="cpu").manual_seed(seed)
    out = {}
    for name, shape in param_shapes(arch, config).items():
        if name.endswith(".bias"):
            t = torch.zeros(shape, dtype=torch.float64)
        elif ".ln_" in f".{name}":  # LayerNorm weights: h.<i>.ln_1, h.<i>.ln_2, ln_f
            t = torch.ones(shape, dtype=torch.float64)
        else:
            bound = (
                0.02 * math.sqrt(3.0) if name in ("wte.weight", "wpe.weight") else 1.0 / math.sqrt(math.prod(shape[1:]))
            )
            t = (torch.rand(shape, dtype=torch.float64, generator=gen) * 2.0 - 1.0) * bound
        out[name] = t.float()
    return out


def forward_flops(arch: str, config: dict, spec: dict) -> int:
    """Multiply-add FLOPs (2 per MAC) of one forward pass over a batch of the given spec.

    Counted from the architecture and batch shapes alone: matmuls, convolutions and attention
    score/value products; elementwise work is not counted (the usual convention).
    """
    x_shape = spec["x"][1]
    b = x_shape[0]
    if arch == "mlp":
        s = config["sizes"]
        return sum(2 * b * i * o for i, o in zip(s[:-1], s[1:]))
    if arch == "cnn":
        side, flops, chans = config["image"], 0, [config["in_channels"], *config["channels"]]
        for i, (ci, co) in enumerate(zip(chans[:-1], chans[1:])):
            side = (side + 2 - 3) // (1 if i == 0 else 2) + 1
            flops += 2 * b * side * side * co * ci * 9
        return flops + 2 * b * chans[-1] * side * side * config["classes"]
    t, c, v, n = x_shape[1], config["n_embd"], config["vocab"], config["n_layer"]
    per_layer = 2 * b * t * c * (3 * c + c + 4 * c + 4 * c) + 2 * 2 * b * t * t * c
    return n * per_layer + 2 * b * t * c * v


def training_flops(arch: str, config: dict, spec: dict) -> int:
    """One training step: forward + backward = 3 x forward (backward computes two products per forward one)."""
    return 3 * forward_flops(arch, config, spec)
