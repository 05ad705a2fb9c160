"""The replay's hot loops in C (`_native.c`), built on first use and loaded with ctypes: a rounding
point's whole record pass (round, find the close calls, their log codes), rounding alone, a replay's
exact bounds and entries, the optimizer updates, and a convolution's im2col and col2im (exact copies,
F.fold's additions in its order).

Optional by design: the torch code in determinism.py and train.py is the reference and the
fallback, so a machine without a C compiler records and replays the same bits, only slower. The
kernels take CPU tensors; anything else (a GPU, odd strides, more than two batch dims) takes the
torch path. `REPLAY_NATIVE=0` turns them off.

Why ctypes and a plain C file rather than a torch C++ extension: no torch headers, so it builds in
well under a second (a torch extension takes about a minute), and the ABI is just pointers.
Built with -fopenmp where the compiler has it (GCC's runtime is the libgomp torch loads: the kernels'
loops share torch's threads; their results do not depend on the thread count) and
-ffp-contract=off (no fused multiply-add: each + - * rounds as in the torch path);
-march=native only schedules the same IEEE operations in wider vectors. The library is cached
per source, compiler and CPU under $REPLAY_NATIVE_CACHE (default ~/.cache/chipledger-replay),
written to a temporary name and renamed, so concurrent first uses do not collide.
"""

from __future__ import annotations

import ctypes
import os
import platform
import resource
import shutil
import struct
import threading
import warnings
from pathlib import Path

import numpy as np
import torch

from replay.training import build, step_allocator

SOURCE = Path(__file__).with_name("_native.c")
FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-fPIC", "-shared", "-std=c99"]
# x86: 512-bit vectors where the CPU has AVX-512 (GCC and Clang tune Intel's server CPUs for 256 bits): the same IEEE
# operations, twice as many an instruction (det64 steps 3-4% faster on an AVX-512 Xeon: mlp, cnn-32, gpt-3.3m); a
# no-op without AVX-512. Tried first; a compiler that does not know it builds without (`_build`).
WIDE_VECTORS = ["-mprefer-vector-width=512"] if platform.machine().lower() in ("x86_64", "amd64") else []
# tried first: GCC's OpenMP runtime is libgomp, which torch's CPU build loads (the kernels' parallel loops share
# its thread pool); a compiler without it builds the same kernels single-threaded
OPENMP = ["-fopenmp"]
_LOCK = threading.Lock()
_LIB: ctypes.CDLL | bool | None = None  # None: not tried yet; False: unavailable

_d = ctypes.c_double
_i = ctypes.c_int64
_p = ctypes.c_void_p
# rp_dot's and rp_full's argument blocks (`dot_args_t`, `full_args_t` in _native.c), fields in order, each
# 8 bytes: a pointer Q, an integer q, a double d. One packed block per call, where ctypes converting each
# of 29 arguments was most of a small rounding point's cost; the library says its sizes (`rp_args_sizes`).
_DOT_ARGS = struct.Struct("=2Q6qQ5qQ5qQ2q2Q4dq2Qq")
_FULL_ARGS = struct.Struct("=2Q2qQq2dq2Qq")
_LN_ARGS = struct.Struct("=6Q2q6dq2QqQ3Q")  # ln_args_t
_LN_BACK_ARGS = struct.Struct("=7Q2q5dq2QqQ3Q")  # ln_back_args_t
_SOFTMAX_ARGS = struct.Struct("=4Q2q5dq2Qq")  # softmax_args_t
_DOT_REPLAY_ARGS = struct.Struct("=2Q6qQ5qQ5qQq2d2q2Qq2dq4Q")  # dot_replay_args_t
_AXIS_SUMS_ARGS = struct.Struct("=3Q3q3dq2Qq")  # axis_sums_args_t
_CE_ARGS = struct.Struct("=3Q2q5dqQ2dQ2Qq")  # ce_args_t
_CE_BACK_ARGS = struct.Struct("=4Q2q5dq2Qq")  # ce_back_args_t
_FULL_REPLAY_ARGS = struct.Struct("=2Q2qQ2q2Qq3d2q3QQ")  # full_replay_args_t
_OUTER_ARGS = struct.Struct("=2Q3q2Q3dq2Qq")  # outer_args_t


def _cpu_id() -> str:
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        flags = ""
    return f"{platform.machine()} {flags}"


def compiler() -> str | None:
    """The C compiler the kernel is built with: $CC, else cc, gcc or clang on PATH; None where there is none."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def _build() -> Path:
    cc = compiler()
    if not cc:
        raise OSError("no C compiler (cc, gcc or clang) on PATH")
    flags = FLAGS + WIDE_VECTORS + OPENMP
    # where the compiler refuses a flag: without the wide vectors, then without OpenMP, then without both
    tries = [flags, FLAGS + OPENMP, FLAGS + WIDE_VECTORS, FLAGS] if WIDE_VECTORS else [flags, FLAGS]
    return build.compiled(cc, SOURCE, tries, ["-lm"], "rounding", _cpu_id())


def _blocks_match(lib) -> bool:
    """Does the library's every argument block (`rp_args_size`) have the size this module packs?"""
    blocks = (_DOT_ARGS, _FULL_ARGS, _LN_ARGS, _LN_BACK_ARGS, _SOFTMAX_ARGS, _DOT_REPLAY_ARGS)
    blocks += (_AXIS_SUMS_ARGS, _CE_ARGS, _CE_BACK_ARGS, _FULL_REPLAY_ARGS, _OUTER_ARGS)
    sizes = [lib.rp_args_size(i) for i in range(len(blocks) + 1)]
    return sizes == [b.size for b in blocks] + [-1]


def library() -> ctypes.CDLL | None:
    """The loaded kernel, or None where it is turned off or cannot be built (warned once)."""
    global _LIB
    if _LIB is None:
        with _LOCK:
            if _LIB is None:
                _LIB = _load()
    return _LIB or None


