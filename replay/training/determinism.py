"""Deterministic mode: compute in float64, round to float32 at fixed points, log the close calls.

The enemy. A float32 matmul on this CPU gives different bits in ~91% of its elements with 1 thread
versus 2, and MKL's AVX2 path, ATen's scalar (DEFAULT) path and a GPU each bring their own orders
of summation and their own exp/log. Computing in float64 and rounding to float32 removes almost
all of it: float64 carries 29 more mantissa bits, so two machines that disagree in float64 only by
their rounding errors round to the same float32 -- except for values that sit within that
disagreement of a float32 rounding midpoint (~7e-8 of matmul outputs here). Those are the cases
this module makes exact: the prover logs how each of them rounded and the verifier applies it.

The argument, one rounding point at a time. Every value that may differ between machines is
produced by an op whose inputs are bit-identical on both machines (float32 values rounded at an
earlier point, or IEEE functions of them) and is rounded to float32 at once. Given identical
inputs only two kinds of op may differ:

* reductions (sums, dot products, matmul, conv, mean): any summation order, blocking, splitting
  across threads or FMA use satisfies |fl(sum x_i y_i) - sum x_i y_i| <= gamma(K) sum |x_i y_i|,
  gamma(K) = K u / (1 - K u), u = 2^-53 (Higham, Accuracy and Stability of Numerical Algorithms,
  eq. 3.5). Relative to the result that is ~K^1.5 u for random data (5e-14 at K = 64, 2e-11 at
  K = 4096) against a float32 half-ulp of ~6e-8 -- but it is an absolute bound, so it stays
  right under cancellation, where the result is tiny and every machine's low bits are noise.
* transcendental functions (exp, log): within 2 ulps (4u relative) in every libm, SLEEF, MKL VML
  and CUDA implementation (they promise <= 1 ulp), EXP_ERR below.

Everything else is a single IEEE-754 operation per kernel (+, -, *, /, sqrt, max, comparisons,
copies) and gives the same bits everywhere. Three rules keep it so: never a fused multi-op kernel
(addcmul, lerp, rsqrt, alpha != 1), never division by a Python scalar (CUDA multiplies by the
reciprocal; we multiply by a Python-computed reciprocal ourselves), and every square root through
`sqrt_`: torch's CPU kernel is not IEEE's (2.13 misses the correctly rounded root by an ulp in ~0.7%
of float64 values, on every ATen capability), a GPU's and NumPy's are.

So each rounding point carries a bound err (per element) on one machine's error; two conforming
machines differ by at most 2 err. The prover flags an element when the window v +- SAFETY * err
(SAFETY = 4: 2 for the two machines, 2 for slack in computing err and the 1 / (1 - K u) factor)
contains a float32 rounding midpoint, i.e. when float32(v - w) != float32(v + w). An element not
flagged rounds the same way on every conforming machine: guaranteed, no log needed. For a flagged
element the log records the prover's float32 result compactly: normally one bit, the parity of
its position on the float32 number line (`ordinal`), which the verifier resolves inside its own
window v' +- DECODE * err (DECODE = 4 >= 2, so the prover's value is inside); if the prover's
wider window v +- 8 err (>= DECODE + 2) holds more than two float32 values -- a bound as large as
a float32 ulp, which happens under heavy cancellation -- the entry carries all 32 bits instead.

The verifier only applies the log; it never needs to find the close calls itself. It refuses an
entry whose value is not inside its own window: a prover may choose only among roundings that a
conforming machine could have produced, never move a value by more. And it refuses an entry whose
window is not close: DECODE * err must be at most REL_WINDOW = 2^-12 of the largest |value| at that
rounding point, so a logged choice moves a value by less than 2^-12 of the tensor's own scale.
Honest windows are ~K u (sum|terms| / max|v|): ~1e-13 to 7e-11 over the bundled architectures and
schedules, and up to 5e-6 where honest cancellation is heavy (AdamW after the rate jumps 1e5-fold,
tests/replay/protocol/test_trajectory.py); 2^-12 keeps a 50x margin over that. The steering construction,
terms near 2^64 cancelling to exact zeros, needs windows of ~1e5 around outputs of 0 (ratio ~1e305
or infinite), and the data commitment's range cap refuses its inputs first.
So the log cannot steer training. (Near zero: +0 and -0 are neighbours on the number line, so a sign-of-zero coin toss
is a close call like any other.)

Log format (one step, bytes): version byte, varint number of rounding points with entries, then
per point: varint key delta, varint count, per entry varint (index delta * 2 + wide) followed by 4
little-endian bytes of the float32 for a wide entry, then the parity bits of the narrow entries
(LSB first). Indices are flat and strictly increasing. A key is op_id * SLOTS + slot, op ids in
forward call order, so the backward pass's execution order does not matter. About 2-3 bytes per
entry.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import struct
import threading
import warnings
import weakref
from dataclasses import dataclass

import numpy as np
import torch

from replay.training import kernels, native

U = 2.0**-53  # unit roundoff of float64
EXP_ERR = 4 * U  # relative error bound of exp/log: 2 ulps
SAFETY = 4.0  # prover flags an element when v +- SAFETY * err holds a rounding midpoint
DECODE = 4.0  # verifier resolves a logged element inside v' +- DECODE * err
WIDE = 8.0  # prover writes all 32 bits when v +- WIDE * err holds more than two float32 values
SLOTS = 16  # rounding points per op (key = op_id * SLOTS + slot)
LOG_VERSION = 1
REL_WINDOW = 2.0**-12  # a logged entry's window (DECODE * err) relative to the point's max |value|
MAX_LOG_ENTRIES = 1 << 20  # per step; honest: ~6,000 at 0.3M parameters (see docs/replay-limits.md)


class LogMismatch(Exception):
    """The rounding log does not fit the computation being replayed (a replay failure, not malformed bytes)."""


def gamma(n: int) -> float:
    """Higham's gamma_n = n u / (1 - n u): the error factor of any n-term sum of products."""
    if n * U >= 0.5:
        raise ValueError(f"reduction of {n} terms is too long for the float64 error argument")
    return n * U / (1 - n * U)


# --------------------------------------------------------------------------- the float32 number line


def ordinal(r: torch.Tensor) -> torch.Tensor:
    """float32 -> int64 position on the number line: consecutive floats are consecutive integers, -0 just below +0."""
    b = r.view(torch.int32).long()
    return torch.where(b >= 0, b, -1 - (b & 0x7FFFFFFF))


def _ord32(b: int) -> int:
    """`ordinal` of one float32 given as its signed int32 bits (a Python int)."""
    return b if b >= 0 else -1 - (b & 0x7FFFFFFF)


_F32, _I32 = struct.Struct("<f"), struct.Struct("<i")


def _f32_bits(x: float) -> int:
    """Signed int32 bits of float32(x), rounded as torch's .float() is (IEEE round-to-nearest-even)."""
    try:
        return _I32.unpack(_F32.pack(x))[0]
    except OverflowError:  # struct refuses exactly where the conversion gives an infinity
        return 0x7F800000 if x > 0 else -0x800000


def from_ordinal(o: torch.Tensor) -> torch.Tensor:
    return torch.where(o >= 0, o, (-1 - o) - 2**31).int().view(torch.float32)


def straddles(v: torch.Tensor, w) -> torch.Tensor:
    """Does the window v +- w hold a float32 rounding midpoint, i.e. do its ends round differently?

    Rounding is monotone, so then and only then can two values inside the window round differently.
    Compared as bits, so -0 and +0 differ too. A zero-width window must never straddle, but -0 + 0
    is +0: zero widths become NaN, whose two ends are the same NaN (at worst an exact value gets a
    harmless log entry). Four elementwise kernels and a comparison over v.
    """
    if not isinstance(w, torch.Tensor):
        if w <= 0:
            return torch.zeros(v.shape, dtype=torch.bool, device=v.device)
    else:
        w = torch.where(w > 0.0, w, math.nan)  # on w's own (often per-row) shape
    return (v - w).float().view(torch.int32) != (v + w).float().view(torch.int32)


_SCRATCH = threading.local()
_RETIRED: list = []  # CUDA scratch stores outgrown since a graph may have captured them (`_scratch`)


def _arange(n: int, device) -> torch.Tensor:
    """0..n-1 as int64 on device, cached per thread (the slot indices of a small rounding point)."""
    cache = _SCRATCH.__dict__
    key = ("arange", torch.device(device), n)
    if key not in cache:
        cache[key] = torch.arange(n, device=device)
    return cache[key]


def _ones(n: int, device) -> torch.Tensor:
    """n ones as uint8 on device, cached per thread: every slot of a small rounding point is a candidate."""
    cache = _SCRATCH.__dict__
    key = ("ones", torch.device(device), n)
    if key not in cache:
        cache[key] = torch.ones(n, dtype=torch.uint8, device=device)
    return cache[key]


def _const(value: int, device) -> torch.Tensor:
    """value as a 0-d int64 tensor on device, cached per thread: torch.where with a Python int wraps and
    converts the scalar each call (five profiler events instead of two)."""
    cache = _SCRATCH.__dict__
    key = ("const", torch.device(device), value)
    if key not in cache:
        cache[key] = torch.tensor(value, device=device)
    return cache[key]


def _flat(t: torch.Tensor) -> torch.Tensor:
    """t.reshape(-1) in one ATen op where t is contiguous (reshape records two)."""
    return t.view(-1) if t.is_contiguous() else t.reshape(-1)


CAT_GRAIN = 32768  # ATen's CPU grain size: torch.cat's parallel path starts at this many elements


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    """torch.cat(parts), the same values. On a CPU with several threads a result of CAT_GRAIN elements
    or more takes ATen's parallel path, which records a narrow, a slice and an as_strided per input
    (a step's 86 points: ~800 ATen ops for _flush's four concatenations); here runs of small inputs
    are joined first on the serial path, one op a run, and the runs then."""
    if len(parts) == 1:
        return parts[0]
    if parts[0].device.type != "cpu" or torch.get_num_threads() == 1:
        return torch.cat(parts)
    runs, run, size = [], [], 0
    for t in parts:
        if run and size + t.numel() >= CAT_GRAIN:
            runs.append(torch.cat(run) if len(run) > 1 else run[0])
            run, size = [], 0
        run.append(t)
        size += t.numel()
    runs.append(torch.cat(run) if len(run) > 1 else run[0])
    return torch.cat(runs) if len(runs) > 1 else runs[0]


def sqrt_(t: torch.Tensor) -> torch.Tensor:
    """t.sqrt_(), correctly rounded on every device: IEEE-754's square root, the same bits everywhere. torch's
    CPU kernel is not (2.13's errs by an ulp in ~0.7% of float64 values, whatever ATEN_CPU_CAPABILITY), a
    GPU's is; NumPy's is the processor's own instruction (or libm's sqrt, correctly rounded too)."""
    if t.device.type != "cpu" or t.dtype not in (torch.float32, torch.float64):
        return t.sqrt_()
    if not t.numel():
        return t
    a = _host_array(t)
    with np.errstate(invalid="ignore"):  # a negative value gives NaN, as torch's does, without a warning
        np.sqrt(a, out=a)
    torch.autograd.graph.increment_version(t)  # changed in place: autograd and `Rounder.as_float32` see it
    return t


