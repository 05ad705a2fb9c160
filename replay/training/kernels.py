"""Triton kernels for det64 on a GPU: a rounding point's candidate search in one pass, its candidates'
exact bounds in one more, and a static replay point's decisions in one (issue 18).

Why. Through a CUDA graph a recorded step of the 15M GPT still ran ~11,800 kernels for 69 ms of GPU
time against float32's 10 ms (bench/RESULTS.md, session 12): at each rounding point torch formed the
window (an outer product of norms), rounded both ends into buffers, compared them, compacted the
flags (a stream compaction of five kernels), gathered the values, and formed the exact bound of
*every* slot, filler included, in chunks of gathered rows and columns (~10 kernels a chunk, up to
25 chunks a point). Here:

* `pick` reads each output once: rounds it (the point's float32 result, as float64), forms its
  window (a product's Cauchy-Schwarz window ||A_i|| ||B_j|| g SAFETY + |bias| SAFETY, or a full
  bound times SAFETY), tests whether the window holds a rounding midpoint exactly as
  `determinism.straddle_mask` does (both ends rounded to float32, their bits compared), and
  appends the flagged outputs to the point's slots (index, value, and a full bound's value) with
  one atomic add per block. Slots fill in any order (`determinism.pick` allows it: `_flush` sorts a
  picked point's slots); slots left over stay zero, not candidates.
* `dot_exact` forms sum_k |A_ik B_kj| g + |bias| at the candidate slots only: a slot that is not a
  candidate (filler, or a static replay's padding) costs nothing, so a point's bound costs what its
  few candidates cost, not n / 64 gathered dot products.
* `pick_cross_entropy_back` is `pick` for the loss's gradient, its bound formed per element from the
  probabilities and the targets (the torch path's operations, in its order) and never as a tensor, the
  gradient rounded in its own place: at a real vocabulary these are the step's largest tensors, and the
  loss's backward held four at once through `pick_full`, two here.
* `apply_slots` makes a static replay point's decisions over its log slots (`determinism.
  _static_decisions_torch` in one pass); `determinism._static_decisions` checks each compiled variant
  against the torch ops before trusting it (`apply_variant`).

Exactness. A rounding point's value is `float32(v)` whatever finds its candidates, so the step's
state is unchanged; the candidate test is `straddle_mask`'s own IEEE operations (no fused
multiply-add: every launch passes enable_fp_fusion=False); the exact bound sums its terms in
another order than torch, which SAFETY's slack absorbs as it does any machine's order
(determinism.py). Scalars reach a kernel as a float64's bits in an int64 (Triton would round a
Python float argument to float32).

Used on CUDA tensors when Triton imports (`REPLAY_TRITON=0` turns it off: the torch path is the
reference). On the CPU only for the suite (`REPLAY_TRITON=cpu`, in a process started with
`TRITON_INTERPRET=1`), where Triton's interpreter runs the same kernels in numpy: that is how the
suite tests them without a GPU (tests/replay/training/test_kernels.py; tests/replay/conftest.py sets
it).
"""

from __future__ import annotations

import contextlib
import os
import struct
import warnings

import torch

triton = tl = None  # imported on first use (`_import`): Triton reads TRITON_INTERPRET when it is imported

PICK_BLOCK = 1024
EXACT_SLOTS, EXACT_TERMS = 32, 64
INTERPRETED_SLOTS = 4096  # the interpreter runs a kernel's programs one by one: fewer, larger ones


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


_BROKEN: list = []  # a launch that failed (a GPU or driver Triton cannot build for): the torch path from then on


def usable(*tensors: torch.Tensor) -> bool:
    """Do the kernels take these tensors: Triton there and not turned off, and all on one GPU; on the
    CPU only for the suite (REPLAY_TRITON=cpu, under Triton's interpreter)."""
    want = os.environ.get("REPLAY_TRITON", "1")
    device = tensors[0].device
    if want == "0" or device.type not in ("cuda", "cpu") or (device.type == "cpu" and want != "cpu"):
        return False
    return not _BROKEN and all(t.device == device for t in tensors) and _import()


