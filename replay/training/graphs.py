"""CUDA graphs for det64 steps: a step's thousands of small kernels launched as one.

Why. On a GPU a det64 step waits on nothing (no host synchronisation inside a step, every shape
fixed by the model and the batch), but it is launch-bound: a step of the 15M GPT issues ~32,000
ATen ops at ~7.6 us of host time each, for far less GPU work (bench/RESULTS.md). So the forward and
backward, every rounding point included, are captured once as a CUDA graph and replayed each step:
the same kernels on the same inputs, hence the same bits (tests/replay/training/test_cuda_graphs.py
compares every step's state and log with the eager path's on a GPU).

Recording: each rounding point's candidates in fixed slots (the deferred Rounder). Replay: each
point's log entries in fixed slots (static_log.py: the step's log is copied into the graph's table
before it runs). Not captured: the update (its learning rate and bias corrections change per step
and would be baked into the graph as kernel arguments), the decisions and the one copy to the host
(`Rounder._flush`, `Rounder._settle`), the loss read.

A graph writes into the memory it was captured with: its own pool, the layout it holds, and the
thread-local scratch buffers of determinism.py, which are never freed on a GPU once outgrown
(`_scratch`: kept alive, grown geometrically). Only where nothing else depends on the step's Python
side: no trace (dispute bisection), no perturbation (tests). Anything that fails to capture falls back to the eager path for that shape,
with a warning, once. REPLAY_CUDA_GRAPHS=0 turns graphs off (the eager path is the reference: the
bench compares both).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch.func import functional_call

from replay.training import architectures as models
from replay.training import static_log
from replay.training.determinism import Rounder, converted, rounding

KEEP = 2  # captured steps kept per process (each holds its step's activations in its own memory pool)
# A step of more FLOPs is GPU work, not launches: a graph gains it nothing (GPT-2 small, block 512, batch 8,
# 3.3e12 FLOPs: 515 ms a step graphed or eager on an H200) and its private pool holds well over the eager
# step's peak (37 GB against 15), so such steps run eagerly (bench/RESULTS.md, session 13)
GRAPH_MAX_FLOPS = 1e12


@dataclass
class Captured:
    """One captured forward and backward: its static inputs, outputs and the Rounder's view of it."""

    model: object
    graph: torch.cuda.CUDAGraph
    params32: dict  # static float32 inputs, copied in before each replay
    x: torch.Tensor
    y: torch.Tensor
    loss: torch.Tensor
    params64: dict  # the float64 parameters the update reads
    grads: list
    names: list  # the rounding ops' names, in forward call order
    held: dict  # the Rounder's per-step device state, refilled by each replay: {attribute: list}
    layout: object  # a replay's static_log.Layout, whose table the graph reads (held: its id keys the graph)


# what a captured step leaves in its Rounder for the eager rest of the step (the flush, the settle)
HELD = {"record": ("_pending",), "replay": ("_ratios", "_bad")}

_CAPTURED: OrderedDict = OrderedDict()
_FAILED: set = set()


def enabled(device: torch.device) -> bool:
    return device.type == "cuda" and os.environ.get("REPLAY_CUDA_GRAPHS", "1") != "0"


def eligible(rounder: Rounder | None, device: torch.device) -> bool:
    """A recording on the deferred path, or a replay whose log is laid out in fixed slots (static_log),
    with nothing traced or bent, on a GPU."""
    if rounder is None or rounder.trace is not None or rounder.perturb is not None or not enabled(device):
        return False
    if rounder.mode == "record":
        return rounder.defer and not rounder._pending and not rounder._entries
    return rounder.mode == "replay" and rounder.static is not None and not rounder._bad and not rounder._ratios


def worth_a_graph(model, x: torch.Tensor) -> bool:
    """Whether a step of this model on batch x is small enough for launches to matter (GRAPH_MAX_FLOPS);
    a model not built by architectures.build (no size known) is given its graph."""
    arch, config = getattr(model, "arch", None), getattr(model, "config", None)
    if arch is None or config is None:
        return True
    return models.training_flops(arch, config, {"x": (str(x.dtype), list(x.shape))}) <= GRAPH_MAX_FLOPS