def _host_array(t: torch.Tensor) -> np.ndarray:
    """A NumPy view of a CPU tensor's elements: of its memory directly where it is contiguous (Tensor.numpy()
    is four ATen ops, which the generic path's op count, a GPU's launches, would carry per parameter)."""
    if not t.is_contiguous():
        return t.detach().numpy()
    element = ctypes.c_double if t.dtype == torch.float64 else ctypes.c_float
    return np.ctypeslib.as_array((element * t.numel()).from_address(t.data_ptr())).reshape(t.shape)


def sqrt_each_(tensors: list) -> None:
    """`sqrt_` of each tensor of a list (torch._foreach_sqrt_ where that is correctly rounded: a GPU)."""
    if tensors and tensors[0].device.type != "cpu":
        torch._foreach_sqrt_(tensors)
        return
    for t in tensors:
        sqrt_(t)


def max_of_numbers(t: torch.Tensor) -> torch.Tensor:
    """t's max over its values that are not NaN, +inf kept (0 where all are NaN), a 0-d tensor: a product's
    coarse window over its columns' norms. A NaN column's outputs are NaN, never close calls; through a plain
    max it made every row's window NaN and hid the other columns' close calls (the kernel's and the device
    path's windows are per column). An infinite norm stays infinite, as the kernel's window for that column:
    its infinite outputs are flagged by both. t holds magnitudes (>= 0)."""
    return t.nan_to_num(nan=0.0, posinf=math.inf).max()


def max_abs(v: torch.Tensor) -> torch.Tensor:
    """max |v| (NaN if any is NaN), a 0-d tensor: the same number as v.abs().max(), from two reductions
    instead of a temporary of v's size and a third pass (a replay takes it at every logged point)."""
    return torch.maximum(v.max(), v.min().neg())


