"""One training step, the same code for the prover (recording) and the verifier (replaying).

State is float32 throughout: parameters and optimizer buffers, as stored in checkpoints. A step
loads them into the compute dtype (float64 in det64, exactly), runs forward and backward through
the model's ops, then updates with the optimizer below and rounds the new state to float32. The
update is elementwise IEEE arithmetic on identical inputs (each op its own kernel, no fused
addcmul/lerp, no division by a Python scalar), so its rounding needs no log; in det64 those
roundings are traced like every other for dispute bisection. On CPU the det64 update runs as one
native loop (native.py) doing the same operations in the same order, one IEEE rounding each (no
fused multiply-add), from the float32 state: the same bits, without float64 copies of the state.

Optimizers: SGD with momentum (and L2 weight decay) and AdamW (decoupled weight decay). Learning-rate
schedules use only + - * / on Python floats, so lr(t) is the same double everywhere: constant,
linear (warmup then linear decay) and step (multiply by gamma every k steps, by square-and-multiply,
not libm's pow).
"""

from __future__ import annotations

import contextlib
import gc
import threading
import weakref
from dataclasses import dataclass

import torch

from replay.training import graphs, native, static_log, step_allocator
from replay.training.determinism import SLOTS, LogOverflow, Rounder, StaticRedo, converted, sqrt_, sqrt_each_
from replay.training.ops import OPS

OPTIMIZERS = {"sgd": ("momentum",), "adamw": ("m", "v")}


@dataclass
class State:
    """Training state after `step` steps: float32 parameters (state_dict order) and optimizer buffers."""

    step: int
    params: dict[str, torch.Tensor]
    buffers: dict[str, dict[str, torch.Tensor]]

    def tensors(self) -> dict[str, torch.Tensor]:
        """Flat {key: tensor} as stored in a checkpoint: 'param:<name>', '<buffer>:<name>'."""
        out = {f"param:{k}": v for k, v in self.params.items()}
        for buf, d in self.buffers.items():
            out.update({f"{buf}:{k}": v for k, v in d.items()})
        return out

    @staticmethod
    def from_tensors(step: int, tensors: dict[str, torch.Tensor], names: list[str], buffers) -> State:
        return State(
            step,
            {k: tensors[f"param:{k}"] for k in names},
            {b: {k: tensors[f"{b}:{k}"] for k in names} for b in buffers},
        )

    def equal(self, other: State) -> bool:
        a, b = self.tensors(), other.tensors()
        return a.keys() == b.keys() and all(torch.equal(a[k].cpu(), b[k].cpu()) for k in a)

    def to(self, device) -> State:
        return State(
            self.step,
            {k: v.to(device) for k, v in self.params.items()},
            {b: {k: v.to(device) for k, v in d.items()} for b, d in self.buffers.items()},
        )


def initial_state(params: dict[str, torch.Tensor], optimizer: dict) -> State:
    return State(
        0, dict(params), {b: {k: torch.zeros_like(v) for k, v in params.items()} for b in OPTIMIZERS[optimizer["kind"]]}
    )


def ipow(x: float, n: int) -> float:
    """x**n by square-and-multiply: a fixed sequence of IEEE multiplications, unlike libm's pow."""
    out = 1.0
    while n:
        if n & 1:
            out *= x
        x *= x
        n >>= 1
    return out