def _load():
    lib = build.loaded("REPLAY_NATIVE", _build, "fused rounding kernel unavailable, using the torch path")
    if not lib:
        return False
    lib.rp_max_abs.argtypes = [_p, _i, _i]
    lib.rp_max_abs.restype = _d
    lib.rp_round.argtypes = [_p, _p, _i, _i]
    lib.rp_relu_back.argtypes, lib.rp_relu_back.restype = [_p, _p, _p, _i, _i], None
    lib.rp_round_max.argtypes, lib.rp_round_max.restype = [_p, _p, _i, _i], _d
    lib.rp_round.restype = None
    lib.rp_args_size.argtypes, lib.rp_args_size.restype = [_i], _i
    lib.rp_vector_lanes.argtypes, lib.rp_vector_lanes.restype = [], _i
    if ctypes.sizeof(_p) != 8 or not _blocks_match(lib):
        warnings.warn(
            "replay: fused rounding kernel's argument blocks do not match, using the torch path",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    lib.rp_dot.argtypes = [ctypes.c_char_p]
    lib.rp_dot.restype = _i
    lib.rp_dot_replay.argtypes, lib.rp_dot_replay.restype = [ctypes.c_char_p], _i
    lib.rp_dot_at.argtypes = [_i] * 6 + [_p] + [_i] * 5 + [_p] + [_i] * 5 + [_p, _i, _d, _i, _p, _i, _p]
    lib.rp_dot_at.restype = _i
    lib.rp_row_col_norms.argtypes, lib.rp_row_col_norms.restype = [_p, _i, _i, _i, _i, _p, _p, _i], _i
    lib.rp_abs_sums.argtypes = [_p, _i, _i, _i, _p, _i]
    lib.rp_abs_sums.restype = None
    lib.rp_apply_at.argtypes = [_p, _p, _i, _p, _p, _p, _i, _d, _i, _d, _p, _p]
    lib.rp_apply_at.restype = _i
    lib.rp_full.argtypes = [ctypes.c_char_p]
    lib.rp_full.restype = _i
    for fn in (lib.rp_layer_norm, lib.rp_layer_norm_back, lib.rp_softmax, lib.rp_axis_sums, lib.rp_ce_forward):
        fn.argtypes, fn.restype = [ctypes.c_char_p], _i
    lib.rp_ce_backward.argtypes, lib.rp_ce_backward.restype = [ctypes.c_char_p], _i
    lib.rp_full_replay.argtypes, lib.rp_full_replay.restype = [ctypes.c_char_p], _i
    lib.rp_round_outer.argtypes, lib.rp_round_outer.restype = [ctypes.c_char_p], _i
    lib.rp_softmax_shift.argtypes, lib.rp_softmax_shift.restype = [_p, _p, _i, _i, _i], None
    lib.rp_im2col.argtypes = [_p, ctypes.c_char_p, ctypes.c_char_p, _p, _p, _i]
    lib.rp_im2col.restype = None
    lib.rp_col2im.argtypes = [_p, ctypes.c_char_p, ctypes.c_char_p, _p, _i]
    lib.rp_col2im.restype = None
    lib.rp_softmax_err.argtypes = [_p, _p, _p, _i, _i, _d, _d, _d, _p, _i]
    lib.rp_softmax_err.restype = None
    _b = ctypes.c_char_p  # a bytes object's buffer (`_each_parameter`'s packed arrays)
    lib.rp_adamw_many.argtypes = [_i, _b, _b, _b] + [_d] * 9
    lib.rp_adamw_many.restype = None
    lib.rp_sgd_many.argtypes = [_i, _b, _b, _b, _d, _i, _d, _d]
    lib.rp_sgd_many.restype = None
    lib.rp_decode_log.argtypes = [ctypes.c_char_p, _i, _i, _p, _p, _p, _p, _p, _p]
    lib.rp_decode_log.restype = _i
    lib.rp_encode_log.argtypes = [_p, _p, _p, _i, _p, _p, _i, _p, _i]
    lib.rp_encode_log.restype = _i
    return lib


_TUNED = False


def tune_allocator() -> None:
    """Keep freed memory in the process instead of returning it to the OS (once).

    A deterministic step allocates the same large float64 temporaries every step. glibc serves
    blocks over its mmap threshold with fresh mmaps and trims the heap top on free, so each step
    page-faults all of them in again: a third of a small model's step time here. Blocks of 64 KiB and
    more go to the step allocator (`step_allocator`: kept mapped, reused best fit in segments of their
    own); the smaller ones stay on glibc's heap, whose top is no longer trimmed (trim threshold 1 GiB).
    Where the step allocator is unavailable, the large blocks are glibc's too: its mmap threshold is raised
    to its 32 MiB cap, and mmap is off altogether (M_MMAP_MAX 0: a rounding pass over 4M outputs 22 -> 6
    ms, its product's GEMM 62 -> 44 ms), except in a process under an address-space cap (the verifier's
    subprocess, RLIMIT_AS): the heap keeps freed holes a larger block cannot reuse, so its
    address space may grow past its live memory, and a step near the cap must not fail for that. Called by
    the first deterministic step: processes that record or replay (the prover's CLI, the verifier's
    subprocess, in-process recordings: the scenario runner, the tests). Numerics do not depend on it.
    """
    global _TUNED
    if _TUNED:
        return
    _TUNED = True
    large_blocks_taken = step_allocator.install()
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return  # not glibc
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4
    mallopt(M_TRIM_THRESHOLD, 1 << 30)
    if large_blocks_taken:  # glibc's blocks are under 64 KiB, under its mmap threshold
        return
    mallopt(M_MMAP_THRESHOLD, 32 << 20)
    if resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY:
        mallopt(M_MMAP_MAX, 0)


def usable(*tensors: torch.Tensor) -> bool:
    """Can the kernel take these tensors (CPU float64)? (A loop: called several times a rounding point,
    where a generator in `all` cost a small point a microsecond.)"""
    for t in tensors:  # noqa: SIM110 (a loop, not all(): see above)
        if t.dtype is not _F64 or not t.is_cpu:
            return False
    return True


_F64, _F32 = torch.float64, torch.float32


def max_abs(v: torch.Tensor) -> float | None:
    """max |v| as a Python float (NaN if any is NaN; +0.0 for no values or all zeros), or None where the
    kernel cannot take v (CPU float64 contiguous)."""
    lib = library()
    if lib is None or not (v.is_contiguous() and usable(v)):
        return None
    return lib.rp_max_abs(v.data_ptr(), v.numel(), threads(v))


def round_f32(v: torch.Tensor, in_place: bool = False) -> torch.Tensor:
    """float32(v) as a new contiguous float64 tensor (v CPU float64 contiguous: its like is contiguous too), or
    written over v (in_place: the caller's own temporary)."""
    out, n = v if in_place else torch.empty_like(v), v.numel()
    library().rp_round(v.data_ptr(), out.data_ptr(), n, _threads_for(n))
    return out


def relu_back(g: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
    """threshold_backward(g, y, 0), torch.relu's gradient, from y's float32 copy (`rp_relu_back`): g CPU float64 and y
    CPU float32, both contiguous and of one shape; the same bits, else None."""
    lib = library()
    if not (lib and g.dtype is _F64 and y.dtype is _F32 and g.is_cpu and y.is_cpu and g.shape == y.shape):
        return None
    if not (g.is_contiguous() and y.is_contiguous()):
        return None
    out = torch.empty_like(g)
    lib.rp_relu_back(g.data_ptr(), y.data_ptr(), out.data_ptr(), g.numel(), threads(g))
    return out


def round_scaled(v: torch.Tensor) -> tuple[torch.Tensor, float] | None:
    """(round_f32(v), max_abs(v)) in one pass, or None where the kernel cannot take v (CPU float64 contiguous)."""
    lib = library()
    if lib is None or not (v.is_contiguous() and usable(v)):
        return None
    out = torch.empty_like(v, memory_format=torch.contiguous_format)
    return out, lib.rp_round_max(v.data_ptr(), out.data_ptr(), v.numel(), threads(v))


def _collect(kernel, block: struct.Struct, args: tuple, cap: int, tail: tuple = ()):
    """Run a kernel on its argument block (`block` packed from args, the room: where its indices and codes
    go and how many fit, then tail) that writes up to cap (flat index, log code) pairs and says how many there
    are: ([indices], [codes]) as Rounder.entries holds them (a code is a parity bool, or the 32 bits of a
    wide entry, tagged 1 << 32 by the kernel); None where the kernel ran out of memory, or of room for the
    candidates of a crowded point (the caller takes the torch path)."""
    while True:
        buf, p = _room_buffer(2 * cap)
        n = kernel(block.pack(*args, p, p + 8 * cap, cap, *tail))
        if n < 0:
            return None
        if n <= cap:
            if not n:
                return [], []
            codes = [bool(c) if c < 2 else c & 0xFFFFFFFF for c in buf[cap : cap + n].tolist()]
            return buf[:n].tolist(), codes
        cap = n  # rare (see _room): rerun with room for all; rounding again gives the same outputs


_ROOM = threading.local()  # this thread's buffer for close calls, reused by every point's kernel
ROOM_KEPT = 1 << 17  # int64s of it kept between calls (1 MiB): a larger point's room is made for it alone


def _room_buffer(n: int) -> tuple[np.ndarray, int]:
    """(room for n int64s, its address), this thread's own (read out before its next kernel call): a small
    point's kernel call allocates nothing in Python. NumPy's, not a tensor: reading a few entries out of
    a tensor (a slice and tolist) cost a point 10 us, NumPy's 1."""
    if n > ROOM_KEPT:
        buf = np.empty(n, dtype=np.int64)
        return buf, buf.ctypes.data
    room = getattr(_ROOM, "room", None)
    if room is None:
        buf = np.empty(ROOM_KEPT, dtype=np.int64)
        room = _ROOM.room = (buf, buf.ctypes.data)
    return room


def _room(v: torch.Tensor) -> int:
    """Room for close calls: far above the ~1e-4 of outputs seen even in cancellation-heavy
    reductions, so that the kernel runs once."""
    return _room_for(v.numel())


def _room_for(outputs: int) -> int:
    return max(1024, outputs >> 6)


def _batch_strides(t: torch.Tensor, batch: tuple[int, ...]) -> list[int] | None:
    """Strides of t's batch dims broadcast to `batch` (<= 2 dims), padded to two; None if more."""
    if not batch:
        return [0, 0]
    if len(batch) > 2:
        return None
    own = t.shape[:-2]
    strides = [0] * (len(batch) - len(own)) + [s if n != 1 else 0 for n, s in zip(own, t.stride()[:-2])]
    return [0] * (2 - len(strides)) + strides


def round_dot(
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    g: float,
    bias: torch.Tensor | None,
    gbias: float,
    bias_rows: bool,
    safety: float,
    wide: float,
    in_place: bool = False,
    norms=None,
    add_bias: bool = False,
    transposed: bool = False,
):
    """Fused rounding point for v = scale * (a @ b) + bias (bias per column, or per row), its bound's
    terms g * |a| @ |b| and |bias| * gbias: (float32(v) as float64, close calls' flat indices, their log
    codes), or None where the kernel is unavailable or cannot take these tensors. safety and wide as in
    determinism.py. in_place: v itself rounded and returned (the caller's own temporary, that nothing else
    reads: no output's pages to fault in, none to hold); v is unchanged where the result is None. norms: (A's
    row norms, B's column norms), each batch's in turn, where the caller formed them (`row_col_norms`,
    `im2col` with_norms), or None (formed here); either may be None. add_bias: v is the product alone and the point's
    value v + bias, added in the kernel's passes over v (`rp_dot`); v is unchanged where the result is None.
    transposed: v is the 2-D product's transpose (N, M), no bias (`Rounder.dot`'s): the output is in v's layout, the
    close calls' indices the (M, N) product's, in order."""
    lib = library()
    if lib is None:
        return None
    if transposed:
        return _transposed_dot(v, a, b, g, gbias, safety, wide, in_place, norms) if bias is None else None
    if v.dim() == a.dim() == b.dim() == 2:  # a linear layer's (most points): `_product`'s checks, unbatched
        # `usable(v, a, b)` written out: a call costs a small point as much as these six reads
        if not (v.dtype is _F64 and a.dtype is _F64 and b.dtype is _F64 and v.is_cpu and a.is_cpu and b.is_cpu):
            return None
        head = _plain_head(v, a, b, bias, bias_rows)
        if head is None:
            return None
        m, n, k = head[2], head[3], head[5]
    else:
        layout = _dot_layout(v, a, b, bias, bias_rows)
        if layout is None:
            return None
        b0, b1, sa, sb = layout
        m, n, k = v.shape[-2], v.shape[-1], a.shape[-1]
        head = (b0, b1, m, n, 1, k, a.data_ptr(), *sa, b.data_ptr(), *sb)
    batches = head[0] * head[1]
    given = _given(norms, batches * m, batches * n) if norms is not None else (0, 0)
    return _dot(lib, v, head, (m + n) * k, bias, gbias, bias_rows, g, safety, wide, in_place, given, add_bias)


def record_product(v, a, b, g: float, gbias: float, safety: float, wide: float, bias=None, add_bias=False, norms=None):
    """`round_dot(v, a, b, g, bias, gbias, False, safety, wide, True, norms, add_bias)` where the caller has established
    its checks (`Rounder.kernel_product`: v a fresh contiguous product of 2-D CPU float64 operands, the kernel
    loaded, the bias none or per column): the kernel's pass alone, v rounded in place. None where it declines (v as
    it was) or cannot take the bias."""
    head = _plain_head(v, a, b, bias, False)  # (its O(1) checks: a caller's slip declined, not read past)
    if head is None:
        return None
    m, n, k = head[2], head[3], head[5]
    given = _given(norms, m, n) if norms is not None else (0, 0)
    return _dot(_LIB, v, head, (m + n) * k, bias, gbias, False, g, safety, wide, True, given, add_bias)


def _plain_head(v, a, b, bias, bias_rows: bool) -> tuple | None:
    """An unbatched product's `dot_args_t` fields from b0 to B's column stride, where the kernel takes v = a @ b (+ bias)
    as they lie: a (M, K), b (K, N), v (M, N) contiguous float64, the bias as `_bias_ok` says; else None. The
    operands' dtype and device are the caller's to check (`round_dot` checks them, `record_product`'s caller has)."""
    (m, k), (kb, n) = a.shape, b.shape
    if kb != k or v.shape != (m, n) or not v.is_contiguous() or v.dtype is not _F64:
        return None
    if bias is not None and not _bias_ok(bias, m if bias_rows else n):
        return None
    (sai, sak), (sbk, sbj) = a.stride(), b.stride()
    return (1, 1, m, n, 1, k, a.data_ptr(), 0, 0, sai, 0, sak, b.data_ptr(), 0, 0, 0, sbk, sbj)


def column_sums(x: torch.Tensor, g: float, safety: float, wide: float, log: bool):
    """`axis_sums` of a 2-D contiguous CPU float64 x (rows, O) over its rows (a linear layer's bias gradient), its
    checks the caller's (`Rounder.kernel_column_sums`): (the rounded sums, close calls' indices, codes), none where not
    `log`; None where the kernel ran out of memory."""
    if x.dim() != 2 or not x.is_contiguous() or not usable(x):  # (O(1): a caller's slip)
        return None
    rows, o = x.shape
    out = torch.empty(o, dtype=_F64)
    head = (x.data_ptr(), out.data_ptr(), 0, rows, o, 1, g, safety, wide, threads(x))
    if not log:
        return (out, [], []) if _LIB.rp_axis_sums(_AXIS_SUMS_ARGS.pack(*head, 0, 0, -1)) >= 0 else None
    got = _collect(_LIB.rp_axis_sums, _AXIS_SUMS_ARGS, head, max(1024, o >> 6))
    return None if got is None else (out, *got)


def _transposed_dot(v, a, b, g: float, gbias: float, safety: float, wide: float, in_place: bool, norms):
    """`round_dot` of v = (a @ b)^T as the product b^T a^T, whose output v is, its close calls' indices mapped to
    (a @ b)'s and sorted (a candidate's terms and bound are the same either way)."""
    if not (v.dim() == a.dim() == b.dim() == 2):
        return None
    swapped = (norms[1], norms[0]) if norms is not None else None  # b's column norms are b^T's row norms
    got = round_dot(v, b.t(), a.t(), g, None, gbias, False, safety, wide, in_place, swapped)
    if got is None or not got[1]:
        return got
    m, n = a.shape[0], b.shape[1]
    pairs = sorted(zip([f % m * n + f // m for f in got[1]], got[2]))
    return got[0], [f for f, _ in pairs], [c for _, c in pairs]


def _dot_layout(v: torch.Tensor, a: torch.Tensor, b: torch.Tensor, bias, bias_rows: bool):
    """`_product`'s layout of v = a @ b (+ bias) where the kernel takes all of them (v CPU float64
    contiguous, the bias as `_bias_ok` says), else None."""
    layout = _product(tuple(v.shape), a, b) if v.is_contiguous() and usable(v) else None
    if layout is None or not _bias_ok(bias, v.shape[-2] if bias_rows else v.shape[-1]):
        return None
    return layout


def _bias_ok(bias: torch.Tensor | None, n: int) -> bool:
    """A product's bias as the kernel reads it: none, or n contiguous CPU float64 values."""
    return bias is None or (bias.dim() == 1 and bias.numel() == n and bias.is_contiguous() and usable(bias))


def _product(shape: tuple[int, ...], a: torch.Tensor, b: torch.Tensor):
    """A product's operands as the kernel takes them, for an output of `shape`: (b0, b1, A's strides
    (batch, batch, row, 0, k), B's (batch, batch, 0, k, column)), or None where it cannot."""
    if not usable(a, b):
        return None
    a_shape, b_shape = a.shape, b.shape
    if len(a_shape) < 2 or len(b_shape) < 2 or len(shape) < 2 or a_shape[-1] != b_shape[-2]:
        return None
    if shape[-2] != a_shape[-2] or shape[-1] != b_shape[-1]:
        return None
    if len(shape) == len(a_shape) == len(b_shape) == 2:  # a linear layer's: no batch (most points)
        (sai, sak), (sbk, sbj) = a.stride(), b.stride()
        return 1, 1, (0, 0, sai, 0, sak), (0, 0, 0, sbk, sbj)
    batch = shape[:-2]
    sa, sb = _batch_strides(a, batch), _batch_strides(b, batch)
    if sa is None or sb is None:
        return None
    (sai, sak), (sbk, sbj) = a.stride()[-2:], b.stride()[-2:]
    return *([1, 1] + list(batch))[-2:], (*sa, sai, 0, sak), (*sb, 0, sbk, sbj)


def dot_at(
    shape: tuple[int, ...], a: torch.Tensor, b: torch.Tensor, g: float, babs, bias_rows: bool, idx: torch.Tensor
) -> torch.Tensor | None:
    """The exact bound of a product (the record pass's code) at flat output indices idx of an output of
    `shape`: g * sum_k |A_ik B_kj| + babs, float64; None where the kernel cannot take them. A replay's
    logged elements: gathered by torch, a weight gradient's strided rows cost more than the product's
    own rounding pass."""
    lib = library()
    layout = _product(tuple(shape), a, b) if lib and idx.is_cpu else None
    if layout is None or not _bias_ok(babs, shape[-2] if bias_rows else shape[-1]):
        return None
    return _exact_at(lib, tuple(shape[-2:]), 1, a.shape[-1], a, b, g, babs, bias_rows, layout, idx)


def replay_dot(
    v, a, b, g: float, bias, gbias: float, bias_rows: bool, idx: list, codes: list, decode, rel, in_place=False
):
    """A replay's logged product point, v = scale * (a @ b) + bias with its log's entries (flat indices
    idx, codes as the log holds them), in one kernel call (rp_dot_replay: what `Rounder._apply` does with
    round_scaled, dot_at and apply_at, without the Python between): (float32(v) as float64 with the entries
    applied, the refused entry or -1, why (1 a window too wide, 2 not a close call), the refused entry's
    window, max |v|, the widest applied window over it); None where the kernel cannot take these tensors
    or indices (the caller takes that path), v unchanged. g, gbias and in_place as `round_dot`'s."""
    lib = library()
    # one rp_dot_at call over every index: as many as `_exact_at` takes in one (its chunks, past that, order
    # a window's sums otherwise: the same decisions need the same calls)
    if lib is None or len(codes) != len(idx) or len(idx) > DOT_AT_CHUNK:
        return None
    layout = _dot_layout(v, a, b, bias, bias_rows)
    if layout is None:
        return None
    b0, b1, sa, sb = layout
    m, n, k = v.shape[-2], v.shape[-1], a.shape[-1]
    entries = _entries_block(idx, codes)
    if entries is None:
        return None
    count, (room, at, results, where) = len(idx), entries  # room and results held until the kernel returns
    out = v if in_place else torch.empty_like(v)
    terms = torch.get_num_threads() if count * k >= PARALLEL_MIN else 1  # as _dot_at's
    head = (v.data_ptr(), out.data_ptr(), b0, b1, m, n, 1, k, a.data_ptr(), *sa, b.data_ptr(), *sb)
    bias_at = bias.data_ptr() if bias is not None else 0  # its term |bias| * gbias formed in the kernel
    tail = (at, at + 8 * count, count, decode, rel, 1, *where)
    bad = lib.rp_dot_replay(_DOT_REPLAY_ARGS.pack(*head, bias_at, int(bias_rows), gbias, g, threads(v), terms, *tail))
    del room  # read by the kernel: alive until it returned
    return None if bad < -1 else _replayed(out, bad, results, count)


def replay_full(v: torch.Tensor, e: torch.Tensor, idx: list, codes: list, decode, rel, steers: bool, floor):
    """A replay's logged point with its bound e given per element (v's shape) or per row (v.shape[:-1] + (1,)),
    in one kernel call (rp_full_replay: what `Rounder._apply` does with round_scaled, the bound's gather and
    apply_at, without the Python between); floor the point's scale floor (`Bound.scale`) or None. Returns as
    `replay_dot`; None where the kernel cannot take these tensors or indices."""
    lib = library()
    if lib is None or len(codes) != len(idx) or not isinstance(e, torch.Tensor):
        return None
    if not (v.is_contiguous() and e.is_contiguous() and usable(v, e)):
        return None
    n = v.shape[-1] if v.dim() else 1
    if e.shape == v.shape:
        e_cols = n
    elif v.dim() and e.shape == v.shape[:-1] + (1,):
        e_cols = 1
    else:
        return None
    entries = _entries_block(idx, codes)
    if entries is None:
        return None
    count, (room, at, results, where) = len(idx), entries  # room and results held until the kernel returns
    out = torch.empty_like(v)
    head = (v.data_ptr(), out.data_ptr(), v.numel() // n if n else 0, n, e.data_ptr(), e_cols, threads(v))
    tail = (at, at + 8 * count, count, decode, rel, 0.0 if floor is None else float(floor))
    bad = lib.rp_full_replay(_FULL_REPLAY_ARGS.pack(*head, *tail, int(floor is not None), int(steers), *where))
    del room  # read by the kernel: alive until it returned
    return None if bad < -1 else _replayed(out, bad, results, count)


def _entries_block(idx: list, codes: list):
    """A logged point's entries as rp_dot_replay and rp_full_replay read them, in this thread's buffers (read
    out before its next kernel call; fresh NumPy arrays and their addresses cost a small point's replay a
    tenth of its time): (the indices' address, the codes (`_kernel_codes`) right after; the results' scratch
    (a window per entry, then the scale, the ratio and why) and its (windows, scale, ratio, why) addresses),
    or None where an index does not fit int64 (the other path refuses it by name). The caller holds both
    arrays until the kernel returns: past what a thread keeps, each is a fresh array of the caller's alone."""
    count = len(idx)
    room, at = _room_buffer(2 * count)
    try:
        room[:count] = idx
    except OverflowError:
        return None
    room[count : 2 * count] = _kernel_codes(codes)
    results, base = _scratch(count + 3)
    return room, at, results, (base, base + 8 * count, base + 8 * count + 8, base + 8 * count + 16)


def _replayed(out: torch.Tensor, bad: int, results: np.ndarray, count: int):
    """A replay kernel's results (`_entries_block`) as `replay_dot` returns them."""
    scale, ratio = results[count : count + 2].tolist()
    why = int(results[count + 2 : count + 3].view(np.int64)[0])
    return out, bad, why, float(results[bad]) if bad >= 0 else None, scale, ratio


_SCRATCH = threading.local()  # this thread's float64 scratch for a replay kernel's results
SCRATCH_KEPT = 1 << 16  # float64s of it kept between calls (512 KiB): a point with more entries gets its own


def _scratch(n: int) -> tuple[np.ndarray, int]:
    if n > SCRATCH_KEPT:
        buf = np.empty(n)
        return buf, buf.ctypes.data
    held = getattr(_SCRATCH, "held", None)
    if held is None:
        buf = np.empty(SCRATCH_KEPT)
        held = _SCRATCH.held = (buf, buf.ctypes.data)
    return held


def dot_summed_at(a: torch.Tensor, b: torch.Tensor, g: float, idx: torch.Tensor) -> torch.Tensor | None:
    """`dot_at` for `round_dot_summed`'s product (a (M, T, K), b (T, K, N), any strides): its exact bound
    g * sum over t, k of |a[m, t, k] b[t, k, n]| at flat output indices idx (a replay's logged elements of a
    convolution's weight gradient), float64; None where the kernel cannot take them."""
    lib = library()
    if lib is None or not (idx.is_cpu and _summed_ok(a, b)):
        return None
    (m, t, k), n = a.shape, b.shape[-1]
    return _exact_at(lib, (m, n), t, k, a, b, g, None, False, (1, 1, (0, 0, *a.stride()), (0, 0, *b.stride())), idx)


def _exact_at(lib, mn, k1, k2, a, b, g, babs, bias_rows, layout, idx) -> torch.Tensor | None:
    idx = idx.to(torch.int64).contiguous()
    e = torch.empty(idx.numel(), dtype=torch.float64)
    call = lambda part, out: _dot_at(lib, mn, k1, k2, a, b, g, babs, bias_rows, layout, part, out)
    if idx.numel() <= DOT_AT_CHUNK:  # most points: a few entries (no slices: ATen ops, a replay's overhead)
        return e if call(idx, e) == 0 else None
    for at in range(0, idx.numel(), DOT_AT_CHUNK):  # bounded working memory, however many entries a log names
        if call(idx[at : at + DOT_AT_CHUNK], e[at : at + DOT_AT_CHUNK]) != 0:
            return None
    return e


DOT_AT_CHUNK = 1 << 16  # indices per rp_dot_at call (48 bytes of working space each)


def _dot_at(lib, mn, k1, k2, a, b, g, babs, bias_rows, layout, idx, e) -> int:
    b0, b1, sa, sb = layout
    return lib.rp_dot_at(
        b0,
        b1,
        *mn,
        k1,
        k2,
        a.data_ptr(),
        *sa,
        b.data_ptr(),
        *sb,
        babs.data_ptr() if babs is not None else None,
        int(bias_rows),
        g,
        torch.get_num_threads() if idx.numel() * k1 * k2 >= PARALLEL_MIN else 1,  # by terms summed
        idx.data_ptr(),
        idx.numel(),
        e.data_ptr(),
    )


def _summed_ok(a: torch.Tensor, b: torch.Tensor) -> bool:
    """A summed product's operands as the kernel reads them: a (M, T, K) and b (T, K, N), CPU float64."""
    return a.dim() == 3 and b.dim() == 3 and a.shape[1:] == b.shape[:2] and usable(a, b)


def round_dot_summed(
    v: torch.Tensor, a: torch.Tensor, b: torch.Tensor, g: float, safety: float, wide: float, norms=None
):
    """Fused rounding point for v = sum over t of a[:, t] @ b[t] (a (M, T, K), b (T, K, N), any
    strides: one reduction over T x K terms, as a convolution's weight gradient): as `round_dot`, norms
    (a's (M,), b's (N,)) too."""
    if not (library() and v.is_contiguous() and v.dim() == 2 and usable(v) and _summed_ok(a, b)):
        return None
    (m, t, k), n = a.shape, b.shape[-1]
    if v.shape != (m, n):
        return None
    head = (1, 1, m, n, t, k, a.data_ptr(), 0, 0, *a.stride(), b.data_ptr(), 0, 0, *b.stride())
    given = _given(norms, m, n) if norms is not None else (0, 0)
    return _dot(library(), v, head, (m + n) * t * k, None, 0.0, False, g, safety, wide, norms=given)


def _dot(
    lib,
    v,
    head: tuple,
    terms: int,
    bias,
    gbias,
    bias_rows,
    g,
    safety,
    wide,
    in_place=False,
    norms=(0, 0),
    add_bias=False,
):
    """rp_dot over v's product: head, the block's fields from b0 to B's column stride (`dot_args_t`);
    terms, (M + N) * K, what the operands' norms read; in_place and add_bias as `round_dot`'s; norms, the
    addresses of A's row norms and B's column norms (`_given`), 0 for none."""
    out = v if in_place else torch.empty_like(v)
    # threads by outputs, or by terms: a convolution's weight gradient is a small output over long sums
    # (its operands' norms, its candidates' exact bounds)
    outputs = v.numel()
    nt = _threads_for(outputs) if terms < PARALLEL_TERMS else torch.get_num_threads()
    pointer = bias.data_ptr() if bias is not None else 0
    args = (v.data_ptr(), out.data_ptr(), *head, pointer, int(bias_rows), int(add_bias), *norms)
    got = _collect(lib.rp_dot, _DOT_ARGS, (*args, gbias, g, safety, wide, nt), _room_for(outputs))
    return got and (out, *got)


def _given(norms, m: int, n: int) -> tuple[int, int]:
    """The addresses of (A's row norms, B's column norms), each where it is m (n) contiguous CPU float64 values (the
    kernel reads that many: every batch's), else 0: formed by the kernel."""
    na, nb = norms
    return _norms_at(na, m), _norms_at(nb, n)


def _norms_at(t, size: int) -> int:
    """t's address where it is `size` contiguous CPU float64 values, else 0 (None too: a small operand's, not formed)."""
    if not isinstance(t, torch.Tensor):
        return 0
    return t.data_ptr() if t.dim() == 1 and t.numel() == size and t.is_contiguous() and usable(t) else 0


def row_col_norms(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(||row i||, ||column j||) of a 2-D CPU float64 t, row-major or column-major, in one pass (`rp_row_col_norms`),
    or None where the kernel cannot take it."""
    lib = library()
    if lib is None or t.dim() != 2 or not usable(t) or 1 not in t.stride() or not t.numel():
        return None
    rows, cols = t.shape
    rn, cn = torch.empty(rows, dtype=_F64), torch.empty(cols, dtype=_F64)
    s0, s1 = t.stride()
    got = lib.rp_row_col_norms(t.data_ptr(), rows, cols, s0, s1, rn.data_ptr(), cn.data_ptr(), threads(t))
    return (rn, cn) if got == 0 else None


PARALLEL_MIN = 1 << 15  # outputs below which a rounding pass runs on one thread (a parallel region's start costs more)
PARALLEL_TERMS = 1 << 20  # a product whose operands hold this many terms runs on threads, whatever its outputs


def threads(v: torch.Tensor) -> int:
    """Threads for a kernel pass over v: torch's own count (the same OpenMP pool: the kernel is built
    against the libgomp torch loads), one for small tensors. Results do not depend on it."""
    return _threads_for(v.numel())


def _threads_for(outputs: int) -> int:
    return torch.get_num_threads() if outputs >= PARALLEL_MIN else 1


def round_full(v: torch.Tensor, e: torch.Tensor, safety: float, wide: float):
    """Fused rounding point for v with a per-element bound e (v's shape, or per row: v.shape[:-1] + (1,)):
    as `round_dot`."""
    if not (library() and v.is_contiguous() and e.is_contiguous() and usable(v, e)):
        return None
    n = v.shape[-1] if v.dim() else 1
    rows = v.numel() // n if n else 0
    if e.shape == v.shape:
        e_cols = n
    elif v.dim() and e.dim() == v.dim() and e.shape[-1] == 1 and e.shape[:-1] == v.shape[:-1]:
        e_cols = 1
    else:
        return None
    out = torch.empty_like(v)
    args = (v.data_ptr(), out.data_ptr(), rows, n, e.data_ptr(), e_cols, safety, wide, threads(v))
    got = _collect(library().rp_full, _FULL_ARGS, args, _room(v))
    return got and (out, *got)


def layer_norm(x, w, b, eps: float, g_mean: float, g_var: float, safety: float, wide: float, log: bool):
    """ops._LayerNorm's forward over x's last dim in one pass per row (`rp_layer_norm`): (y, xhat, rstd,
    points), points the close calls [(indices, codes)] of its rounding points mu and var where `log` (else
    []), or None where the kernel cannot take these tensors (CPU float64, x contiguous, w and b of x's last
    dim) or ran out of memory. g_mean and g_var: the points' bound factors (ops); safety and wide as in
    determinism.py."""
    if not _forward_ok(x, w, b):
        return None
    rows, outputs, head = _forward_block(x, w, b, eps, g_mean, g_var)
    points = _points(library().rp_layer_norm, _LN_ARGS, (*head, safety, wide, threads(x)), (rows, rows), log)
    return None if points is None else (*outputs, points)


def _forward_block(x, w, b, eps: float, g_mean: float, g_var: float):
    """(rows, (y, xhat, rstd) made, ln_args_t's fields up to eps): what a layer norm's whole and staged passes share."""
    n = x.shape[-1]
    outputs = torch.empty_like(x), torch.empty_like(x), torch.empty(x.shape[:-1] + (1,), dtype=torch.float64)
    head = (*(t.data_ptr() for t in (x, w, b, *outputs)), x.numel() // n, n, 1.0 / n, g_mean, g_var, eps)
    return x.numel() // n, outputs, head


def layer_norm_staged(x, w, b, eps: float, g_mean: float, g_var: float, point):
    """`layer_norm` in a replay whose log names one of its points: the kernel stops at each point, whose
    values and bounds point(slot, values, bounds) rounds (the rounder, applying the log there: it may raise
    LogMismatch), and goes on from the rounded values: (y, xhat, rstd), or None where the kernel cannot take
    these tensors."""
    if not _forward_ok(x, w, b):
        return None
    lib = library()
    rows, outputs, head = _forward_block(x, w, b, eps, g_mean, g_var)
    raw = torch.empty(4, rows, dtype=torch.float64)
    head = (*head, 0.0, 0.0, threads(x), 0, 0, -1, 0)  # no log: the rounder applies the replay's
    run = lambda *given: lib.rp_layer_norm(_LN_ARGS.pack(*head, raw.data_ptr(), *given))  # stages allocate nothing
    if run(0, 0) < 0:
        return None
    mu = point(0, raw[0], raw[1]).contiguous()
    _staged(run(mu.data_ptr(), 0))
    var = point(1, raw[2], raw[3]).contiguous()
    _staged(run(mu.data_ptr(), var.data_ptr()))
    return outputs


def _staged(status: int) -> None:
    """A stage after the rounder has applied a point's entries cannot hand the op back to the torch path,
    which would meet those points again without them: it cannot fail (no allocation), and if it did, says so."""
    if status < 0:
        raise MemoryError("replay: a layer norm's kernel stage failed after its points were applied")


def layer_norm_back(dy, xhat, rstd, w, g_mean: float, g_rows: float, safety: float, wide: float, log: bool):
    """ops._LayerNorm's backward in one pass (`rp_layer_norm_back`): (dx, dw, db, points), points those of
    its rounding points dw, db, a and c, as `layer_norm`; None where the kernel cannot take these tensors."""
    if not _back_ok(dy, xhat, rstd, w):
        return None
    n = xhat.shape[-1]
    rows = xhat.numel() // n
    dx, dw, db = torch.empty_like(xhat), torch.empty(n, dtype=torch.float64), torch.empty(n, dtype=torch.float64)
    ptrs = (dy, xhat, rstd, w, dx, dw, db)
    head = (*(t.data_ptr() for t in ptrs), rows, n, 1.0 / n, g_mean, g_rows, safety, wide, threads(xhat))
    points = _points(library().rp_layer_norm_back, _LN_BACK_ARGS, head, (n, n, rows, rows), log)
    return None if points is None else (dx, dw, db, points)


def layer_norm_back_staged(dy, xhat, rstd, w, g_mean: float, g_rows: float, point):
    """`layer_norm_back` in stages, as `layer_norm_staged`: the four points' values and bounds to point(slot,
    values, bounds) (slots 2 to 5: dw, db, a, c), then dx from the rounded a and c: (dx, dw, db), or None."""
    if not _back_ok(dy, xhat, rstd, w):
        return None
    n, lib = xhat.shape[-1], library()
    rows = xhat.numel() // n
    dx, raw = torch.empty_like(xhat), torch.empty(4 * n + 4 * rows, dtype=torch.float64)
    spare = torch.empty(2 * n, dtype=torch.float64)  # the first stage's rounded dw and db: the rounder's are kept
    ptrs = (dy, xhat, rstd, w, dx, spare, spare[n:])
    head = (*(t.data_ptr() for t in ptrs), rows, n, 1.0 / n, g_mean, g_rows, 0.0, 0.0, threads(xhat), 0, 0, -1, 0)
    run = lambda *given: lib.rp_layer_norm_back(_LN_BACK_ARGS.pack(*head, raw.data_ptr(), *given))
    if run(0, 0) < 0:
        return None
    starts = (0, n, 2 * n, 3 * n, 4 * n, 4 * n + rows, 4 * n + 2 * rows, 4 * n + 3 * rows, 4 * n + 4 * rows)
    parts = [raw[lo:hi] for lo, hi in zip(starts, starts[1:])]
    dw, db, a, c = (point(slot, parts[2 * i], parts[2 * i + 1]).contiguous() for i, slot in enumerate((2, 3, 4, 5)))
    _staged(run(a.data_ptr(), c.data_ptr()))
    return dx, dw, db


def _back_ok(dy, xhat, rstd, w) -> bool:
    """A layer norm's backward operands as the kernel reads them."""
    n = xhat.shape[-1] if xhat.dim() else 0
    if not (library() and n and xhat.numel() and dy.shape == xhat.shape and rstd.numel() * n == xhat.numel()):
        return False
    return _vectors_ok(n, w) and all(t.is_contiguous() for t in (dy, xhat, rstd)) and usable(dy, xhat, rstd)


def _forward_ok(x, w, b) -> bool:
    """A layer norm's forward operands as the kernel reads them."""
    n = x.shape[-1] if x.dim() else 0
    return bool(library() and n and x.numel() and x.is_contiguous() and usable(x) and _vectors_ok(n, w, b))


def softmax(x: torch.Tensor, c: float, safety: float, wide: float, log: bool):
    """ops._Softmax's forward over x's last dim: the row's max subtracted in the kernel, torch's exp (the
    reference's own) in place, then the quotients by the row's sum rounded with the bound p * c per element
    in one kernel pass (`rp_softmax`): (p, points) as `layer_norm`'s; None where the kernel cannot take x."""
    lib = library()
    if not (lib and _rows_ok(x)):
        return None
    e = _exponentials(lib, x)
    # p in a tensor of its own: a pass rerun for room (`_collect`) reads the exponentials again
    return _softmax_pass(lib, e, None, torch.empty_like(e), (c, 0.0, 0.0), safety, wide, log)


def softmax_values(x: torch.Tensor, c: float):
    """`softmax`'s quotients and their bounds p * c, not rounded (a replay whose log names the point: the rounder
    applies it), the quotients over the exponentials (two tensors of x's size, where the torch reference makes four):
    (p, bounds), or None where the kernel cannot take x."""
    lib = library()
    if not (lib and _rows_ok(x)):
        return None
    e = _exponentials(lib, x)
    return _softmax_stage(lib, e, None, e, (c, 0.0, 0.0))


def _rows_ok(x: torch.Tensor) -> bool:
    """Rows of n > 0 values, contiguous CPU float64: a softmax pass's input as the kernel takes it."""
    n = x.shape[-1] if x.dim() else 0
    return bool(n and x.numel() and x.is_contiguous() and usable(x))


def _softmax_back_ok(p: torch.Tensor, dp: torch.Tensor) -> bool:
    """The backward's p and dp as the kernel takes them: p as `_rows_ok`, dp of its shape, contiguous CPU float64."""
    return _rows_ok(p) and dp.shape == p.shape and dp.is_contiguous() and usable(dp)


def _exponentials(lib, x: torch.Tensor) -> torch.Tensor:
    """exp(x - the row's max) of a contiguous CPU float64 x: the max subtracted in the kernel, torch's exp in place."""
    n = x.shape[-1]
    e = torch.empty_like(x)
    lib.rp_softmax_shift(x.data_ptr(), e.data_ptr(), x.numel() // n, n, threads(x))
    return e.exp_()


def softmax_back(p: torch.Tensor, dp: torch.Tensor, consts: tuple, safety: float, wide: float, log: bool):
    """ops._Softmax's backward, dx = p * (dp - sum(p * dp)), with its bound (`softmax_err`'s, consts its
    (c, k, u4)) and its rounding in one kernel pass: (dx, points); None where the kernel cannot take them."""
    lib = library()
    if not (lib and _softmax_back_ok(p, dp)):
        return None
    return _softmax_pass(lib, p, dp, torch.empty_like(p), consts, safety, wide, log)


def softmax_back_values(p: torch.Tensor, dp: torch.Tensor, consts: tuple):
    """`softmax_back`'s dx and its bounds, not rounded (as `softmax_values`): (dx, bounds), or None where the kernel
    cannot take them."""
    lib = library()
    if not (lib and _softmax_back_ok(p, dp)):
        return None
    return _softmax_stage(lib, p, dp, torch.empty_like(p), consts)


def _softmax_stage(lib, p, dp, out, consts):
    """A softmax pass's values into out and their bounds into a new tensor (`rp_softmax` with bounds): (out, bounds)."""
    bounds = torch.empty_like(out)
    lib.rp_softmax(_SOFTMAX_ARGS.pack(*_softmax_head(p, dp, out, bounds, consts, 0.0, 0.0), 0, 0, -1))
    return out, bounds


def _softmax_head(p, dp, out, bounds, consts, safety, wide) -> tuple:
    """softmax_args_t's fields from p to threads (bounds None: a rounding pass)."""
    n = p.shape[-1]
    ptrs = (
        p.data_ptr(),
        dp.data_ptr() if dp is not None else 0,
        out.data_ptr(),
        bounds.data_ptr() if bounds is not None else 0,
    )
    return (*ptrs, p.numel() // n, n, *consts, safety, wide, threads(p))


def _softmax_pass(lib, p, dp, out, consts, safety, wide, log):
    head = _softmax_head(p, dp, out, None, consts, safety, wide)
    if not log:
        return (out, []) if lib.rp_softmax(_SOFTMAX_ARGS.pack(*head, 0, 0, -1)) >= 0 else None
    got = _collect(lib.rp_softmax, _SOFTMAX_ARGS, head, _room(p))
    return None if got is None else (out, [got])


def axis_sums(x: torch.Tensor, g: float, safety: float, wide: float, log: bool):
    """A bias's gradient as one rounding point in one pass (`rp_axis_sums`): x (A, O, L) contiguous summed over
    A and L per O, its bound the magnitudes' sums times g; (rounded sums, points) as `softmax`'s; None where
    the kernel cannot take x."""
    lib = library()
    if not (lib and x.dim() == 3 and x.is_contiguous() and usable(x)):
        return None
    a, o, length = x.shape
    out = torch.empty(o, dtype=torch.float64)
    head = (x.data_ptr(), out.data_ptr(), 0, a, o, length, g, safety, wide, threads(x))
    if not log:
        return (out, []) if lib.rp_axis_sums(_AXIS_SUMS_ARGS.pack(*head, 0, 0, -1)) >= 0 else None
    got = _collect(lib.rp_axis_sums, _AXIS_SUMS_ARGS, head, max(1024, o >> 6))
    return None if got is None else (out, [got])


def round_outer(v: torch.Tensor, win: torch.Tensor, f: torch.Tensor, g: float, safety: float, wide: float):
    """A rounding point whose bound is an outer product, v (B, C, ...) with e[b, c, ...] = (win[b, ...] * f[c]) * g
    (a convolution's input gradient), rounded with its close calls found in one pass (`rp_round_outer`), the
    bound never formed: (rounded, points) as `softmax`'s; None where the kernel cannot take them (all CPU
    float64 contiguous, win (B, 1, ...) or (B, ...) of v's trailing size, f (C,))."""
    lib = library()
    if not (lib and v.dim() >= 2 and v.numel() and v.is_contiguous() and win.is_contiguous() and f.is_contiguous()):
        return None
    b, c = v.shape[:2]
    p = v.numel() // (b * c)
    if not (usable(v, win, f) and win.numel() == b * p and win.shape[0] == b and f.shape == (c,)):
        return None
    out = torch.empty_like(v)
    head = (v.data_ptr(), out.data_ptr(), b, c, p, win.data_ptr(), f.data_ptr(), g, safety, wide, threads(v))
    got = _collect(lib.rp_round_outer, _OUTER_ARGS, head, _room(v))
    return None if got is None else (out, [got])


def axis_sums_values(x: torch.Tensor, g: float):
    """`axis_sums`' sums and bounds, not rounded (a replay whose log names the point: the rounder applies it),
    or None where the kernel cannot take x."""
    lib = library()
    if not (lib and x.dim() == 3 and x.is_contiguous() and usable(x)):
        return None
    a, o, length = x.shape
    out = torch.empty(2, o, dtype=torch.float64)
    head = (x.data_ptr(), out.data_ptr(), out[1].data_ptr(), a, o, length, g, 0.0, 0.0, threads(x), 0, 0, -1)
    return (out[0], out[1]) if lib.rp_axis_sums(_AXIS_SUMS_ARGS.pack(*head)) >= 0 else None


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, consts: tuple, point=None):
    """ops._CrossEntropy's forward: the row's max subtracted and torch's exp in place (as `softmax`), then the
    row sums, logs and quotients and the loss with its bound in one pass (`rp_ce_forward`; consts: gamma(n + 8),
    EXP_ERR, U, gamma(rows + 1), 1 / rows): (loss, its bound, p), the first two 0-dim; None where the kernel
    cannot take them or a target is outside the row (the torch path then says so). point (safety, wide, log): the
    loss's rounding point in the same pass, as `round_full` rounds it: (the rounded loss (0-dim), its close calls
    ([indices], [codes]), none where not log, p)."""
    lib = library()
    if not (lib and _rows_and_targets_ok(logits, targets)):
        return None
    rows, n = logits.shape
    p = torch.empty_like(logits)
    lib.rp_softmax_shift(logits.data_ptr(), p.data_ptr(), rows, n, threads(logits))
    p.exp_()
    # the loss and its bound: handed back, or (the point rounded here) this thread's scratch, read by nothing after
    loss = torch.empty(2, dtype=torch.float64) if point is None else None
    at = loss.data_ptr() if loss is not None else _scratch(2)[1]
    head = (logits.data_ptr(), p.data_ptr(), targets.data_ptr(), rows, n, *consts, threads(logits), at)
    if point is None:
        if lib.rp_ce_forward(_CE_ARGS.pack(*head, 0.0, 0.0, 0, 0, 0, -1)) < 0:
            return None
        return loss[0], loss[1], p
    safety, wide, log = point
    rounded = torch.empty((), dtype=torch.float64)
    head = (*head, safety, wide, rounded.data_ptr())
    if not log:
        return (rounded, ([], []), p) if lib.rp_ce_forward(_CE_ARGS.pack(*head, 0, 0, -1)) >= 0 else None
    got = _collect(lib.rp_ce_forward, _CE_ARGS, head, 1)
    return None if got is None else (rounded, got, p)


def cross_entropy_back(p, targets, c: float, consts: tuple, safety: float, wide: float, log: bool, bounds=None):
    """ops._CrossEntropy's backward, dz = (p - onehot) * c with its bound (consts: U, gamma(n + 10)), and its
    rounding in one pass (`rp_ce_backward`): (dz, points) as `softmax_back`'s, the bound written into `bounds`
    (p's shape, float64, contiguous) where given; None where the kernel cannot take them, or a target is
    outside the row."""
    lib = library()
    if not (lib and _rows_and_targets_ok(p, targets)):
        return None
    rows, n = p.shape
    out = torch.empty_like(p)
    if bounds is not None and not (bounds.shape == p.shape and bounds.is_contiguous() and usable(bounds)):
        return None
    kept = bounds.data_ptr() if bounds is not None else 0
    head = (p.data_ptr(), targets.data_ptr(), out.data_ptr(), kept, rows, n, c, *consts, safety, wide, threads(p))
    if not log:
        return (out, []) if lib.rp_ce_backward(_CE_BACK_ARGS.pack(*head, 0, 0, -1)) >= 0 else None
    got = _collect(lib.rp_ce_backward, _CE_BACK_ARGS, head, _room(p))
    return None if got is None else (out, [got])


def _rows_and_targets_ok(x: torch.Tensor, targets: torch.Tensor) -> bool:
    """The cross-entropy's passes' operands: x (rows, n) CPU float64 contiguous and not empty, one int64 target a row."""
    if not (x.dim() == 2 and min(x.shape) > 0 and x.is_contiguous() and usable(x)):
        return False
    ok = targets.dtype is torch.int64 and targets.is_cpu and targets.is_contiguous()
    return ok and targets.shape == (x.shape[0],)


def _vectors_ok(n: int, *vectors: torch.Tensor) -> bool:
    return all(t.dim() == 1 and t.numel() == n and t.is_contiguous() and usable(t) for t in vectors)


def _points(fn, block: struct.Struct, head: tuple, sizes: tuple[int, ...], log: bool):
    """Run a fused op's kernel in one whole pass (its argument block `head`, then idx, code, cap, counts, and
    no stages): its points' close calls [(indices, codes)] in order where `log`, [] where not, None where it
    failed."""
    counts = (ctypes.c_int64 * len(sizes))()
    at = ctypes.addressof(counts)
    if not log:
        return [] if fn(block.pack(*head, 0, 0, -1, at, 0, 0, 0)) >= 0 else None
    got = _collect(fn, block, head, max(1024, sum(sizes) >> 6), (at, 0, 0, 0))
    if got is None:
        return None
    idx, codes, start, points = *got, 0, []
    for c in counts:
        points.append((idx[start : start + c], codes[start : start + c]))
        start += c
    return points


def _state_ok(g: torch.Tensor, *state: torch.Tensor) -> bool:
    if g.dtype is not _F64 or not g.is_cpu:
        return False
    shape = g.shape
    for t in state:  # noqa: SIM110 (a loop, not all(): a generator is a call per tensor, as in `usable`)
        if t.dtype is not _F32 or not t.is_cpu or t.shape != shape or not t.is_contiguous():
            return False
    return True


def _grad_layout(g: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int, int, int]]:
    """(g, (rows, cols, row stride, column stride)) as the optimizer kernels read it: a 2-D gradient in
    place at any strides (a weight's comes transposed from its matmul), anything else contiguous, flat."""
    if g.dim() == 2:
        return g, (*g.shape, *g.stride())
    g = g.contiguous()
    return g, (1, g.numel(), g.numel(), 1)


def takes_updates(grads: list, *states: list) -> bool:
    """Can the kernel update this group: per parameter its float64 CPU gradient and float32 state tensors
    (param, then buffers), each list in the group's order?"""
    if library() is None:
        return False
    for g, *state in zip(grads, *states):  # noqa: SIM110 (as in _state_ok)
        if not _state_ok(g, *state):
            return False
    return True


def adamw_group(ps, gs, ms, vs, b1, b2, s1, s2, eps, wd, lr, checked: bool = False):
    """train._adamw over a group of parameters in one native call (the same operations, the same bits):
    ([p], [m], [v]) float32 after the step, or None where the kernel cannot take one of them
    (`takes_updates`, unless the caller has just checked). s1, s2 are the bias corrections 1 / (1 - beta^(t+1))
    as train.py computes them."""
    if not (checked or takes_updates(gs, ps, ms, vs)):
        return None
    outs = [(torch.empty_like(p), torch.empty_like(m), torch.empty_like(v)) for p, m, v in zip(ps, ms, vs)]
    tensors = [(p, g, m, v, *out) for p, g, m, v, out in zip(ps, gs, ms, vs, outs)]
    _each_parameter(library().rp_adamw_many, tensors, b1, 1.0 - b1, b2, 1.0 - b2, s1, s2, eps, wd, lr)
    return tuple(list(t) for t in zip(*outs)) if outs else ([], [], [])


def sgd_group(ps, gs, moms, momentum, wd, lr, checked: bool = False):
    """train._sgd over a group of parameters in one native call: ([p], [momentum]) float32 after the step,
    or None where the kernel cannot take one of them (unless the caller has just checked: `takes_updates`)."""
    if not (checked or takes_updates(gs, ps, moms)):
        return None
    outs = [(torch.empty_like(p), torch.empty_like(m)) for p, m in zip(ps, moms)]
    tensors = [(p, g, m, *out) for p, g, m, out in zip(ps, gs, moms, outs)]
    _each_parameter(library().rp_sgd_many, tensors, momentum, int(bool(wd)), wd, lr)
    return tuple(list(t) for t in zip(*outs)) if outs else ([], [])


def _each_parameter(kernel, tensors: list, *scalars) -> None:
    """Run a many-parameter optimizer kernel: tensors per parameter (p, g, state..., outputs...), the
    gradient read in place where it is 2-D (`_grad_layout`), the rest contiguous."""
    grads = [_grad_layout(t[1]) for t in tensors]  # kept alive (a contiguous copy) until the call returns
    lay = [x for _, layout in grads for x in layout]
    nthreads = [threads(t[0]) for t in tensors]
    ptr = [x.data_ptr() if i != 1 else g.data_ptr() for t, (g, _) in zip(tensors, grads) for i, x in enumerate(t)]
    # the arrays packed as bytes (ctypes passes their buffers): three NumPy arrays and their addresses were a third of a
    # small model's update's Python (`sgd_group` over six tiny parameters: 28.7 -> 24.3 us)
    packed = struct.pack(f"={len(lay)}q", *lay), struct.pack(f"={len(nthreads)}q", *nthreads)
    kernel(len(tensors), *packed, struct.pack(f"={len(ptr)}Q", *ptr), *scalars)


def abs_sums(x: torch.Tensor, over_rows: bool) -> torch.Tensor | None:
    """Sums of |x| over the rows (per column) or over each row of a 2-D CPU float64 tensor, in one pass
    with no temporary of x's size (`x.abs().sum(...)` makes one: most of a bias gradient's bound's
    time); None where the kernel cannot take x."""
    lib = library()
    if lib is None or x.dim() != 2 or not (x.is_contiguous() and usable(x)):
        return None
    rows, cols = x.shape
    res = torch.empty(cols if over_rows else rows, dtype=torch.float64)
    lib.rp_abs_sums(x.data_ptr(), rows, cols, int(over_rows), res.data_ptr(), threads(x))
    return res


_CONV = struct.Struct("=10q")  # conv_t in _native.c: B, C, H, W, kh, kw, pad, stride, Ho, Wo


def _geometry(bsz, c, h, w, ksize, padding, stride) -> tuple[bytes, int, int]:
    """(conv_t packed, Ho, Wo)."""
    kh, kw = ksize
    ho, wo = (h + 2 * padding - kh) // stride + 1, (w + 2 * padding - kw) // stride + 1
    return _CONV.pack(bsz, c, h, w, kh, kw, padding, stride, ho, wo), ho, wo


def _window_ok(ksize, padding: int, stride: int) -> bool:
    """A window the kernels take: kernel sides and stride >= 1, padding >= 0 (else torch's F.unfold / F.fold
    say what is wrong)."""
    return min(ksize) >= 1 and stride >= 1 and padding >= 0


def im2col(x: torch.Tensor, ksize: tuple[int, int], padding: int, stride: int, with_norms: bool = False):
    """F.unfold(x, ksize, padding=padding, stride=stride) of a 4-D CPU float64 x (any strides): the same
    values, (B, C * kh * kw, L) contiguous, in one pass; None where the kernel cannot take x. with_norms:
    (the columns, their norms (B * L,), each image's in turn: `round_dot`'s norms of them) in the same pass."""
    lib = library()
    if lib is None or x.dim() != 4 or not usable(x) or min(x.shape) == 0 or not _window_ok(ksize, padding, stride):
        return None
    bsz, c, h, w = x.shape
    (kh, kw), (geom, ho, wo) = ksize, _geometry(bsz, c, h, w, ksize, padding, stride)
    if ho <= 0 or wo <= 0:
        return None
    out = torch.empty(bsz, c * kh * kw, ho * wo, dtype=torch.float64)
    norms = torch.empty(bsz * ho * wo, dtype=torch.float64) if with_norms else None
    where = norms.data_ptr() if with_norms else None
    lib.rp_im2col(x.data_ptr(), struct.pack("=4q", *x.stride()), geom, out.data_ptr(), where, threads(out))
    return (out, norms) if with_norms else out


def col2im(cols: torch.Tensor, size: tuple[int, int], ksize: tuple[int, int], padding: int, stride: int):
    """F.fold(cols, size, ksize, padding=padding, stride=stride) of a 3-D CPU float64 cols (any strides,
    a broadcast too): the same additions in the same order, hence the same bits, (B, C, H, W) contiguous;
    None where the kernel cannot take cols."""
    lib = library()
    if (
        lib is None
        or cols.dim() != 3
        or not usable(cols)
        or min(cols.shape) == 0
        or not _window_ok(ksize, padding, stride)
    ):
        return None
    kk = ksize[0] * ksize[1]
    if cols.shape[1] % kk or min(size) <= 0:
        return None
    bsz, c = cols.shape[0], cols.shape[1] // kk
    geom, ho, wo = _geometry(bsz, c, *size, ksize, padding, stride)
    if ho * wo != cols.shape[2]:
        return None
    out = torch.empty(bsz, c, *size, dtype=torch.float64)
    lib.rp_col2im(cols.data_ptr(), struct.pack("=3q", *cols.stride()), geom, out.data_ptr(), threads(out))
    return out


def softmax_err(p: torch.Tensor, pd: torch.Tensor, dx: torch.Tensor, c: float, k: float, u4: float):
    """ops._Softmax.backward's bound in one native pass (see rp_softmax_err), or None where the kernel
    cannot take the tensors."""
    lib = library()
    if lib is None or not (p.shape == pd.shape == dx.shape and p.dim() and usable(p, pd, dx)):
        return None
    if not (p.is_contiguous() and pd.is_contiguous() and dx.is_contiguous()):
        return None
    n = p.shape[-1]
    e = torch.empty_like(p)
    lib.rp_softmax_err(
        p.data_ptr(), pd.data_ptr(), dx.data_ptr(), p.numel() // n if n else 0, n, c, k, u4, e.data_ptr(), threads(p)
    )
    return e


def apply_at(v: torch.Tensor, r: torch.Tensor, idx: torch.Tensor, e: torch.Tensor, codes: list, scale, steers, rel):
    """Rounder._apply's per-entry decisions in one C pass (the Python loop is the reference; tests hold the
    two to the same values and refusals): at flat indices idx of v (the values there; e their windows,
    DECODE * bound; codes as the log holds them), the float32s chosen written into r (contiguous) at the
    same indices only if every entry is accepted. (the refused entry or -1, why it was refused: 1 a window
    too wide, 2 not a close call, the widest applied window over scale); None where the kernel cannot take
    them. A contiguous v is read in place; a strided one is gathered first and scattered after."""
    lib = library()
    if lib is None or not (v.is_cpu and e.is_cpu and idx.is_cpu and r.is_contiguous() and usable(r)):
        return None
    if not (idx.numel() == e.numel() == len(codes) and v.numel() == r.numel()):
        return None
    idx, e = idx.to(torch.int64).contiguous(), e.to(torch.float64).contiguous()
    if v.is_contiguous() and usable(v):
        return _apply_at(lib, v, r, idx, e, codes, scale, steers, rel)
    x = v.reshape(-1)[idx].to(torch.float64).contiguous()
    out = torch.empty_like(x)
    done = _apply_at(lib, x, out, torch.arange(x.numel()), e, codes, scale, steers, rel)
    if done is not None and done[0] == -1:
        r.view(-1)[idx] = out
    return done


def _kernel_codes(codes: list) -> list:
    """A log's codes as rp_apply reads them: a parity bool as 0 or 1, a wide entry's 32 bits tagged 1 << 32."""
    return [c if type(c) is bool else (c & 0xFFFFFFFF) | 1 << 32 for c in codes]


def _apply_at(lib, v, r, idx, e, codes, scale, steers, rel):
    code = torch.tensor(_kernel_codes(codes), dtype=torch.int64)
    why, ratio = ctypes.c_int64(0), ctypes.c_double(0.0)
    bad = lib.rp_apply_at(
        v.data_ptr(),
        r.data_ptr(),
        v.numel(),
        idx.data_ptr(),
        e.data_ptr(),
        code.data_ptr(),
        idx.numel(),
        scale,
        int(steers),
        rel,
        ctypes.byref(why),
        ctypes.byref(ratio),
    )
    return None if bad < -1 else (bad, why.value, ratio.value)


LOG_REFUSALS = {
    -1: "unknown version",
    -2: "truncated or overlong varint",
    -3: "point count exceeds size",
    -4: "keys not strictly increasing",
    -5: "bad entry count",
    -6: "truncated wide entry",
    -7: "truncated parity bits",
    -8: "stray parity bits",
    -9: "trailing bytes",
}


def decode_flat(buf: bytes, max_entries: int):
    """determinism.decode_log in one C pass, as flat arrays (determinism.FlatLog's fields: the keys,
    each key's first entry and count, every entry's index and code: a parity bit 0 or 1, or a wide
    entry's 32 bits | 2^32), or ValueError with the reference's words; None where the kernel is off or
    a value needs more than 63 bits (the caller decodes with the reference)."""
    lib = library()
    if lib is None or not isinstance(buf, bytes | bytearray):
        return None
    size = max(1, min(len(buf), max_entries))
    ints = torch.empty(3 * (len(buf) + 1) + 2 * size + 1, dtype=torch.int64)
    p = ints.data_ptr()
    at = [p + 8 * o for o in (0, len(buf) + 1, 2 * (len(buf) + 1), 3 * (len(buf) + 1))]
    npoints = at[3] + 8 * 2 * size
    total = lib.rp_decode_log(bytes(buf), len(buf), max_entries, at[0], at[1], at[2], at[3], at[3] + 8 * size, npoints)
    if total == -10:
        return None
    if total < 0:
        raise ValueError(f"rounding log: {LOG_REFUSALS[total]}")
    a = ints.numpy()
    n = int(a[-1])
    keys, starts, counts = (a[i * (len(buf) + 1) : i * (len(buf) + 1) + n] for i in range(3))
    base = 3 * (len(buf) + 1)
    # copies: the scratch above is sized by the log's bytes, several times what the entries need
    return tuple(t.copy() for t in (keys, starts, counts, a[base : base + total], a[base + size : base + size + total]))


def encode_flat(keys, starts, counts, idx, codes) -> bytes | None:
    """determinism.encode_log of a FlatLog's arrays (int64, contiguous) in one C pass: the reference's
    bytes; None where the kernel is off or the arrays are not a log (keys or indices not increasing)."""
    lib = library()
    if lib is None:
        return None
    arrays = [np.ascontiguousarray(a, dtype=np.int64) for a in (keys, starts, counts, idx, codes)]
    keys, starts, counts, idx, codes = arrays
    if len(starts) != len(keys) or len(counts) != len(keys) or len(codes) != len(idx):
        return None  # (each run's bounds are checked in C, without int64 sums that could wrap)
    cap = 1 + 10 + 20 * len(keys) + 14 * len(idx) + (len(idx) + 7 * len(keys)) // 8 + len(keys)
    out = np.empty(cap, dtype=np.uint8)
    ptr = lambda a: a.ctypes.data
    n = lib.rp_encode_log(ptr(keys), ptr(starts), ptr(counts), len(keys), ptr(idx), ptr(codes), len(idx), ptr(out), cap)
    return None if n < 0 else out[:n].tobytes()