def abs_sum(t: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
    """t.abs().sum(dim, keepdim) for dim 0 or -1, a bound's sum of magnitudes: in one native pass where
    the kernel takes t (its order of addition differs from torch's: within SAFETY's slack, as any
    machine's), else as written."""
    flat = t.reshape(-1, t.shape[-1]) if dim == -1 and t.dim() > 2 and t.is_contiguous() else t
    fast = native.abs_sums(flat, dim == 0) if dim in (0, -1) else None
    if fast is None:
        return t.abs().sum(dim, keepdim=keepdim)
    if dim == -1:
        fast = fast.view(t.shape[:-1])
    return fast.unsqueeze(dim) if keepdim else fast


def converted(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t.to(dtype) (the same copy_ kernel, hence the same bits: exact widening, round-to-nearest-even
    narrowing) as a fresh contiguous tensor; t itself when it has that dtype already. Two ATen ops
    instead of `to`'s four: the generic det64 path converts every parameter and optimizer buffer
    twice a step."""
    if t.dtype == dtype:
        return t
    return torch.empty(t.shape, dtype=dtype, device=t.device).copy_(t)


def _scratch(v: torch.Tensor):
    """Reusable buffers shaped like v, private to this thread: (float64, float32 lo, float32 hi,
    lo and hi viewed as int32), views into one growing storage per device, cached per shape.

    straddle_index runs over every rounding point's whole output; fresh temporaries of that size
    cost more (allocation, page faults, cache misses) than the arithmetic does. The views are
    valid until the next straddle_index call on this thread.
    """
    cache = _SCRATCH.__dict__
    key = (v.device, v.shape)
    views = cache.get(key)
    if views is None:
        n = v.numel()
        store = cache.get(v.device)
        if store is None or store[0].numel() < n:
            for k in [k for k in cache if isinstance(k, tuple) and k[0] == v.device]:
                del cache[k]
            cap = max(n, 1 << 16)
            if store is not None and v.device.type == "cuda":
                # a captured CUDA graph (graphs.py) writes into the store it was captured with: kept
                # alive, and grown geometrically so that few are
                _RETIRED.append(store)
                cap = max(cap, 2 * store[0].numel())
            store = cache[v.device] = (
                torch.empty(cap, dtype=torch.float64, device=v.device),
                torch.empty(cap, dtype=torch.float32, device=v.device),
                torch.empty(cap, dtype=torch.float32, device=v.device),
            )
        f64, lo, hi = (t[:n].view(v.shape) for t in store)
        views = cache[key] = (f64, lo, hi, lo.view(torch.int32), hi.view(torch.int32))
    return views


def straddle_index(v: torch.Tensor, coarse, scale: float) -> torch.Tensor:
    """Flat indices where `straddles(v, coarse * scale)`: the same set, in fewer and cheaper passes.

    The record hot path, one call per rounding point over its whole output, so it is written for
    memory traffic and dispatch: the two ends are formed and rounded exactly as in `straddles`
    (v - w and v + w in float64, each converted to float32), but into reused buffers; then the
    ends' bit patterns are compared with one `torch.equal` (no bool tensor, no scan for indices),
    which settles most rounding points; only when some end differs are the hits listed, from the
    int32 xor of the ends. An element whose width is not > 0 (zero, negative, NaN) never
    straddles in `straddles` (its window becomes NaN, whose two ends are the same NaN); for a
    width smaller than v (per row) that rewrite stays, cheap on the width's own shape; for a
    full-shape width such elements are dropped from the few hits instead (coarse > 0 exactly when
    coarse * scale > 0, scale >= 1).
    """
    full = isinstance(coarse, torch.Tensor) and coarse.shape == v.shape
    w = coarse * scale
    if not isinstance(w, torch.Tensor):
        if not w > 0:
            return torch.zeros(0, dtype=torch.long, device=v.device)
    elif not full:
        w = torch.where(w > 0, w, math.nan)
    if (
        v.dtype != torch.float64
        or v.requires_grad
        or (isinstance(w, torch.Tensor) and (w.dtype != torch.float64 or w.requires_grad))
    ):
        lo = (v - w).float().view(torch.int32)
        hi = (v + w).float().view(torch.int32)
    else:
        buf, lo32, hi32, lo, hi = _scratch(v)
        lo32.copy_(torch.sub(v, w, out=buf))
        hi32.copy_(torch.add(v, w, out=buf))
    if torch.equal(lo, hi):
        return torch.zeros(0, dtype=torch.long, device=v.device)
    idx = torch.bitwise_xor(lo, hi, out=lo).reshape(-1).nonzero().view(-1)
    if full:
        idx = idx[coarse.reshape(-1)[idx] > 0]
    return idx


def straddle_mask(v: torch.Tensor, w, positive: bool = True) -> torch.Tensor:
    """Bool mask, shaped like v, of the elements whose window v +- w, w > 0, holds a float32 rounding
    midpoint (`straddles`; a zero width would flag every -0: -0 - 0 is -0, -0 + 0 is +0). Seven
    element-wise ops into reused buffers where v is a plain float64 tensor; no host synchronisation.
    positive=False leaves out the w > 0 test: a superset, for callers that test the exact bound later."""
    if v.dtype != torch.float64 or v.requires_grad or (isinstance(w, torch.Tensor) and w.dtype != torch.float64):
        mask = (v - w).float().view(torch.int32) != (v + w).float().view(torch.int32)
    else:
        buf, lo32, hi32, lo, hi = _scratch(v)
        lo32.copy_(torch.sub(v, w, out=buf))
        hi32.copy_(torch.add(v, w, out=buf))
        mask = torch.ne(lo, hi)
    return mask.bitwise_and_(w > 0.0) if positive and isinstance(w, torch.Tensor) else mask


def close_calls(v: torch.Tensor, err) -> torch.Tensor:
    """Exact mask of the elements the prover must log (reference implementation, for tests)."""
    return straddles(v, torch.as_tensor(err, dtype=torch.float64) * SAFETY)


# --------------------------------------------------------------------------- error bounds


@dataclass
class Bound:
    """Error bound of one rounding point, at three levels of cost.

    coarse: a float or a tensor broadcastable to the output, >= every element's bound: finding the
            candidates is one `straddles` pass over the output with it (or a zero-argument
            callable giving it, so that it is only formed when needed);
    cheap(idx): optionally, a tighter per-element bound at flat indices;
    at(idx): the bound itself at flat indices -- what flags a close call, and what the verifier uses.
    max: 0 if the result is exact everywhere (nothing to log), else inf or a float >= coarse.
    fused(v): optionally, the native kernel for the whole record pass (native.py): (float32(v) as
            float64, close calls' flat indices, their log codes), or None to fall back.
    window(): optionally, for the device path (no host synchronisation): a width tensor
            broadcastable to the output, >= every element's bound (default: coarse);
    exact(idx): optionally, the bound at a fixed number of flat indices (padding included) with no
            data-dependent shapes; None when `window` is itself the exact bound (a full bound).
    dense(): optionally, the exact bound at every output as one tensor, for a point too crowded for
            its slots (`Rounder.dense`): a product's |A| @ |B|, one more product of the same shape.
    pick(v, k): optionally, the device path's candidate search in one kernel (kernels.py): (float32(v)
            as float64, k slots' flat indices, values, bounds or None, candidate flags), or None.
    steers: whether the rounded value feeds the training state. The loss does not (its gradient is
            formed from the softmax, not from it): a logged choice there cannot steer training,
            and a loss near 0 under cancellation (an honest one: tests/replay/protocol/test_trajectory.py)
            has a window far above 2^-12 of itself, so REL_WINDOW does not apply to it.
    scale: the scale REL_WINDOW measures windows against is max |value| at the point, or this
            floor where the point's values can all be honest noise: the loss gradient of a model
            that predicts every example (p - onehot ~ 1e-17, each window ~1e-15 x the gradient's
            natural scale 1/n); a choice within 2^-12 of that scale cannot steer training.
    """

    max: float
    at: object = None
    coarse: object = None
    cheap: object = None
    fused: object = None
    window: object = None
    exact: object = None
    dense: object = None
    pick: object = None
    steers: bool = True  # False where the value never feeds training (the loss): no REL_WINDOW rule
    scale: object = None  # a floor under the point's scale for REL_WINDOW (a 0-d tensor), or None

    def close_calls(self, idx: torch.Tensor, v: torch.Tensor):
        """Of candidates (flat idx, values v): which are close calls, and the exact bound of those."""
        if self.cheap is not None:
            sub = straddles(v, self.cheap(idx) * SAFETY).nonzero().flatten()
            idx, v = idx[sub], v[sub]
        else:
            sub = torch.arange(idx.numel(), device=idx.device)
        err = self.at(idx)
        close = straddles(v, err * SAFETY)
        return sub[close], err[close]


def norms(t: torch.Tensor, dim) -> torch.Tensor:
    """Euclidean norms along dim(s). (vector_norm is slow off the last dim, a sum of squares is not;
    either's own rounding, ~K u relative, is absorbed by SAFETY's slack.)"""
    if dim == -1 or dim == t.dim() - 1:
        return torch.linalg.vector_norm(t, dim=-1)
    return (t * t).sum(dim).sqrt()


def unravel(idx: torch.Tensor, shape) -> tuple[torch.Tensor, ...]:
    """torch.unravel_index for non-negative flat indices in range, without its per-call overhead
    (it runs a few times per rounding point that has candidates): the same integers."""
    shape = tuple(shape)
    if len(shape) <= 1:
        return (idx,) if shape else ()
    out = []
    for d in shape[:0:-1]:
        out.append(torch.remainder(idx, d))  # one op each, where q and idx - q * d were three
        idx = torch.div(idx, d, rounding_mode="floor")
    out.append(idx)
    return tuple(out[::-1])


def _gather(t: torch.Tensor, idx: torch.Tensor, shape) -> torch.Tensor:
    if tuple(t.shape) == tuple(shape):
        return t.reshape(-1)[idx]
    return t.expand(shape)[unravel(idx, shape)]


CHUNK_TERMS = 1 << 22  # float64 elements a bound's exact refinement may gather at once (32 MiB)


def in_chunks(fn, idx: torch.Tensor, terms: int) -> torch.Tensor:
    """fn(idx) over slices of idx small enough that slice * terms <= CHUNK_TERMS: the same values,
    in bounded memory however many entries a log names."""
    step = max(1, CHUNK_TERMS // max(terms, 1))
    if idx.numel() <= step:
        return fn(idx)
    return torch.cat([fn(idx[i : i + step]) for i in range(0, idx.numel(), step)])


def entry_cap(n: int) -> int:
    """Most log entries one rounding point of n outputs may carry. Honest runs reach a third of a
    point whose exact value is 0 (an attention key bias's gradient: 257 of 768) and 1,891 of
    524,288 at a large product (docs/replay-limits.md)."""
    return 256 + n // 2


def _fits(idx: list, outputs: int) -> bool:
    """Entries a one-call replay kernel may take: some, no more than `entry_cap`, the last inside the outputs
    (else `_apply` refuses the log before any entry, and says why)."""
    return bool(idx) and len(idx) <= entry_cap(outputs) and idx[-1] < outputs


def full_bound(err, shape, steers: bool = True, scale=None, pick=None) -> Bound:
    """A bound given as a tensor broadcastable to the output's shape, or a zero-argument callable
    giving one: formed only when needed (always when recording, but where `pick`, the op's own
    `Bound.pick`, forms it inside its kernel; in a replay only at a point the log names)."""
    memo = []

    def e() -> torch.Tensor:
        if not memo:
            memo.append(err() if callable(err) else err)
        return memo[0]

    return Bound(
        math.inf,
        lambda idx: _gather(e(), idx, shape),
        coarse=e,
        # (on the CPU's kernel alone: a device's pick may form the bound in its own kernel, `pick`)
        fused=lambda v: native.round_full(v, e(), SAFETY, WIDE) if v.is_cpu and native.library() else None,
        window=e,
        pick=pick if pick is not None else lambda v, k: _pick_full(v, e, k),
        steers=steers,
        scale=scale,
    )


def _pick_full(v: torch.Tensor, bound, k: int):
    """`Bound.pick` of a full bound (a tensor of the output's own shape), or None."""
    if not kernels.usable(v):
        return None
    e = bound()
    return kernels.pick_full(v, e, SAFETY, k) if isinstance(e, torch.Tensor) and e.shape == v.shape else None


def _dot_gammas(k: int, scale: float) -> tuple[float, float]:
    """A product's bound's factors: gamma(K + 2), for |bias|, and g = gamma(K + 2) |scale|, for sum_k |A_ik B_kj|."""
    gk = _GAMMAS.get(k)
    if gk is None:
        gk = _GAMMAS[k] = gamma(k + 2)
    return gk, (gk if scale == 1.0 else gk * abs(scale))


_GAMMAS: dict[int, float] = {}  # gamma(K + 2) by K: a model's few reduction lengths, each formed once


def _with_bias(v: torch.Tensor, bias, bias_rows: bool, owned: bool, add: bool) -> torch.Tensor:
    """v + bias where `add` (`Rounder.dot`'s), per column or per row (bias_rows: v's rows, the last but one dim): in
    v's place where the caller owns it. The kernel's `biased` additions, one an element, in torch; else v."""
    if not add or bias is None:
        return v
    b = bias.reshape(-1, 1) if bias_rows else bias
    return v.add_(b) if owned else v + b


def dot_bound(a: torch.Tensor, b: torch.Tensor, scale: float = 1.0, bias=None, bias_rows: bool = False) -> Bound:
    """Bound for C = scale * (A @ B) + bias, A (..., M, K), B (..., K, N), batch dims broadcast;
    bias (N,), or (M,) with bias_rows (a convolution's per-channel bias).

    Per element: gamma(K + 2) * (|scale| * sum_k |A_ik B_kj| + |bias|), Higham's bound, exact
    zeros included (all-zero products give a zero bound). `coarse` (per output row) and `cheap` use
    Cauchy-Schwarz, sum_k |A_ik B_kj| <= ||A_i|| ||B_j||, so finding candidates costs two norms,
    not a second matmul; the exact sum is formed only for the few candidates that survive. The
    norms are formed lazily: the fused kernel computes its own, and a replay needs them only at
    logged elements.
    """
    k = a.shape[-1]
    gk, g = _dot_gammas(k, scale)
    babs = bias.abs() * gk if bias is not None else None
    sa, sb = tuple(a.shape[:-2]), tuple(b.shape[:-2])  # torch.broadcast_shapes only where needed: it is slow
    bat = sa if sa == sb or not sb else sb if not sa else tuple(torch.broadcast_shapes(sa, sb))
    out_shape = bat + (a.shape[-2], b.shape[-1])
    memo = {}

    def norm_a():
        if "a" not in memo:
            memo["a"] = norms(a, -1)
        return memo["a"]

    def norm_b():
        if "b" not in memo:
            memo["b"] = norms(b, -2)
        return memo["b"]

    def bias_at(i, j):
        return torch.take(babs, i if bias_rows else j)  # babs is 1-D: take is two ATen ops, indexing four

    def coarse():
        na, nb = norm_a(), norm_b()  # (a NaN column's norm blanks no other column's window: `max_of_numbers`)
        c = na * (max_of_numbers(nb) * g) if nb.numel() else torch.zeros_like(na)
        if babs is not None and babs.numel():
            c = c + (babs if bias_rows else max_of_numbers(babs))
        return c.unsqueeze(-1)  # per row of the output; tensors throughout, no host sync

    def coords(idx):
        *bat, i, j = unravel(idx, out_shape)
        return bat[len(bat) - (a.dim() - 2) :], bat[len(bat) - (b.dim() - 2) :], i, j

    def cheap(idx):
        ba, bb, i, j = coords(idx)
        e = norm_a()[(*ba, i)] * norm_b()[(*bb, j)] * g
        return e + bias_at(i, j) if babs is not None else e

    def at(idx):  # a few at a time: one entry's terms are k products (a crafted log names many entries)
        fast = native.dot_at(out_shape, a, b, g, babs, bias_rows, idx)
        return fast if fast is not None else in_chunks(exact, idx, k)

    def exact(idx):
        ba, bb, i, j = coords(idx)
        e = None
        if a.dim() == b.dim() == 2 and idx.numel() > 64:  # many: perhaps their rows x columns as one small matmul
            rows_i, inv_i = torch.unique(i, return_inverse=True)
            cols_j, inv_j = torch.unique(j, return_inverse=True)
            if (
                rows_i.numel() * cols_j.numel() <= 8 * idx.numel() + 4096
                and (rows_i.numel() + cols_j.numel()) * k <= CHUNK_TERMS
            ):
                # |.| terms: exact zeros stay zero; the matmul's own error gamma(K) is absorbed by SAFETY's slack
                e = (a[rows_i].abs() @ b[:, cols_j].abs())[inv_i, inv_j] * g
        if e is None:
            rows, cols = a[(*ba, i)], b.transpose(-2, -1)[(*bb, j)]
            e = (rows.abs() * cols.abs()).sum(-1) * g
        return e + bias_at(i, j) if babs is not None else e

    def fused(v):
        return native.round_dot(v, a, b, g, bias, gk, bias_rows, SAFETY, WIDE)

    def window():  # the candidates' window, SAFETY included: Cauchy-Schwarz per element, as the native
        # kernel's filter, ||A_i|| g ||B_j|| + |bias|; the exact bound decides (Rounder._flush)
        nb = torch.linalg.vector_norm(b, dim=-2)
        na = norm_a() * (g * SAFETY)
        w = na.view(*na.shape, 1) * nb.view(*nb.shape[:-1], 1, nb.shape[-1])  # (views: one ATen op, unsqueeze two)
        if babs is not None and babs.numel():
            w = w + (babs.view(-1, 1) if bias_rows else babs) * SAFETY
        return w

    def exact_fixed(idx, valid=None):  # the exact bound at a fixed number of indices, no host sync: at the
        # `valid` ones alone in one kernel (0 elsewhere), or gathers in chunks of host-known size
        if kernels.usable(idx, a, b):
            fast = kernels.dot_exact(a, b, g, babs, bias_rows, out_shape, idx, valid)
            if fast is not None:
                return fast
        return in_chunks(exact_gathered, idx, k)

    def pick(v, slots):  # `window` and the candidate search in one kernel
        if not kernels.usable(v, a, b):
            return None
        nb = torch.linalg.vector_norm(b, dim=-2)
        bias_w = babs * SAFETY if babs is not None and babs.numel() else None
        return kernels.pick_dot(v, norm_a() * (g * SAFETY), nb, bias_w, bias_rows, slots)

    def exact_gathered(idx):
        ba, bb, i, j = coords(idx)
        if a.dim() == 2 and b.dim() == 2:
            rows = a[i]  # four ATen ops; index_select on dim 0 records six
            # a linear layer's b is its weight's transpose: index_select on dim 1 would copy all of b first
            # (transpose(0, 1): two ATen ops, t() three)
            cols = b.index_select(1, j).transpose(0, 1) if b.is_contiguous() else b.transpose(0, 1)[j]
        else:
            rows, cols = a[(*ba, i)], b.transpose(-2, -1)[(*bb, j)]
        # |x y| is |x| |y| bit for bit (IEEE rounding is symmetric in sign), in one op where two abs were three
        e = (rows * cols).abs_().sum(-1).mul_(g)
        return e + bias_at(i, j) if babs is not None else e

    def dense():  # every output's bound as the product of the magnitudes (its own error: SAFETY's slack)
        e = torch.matmul(a.abs(), b.abs()).mul_(g)
        if babs is not None and babs.numel():
            e = e + (babs.view(-1, 1) if bias_rows else babs)
        return e

    return Bound(
        math.inf, at, coarse=coarse, cheap=cheap, fused=fused, window=window, exact=exact_fixed, dense=dense, pick=pick
    )


# --------------------------------------------------------------------------- the log codec


def _put_varint(out: bytearray, n: int) -> None:
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _get_varint(buf: bytes, pos: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("rounding log: truncated or overlong varint")
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return n, pos
        shift += 7


def encode_log(entries) -> bytes:
    """{key: (strictly increasing flat indices, codes)}, or a FlatLog, -> bytes. A FlatLog is encoded in C
    where the native kernel is on (a large step logs a million entries: a third of a second in Python)."""
    if isinstance(entries, FlatLog):
        fast = native.encode_flat(entries.keys, entries.starts, entries.counts, entries.idx, entries.codes)
        if fast is not None:
            return fast
        entries = entries.as_dict()
    return encode_log_reference(entries)


def encode_log_reference(entries: dict[int, tuple[list[int], list]]) -> bytes:
    """{key: (strictly increasing flat indices, codes)} -> bytes. A code is a parity bit (bool) or a float32's bits (int)."""
    out = bytearray([LOG_VERSION])
    keys = sorted(k for k, (idx, _) in entries.items() if idx)
    _put_varint(out, len(keys))
    prev_key = 0
    for key in keys:
        idx, codes = entries[key]
        _put_varint(out, key - prev_key)
        prev_key = key
        _put_varint(out, len(idx))
        prev, bits = -1, []
        for i, code in zip(idx, codes):
            wide = not isinstance(code, bool)
            _put_varint(out, (i - prev - 1) * 2 + wide)
            prev = i
            if wide:
                out += struct.pack("<I", code & 0xFFFFFFFF)
            else:
                bits.append(code)
        packed = bytearray((len(bits) + 7) // 8)
        for j, b in enumerate(bits):
            if b:
                packed[j >> 3] |= 1 << (j & 7)
        out += packed
    return bytes(out)


PACK_MIN = 1 << 18  # elements below which what backward keeps is kept as it is (ops._save): its bytes do not
# matter, its two copies' ops do; nor is a smaller rounding point's output noted as float32-valued
SHARED_NORMS_MIN = 1 << 16  # elements of a product's operand past which its norms are formed once for two points
WIDE_CODE = 1 << 32  # FlatLog: a wide entry's code is its float32's 32 bits with this bit set


@dataclass(frozen=True, eq=False)
class FlatLog:
    """A log's entries as flat arrays: what a static replay lays into its table in a few vectorised
    passes (a 15M GPT step logs ~94,000 entries: as Python lists they cost a GPU replay more host time
    than its graph), and what the C encoder writes. `as_dict` gives `decode_log`'s entries where a path
    needs them."""

    keys: np.ndarray  # int64, distinct; increasing where decoded or flushed (`from_dict` keeps a dict's order)
    starts: np.ndarray  # each key's first entry in idx / codes
    counts: np.ndarray  # its entries (>= 1)
    idx: np.ndarray  # int64: each key's flat indices, strictly increasing
    codes: np.ndarray  # int64: a parity bit 0 or 1, or a wide entry's 32 bits | 2^32

    @property
    def total(self) -> int:
        return len(self.idx)

    def as_dict(self) -> dict[int, tuple[list[int], list]]:
        """{key: (indices, codes)}, codes as the reference decodes them (a parity bool, a wide entry's int): the
        arrays made lists once and sliced per key (NumPy's calls per key were a small model's replay step's
        ~5%)."""
        idx = self.idx.tolist()
        if (self.codes >= WIDE_CODE).any():  # wide entries: their 32 bits as a Python int, beside parity bools
            codes = [bool(c) if c < 2 else c & 0xFFFFFFFF for c in self.codes.tolist()]
        else:
            codes = self.codes.astype(bool).tolist()
        runs = zip(self.keys.tolist(), self.starts.tolist(), self.counts.tolist())
        return {key: (idx[s : s + c], codes[s : s + c]) for key, s, c in runs}

    @classmethod
    def from_runs(cls, keys: list, runs: list, idx: np.ndarray, codes: np.ndarray) -> FlatLog:
        """Distinct keys, each with its run [lo, hi) of idx and codes (indices increasing), in key order."""
        order = sorted(range(len(keys)), key=keys.__getitem__)
        take = np.concatenate([np.arange(*runs[j]) for j in order]) if keys else np.zeros(0, dtype=np.int64)
        counts = np.array([runs[j][1] - runs[j][0] for j in order], dtype=np.int64)
        return cls(np.array(sorted(keys), dtype=np.int64), _starts(counts), counts, idx[take], codes[take])

    @classmethod
    def from_dict(cls, entries: dict) -> FlatLog | None:
        """The same entries flat, in the dict's order; None where a key or an index does not fit in 63
        bits, or a key has no entries (no decoded log has either: the static replay hands such entries
        to the deferred replay, which refuses them)."""
        if any(not len(i) for i, _ in entries.values()):
            return None
        items = [(k, i, c) for k, (i, c) in entries.items()]
        limit = 1 << 63
        if any(k >= limit or k < 0 or i[-1] >= limit or i[0] < 0 for k, i, _ in items):
            return None
        counts = np.array([len(i) for _, i, _ in items], dtype=np.int64)
        idx = np.fromiter((j for _, i, _ in items for j in i), dtype=np.int64, count=int(counts.sum()))
        codes = np.fromiter(
            (int(x) if isinstance(x, bool) else (x & 0xFFFFFFFF) | WIDE_CODE for _, _, c in items for x in c),
            dtype=np.int64,
            count=int(counts.sum()),
        )
        return cls(np.array([k for k, _, _ in items], dtype=np.int64), _starts(counts), counts, idx, codes)


def _starts(counts: np.ndarray) -> np.ndarray:
    """Each run's first entry, the runs laid end to end."""
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64) if len(counts) else counts


def decode_log_flat(buf: bytes, max_entries: int = MAX_LOG_ENTRIES) -> FlatLog | dict:
    """`decode_log` as a FlatLog where the C decoder takes the log; else the reference's dict (no native
    kernel, or a value past 63 bits). Either is a Rounder's `entries` for a replay."""
    fast = native.decode_flat(buf, max_entries)
    return decode_log_reference(buf, max_entries) if fast is None else FlatLog(*fast)


def decode_log(buf: bytes, max_entries: int = MAX_LOG_ENTRIES) -> dict[int, tuple[list[int], list]]:
    """bytes -> {key: (indices, codes)}; raises ValueError on anything malformed or over max_entries.
    In C where the native kernel is on (native.decode_flat: the same entries and refusals), else
    `decode_log_reference`."""
    log = decode_log_flat(buf, max_entries)
    return log.as_dict() if isinstance(log, FlatLog) else log


def decode_log_reference(buf: bytes, max_entries: int = MAX_LOG_ENTRIES) -> dict[int, tuple[list[int], list]]:
    """The log's decoder in Python: the reference the C one is held to."""
    if not buf or buf[0] != LOG_VERSION:
        raise ValueError("rounding log: unknown version")
    points, pos = _get_varint(buf, 1)
    if points > len(buf):
        raise ValueError("rounding log: point count exceeds size")
    entries, key, total = {}, -1, 0
    for p in range(points):
        delta, pos = _get_varint(buf, pos)
        if p and delta == 0:
            raise ValueError("rounding log: keys not strictly increasing")
        key = delta if p == 0 else key + delta
        count, pos = _get_varint(buf, pos)
        total += count
        if count == 0 or total > max_entries or count > len(buf) - pos:
            raise ValueError("rounding log: bad entry count")
        idx, codes, narrow, prev = [], [], [], -1
        for _ in range(count):
            d, pos = _get_varint(buf, pos)
            prev += (d >> 1) + 1
            idx.append(prev)
            if d & 1:
                if pos + 4 > len(buf):
                    raise ValueError("rounding log: truncated wide entry")
                codes.append(struct.unpack_from("<I", buf, pos)[0])
                pos += 4
            else:
                narrow.append(len(codes))
                codes.append(False)
        nbytes = (len(narrow) + 7) // 8
        if pos + nbytes > len(buf):
            raise ValueError("rounding log: truncated parity bits")
        for j, c in enumerate(narrow):
            codes[c] = bool(buf[pos + (j >> 3)] >> (j & 7) & 1)
        if len(narrow) % 8 and buf[pos + nbytes - 1] >> (len(narrow) % 8):
            raise ValueError("rounding log: stray parity bits")
        pos += nbytes
        entries[key] = (idx, codes)
    if pos != len(buf):
        raise ValueError("rounding log: trailing bytes")
    return entries


# --------------------------------------------------------------------------- the rounder


class StaticRedo(Exception):
    """A static replay step refused a log entry: train_step replays it the deferred way, whose refusal
    names the point and the element."""


class LogOverflow(Exception):
    """Rounding points (`keys`) had more candidates than their fixed slots hold: train_step redoes the
    step with those points dense (`Rounder.dense`), or on the host-synchronising path; the rounded
    values do not depend on which path logs."""

    def __init__(self, message: str, keys=frozenset()):
        super().__init__(message)
        self.keys = frozenset(keys)


FLUSH_MIN = 1 << 16  # close calls a step's one copy to the host carries at least (honest GPT-2 small: ~37,000)


def flush_cap(slots_total: int) -> int:
    """How many close calls `_flush` copies to the host in its one copy: a step with more copies them
    all in a second one (correct, slower)."""
    return min(slots_total, max(FLUSH_MIN, slots_total >> 5))


def _candidates_per_pick(cand: torch.Tensor, pending: list) -> torch.Tensor:
    """How many of its slots are candidates, per picked point of a step (int64, on the device): a
    cumulative sum over the step's slots read at each point's ends, not an op per point."""
    spans, at = [], 0
    for p in pending:
        if p[5]:
            spans.append((at, at + p[1].numel() - 1))
        at += p[1].numel()
    cache = _SCRATCH.__dict__
    key = ("spans", cand.device, tuple(spans))
    if key not in cache:
        first, last = zip(*spans)
        cache[key] = torch.tensor([first, last], device=cand.device)
    ends = cache[key]
    total = torch.cumsum(cand, 0)
    return torch.take(total, ends[1]) - torch.take(total, ends[0]) + torch.take(cand, ends[0])


_POINT_SHIFT = 40  # a close call's sort key: its point's place in the step << 40 | its flat index (< 2^40)


def _point_ends(pending: list, device) -> torch.Tensor:
    """Where each pending point's slots end in the step's concatenated slots (on the device, cached)."""
    cache = _SCRATCH.__dict__
    sizes = tuple(p[1].numel() for p in pending)
    key = ("ends", device, sizes)
    if key not in cache:
        cache[key] = torch.tensor(np.cumsum(sizes, dtype=np.int64), device=device)
    return cache[key]


def _in_point_order(at: torch.Tensor, idx: torch.Tensor, code: torch.Tensor, ends: torch.Tensor):
    """The close calls at slots `at` (-1: padding) as (sort keys, codes), sorted on the device by point,
    then by flat index (a picked point's slots are in the pick's own order; its log's indices must
    increase): one sort for the step, where the host sorted a million entries point by point at GPT-2
    size (50 ms); padding last."""
    slot = at.clamp(min=0)
    point = torch.searchsorted(ends, slot, right=True)
    where = torch.where(at >= 0, (point << _POINT_SHIFT) | torch.take(idx, slot), torch.iinfo(torch.int64).max)
    where, order = torch.sort(where)
    return where, torch.take(torch.take(code, slot), order)


def _to_host(t: torch.Tensor):
    """t as a numpy array on the host, valid until the next call on this thread: through a reused
    pinned buffer on a GPU (a pageable copy of a few MB costs tens of ms there)."""
    if t.device.type == "cpu":
        return t.numpy()
    cache = _SCRATCH.__dict__
    key = ("pinned", t.device, t.dtype)
    buf = cache.get(key)
    if buf is None or buf.numel() < t.numel():
        buf = cache[key] = torch.empty(max(t.numel(), FLUSH_MIN), dtype=t.dtype, pin_memory=True)
    out = buf[: t.numel()]
    out.copy_(t, non_blocking=True)
    torch.cuda.current_stream(t.device).synchronize()
    return out.numpy()


SMALL_POINT = 4096  # outputs up to which every element has a slot (no compaction)


def slots(n: int) -> int:
    """Fixed number of candidate slots of a rounding point of n outputs on the device path: every
    element of a small point (an exact-zero bias gradient has a third of its outputs logged), and far
    above the candidates honest steps show at larger ones (1,423 of 524,288 at most: 1/368), so that
    a step is recorded once (docs/replay-limits.md)."""
    return n if n <= SMALL_POINT else max(SMALL_POINT, n >> 6)


PICK_BY_TOPK = {"cpu"}  # device types whose rounding points pick their candidates with top-k


def pick(flags: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """k slots for the flagged elements of a flat bool mask: (each slot flagged, as uint8; its flat
    index). Every flagged element has a slot while there are at most k; the other slots hold
    unflagged elements, in any order (`_flush` tells them apart and sorts on the host). On a CPU one
    top-k over the mask's bytes: one ATen op, where nonzero_static records fifteen. Elsewhere
    nonzero_static, a stream compaction: CUDA's top-k sorts the whole mask of a slice over 100,000
    elements (memory and time of a sort per rounding point)."""
    if flags.device.type in PICK_BY_TOPK:
        return torch.topk(flags.view(torch.uint8), k, sorted=False)
    idx = torch.nonzero_static(flags, size=k, fill_value=-1).view(-1)
    return (idx >= 0).view(torch.uint8), idx.clamp(min=0)


class Rounder:
    """Rounds float64 results to float32 at the fixed points of one training step.

    mode "record": find the close calls and keep their codes in `entries` (then `encode_log(log())`).
    mode "replay": apply `entries` (decoded from the prover's log), refusing any that do not fit.
    trace=[] keeps every rounded output (key, name, float32) for dispute bisection; lenient=True
    then skips log entries that do not fit instead of failing (the trace shows where things part).
    perturb(v, bound) -> v' lets tests play a worst-case machine (|v' - v| <= the bound).

    Recording off the native kernel (a GPU, or REPLAY_NATIVE=0) is deferred (defer=True): each
    rounding point finds its candidates with element-wise ops into a fixed number of slots (no
    host synchronisation, no data-dependent shape) and keeps them on the device; `entries` (read,
    or `finish`) decides them all at once and copies the log to the host: once per step. If a
    point had more candidates than slots, LogOverflow: train_step redoes that step with defer=False
    (the reference path: per point, host-synchronising, exact sizes).
    """

    def __init__(self, mode="record", entries=None, trace=None, perturb=None, lenient=False, defer=True, dense=None):
        self.mode, self.trace, self.perturb, self.lenient, self.defer = mode, trace, perturb, lenient, defer
        # deferred record: keys of the points that hand all their outputs to `_flush` with their exact
        # bounds (dense), because their candidates overflowed the slots once: train_step keeps the set
        self.dense: set = set() if dense is None else dense
        self._entries = {} if entries is None else entries
        self.names: list = []
        self.max_ratio = 0.0  # replay: the widest applied window relative to its point's scale
        self._pending: list = []  # deferred record: (key, slot indices, values, bounds) per point
        self._checks: list = []  # deferred replay: (key, indices, codes, ok, window ok, window, scale) per point
        self._ratios: list = []  # deferred replay: each point's widest applied window / scale (device)
        self._uploaded = None  # deferred replay: the whole log on the device, {key: (indices, codes, wide)}
        self.static = None  # static replay: the step's entries laid out in fixed slots (static_log.Layout)
        self.allow_static = True  # False once a static step refused an entry (the step is replayed deferred)
        self.learn, self.learn_key = None, None  # deferred replay: [(key, outputs)] of the step's points
        self.crowded = []  # deferred replay: points this step gave more entries than their slots
        self._slots = None  # static replay: this step's slots (static_log.Slots)
        self._bad = []  # static replay: per point, did a real entry not fit (device)
        self._exact: dict = {}  # storage address -> (its tensor, weakly; version then; its float32 copy, weakly)

    @property
    def _entries(self) -> dict:
        """The log's entries {key: (indices, codes)}, made from a FlatLog the first time a path reads them
        (a static replay lays the FlatLog itself into its table: `replay_log`)."""
        if self._flat is not None:
            self._entries_dict, self._flat = self._flat.as_dict(), None
        return self._entries_dict

    @_entries.setter
    def _entries(self, value) -> None:
        self._flat = value if isinstance(value, FlatLog) else None
        self._entries_dict = {} if self._flat is not None else value

    def replay_log(self) -> FlatLog | None:
        """The entries as a FlatLog (the one decoded, or made from the dict), or None where they do not fit one."""
        return self._flat if self._flat is not None else FlatLog.from_dict(self._entries_dict)

    @property
    def entries(self) -> dict:
        if self._pending:
            self._flush()
        return self._entries

    def log(self) -> FlatLog | dict:
        """The step's entries for `encode_log` as they are held: a FlatLog (a device recording's flush,
        a decoded log) or the dict, without making one from the other."""
        if self._pending:
            self._flush()
        return self._flat if self._flat is not None else self._entries_dict

    def entry_count(self) -> int:
        log = self.log()
        return log.total if isinstance(log, FlatLog) else sum(len(i) for i, _ in log.values())

    @entries.setter
    def entries(self, value: dict) -> None:
        self._pending, self._entries = [], value

    def reset(self, defer: bool) -> None:
        """Forget a step's work (LogOverflow): the same rounder, ready to run the step again (its dense
        points kept)."""
        self._pending, self._entries, self.names, self.defer = [], {}, [], defer
        self._checks, self._ratios, self._uploaded = [], [], None
        self._slots, self._bad, self._exact = None, [], {}
        if self.trace is not None:
            self.trace.clear()

    def op(self, name: str) -> int:
        """Allocate the id of the next op (forward call order); its rounding points are id * SLOTS + slot."""
        self.names.append(name)
        return len(self.names) - 1

    def __call__(self, key: int, v: torch.Tensor, bound: Bound) -> torch.Tensor:
        """float64 v with error bound `bound` -> float64 tensor of float32 values, the same on every machine."""
        if self.perturb is not None and bound.max > 0:
            v = self.perturb(v, bound)
        if self.mode == "record" and bound.max > 0:
            r = self._record(key, v, bound)
        else:
            # a logged point on the CPU's kernel: its rounding and its scale (`_apply`) in one pass
            logged = self.mode == "replay" and self.static is None and v.is_cpu and key in self._entries
            scaled = native.round_scaled(v) if logged else None
            r, scale = scaled if scaled is not None else (_round(v), None)
            if self.mode == "replay" and bound.max > 0 and self.learn is not None:
                self.learn.append((key, r.numel()))
            if self.mode == "replay" and bound.max > 0 and self.static is not None:
                if key not in self.static.points:  # not the step the layout was learnt from
                    raise StaticRedo(f"rounding point {self.name(key)} is not in the layout")
                r = self._apply_static(key, v, r, bound)
            elif self.mode == "replay" and key in self._entries:
                # on a CPU with the native kernel a host round trip is free and the few Python-side
                # decisions are cheaper than the device path's element-wise ops (REPLAY_NATIVE=0 runs
                # the device path on the CPU, so that CI tests what accelerators run)
                host = not self.defer or (v.is_cpu and native.library() is not None)
                r = self._apply(key, v, r, bound, scale) if host else self._apply_deferred(key, v, r, bound)
        if self.trace is not None:
            self.trace.append((key, self.name(key), r.detach().float()))
        return self._noted(r)

    def dot(
        self,
        key: int,
        v: torch.Tensor,
        a,
        b,
        scale=1.0,
        bias=None,
        bias_rows=False,
        owned=False,
        norms=None,
        add=False,
        transposed=False,
    ):
        """self(key, v, dot_bound(a, b, scale, bias, bias_rows)), the same result, without forming the
        bound's other forms where the step goes straight to the native kernel's record pass or to a
        replay's plain rounding: a small model's step is mostly the Python around its rounding points.
        Not where `__call__` is another's (a subclass, a tracer): every point then goes through it.
        owned: v is the caller's fresh temporary, which nothing reads after: the kernel may round it in place.
        norms: (a's row norms, b's column norms) where the caller formed them (`shares_norms`), for the kernel.
        add: v is the product alone (a GEMM that adds a bias first copies it into its output: a pass of its own), and
        the point's value v + bias, one IEEE addition an element: in the kernel's record pass, else here first.
        transposed: v is the 2-D product's transpose, (N, M) contiguous, with no bias (`ops._b_gradient`: a CPU GEMM
        forms a product of few columns slowly); the point is still the (M, N) product's, its log's indices too, and the
        result comes in v's layout, the rounded product's transpose."""
        if transposed and bias is not None:
            raise ValueError("a transposed product's point takes no bias")
        direct = self._direct() and v.is_cpu
        if direct and self.mode == "record" and native.library() is not None:
            gk, g = _dot_gammas(a.shape[-1], scale)  # the bias's term |bias| * gk is the kernel's (no torch ops)
            fused = native.round_dot(v, a, b, g, bias, gk, bias_rows, SAFETY, WIDE, owned, norms, add, transposed)
            if fused is not None:
                return self._recorded(key, *fused)
            return self._record_declined(key, v, a, b, scale, bias, bias_rows, owned, add, transposed)
        v = _with_bias(v, bias, bias_rows, owned, add)
        route = self._replay_route(key) if direct else None
        if route == "plain":  # element by element: either layout
            return self._noted(_round(v, in_place=owned))
        if route == "kernel":
            applied = (self._replay_turned if transposed else self._replay_dot)(
                key, v, a, b, scale, bias, bias_rows, owned
            )
            if applied is not None:
                return applied
        if transposed:  # the point's own layout for the rest (a tracer, the torch path, the kernel declined)
            return self._transposed_back(v, owned, lambda vt, own: self.dot(key, vt, a, b, scale, owned=own))
        return self(key, v, dot_bound(a, b, scale, bias, bias_rows))

    @staticmethod
    def _transposed_back(v: torch.Tensor, owned: bool, point) -> torch.Tensor:
        """point(vt, owned) on the point's own layout, vt = v's transpose made contiguous, its result in v's layout: written
        back into v where the caller owns it (the copy lives for the call alone: the step allocator's blocks stay as
        they were, where keeping the copy as the result left a convolution's columns a fresh segment, cnn-32's replay
        peak 86 -> 122 MiB), else the result's transpose. vt is always a copy, v's owner's or not (a side of 1 too: four
        ATen ops, where contiguous() is eight and a view of v where a side is 1)."""
        vt = torch.empty((v.shape[1], v.shape[0]), dtype=v.dtype, device=v.device).copy_(v.transpose(0, 1))
        r = point(vt, True).transpose(0, 1)
        return v.copy_(r) if owned else r

    def _record_declined(self, key: int, v, a, b, scale, bias, bias_rows: bool, owned: bool, add: bool, transposed):
        """A recording's point the kernel has just declined (a crowded one, or memory), through `__call__` with the
        whole bound, the kernel not asked again (`_declined`); a transposed product in the point's own layout."""
        bound = _declined(dot_bound(a, b, scale, bias, bias_rows))
        if transposed:
            return self._transposed_back(v, owned, lambda vt, own: self(key, vt, bound))
        return self(key, _with_bias(v, bias, bias_rows, owned, add), bound)

    def takes_kernel_points(self) -> bool:
        """May a caller that has checked its operands hand its points to the CPU kernel's passes straight
        (`kernel_product`, `kernel_column_sums`): a recording or a replay on the CPU's kernel, this class's own
        `__call__`, nothing to perturb or trace."""
        return self.mode in ("record", "replay") and self._direct() and native.library() is not None

    def kernel_product(self, key: int, v, a, b, bias=None, norms=None, add=False, transposed=False):
        """`dot(key, v, a, b, 1.0, bias, False, True, norms, add, transposed)` where the caller has established what
        the kernel's passes need (`takes_kernel_points`; v a fresh contiguous float64 product of 2-D CPU float64
        operands, scale 1, the bias none or per column): in a recording the kernel's record pass alone, in a replay
        plain rounding where the log names nothing there, without `dot`'s routes and `round_dot`'s checks (a small
        model's linear layers are most of its points, and its step mostly their Python); `dot` otherwise, and where
        the kernel declines."""
        if transposed and bias is not None:
            raise ValueError("a transposed product's point takes no bias")
        if self.mode == "record":
            gk, g = _dot_gammas(a.shape[-1], 1.0)
            if transposed:
                fused = native.round_dot(v, a, b, g, bias, gk, False, SAFETY, WIDE, True, norms, add, True)
            else:
                fused = native.record_product(v, a, b, g, gk, SAFETY, WIDE, bias, add, norms)
            if fused is not None:
                return self._recorded(key, *fused)
            return self._record_declined(key, v, a, b, 1.0, bias, False, True, add, transposed)
        if self._replay_route(key) == "plain":  # element by element: either layout
            return self._noted(_round(_with_bias(v, bias, False, True, add), in_place=True))
        return self.dot(key, v, a, b, 1.0, bias, False, True, norms, add, transposed)

    def kernel_column_sums(self, key: int, x: torch.Tensor) -> torch.Tensor | None:
        """The point sum of a 2-D x over its rows (a linear layer's bias gradient, its bound the magnitudes' sums
        times gamma(rows)) in one kernel pass, where the caller has established what it needs (`takes_kernel_points`;
        x contiguous CPU float64): logging in a recording, plain rounding in a replay whose log names nothing there;
        None otherwise, or where the kernel declines (the caller's general pass)."""
        if self.mode == "record":
            log = True
        elif self._replay_route(key) == "plain":
            log = False
        else:
            return None
        got = native.column_sums(x, gamma(x.shape[0]), SAFETY, WIDE, log)
        return None if got is None else self._recorded(key, *got)

    def _replay_route(self, key: int) -> str | None:
        """How a replay's point goes on the CPU: "plain" rounding where it is unlogged (`_unlogged`), "kernel" where
        `_apply` would apply its entries on the CPU's kernel, entry by entry (not lenient, the kernel there), or
        None (a recording, a static layout, a step that learns: their own paths). One call, the log's dict read
        once: a small model's step is mostly the Python around its points."""
        if self.mode != "replay" or self.learn is not None or self.static is not None:
            return None
        if key not in (self._entries_dict if self._flat is None else self._entries):
            return "plain"
        return "kernel" if not self.lenient and native.library() is not None else None

    def _replay_dot(self, key: int, v, a, b, scale: float, bias, bias_rows: bool, owned: bool = False):
        """`_apply` for a product, in one kernel call (native.replay_dot): the same rounding, windows,
        choices and refusals; None where the kernel cannot take it, or where `_apply` refuses the log
        before any entry (too many, one past the outputs): that path then runs, and says why (v as it was).
        owned as `dot`'s: v rounded in place."""
        idx, codes = self._entries[key]
        if not _fits(idx, v.numel()):
            return None
        gk, g = _dot_gammas(a.shape[-1], scale)
        got = native.replay_dot(v, a, b, g, bias, gk, bias_rows, idx, codes, DECODE, REL_WINDOW, owned)
        return self._kernel_applied(key, idx, got)

    def _replay_turned(self, key: int, v, a, b, scale: float, bias, bias_rows: bool, owned: bool = False):
        """`_replay_dot` for a transposed point (`dot`'s transposed: v the (M, N) product's transpose, no bias): the
        product b^T a^T, which v is, with the log's indices mapped to v's layout in the log's order (so that a refusal
        names the entry the point's own layout would), where a copy of v into that layout and back was most of a
        replay step's time for the 0.1M MLP's square weight gradient. None as `_replay_dot`'s, and where an index lies
        outside the outputs (the point's own layout then refuses the log by name)."""
        idx, codes = self._entries[key]
        m, n = a.shape[-2], b.shape[-1]
        if not (_fits(idx, v.numel()) and min(idx) >= 0 and max(idx) < v.numel()):
            return None
        gk, g = _dot_gammas(a.shape[-1], scale)
        turned = [f % n * m + f // n for f in idx]  # (i, j) of the point is (j, i) of v
        got = native.replay_dot(v, b.t(), a.t(), g, None, gk, False, turned, codes, DECODE, REL_WINDOW, owned)
        return self._kernel_applied(key, idx, got)

    def _replay_full(self, key: int, v, err, steers: bool, scale):
        """`_apply` for a point whose bound is given as values (err, formed), in one kernel call (native.replay_full), as
        `_replay_dot`: None where the kernel cannot take it, or where `_apply` refuses the log before any
        entry: that path then runs, and says why."""
        idx, codes = self._entries[key]
        if not _fits(idx, v.numel()):
            return None
        return self._kernel_applied(key, idx, native.replay_full(v, err, idx, codes, DECODE, REL_WINDOW, steers, scale))

    def _kernel_applied(self, key: int, idx: list, got):
        """A one-call replay kernel's result (native.replay_dot's form) taken as `_apply` takes its own: the point's
        entries used up, a refused one named, the widest window kept; the rounded output, or None where the
        kernel declined (got None: the other path runs)."""
        if got is None:
            return None
        r, bad, why, e, found, ratio = got
        del self._entries[key]
        if bad >= 0:
            raise LogMismatch(self._refusal(key, idx[bad], why == 1, e, found))
        self.max_ratio = max(self.max_ratio, ratio)
        return self._noted(r)

    def full(self, key: int, v: torch.Tensor, err, shape, steers: bool = True, scale=None, pick=None):
        """self(key, v, full_bound(err, shape, steers, scale, pick)), as `dot`: err (a callable) is formed when
        recording (but where `pick` takes the point: `full_bound`), and in a replay only where the log names it."""
        if self._direct() and v.is_cpu:
            if self.mode == "record" and native.library() is not None:
                err = err() if callable(err) else err
                fused = native.round_full(v, err, SAFETY, WIDE)
                if fused is not None:
                    return self._recorded(key, *fused)
                return self(key, v, _declined(full_bound(err, shape, steers, scale)))
            route = self._replay_route(key)
            if route == "plain":
                return self._noted(_round(v))
            if route == "kernel":
                err = err() if callable(err) else err  # formed once, whichever path applies the log
                applied = self._replay_full(key, v, err, steers, scale)
                if applied is not None:
                    return applied
        return self(key, v, full_bound(err, shape, steers, scale, pick))

    def hands_norms(self) -> bool:
        """Would `dot` hand norms formed by its caller to the kernel's record pass (a CPU recording on the kernel)?"""
        return self.mode == "record" and self.takes_kernel_points()

    def shares_norms(self, t: torch.Tensor) -> bool:
        """`hands_norms`, and is this 2-D operand large enough for a pass of its own to pay (`native.row_col_norms`:
        read once for two products' norms)?"""
        return t.numel() >= SHARED_NORMS_MIN and t.dim() == 2 and t.is_cpu and self.hands_norms()  # (cheapest first)

    def fused_mode(self, keys) -> str | None:
        """How an op may form these rounding points through native passes (ops' layer norm, softmax): "record",
        logging their close calls (`record_points`), in a CPU recording; "plain", as plain rounding, in a replay
        whose log names none of them; "staged", each point through `full` between the passes, in a replay whose
        log names one; None where the op takes its own path (a GPU, the torch path, a tracer, a perturbation)."""
        if not (self._direct() and native.library() is not None):
            return None
        if self.mode == "record":
            return "record"
        if self.learn is not None or self.static is not None:
            return None
        return "plain" if all(self._unlogged(k) for k in keys) else "staged"

    def record_points(self, keys, points, rounded=()) -> None:
        """A fused pass's close calls [(indices, codes)] per point kept, and its rounded outputs that leave
        the op noted, as `_recorded` keeps and notes one point's."""
        for key, (idx, codes) in zip(keys, points):
            if idx:
                self._entries[key] = (idx, codes)
        for r in rounded:
            self._noted(r)

    def _direct(self) -> bool:
        """May `dot` and `full` skip `__call__`: it is this class's own, with nothing to perturb or trace."""
        return self.perturb is None and self.trace is None and type(self).__call__ is _ROUNDER_CALL

    def _unlogged(self, key: int) -> bool:
        """A replay's point that is plain rounding: no entries there, nothing learnt or laid out."""
        return self._replay_route(key) == "plain"

    def _recorded(self, key: int, r: torch.Tensor, idx: list, codes: list) -> torch.Tensor:
        """A fused record pass's result kept (`_record`), r noted (`__call__`)."""
        if idx:
            self._entries[key] = (idx, codes)
        return self._noted(r)

    def _noted(self, r: torch.Tensor) -> torch.Tensor:
        if r.numel() >= PACK_MIN:  # only tensors this large are kept as float32 (ops._save)
            self.note_exact(r)
        return r

    def note_exact(self, t: torch.Tensor) -> None:
        """t (a fresh float64 tensor) holds float32 values: a saved view of it may be kept as float32
        (`as_float32`) while neither it nor any view of it is changed in place (its version counter)."""
        fresh = t._base is None and t.is_contiguous() and t.storage_offset() == 0 and t.numel() > 0
        if t.dtype == torch.float64 and fresh:
            self._exact[t.untyped_storage().data_ptr()] = (weakref.ref(t), t._version, None)

    def _exact_entry(self, t: torch.Tensor):
        """The `note_exact` entry whose tensor t views, unchanged since (its version counter), or None."""
        if t.dtype != torch.float64 or t.numel() == 0:
            return None
        storage = t.untyped_storage()
        entry = self._exact.get(storage.data_ptr())
        base = entry[0]() if entry else None
        if base is None or t._version != entry[1] or storage.nbytes() != base.numel() * 8:
            return None
        return entry

    def is_exact(self, t: torch.Tensor) -> bool:
        """Whether t holds float32 values by construction (a view of a rounding point's output, unchanged)."""
        return self._exact_entry(t) is not None

    def as_float32(self, t: torch.Tensor) -> torch.Tensor | None:
        """t as float32, losslessly, where t is a view of a tensor `note_exact` took that has not changed
        since (else None). Views of one tensor share one float32 copy: what backward keeps of q, k and v
        (one product's output) or of the attention's probabilities (saved by two ops) is half the bytes."""
        entry = self._exact_entry(t)
        if entry is None:
            return None
        base, storage = entry[0](), t.untyped_storage()
        copy = entry[2]() if entry[2] is not None else None
        if copy is None:  # two ATen ops, where .float() is four (a GPU step's launches, a CPU step's ops)
            copy = torch.empty(base.shape, dtype=torch.float32, device=base.device).copy_(base)
            self._exact[storage.data_ptr()] = (entry[0], entry[1], weakref.ref(copy))
        if t.shape == base.shape and t.stride() == base.stride() and t.storage_offset() == 0:
            return copy
        return copy.as_strided(t.shape, t.stride(), t.storage_offset())

    def _record(self, key, v, bound) -> torch.Tensor:
        """Round v and log its close calls: in one fused pass where the kernel takes v, else with torch."""
        fused = bound.fused(v) if bound.fused is not None else None
        if fused is not None:
            r, idx, codes = fused
            if idx:
                self._entries[key] = (idx, codes)
            return r
        if self.defer:
            return self._record_deferred(key, v, bound)
        r = v.float()
        idx, err = self._close_calls(v, bound)
        r = r.double()
        if idx.numel():
            self._log(key, v, r, idx, err)
        return r

    def _record_deferred(self, key, v, bound) -> torch.Tensor:
        """The device path: candidates into slots(n) fixed slots with their exact bounds, decided in
        `_flush`; nothing waits for the device. A point with a slot per element hands over all of it
        (its window is not even formed as a test: `_flush` decides on the exact bound, and every close
        call lies inside the window); a larger one keeps the elements its window flags, picked by one
        top-k over the flags (with filler elements when fewer; `_flush` tells them apart)."""
        window = bound.window if bound.window is not None else bound.coarse
        if window is None:
            window = bound.max
        if not callable(window) and _no_window(window):
            return v.float().double()
        n = v.numel()
        if n >= 1 << _POINT_SHIFT:  # `_flush` sorts a step's close calls by point and index in one key
            raise ValueError(f"rounding point {self.name(key)}: {n} outputs, past the 2^40 a step's log sorts")
        k = n if key in self.dense else slots(n)
        fast = bound.pick(v, k) if k < n and bound.pick is not None else None
        if fast is not None:  # the window, the search and the rounding in one kernel
            r, idx, x, e, cand = fast
            if e is None:
                e = bound.exact(idx, cand)
            self._pending.append((key, idx, x, e, cand, True))
            return r
        if callable(window):
            window = window()
            if _no_window(window):
                return v.float().double()
        full = isinstance(window, torch.Tensor) and window.shape == v.shape
        r = _round(v)
        if k == n:
            idx, cand, x = _arange(n, v.device), _ones(n, v.device), _flat(v)
        else:
            w = window * SAFETY if bound.exact is None else window  # a dot's window has SAFETY in it
            mask = straddle_mask(v, w, positive=bound.exact is None)
            cand, idx = pick(_flat(mask), k)
            x = torch.take(v, idx)
        if k == n and bound.exact is not None and bound.dense is not None and n > SMALL_POINT:
            e = _flat(bound.dense())  # a crowded product: one product of magnitudes, not n gathered sums
        elif bound.exact is not None:
            e = bound.exact(idx, cand)
        elif full:
            e = _flat(window) if k == n else torch.take(window, idx)
        else:
            e = bound.at(idx)
        self._pending.append((key, idx, x, e if e.dtype == x.dtype else e.to(x.dtype), cand, k < n))
        return r

    def _flush(self) -> None:
        """Decide the pending candidates of the step at once and copy the result to the host (the
        step's one synchronisation): close calls exactly as `Bound.close_calls` decides them (the
        window v +- SAFETY * err, err > 0, holds a rounding midpoint), codes as `_log` writes them.
        Only the close calls travel (compacted on the device, with each picked point's count of
        candidates): a few MB of slots copied per step cost more on a GPU than its rounding points."""
        pending, self._pending = self._pending, []
        idx, x, e, cand = (_cat([p[i] for p in pending]) for i in (1, 2, 3, 4))
        ew = e * SAFETY
        close = cand.view(torch.bool) & (e > 0.0)
        close &= (x - ew).float().view(torch.int32) != (x + ew).float().view(torch.int32)
        r = x.float()
        ew = e * WIDE
        wide = ordinal((x + ew).float()) - ordinal((x - ew).float()) > 1
        code = torch.where(wide, (r.view(torch.int32).long() & 0xFFFFFFFF) | (1 << 32), ordinal(r) & 1)
        picks = [(p[0], p[1].numel()) for p in pending if p[5]]
        cap = flush_cap(close.numel())
        ends = _point_ends(pending, idx.device)
        at = torch.nonzero_static(close, size=cap, fill_value=-1).view(-1)
        head = [close.sum().view(1)] + ([_candidates_per_pick(cand, pending)] if picks else [])
        packed = _to_host(torch.cat([*head, *_in_point_order(at, idx, code, ends)]))
        count, counts, rest = int(packed[0]), packed[1 : 1 + len(picks)], packed[1 + len(picks) :]
        # every slot of a picked point a candidate: perhaps there were more than it has slots
        over = [key for (key, k), c in zip(picks, counts.tolist()) if c >= k]
        if over:
            names = ", ".join(self.name(k) for k in over)
            raise LogOverflow(f"rounding points {names}: as many candidates as slots or more", over)
        if count > cap:  # more close calls than the compact copy holds: all of them, in a second copy
            rest, cap = torch.cat(_in_point_order(close.nonzero().view(-1), idx, code, ends)).cpu().numpy(), count
        where, code = rest[:count], rest[cap : cap + count]
        point, idx = where >> _POINT_SHIFT, where & ((1 << _POINT_SHIFT) - 1)
        bounds = point.searchsorted(np.arange(len(pending) + 1))  # each point's close calls: a run
        keys, runs = [], []
        for j, p in enumerate(pending):
            if bounds[j] < bounds[j + 1]:
                keys.append(p[0])
                runs.append((bounds[j], bounds[j + 1]))
        self._store(keys, runs, idx, code)

    def _store(self, keys: list, runs: list, idx, code) -> None:
        """Keep a flush's close calls (per key, a run [lo, hi) of idx and code) as a FlatLog in key order
        (a large step logs over a million: no Python object each); merged as dicts where the step
        already holds entries (a flush after another)."""
        if len(set(keys)) < len(keys):  # one key twice (no step does it): dicts, the later run wins
            for key, (lo, hi) in zip(keys, runs):
                self._entries.update(FlatLog.from_runs([key], [(lo, hi)], idx, code).as_dict())
            return
        flat = FlatLog.from_runs(keys, runs, idx, code)
        if self._flat is None and not self._entries_dict:
            self._entries = flat
        else:
            self._entries.update(flat.as_dict())

    @staticmethod
    def _close_calls(v, bound):
        coarse = bound.max if bound.coarse is None else bound.coarse
        if callable(coarse):
            coarse = coarse()
        idx = straddle_index(v, coarse, SAFETY)
        if not idx.numel():
            return idx, torch.zeros(0, dtype=v.dtype, device=v.device)
        sub, err = bound.close_calls(idx, v.reshape(-1)[idx])
        return idx[sub], err

    def _log(self, key, v, r, idx, err):
        """Keep the codes of close calls (flat idx, bounds err) of v, rounded to r (float64 of float32s).

        Few per point: on Python floats, whose arithmetic and float32 packing are the same IEEE
        operations as the torch path's."""
        codes = []
        flat_v, flat_r = v.reshape(-1), r.reshape(-1)
        for x, e, c in zip(flat_v[idx].tolist(), err.tolist(), flat_r[idx].tolist()):
            ew = e * WIDE
            c = _f32_bits(c)
            if _ord32(_f32_bits(x + ew)) - _ord32(_f32_bits(x - ew)) > 1:
                codes.append(c & 0xFFFFFFFF)
            else:
                codes.append(bool(_ord32(c) & 1))
        self._entries[key] = (idx.tolist(), codes)

    def _refusal(self, key, element, too_wide: bool, e: float, scale: float) -> str:
        """Why a logged element was refused: its window is wider than REL_WINDOW allows, or it names no
        float32 inside its window. (scale + 0.0: a zero scale reads 0 whichever path, torch's reductions
        or the kernel's, found it.)"""
        if too_wide:
            return (
                f"rounding point {self.name(key)}: logged element {element} has a window of "
                f"+-{e:.3g}, wider than 2^-12 of the largest |value| there ({scale + 0.0:.3g}): not a close call"
            )
        return f"rounding point {self.name(key)}: logged element {element} is not a close call"

    def _apply(self, key, v, r, bound, scale=None):
        """Apply the log's entries at this point to r (float64 of float32s, a fresh tensor: changed in place).

        A handful of entries per point: decided on Python floats and ints, whose arithmetic and
        float32 packing are the same IEEE operations as torch's (one gather, one scatter, the bound)."""
        idx_list, codes = self._entries.pop(key)
        if len(idx_list) > entry_cap(r.numel()):
            raise LogMismatch(
                f"rounding point {self.name(key)}: {len(idx_list)} log entries, more than the "
                f"{entry_cap(r.numel())} allowed for its {r.numel()} outputs"
            )
        if len(codes) != len(idx_list):  # (a decoded log's never do; entries handed in directly might)
            raise LogMismatch(f"rounding point {self.name(key)}: {len(idx_list)} log entries, {len(codes)} codes")
        if idx_list[-1] >= r.numel() or bound.max == 0:
            if self.lenient:
                return r
            raise LogMismatch(f"rounding point {self.name(key)}: log entry {idx_list[-1]} does not exist")
        idx = torch.tensor(idx_list, dtype=torch.long, device=v.device)
        flat = r.view(-1)
        own = None
        out = []
        scale = native.max_abs(v) if scale is None else scale  # max |v|: given where the rounding pass found it
        if scale is None:
            scale = float(max_abs(v.detach())) if v.numel() else 0.0
        if bound.scale is not None:
            scale = max(scale, float(bound.scale))
        es = bound.at(idx) * DECODE
        # the loop below in C, with its gather and scatter (tens of thousands of entries a step at 15M
        # parameters; a few at a small model's point, where the Python around them was the cost)
        fast = None if self.lenient else native.apply_at(v.detach(), r, idx, es, codes, scale, bound.steers, REL_WINDOW)
        if fast is not None:
            bad, why, ratio = fast
            if bad >= 0:
                raise LogMismatch(self._refusal(key, idx_list[bad], why == 1, float(es[bad]), scale))
            self.max_ratio = max(self.max_ratio, ratio)
            return r
        xs = v.reshape(-1)[idx]
        for j, (x, e, code) in enumerate(zip(xs.tolist(), es.tolist(), codes)):
            if bound.steers and not e <= REL_WINDOW * scale:  # also NaN; a zero scale admits only zero windows
                if not self.lenient:
                    raise LogMismatch(self._refusal(key, idx_list[j], True, e, scale))
                e = 0.0  # lenient: no choice there (our own rounding below)
            elif e > 0 and bound.steers:
                self.max_ratio = max(self.max_ratio, e / scale)
            lo, hi = _ord32(_f32_bits(x - e)), _ord32(_f32_bits(x + e))
            if isinstance(code, bool):  # narrow: the one of the window's (at most) two floats with this parity
                o = lo if (lo & 1) == code else hi
                good = e > 0 and hi - lo <= 1 and (o & 1) == code
            else:  # wide: the prover's float32 itself, which must lie in our window
                o = _ord32(code - (1 << 32) if code >= 1 << 31 else code)
                good = e > 0 and lo <= o <= hi
            if not good:
                if not self.lenient:
                    raise LogMismatch(self._refusal(key, idx_list[j], False, e, scale))
                if own is None:
                    own = flat[idx].tolist()
                o = _ord32(_f32_bits(own[j]))  # lenient: keep our own rounding there
            out.append(_F32.unpack(_I32.pack(o if o >= 0 else (-1 - o) - (1 << 31)))[0])
        flat[idx] = torch.tensor(out, dtype=r.dtype, device=r.device)
        return r

    def _upload(self, device) -> dict:
        """The whole step's log on the device in one copy (a copy per rounding point would wait for
        the device each time): {key: (flat indices, codes, wide flags)}, codes as int64 (a parity
        bit, or a wide entry's float32 bits as a signed int32)."""
        if self._uploaded is None:
            keys = sorted(self._entries)
            idx, code, wide, spans, at = [], [], [], {}, 0
            for k in keys:
                i, c = self._entries[k]
                if len(c) != len(i):  # (as `_apply`: the table's spans would pair other points' entries off)
                    raise LogMismatch(f"rounding point {self.name(k)}: {len(i)} log entries, {len(c)} codes")
                if i[-1] >= 1 << 62:  # past any point's outputs (and int64): `_apply_deferred` refuses it by name
                    continue
                idx += i
                for x in c:
                    w = not isinstance(x, bool)
                    wide.append(w)
                    code.append((x - (1 << 32) if x >= 1 << 31 else x) if w else int(x))
                spans[k] = (at, len(i))
                at += len(i)
            host = torch.tensor([idx, code, wide], dtype=torch.long)
            if device.type != "cpu":
                host = host.pin_memory()
            dev = host.to(device, non_blocking=True)
            self._uploaded = {
                k: (dev[0, a : a + n], dev[1, a : a + n], dev[2, a : a + n].bool()) for k, (a, n) in spans.items()
            }
        return self._uploaded

    def _apply_deferred(self, key, v, r, bound):
        """`_apply` with element-wise ops on the device: the same choices, the same refusals, but the
        refusals are collected and raised by `finish` (the step's one wait for the device)."""
        uploaded = self._upload(v.device)
        idx_list, _ = self._entries.pop(key)
        if len(idx_list) > entry_cap(r.numel()):
            raise LogMismatch(
                f"rounding point {self.name(key)}: {len(idx_list)} log entries, more than the "
                f"{entry_cap(r.numel())} allowed for its {r.numel()} outputs"
            )
        if idx_list[-1] >= r.numel() or bound.max == 0:
            if self.lenient:
                return r
            raise LogMismatch(f"rounding point {self.name(key)}: log entry {idx_list[-1]} does not exist")
        idx, code, wide = uploaded[key]
        x = torch.take(v, idx)
        e = (bound.exact(idx) if bound.exact is not None else bound.at(idx)).to(x.dtype) * DECODE
        scale = max_abs(v.detach())
        if bound.scale is not None:
            scale = torch.maximum(scale, bound.scale.to(scale.dtype))
        window_ok = e <= scale * REL_WINDOW if bound.steers else e == e  # also NaN; a zero scale: zero windows
        used = window_ok & (e > 0.0)
        if bound.steers:
            self._ratios.append(torch.where(used, e / scale, 0.0).max())
        w = torch.where(window_ok, e, 0.0)
        lo, hi = ordinal((x - w).float()), ordinal((x + w).float())
        narrow = torch.where((lo & 1) == code, lo, hi)  # the window's float with the logged parity
        prover = torch.where(code >= 0, code, -1 - (code & 0x7FFFFFFF))  # a wide entry's own float
        o = torch.where(wide, prover, narrow)
        ok = used & torch.where(wide, (lo <= prover) & (prover <= hi), (hi - lo <= 1) & ((narrow & 1) == code))
        flat = r.view(-1)
        if self.lenient:  # keep our own rounding where the entry does not fit
            o = torch.where(ok, o, ordinal(torch.take(flat, idx).float()))
        else:
            self._checks.append((key, idx_list, ok, window_ok, e, scale))
        flat.index_copy_(0, idx, from_ordinal(o).to(r.dtype))
        return r

    def _apply_static(self, key, v, r, bound):
        """`_apply_deferred` over the point's fixed slots (static_log.py): the same choices and refusals,
        at the same ops whatever the log holds. A refusal is raised by `finish` as StaticRedo: the step
        is then replayed the deferred way, which names it."""
        if self._slots is None:
            self._slots = self.static.expand()
        off, k, n = self.static.points[key]
        s = self._slots
        idx, code, wide, valid, has, src = (t[off : off + k] for t in (s.idx, s.code, s.wide, s.valid, s.has, s.src))
        if k == n > SMALL_POINT and bound.exact is not None and bound.dense is not None:
            e = torch.take(bound.dense(), idx)  # a crowded product: one product of magnitudes, not n gathered sums
        else:
            e = bound.exact(idx, valid) if bound.exact is not None else bound.at(idx)
        e = e.to(v.dtype)
        scale = max_abs(v.detach())
        if bound.scale is not None:
            scale = torch.maximum(scale, bound.scale.to(scale.dtype))
        vals, bad, ratio = _static_decisions(v, idx, e, code, wide, valid, scale, bound.steers)
        if bound.steers:
            self._ratios.append(ratio.max())
        self._bad.append((key, bad.any()))
        flat = r.view(-1)
        # padding repeats the point's first entry and writes that entry's value (taken from its slot), or,
        # at a point without entries, its own rounding: every write to one output carries the same bits
        flat.index_copy_(0, idx, torch.where(has, torch.take(vals.to(r.dtype), src), torch.take(flat, idx)))
        return r

    def _settle(self) -> None:
        """Deferred replay: read the step's checks back at once; raise the first refusal as `_apply` would."""
        checks, ratios, bad = self._checks, self._ratios, self._bad
        self._checks, self._ratios, self._bad, self._slots = [], [], [], None
        if self.static is not None and {key for key, _ in bad} != self.static.points.keys():
            raise StaticRedo("the step's rounding points are not the layout's")  # entries must not go unapplied
        if not ratios and not checks and not bad:
            return
        device = (ratios[0] if ratios else checks[0][2] if checks else bad[0][1]).device
        ratios = ratios or [torch.zeros((), dtype=torch.float64, device=device)]
        flags = torch.cat([c[2] for c in checks]).all() if checks else torch.ones((), dtype=torch.bool, device=device)
        refused = torch.stack([b for _, b in bad]).any() if bad else torch.zeros((), dtype=torch.bool, device=device)
        ratio, good, refused = torch.stack(
            [torch.stack(ratios).max(), flags.to(torch.float64), refused.to(torch.float64)]
        ).tolist()
        if refused:
            raise StaticRedo("a log entry does not fit: replaying the step the deferred way to name it")
        self.max_ratio = max(self.max_ratio, ratio)
        if good:
            return
        for key, idx_list, ok, window_ok, e, scale in checks:
            bad = (~ok).nonzero().view(-1)
            if not bad.numel():
                continue
            j = int(bad[0])
            raise LogMismatch(self._refusal(key, idx_list[j], not bool(window_ok[j]), float(e[j]), float(scale)))

    def redo_deferred(self) -> None:
        """After StaticRedo: the same rounder, its log intact, ready to replay the step the deferred way."""
        self.static, self.allow_static, self.names = None, False, []
        self._checks, self._ratios, self._bad, self._slots, self._uploaded = [], [], [], None, None

    def name(self, key: int) -> str:
        op, slot = divmod(key, SLOTS)
        return f"{self.names[op] if op < len(self.names) else '?'}#{slot}"

    def finish(self) -> None:
        """Replay: every log entry must have been used by some rounding point of the step."""
        if self._pending:
            self._flush()
        self._settle()
        if self.static is not None:
            self._entries = {}  # a settled static step applied every entry (fill checked each has its point)
        if self.mode == "replay" and self._entries and not self.lenient:
            raise LogMismatch(f"rounding log names rounding point {min(self._entries)}, which the step never reached")


def _no_window(window) -> bool:
    """A bound given as a number that is not > 0 (zero, NaN): the point is exact, nothing to find."""
    return not isinstance(window, torch.Tensor) and not window > 0


def _static_decisions_torch(x, e, code, wide, valid, scale, steers: bool):
    """A static replay point's decisions with torch ops (the reference): per slot the value its entry
    chooses (float64 of a float32), whether a real entry does not fit, and its window / scale where
    applied (else 0). x: the point's values at the slots, e: their bounds (before DECODE)."""
    e = e * DECODE
    window_ok = e <= scale * REL_WINDOW if steers else e == e  # also NaN; a zero scale: zero windows
    used = window_ok & (e > 0.0) & valid
    ratio = torch.where(used, e / scale, 0.0)
    w = torch.where(window_ok, e, 0.0)
    lo, hi = ordinal((x - w).float()), ordinal((x + w).float())
    narrow = torch.where((lo & 1) == code, lo, hi)
    prover = torch.where(code >= 0, code, -1 - (code & 0x7FFFFFFF))
    o = torch.where(wide, prover, narrow)
    ok = used & torch.where(wide, (lo <= prover) & (prover <= hi), (hi - lo <= 1) & ((narrow & 1) == code))
    return from_ordinal(o).double(), valid & ~ok, ratio


_APPLY_CHECKED: set = set()  # kernel variants (kernels.apply_variant) that agreed with the torch ops on real entries
_APPLY_OFF: set = set()  # devices where the kernel once disagreed: the torch ops there from then on


def _static_decisions(v, idx, e, code, wide, valid, scale, steers: bool):
    """`_static_decisions_torch`, in one kernel where it runs (kernels.apply_slots). Until a variant of
    the kernel (what Triton compiles apart: device, `steers`, its pointers' alignment, the slot count's
    divisibility) has agreed with the torch ops on a point with real entries, both run (outside a graph's
    capture) and must agree bit for bit on every slot that is read (a real entry's value, every refusal
    flag, every ratio); a disagreement turns the kernel off on that device, with a warning."""
    device = v.device
    if device in _APPLY_OFF or not kernels.usable(v):
        return _static_decisions_torch(torch.take(v, idx), e, code, wide, valid, scale, steers)
    variant = kernels.apply_variant(v, idx, e, code, wide, valid, scale, steers)
    checked = variant in _APPLY_CHECKED
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    fast = None
    if checked or not capturing:
        fast = kernels.apply_slots(v, idx, e, code, wide, valid, scale, steers, DECODE, REL_WINDOW)
    if fast is None:
        return _static_decisions_torch(torch.take(v, idx), e, code, wide, valid, scale, steers)
    vals, bad, ratio = fast[0], fast[1].bool(), fast[2]
    if checked:
        return vals, bad, ratio
    ref = _static_decisions_torch(torch.take(v, idx), e, code, wide, valid, scale, steers)
    bits = lambda t: torch.where(valid, t, 0.0).view(torch.int64)  # -0 and NaN payloads compared exactly
    if not (
        torch.equal(bits(vals), bits(ref[0]))
        and torch.equal(bad, ref[1])
        and torch.equal(ratio.view(torch.int64), ref[2].view(torch.int64))
    ):
        _APPLY_OFF.add(device)
        warnings.warn("the static replay's kernel disagreed with the torch ops: using the torch ops", stacklevel=2)
        return ref
    if valid.any():  # a point without real entries compares no decision: not a check
        _APPLY_CHECKED.add(variant)
    return ref


def _round(v: torch.Tensor, in_place: bool = False) -> torch.Tensor:
    """float32(v) as a fresh float64 tensor: one fused pass where the kernel takes v, written over v there where
    in_place (the caller's own temporary: `Rounder.dot`'s owned)."""
    if v.dtype is torch.float64 and v.is_cpu and v.is_contiguous() and native.library():  # (`native.usable`)
        return native.round_f32(v, in_place)
    if v.dtype == torch.float64 and v.is_contiguous() and not v.requires_grad:
        # the same conversions as v.float().double(), through a reused float32 buffer: half the ops
        return torch.empty(v.shape, dtype=v.dtype, device=v.device).copy_(_scratch(v)[1].copy_(v))
    return v.float().double()


def _declined(bound: Bound) -> Bound:
    """The bound without its fused pass: the kernel has just declined the point (a crowded one, or memory),
    and would again (a whole pass over the output for nothing)."""
    bound.fused = None
    return bound


_ROUNDER_CALL = Rounder.__call__  # `Rounder._direct`: a replaced or overridden __call__ sees every point
_ACTIVE: list[Rounder] = []


@contextlib.contextmanager
def rounding(rounder: Rounder):
    """Make `rounder` the one the deterministic ops use inside the block."""
    _ACTIVE.append(rounder)
    try:
        yield rounder
    finally:
        _ACTIVE.pop()


def active() -> Rounder:
    if not _ACTIVE:
        raise RuntimeError("deterministic ops need an active Rounder (use `with rounding(r):`)")
    return _ACTIVE[-1]