def _key(model, params32: dict, x: torch.Tensor, y: torch.Tensor, ops, rounder: Rounder) -> tuple:
    how = frozenset(rounder.dense) if rounder.mode == "record" else id(rounder.static)
    return (id(model), rounder.mode, how, *static_log.shape_key(params32, x, y, ops.dtype))


def eager_forward_backward(model, params32: dict, x, y, ops, rounder: Rounder | None):
    """A step's forward and backward from its float32 parameters: (loss, parameters in the compute
    dtype, gradients), detached. What a graph captures, and what train_step runs where there is none."""
    if x.is_floating_point():
        x = x.to(ops.dtype)
    params = {k: converted(v, ops.dtype).requires_grad_() for k, v in params32.items()}
    with rounding(rounder) if rounder is not None else contextlib.nullcontext():
        loss = functional_call(model, params, (x, y, ops))
        grads = torch.autograd.grad(loss, list(params.values()))
    return loss.detach(), {k: p.detach() for k, p in params.items()}, [g.detach() for g in grads]


def _like(rounder: Rounder) -> Rounder:
    """A rounder for the warm-up and the capture, doing what `rounder` would."""
    if rounder.mode == "record":
        return Rounder("record", dense=set(rounder.dense))
    twin = Rounder("replay", entries=rounder.replay_log())  # the static table is what the twin reads
    twin.static = rounder.static
    return twin


def _capture(model, params32: dict, x, y, ops, rounder: Rounder) -> Captured:
    static_p = {k: v.clone() for k, v in params32.items()}
    static_x, static_y = x.clone(), y.clone()
    stream = torch.cuda.Stream(device=x.device)
    stream.wait_stream(torch.cuda.current_stream(x.device))
    with torch.cuda.stream(stream):  # warm-up on the capturing stream: lazy handles, workspaces, caches
        eager_forward_backward(model, static_p, static_x, static_y, ops, _like(rounder))
    torch.cuda.current_stream(x.device).wait_stream(stream)
    graph, twin = torch.cuda.CUDAGraph(), _like(rounder)
    with torch.cuda.graph(graph, stream=stream):
        loss, params64, grads = eager_forward_backward(model, static_p, static_x, static_y, ops, twin)
    if twin.mode == "record" and (twin._entries or not twin.defer):
        raise RuntimeError("a rounding point logged on the host while being captured")
    held = {name: getattr(twin, name) for name in HELD[twin.mode]}
    return Captured(model, graph, static_p, static_x, static_y, loss, params64, grads, twin.names, held, twin.static)


def forward_backward(model, params32: dict, x, y, ops, rounder: Rounder):
    """(loss, float64 parameters, gradients) of a det64 step from a CUDA graph, with the rounder left
    as the eager forward and backward would leave it; None where graphs do not apply (the caller
    runs the eager path)."""
    if not eligible(rounder, x.device) or not worth_a_graph(model, x):
        return None
    key = _key(model, params32, x, y, ops, rounder)
    if key in _FAILED:
        return None
    captured = _CAPTURED.get(key)
    if captured is None or captured.model is not model or captured.layout is not rounder.static:
        try:
            captured = _capture(model, params32, x, y, ops, rounder)
        except Exception as exc:  # any capture failure: the eager path is always right
            _FAILED.add(key)
            warnings.warn(f"CUDA graph capture failed, running eagerly: {exc!r}", stacklevel=2)
            return None
        for old in [k for k in _CAPTURED if k[:2] == key[:2]]:  # the model's earlier capture in this mode
            del _CAPTURED[old]
        _CAPTURED[key] = captured
        while len(_CAPTURED) > KEEP:
            _CAPTURED.popitem(last=False)
    _CAPTURED.move_to_end(key)
    for k, v in params32.items():
        captured.params32[k].copy_(v)
    captured.x.copy_(x)
    captured.y.copy_(y)
    captured.graph.replay()
    rounder.names = list(captured.names)
    for name, value in captured.held.items():
        setattr(rounder, name, list(value))
    return captured.loss, dict(captured.params64), list(captured.grads)


def release() -> None:
    """Forget every captured step (and its memory pool)."""
    _CAPTURED.clear()
    _FAILED.clear()