def lr_at(schedule: dict, t: int) -> float:
    """Learning rate of step t (0-based) under a committed schedule."""
    kind, lr = schedule["kind"], schedule["lr"]
    if kind == "constant":
        return lr
    if kind == "step":
        return lr * ipow(schedule["gamma"], t // schedule["every"])
    warmup, total, final = schedule["warmup"], schedule["total"], schedule["final"]
    if t < warmup:
        return lr * (t + 1) / warmup
    if t >= total:
        return final
    return lr + (final - lr) * (t - warmup) / max(1, total - warmup)


def _sgd(hp: dict, lr: float, p, g, bufs: dict, to32, own: bool = False):
    """own: `bufs` are this step's own copies (float64 of the float32 state), reused in place: the same
    operations in the same order (an in-place op is the same kernel), fewer conversions and allocations."""
    if hp.get("weight_decay", 0.0):
        g = g + p * hp["weight_decay"]
    b = bufs["momentum"]
    mom = to32("momentum", b.mul_(hp["momentum"]).add_(g) if own else b * hp["momentum"] + g)
    step = b.copy_(mom).mul_(lr) if own else converted(mom, p.dtype) * lr
    return to32("param", p - step), {"momentum": mom}


def _adamw(hp: dict, lr: float, t: int, p, g, bufs: dict, to32, own: bool = False, root_=sqrt_):
    """own: as in `_sgd`. root_: the in-place square root, correctly rounded (`sqrt_`: the reference the
    kernels are held to); the plain precisions' baselines take torch's own (`torch.sqrt_`), as plain training does."""
    b1, b2 = hp["betas"]
    m = to32("m", bufs["m"].mul_(b1).add_(g * (1.0 - b1)) if own else bufs["m"] * b1 + g * (1.0 - b1))
    v = to32("v", bufs["v"].mul_(b2).add_((g * g) * (1.0 - b2)) if own else bufs["v"] * b2 + (g * g) * (1.0 - b2))
    c1, c2 = 1.0 / (1.0 - ipow(b1, t + 1)), 1.0 / (1.0 - ipow(b2, t + 1))
    if own:
        mhat, vhat = bufs["m"].copy_(m).mul_(c1), bufs["v"].copy_(v).mul_(c2)
        upd = mhat.div_(root_(vhat).add_(hp["eps"]))
        upd = upd.add_(p * hp.get("weight_decay", 0.0)).mul_(lr)
    else:
        mhat, vhat = converted(m, p.dtype) * c1, converted(v, p.dtype) * c2
        upd = mhat / (root_(vhat) + hp["eps"])
        upd = (upd + p * hp.get("weight_decay", 0.0)) * lr
    return to32("param", p - upd), {"m": m, "v": v}


def _fused_group(kind: str, hp: dict, lr: float, t: int, p32: list, g: list, bufs32: dict):
    """`_sgd` or `_adamw` over a group of parameters in one native pass from the float32 state (the same
    operations, the same bits; one call, where a call per parameter was most of a small model's update),
    where `native.takes_updates` holds for them (checked: not again)."""
    if kind == "sgd":
        wd = hp.get("weight_decay", 0.0)
        out = native.sgd_group(p32, g, bufs32["momentum"], hp["momentum"], wd, lr, checked=True)
        return out[0], {"momentum": out[1]}
    b1, b2 = hp["betas"]
    c1, c2 = 1.0 / (1.0 - ipow(b1, t + 1)), 1.0 / (1.0 - ipow(b2, t + 1))
    out = native.adamw_group(
        p32, g, bufs32["m"], bufs32["v"], b1, b2, c1, c2, hp["eps"], hp.get("weight_decay", 0.0), lr, checked=True
    )
    return out[0], {"m": out[1], "v": out[2]}


GROUP_BYTES = 64 << 20  # float64 bytes of parameters one multi-tensor update takes at once


def _groups(names: list, params: dict) -> list:
    """The parameters in runs of at most GROUP_BYTES (float64), in order: a step's extra memory for its
    update is a group's temporaries, not every parameter's at once."""
    groups, run, size = [], [], 0
    for name in names:
        n = params[name].numel() * 8
        if run and size + n > GROUP_BYTES:
            groups.append(run)
            run, size = [], 0
        run.append(name)
        size += n
    return [*groups, run] if run else groups


def _widened(tensors: list) -> list:
    """float64 copies of float32 tensors (exact), in one multi-tensor copy where the device has one."""
    out = [torch.empty(t.shape, dtype=torch.float64, device=t.device) for t in tensors]
    torch._foreach_copy_(out, tensors)
    return out


def _narrowed(tensors: list) -> list:
    """float32 of float64 tensors (round to nearest even, as `converted`)."""
    out = [torch.empty(t.shape, dtype=torch.float32, device=t.device) for t in tensors]
    torch._foreach_copy_(out, tensors)
    return out


def _sgd_foreach(hp: dict, lr: float, p: list, g: list, bufs32: dict) -> tuple:
    """`_sgd` (own) over a group of parameters, each operation one multi-tensor kernel for the group
    (a GPU launches ~5 per step's group, not ~8 per parameter): the same operations in the same
    order, one IEEE rounding each, hence the same bits. Returns (params, {buffer: list}) float32."""
    if hp.get("weight_decay", 0.0):
        g = torch._foreach_add(g, torch._foreach_mul(p, hp["weight_decay"]))
    b = _widened(bufs32["momentum"])
    torch._foreach_mul_(b, hp["momentum"])
    torch._foreach_add_(b, g)
    mom = _narrowed(b)
    torch._foreach_copy_(b, mom)
    torch._foreach_mul_(b, lr)
    return _narrowed(torch._foreach_sub(p, b)), {"momentum": mom}


def _adamw_foreach(hp: dict, lr: float, t: int, p: list, g: list, bufs32: dict) -> tuple:
    """`_adamw` (own) over a group of parameters, as `_sgd_foreach`."""
    b1, b2 = hp["betas"]
    m, v = _widened(bufs32["m"]), _widened(bufs32["v"])
    torch._foreach_mul_(m, b1)
    torch._foreach_add_(m, torch._foreach_mul(g, 1.0 - b1))
    m32 = _narrowed(m)
    gg = torch._foreach_mul(g, g)
    torch._foreach_mul_(gg, 1.0 - b2)
    torch._foreach_mul_(v, b2)
    torch._foreach_add_(v, gg)
    v32 = _narrowed(v)
    del gg
    c1, c2 = 1.0 / (1.0 - ipow(b1, t + 1)), 1.0 / (1.0 - ipow(b2, t + 1))
    torch._foreach_copy_(m, m32)
    torch._foreach_mul_(m, c1)
    torch._foreach_copy_(v, v32)
    torch._foreach_mul_(v, c2)
    sqrt_each_(v)
    torch._foreach_add_(v, hp["eps"])
    torch._foreach_div_(m, v)
    torch._foreach_add_(m, torch._foreach_mul(p, hp.get("weight_decay", 0.0)))
    torch._foreach_mul_(m, lr)
    return _narrowed(torch._foreach_sub(p, m)), {"m": m32, "v": v32}


_HEAP = threading.Lock()  # frozen_heap's count of loops inside it (threads, nesting), and whether it froze
_HEAP_LOOPS, _HEAP_OURS = 0, False


@contextlib.contextmanager
def frozen_heap():
    """A loop of training steps with what was alive at its start (torch's modules and the process's own: some
    170K objects) out of the cyclic collector's passes, given back after. A det64 step makes more short-lived
    Python objects than torch's own (autograd Functions, rounding points' lists of close calls), enough that
    every few hundred steps the collector's full pass walked all of them: 80-110 ms, 0.3 ms a step on
    average, 4-7% of a small model's det64 step (float64's steps never started one). The first loop in
    freezes, the last out gives back (nested, or on threads); a process that froze its heap already (a
    Celery worker, once ready) is left as it is: unfreezing would give its start-up back. The last out also
    gives the step allocator's free blocks back to the system (`step_allocator.release`): a run's large
    temporaries, kept mapped from step to step, are not the process's to hold after it."""
    global _HEAP_LOOPS, _HEAP_OURS
    with _HEAP:
        _HEAP_LOOPS += 1
        if _HEAP_LOOPS == 1:
            _HEAP_OURS = not gc.get_freeze_count()
            if _HEAP_OURS:
                gc.freeze()
    try:
        yield
    finally:
        with _HEAP:
            _HEAP_LOOPS -= 1
            if not _HEAP_LOOPS:
                if _HEAP_OURS:
                    gc.unfreeze()
                step_allocator.release()


DENSE_RETRIES = 2  # steps redone with more points dense before the reference path
_DENSE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> keys of its dense points


def train_step(model, state: State, batch: dict, optimizer: dict, precision: str, rounder: Rounder | None = None):
    """state after step t -> (state after step t+1, loss as a float). det64 needs a Rounder.

    A recording step whose device-side candidate slots overflowed (LogOverflow) is run again with
    those rounding points dense (every output handed to the flush with its exact bound), which the
    model's later steps keep (an honest crowded point stays crowded: GPT-2's head); after that, on
    the reference path. The rounded values, hence the state, are the same on every path."""
    if rounder is not None and rounder.mode == "record" and rounder.defer:
        rounder.dense = _DENSE.setdefault(model, set())
    for attempt in range(DENSE_RETRIES + 1):
        try:
            return _train_step(model, state, batch, optimizer, precision, rounder)
        except StaticRedo:
            rounder.redo_deferred()
            return _train_step(model, state, batch, optimizer, precision, rounder)
        except torch.OutOfMemoryError:
            if rounder is None or rounder.static is None:
                raise
            # a static replay forms every point's bound each step (the deferred one only where entries
            # are): out of memory, this model replays the deferred way from now on
            static_log.give_up(model)
            graphs.release()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            rounder.redo_deferred()
            return _train_step(model, state, batch, optimizer, precision, rounder)
        except LogOverflow as exc:
            if attempt == DENSE_RETRIES or exc.keys <= rounder.dense:
                break
            rounder.dense.update(exc.keys)
            rounder.reset(defer=True)
    rounder.reset(defer=False)
    return _train_step(model, state, batch, optimizer, precision, rounder)


def _train_step(model, state: State, batch: dict, optimizer: dict, precision: str, rounder: Rounder | None):
    ops = OPS[precision]
    dt, device = ops.dtype, state.params[next(iter(state.params))].device
    t = state.step
    x, y = batch["x"].to(device), batch["y"].to(device)
    captured = None
    if precision == "det64":
        native.tune_allocator()
        static_log.prepare(model, rounder, state.params, x, y, dt)
        captured = graphs.forward_backward(model, state.params, x, y, ops, rounder)
    loss, params, grads = captured or graphs.eager_forward_backward(
        model, state.params, x, y, ops, rounder if precision == "det64" else None
    )

    # The graph (whose leaves are the float64 parameters) goes with the loss's grad_fn; the float64 copies
    # and gradients go as soon as their update is done (det64: a group's, at most GROUP_BYTES; the plain
    # precisions: each parameter's): the new state then takes their place instead of adding to them (a
    # step's peak is its state, not three states, at GPT-2 size).
    loss, grads = loss.detach(), list(grads)
    kind, lr = optimizer["kind"], lr_at(optimizer["lr"], t)
    new_p, new_b = {}, {b: {} for b in state.buffers}
    with torch.no_grad():
        names = list(params)
        if precision == "det64":  # a group of parameters at a time (`_update_groups`)
            _update_groups(kind, optimizer, lr, t, names, params, grads, state, new_p, new_b, rounder)
        else:
            _update_each(kind, optimizer, lr, t, names, params, grads, state, new_p, new_b, dt, rounder)
    if rounder is not None:
        rounder.finish()
        static_log.learnt(model, rounder)
    return State(t + 1, new_p, new_b), float(loss.detach())


def _update_each(kind, hp, lr, t, names, params, grads, state, new_p, new_b, dt, rounder) -> None:
    """The plain precisions' update, a parameter at a time; each float64 copy and gradient goes with its update."""
    for i, name in enumerate(names):
        p, g = params.pop(name), grads[i]
        grads[i] = None
        note = _noter(rounder, name)
        bufs32 = {b: state.buffers[b][name] for b in state.buffers}
        to32 = lambda what, v, note=note: note(what, converted(v, torch.float32))
        bufs = {b: converted(v, dt) for b, v in bufs32.items()}
        own = all(bufs[b] is not bufs32[b] for b in bufs)  # fresh copies, not the state itself
        if kind == "sgd":
            new_p[name], nb = _sgd(hp, lr, p.detach(), g, bufs, to32, own)
        else:
            new_p[name], nb = _adamw(hp, lr, t, p.detach(), g, bufs, to32, own, torch.sqrt_)
        for b, v in nb.items():
            new_b[b][name] = v


def _noter(rounder: Rounder | None, name: str):
    """An update's roundings to float32 (exact arithmetic on identical inputs, never logged), traced where the
    rounder traces: each an op of its own then, after the step's rounding points (no key of theirs moves)."""
    if rounder is None or rounder.trace is None:
        return _unnoted

    def note(what: str, r: torch.Tensor) -> torch.Tensor:
        key = rounder.op(f"update.{what}:{name}") * SLOTS
        rounder.trace.append((key, rounder.name(key), r.clone()))
        return r

    return note


def _unnoted(what: str, r: torch.Tensor) -> torch.Tensor:
    return r


def _update_groups(kind, hp, lr, t, names, params, grads, state, new_p, new_b, rounder) -> None:
    """The update of every parameter, a group at a time (`_groups`); each parameter's float64 copy and
    gradient go with its group. Traced per parameter in the order the per-parameter loop traces."""
    order = {name: i for i, name in enumerate(names)}
    for group in _groups(names, params):
        p = [params.pop(name) for name in group]
        g = [grads[order[name]] for name in group]
        for name in group:
            grads[order[name]] = None
        bufs32 = {b: [state.buffers[b][name] for name in group] for b in state.buffers}
        p32 = [state.params[name] for name in group]
        on_cpu = bool(p32) and p32[0].is_cpu  # (a GPU does not build the CPU's kernel for nothing)
        if on_cpu and native.takes_updates(g, p32, *bufs32.values()):
            del p  # the kernel reads the float32 state: the float64 copies go before the new state comes
            ps, bufs = _fused_group(kind, hp, lr, t, p32, g, bufs32)
        elif kind == "sgd":
            ps, bufs = _sgd_foreach(hp, lr, p, g, bufs32)
        else:
            ps, bufs = _adamw_foreach(hp, lr, t, p, g, bufs32)
        del g
        if rounder is None or rounder.trace is None:  # nothing to note: a loop of assignments
            for i, name in enumerate(group):
                new_p[name] = ps[i]
                for b in OPTIMIZERS[kind]:
                    new_b[b][name] = bufs[b][i]
            continue
        for i, name in enumerate(group):
            note = _noter(rounder, name)
            for b in OPTIMIZERS[kind]:
                new_b[b][name] = note(b, bufs[b][i])
            new_p[name] = note("param", ps[i])