def _launch(kernel: int, grid: tuple, *args, **kwargs) -> bool:
    """Run one of the kernels on its first argument's device (Triton launches on the current one: a
    verifier may run on cuda:1 while cuda:0 is current); False (with a warning, once) where Triton
    fails to build or launch it: the caller then takes the torch path, which gives the same values."""
    device = args[0].device
    try:
        with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
            _jit()[kernel][grid](*args, **kwargs)
    except Exception as exc:  # any failure of the compiler or the driver: the torch path is always right
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise  # inside a graph's capture: graphs.py falls back to the eager step
        _BROKEN.append(repr(exc))
        warnings.warn(f"Triton kernel failed, using the torch path: {exc!r}", stacklevel=3)
        return False
    return True


_MISSING: list = []  # Triton failed to import once: not searched for again on every rounding point


def _import() -> bool:
    global triton, tl
    if triton is None and not _MISSING:
        try:
            import triton as _triton
            import triton.language as _tl
        except ImportError:  # the CPU build of torch comes without Triton: the torch path runs
            _MISSING.append(True)
            return False
        triton, tl = _triton, _tl
    return triton is not None


def _bits(x: float) -> int:
    """x as the int64 of its float64 bits: a kernel bitcasts it back, bit for bit."""
    return struct.unpack("<q", struct.pack("<d", x))[0]


_KERNELS: list = []


def _jit():
    """The kernels, defined on first use (after `_import`): for the GPU, or for Triton's interpreter
    where the process started with TRITON_INTERPRET=1 (Triton decides that when it is imported)."""
    if not _KERNELS:
        _KERNELS.extend(_define())
    return _KERNELS


def _block(gpu: int) -> int:
    """A kernel's block: `gpu` elements, or larger ones under the interpreter, which runs a kernel's
    programs one by one."""
    return INTERPRETED_SLOTS if interpreting() else gpu


def _define():

    @triton.jit
    def _pick_kernel(
        v_ptr,
        r_ptr,
        win_ptr,
        na_ptr,
        nb_ptr,
        bias_ptr,
        idx_ptr,
        x_ptr,
        e_ptr,
        cand_ptr,
        count_ptr,
        n,
        rows,
        cols,
        k,
        safety_bits,
        DOT: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        BIAS_ROWS: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inside = offs < n
        x = tl.load(v_ptr + offs, mask=inside, other=0.0)
        tl.store(r_ptr + offs, x.to(tl.float32).to(tl.float64), mask=inside)
        if DOT:
            col = offs % cols
            row = offs // cols  # batch and row together: the norms are laid out (batch, rows)
            w = tl.load(na_ptr + row, mask=inside, other=0.0) * tl.load(
                nb_ptr + (row // rows) * cols + col, mask=inside, other=0.0
            )
            if HAS_BIAS:
                if BIAS_ROWS:
                    w = w + tl.load(bias_ptr + row % rows, mask=inside, other=0.0)
                else:
                    w = w + tl.load(bias_ptr + col, mask=inside, other=0.0)
            positive = inside
        else:
            e = tl.load(win_ptr + offs, mask=inside, other=0.0)
            w = e * safety_bits.to(tl.float64, bitcast=True)
            positive = inside & (w > 0.0)
        lo = (x - w).to(tl.float32).to(tl.int32, bitcast=True)
        hi = (x + w).to(tl.float32).to(tl.int32, bitcast=True)
        flag = positive & (lo != hi)
        f = flag.to(tl.int32)
        base = tl.atomic_add(count_ptr, tl.sum(f, 0).to(tl.int64))  # int64: no count or slot wraps
        at = base + tl.cumsum(f, 0).to(tl.int64) - 1
        keep = flag & (at < k)
        tl.store(idx_ptr + at, offs, mask=keep)
        tl.store(x_ptr + at, x, mask=keep)
        tl.store(cand_ptr + at, f.to(tl.uint8), mask=keep)
        if not DOT:
            tl.store(e_ptr + at, e, mask=keep)

    @triton.jit
    def _dot_exact_kernel(
        a_ptr,
        b_ptr,
        idx_ptr,
        valid_ptr,
        bias_ptr,
        out_ptr,
        slots,
        rows,
        cols,
        terms,
        batch1,
        sa0,
        sa1,
        sam,
        sak,
        sb0,
        sb1,
        sbk,
        sbn,
        g_bits,
        HAS_VALID: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        BIAS_ROWS: tl.constexpr,
        SLOTS: tl.constexpr,
        TERMS: tl.constexpr,
    ):
        s = tl.program_id(0).to(tl.int64) * SLOTS + tl.arange(0, SLOTS)
        inside = s < slots
        if HAS_VALID:
            valid = inside & (tl.load(valid_ptr + s, mask=inside, other=0) != 0)
        else:
            valid = inside
        f = tl.load(idx_ptr + s, mask=valid, other=0)
        j = f % cols
        t = f // cols
        i = t % rows
        t = t // rows
        a_row = (t // batch1) * sa0 + (t % batch1) * sa1 + i * sam
        b_col = (t // batch1) * sb0 + (t % batch1) * sb1 + j * sbn
        acc = tl.zeros((SLOTS,), dtype=tl.float64)
        end = tl.max(valid.to(tl.int32), 0) * terms  # a block without candidates reads nothing
        for k0 in range(0, end, TERMS):
            kk = (k0 + tl.arange(0, TERMS)).to(tl.int64)  # times a stride: past 2^31 at a vocabulary's width
            m = valid[:, None] & (kk < terms)[None, :]
            av = tl.load(a_ptr + a_row[:, None] + kk[None, :] * sak, mask=m, other=0.0)
            bv = tl.load(b_ptr + b_col[:, None] + kk[None, :] * sbk, mask=m, other=0.0)
            acc += tl.sum(tl.abs(av * bv), 1)
        e = acc * g_bits.to(tl.float64, bitcast=True)
        if HAS_BIAS:
            if BIAS_ROWS:
                e = e + tl.load(bias_ptr + i, mask=valid, other=0.0)
            else:
                e = e + tl.load(bias_ptr + j, mask=valid, other=0.0)
        tl.store(out_ptr + s, tl.where(valid, e, 0.0), mask=inside)

    @triton.jit
    def _apply_kernel(
        v_ptr,
        idx_ptr,
        e_ptr,
        code_ptr,
        wide_ptr,
        valid_ptr,
        scale_ptr,
        vals_ptr,
        bad_ptr,
        ratio_ptr,
        slots,
        decode_bits,
        rel_bits,
        STEERS: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        s = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inside = s < slots
        x = tl.load(v_ptr + tl.load(idx_ptr + s, mask=inside, other=0), mask=inside, other=0.0)
        e = tl.load(e_ptr + s, mask=inside, other=0.0) * decode_bits.to(tl.float64, bitcast=True)
        scale = tl.load(scale_ptr)
        if STEERS:
            window_ok = e <= scale * rel_bits.to(tl.float64, bitcast=True)
        else:
            window_ok = e == e
        valid = tl.load(valid_ptr + s, mask=inside, other=0) != 0
        used = window_ok & (e > 0.0) & valid
        ratio = tl.where(used, e / tl.where(used, scale, 1.0), 0.0)  # (no 0 / 0 where unused)
        w = tl.where(window_ok, e, 0.0)
        lo = (x - w).to(tl.float32).to(tl.int32, bitcast=True).to(tl.int64)  # `determinism.ordinal`, inline
        lo = tl.where(lo >= 0, lo, -1 - (lo & 0x7FFFFFFF))
        hi = (x + w).to(tl.float32).to(tl.int32, bitcast=True).to(tl.int64)
        hi = tl.where(hi >= 0, hi, -1 - (hi & 0x7FFFFFFF))
        code = tl.load(code_ptr + s, mask=inside, other=0)
        wide = tl.load(wide_ptr + s, mask=inside, other=0) != 0
        narrow = tl.where((lo & 1) == code, lo, hi)
        prover = tl.where(code >= 0, code, -1 - (code & 0x7FFFFFFF))
        o = tl.where(wide, prover, narrow)
        fits = tl.where(wide, (lo <= prover) & (prover <= hi), (hi - lo <= 1) & ((narrow & 1) == code))
        ok = used & fits
        bits = tl.where(o >= 0, o, (-1 - o) - 2147483648).to(tl.int32)
        tl.store(vals_ptr + s, bits.to(tl.float32, bitcast=True).to(tl.float64), mask=inside)
        tl.store(bad_ptr + s, (valid & ~ok).to(tl.uint8), mask=inside)
        tl.store(ratio_ptr + s, ratio, mask=inside)

    @triton.jit
    def _pick_cross_entropy_back_kernel(
        v_ptr,
        r_ptr,
        p_ptr,
        t_ptr,
        c_ptr,
        idx_ptr,
        x_ptr,
        e_ptr,
        cand_ptr,
        count_ptr,
        n,
        vocab,
        k,
        u_bits,
        g_bits,
        safety_bits,
        BLOCK: tl.constexpr,
    ):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inside = offs < n
        x = tl.load(v_ptr + offs, mask=inside, other=0.0)
        tl.store(r_ptr + offs, x.to(tl.float32).to(tl.float64), mask=inside)  # r may be v: its x is read first
        p = tl.load(p_ptr + offs, mask=inside, other=0.0)
        target = tl.load(t_ptr + offs // vocab, mask=inside, other=-1)
        d = tl.where(offs % vocab == target, p + -1.0, p)  # p - onehot as the torch path forms it: p + -1 at the target
        u = u_bits.to(tl.float64, bitcast=True)
        # ops._CrossEntropy.backward's err, its operations in its order: (|p - onehot| U + p g) |c| + |v| (2 U)
        e = ((tl.abs(d) * u + p * g_bits.to(tl.float64, bitcast=True)) * tl.abs(tl.load(c_ptr))) + tl.abs(x) * (u * 2.0)
        w = e * safety_bits.to(tl.float64, bitcast=True)
        lo = (x - w).to(tl.float32).to(tl.int32, bitcast=True)
        hi = (x + w).to(tl.float32).to(tl.int32, bitcast=True)
        flag = inside & (w > 0.0) & (lo != hi)
        f = flag.to(tl.int32)
        base = tl.atomic_add(count_ptr, tl.sum(f, 0).to(tl.int64))
        at = base + tl.cumsum(f, 0).to(tl.int64) - 1
        keep = flag & (at < k)
        tl.store(idx_ptr + at, offs, mask=keep)
        tl.store(x_ptr + at, x, mask=keep)
        tl.store(cand_ptr + at, f.to(tl.uint8), mask=keep)
        tl.store(e_ptr + at, e, mask=keep)

    return _pick_kernel, _dot_exact_kernel, _apply_kernel, _pick_cross_entropy_back_kernel


def pick_full(v: torch.Tensor, window: torch.Tensor, safety: float, k: int):
    """A rounding point whose bound is a tensor of v's shape: (float32(v) as float64, the k slots'
    flat indices, values, bounds and candidate flags (uint8)), or None where the kernel does not
    take v. A slot holds an output whose window v +- safety * bound, bound > 0, holds a rounding
    midpoint; every such output has one while there are at most k."""
    if not (v.is_contiguous() and window.is_contiguous() and window.dtype == v.dtype == torch.float64):
        return None
    if not _import():
        return None
    return _pick(v, window, None, None, None, False, safety, k)


def pick_dot(v: torch.Tensor, na: torch.Tensor, nb: torch.Tensor, bias, bias_rows: bool, k: int):
    """`pick_full` for a product C (..., M, N): the window of output (i, j) is na_i nb_j (+ bias_j, or
    bias_i with bias_rows), na (..., M) and nb (..., N) given with SAFETY in them; no bound slot."""
    if not v.is_contiguous() or v.dtype != torch.float64 or not _import():
        return None
    rows, cols = v.shape[-2], v.shape[-1]
    na = na.expand(v.shape[:-1]).reshape(-1)  # laid out (batch, rows) and (batch, cols), as the kernel reads
    nb = nb.expand(v.shape[:-2] + (cols,)).reshape(-1)
    return _pick(v, None, na, nb, bias, bias_rows, 1.0, k, rows, cols)


def pick_cross_entropy_back(v, p, targets, c, u: float, g: float, safety: float, k: int):
    """`pick_full` for the cross-entropy's gradient v (N, V), (p - onehot(targets)) * c with c = dL/dloss / N a 0-d
    tensor, its bound ((|p - onehot| u + p g) |c| + |v| 2u, `ops._CrossEntropy.backward`'s) formed per element in the
    kernel and never as a tensor; float32(v) written over v, the caller's own (at a real vocabulary these are a step's
    largest tensors: a GPU's det64 step peaks there with the probabilities, the gradient, its bound and its rounding);
    None where the kernel does not take them."""
    f64 = torch.float64
    if not (v.dim() == 2 and v.shape == p.shape and v.dtype == p.dtype == c.dtype == f64 and c.numel() == 1):
        return None
    if not (v.is_contiguous() and p.is_contiguous() and targets.is_contiguous() and c.is_contiguous()):
        return None
    if targets.dtype != torch.int64 or targets.shape != v.shape[:1] or not _import():
        return None
    r, idx, x, e, cand, count = _slots(v, k, bounds=True, out=v)
    block = _block(PICK_BLOCK)
    grid = (triton.cdiv(v.numel(), block),)
    args = (v, r, p, targets, c, idx, x, e, cand, count, v.numel(), v.shape[1], k, _bits(u), _bits(g), _bits(safety))
    ran = _launch(3, grid, *args, BLOCK=block, enable_fp_fusion=False)
    return (r, idx, x, e, cand) if ran else None


def _slots(v: torch.Tensor, k: int, bounds: bool, out=None) -> tuple:
    """A pick's output (float32(v) as float64: `out`, or a new tensor) and k slots (flat indices, values, bounds where
    `bounds`, candidate flags), zeros (not candidates), and the count the kernel's blocks add to."""
    dev = v.device
    r = out if out is not None else torch.empty(v.shape, dtype=torch.float64, device=dev)
    words = torch.zeros(2 * k + 1, dtype=torch.int64, device=dev)  # slots start as zeros: not candidates
    idx, x = words[:k], words[k : 2 * k].view(torch.float64)
    cand = torch.zeros(k, dtype=torch.uint8, device=dev)
    e = torch.zeros(k, dtype=torch.float64, device=dev) if bounds else None
    return r, idx, x, e, cand, words[2 * k :]


def _pick(v, window, na, nb, bias, bias_rows, safety, k, rows=1, cols=1):
    n = v.numel()
    r, idx, x, e, cand, count = _slots(v, k, bounds=window is not None)
    dot = window is None
    anything = v  # a pointer for the arguments a variant does not read
    block = _block(PICK_BLOCK)
    ran = _launch(
        0,
        (triton.cdiv(n, block),),
        v,
        r,
        window if window is not None else anything,
        na if dot else anything,
        nb if dot else anything,
        bias if bias is not None else anything,
        idx,
        x,
        e if e is not None else anything,
        cand,
        count,
        n,
        rows,
        cols,
        k,
        _bits(safety),
        DOT=dot,
        HAS_BIAS=bias is not None,
        BIAS_ROWS=bias_rows,
        BLOCK=block,
        enable_fp_fusion=False,
    )
    return (r, idx, x, e, cand) if ran else None


def _batch2(t: torch.Tensor, batch: tuple):
    """t (..., R, C) broadcast to batch + (R, C), as the strides of two batch dims (or None)."""
    if len(batch) > 2:
        return None
    full = t.expand(batch + tuple(t.shape[-2:]))
    strides = (0,) * (2 - len(batch)) + full.stride()[:-2]
    return full, strides, full.stride()[-2], full.stride()[-1], (1,) * (2 - len(batch)) + tuple(full.shape[:-2])


def dot_exact(a, b, g: float, bias, bias_rows: bool, out_shape: tuple, idx: torch.Tensor, valid=None):
    """g sum_k |A_ik B_kj| (+ |bias|, given scaled) at flat output indices idx of C = A @ B (batch dims
    broadcast to out_shape's); 0 where `valid` (uint8 or bool per slot) is false. None where the
    kernel does not take the operands."""
    if a.dtype != torch.float64 or b.dtype != torch.float64 or idx.numel() == 0 or not g > 0 or not _import():
        return None
    batch = tuple(out_shape[:-2])
    pa, pb = _batch2(a, batch), _batch2(b, batch)
    if pa is None or pb is None:
        return None
    (a4, (sa0, sa1), sam, sak, bat), (b4, (sb0, sb1), sbk, sbn, _) = pa, pb
    out = torch.empty(idx.numel(), dtype=torch.float64, device=idx.device)
    slots = idx.numel()
    block = _block(EXACT_SLOTS)
    ran = _launch(
        1,
        (triton.cdiv(slots, block),),
        a4,
        b4,
        idx,
        valid.view(torch.uint8) if valid is not None else idx,
        bias if bias is not None else out,
        out,
        slots,
        out_shape[-2],
        out_shape[-1],
        a.shape[-1],
        bat[1],
        sa0,
        sa1,
        sam,
        sak,
        sb0,
        sb1,
        sbk,
        sbn,
        _bits(g),
        HAS_VALID=valid is not None,
        HAS_BIAS=bias is not None,
        BIAS_ROWS=bias_rows,
        SLOTS=block,
        TERMS=EXACT_TERMS,
        enable_fp_fusion=False,
    )
    return out if ran else None


def apply_variant(v, idx, e, code, wide, valid, scale, steers: bool) -> tuple:
    """What Triton compiles `apply_slots` apart for: the device, `steers`, each pointer's 16-byte alignment,
    and whether the slot count is 1 or a multiple of 16 (its specialisations): a check of one variant
    says nothing of another."""
    aligned = tuple(t.data_ptr() % 16 == 0 for t in (v, idx, e, code, wide, valid, scale))
    slots = idx.numel()
    return (v.device, steers, aligned, slots == 1, slots % 16 == 0)


def apply_slots(v, idx, e, code, wide, valid, scale, steers: bool, decode: float, rel_window: float):
    """A static replay point's decisions (`Rounder._static_decisions`) in one pass over its slots:
    (each slot's value as float64, whether a real entry does not fit (uint8), its window / scale where
    applied, else 0), or None where the kernel does not take them."""
    slots, dev = idx.numel(), v.device
    laid_out = all(t.is_contiguous() and t.numel() == slots and t.device == dev for t in (idx, e, code, wide, valid))
    typed = (v.dtype, idx.dtype, e.dtype, code.dtype, wide.dtype, valid.dtype, scale.dtype) == (
        torch.float64,
        torch.int64,
        torch.float64,
        torch.int64,
        torch.bool,
        torch.bool,
        torch.float64,
    )
    if not (laid_out and typed and v.is_contiguous() and scale.numel() == 1 and _import()):
        return None
    vals = torch.empty(slots, dtype=torch.float64, device=dev)
    bad = torch.empty(slots, dtype=torch.uint8, device=dev)
    ratio = torch.empty(slots, dtype=torch.float64, device=dev)
    block = _block(PICK_BLOCK)
    ran = _launch(
        2,
        (triton.cdiv(slots, block),),
        v,
        idx,
        e,
        code,
        wide.view(torch.uint8),
        valid.view(torch.uint8),
        scale,
        vals,
        bad,
        ratio,
        slots,
        _bits(decode),
        _bits(rel_window),
        STEERS=steers,
        BLOCK=block,
        enable_fp_fusion=False,
    )
    return (vals, bad, ratio) if ran else None
