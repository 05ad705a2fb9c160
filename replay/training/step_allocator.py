"""The step allocator (`_step_allocator.cpp`): torch's CPU allocator, in a process that records or replays, for
blocks of 64 KiB and more, kept mapped between steps in segments of their own and reused best fit, split and
merged as CUDA's caching allocator does on a GPU. A step's large temporaries then neither fault fresh pages in
every step (glibc's mmaps) nor drift apart among the heap's small blocks (glibc tuned to keep them: a 32x32-image
CNN's step held 143 MiB resident after its first step and 294 MiB by its 30th, for 72 MiB of live large blocks);
here the same step maps 86 MiB of segments, in step 30 as in step 1 (`bench/step_allocator.py`).

Installed by `native.tune_allocator` (the first deterministic step of a process); its free blocks are unmapped at
the end of a run of steps (`train.frozen_heap`, the last loop out) and whenever a new segment cannot be mapped (an
address-space cap: the verifier's). Optional like the kernel: it needs a C++ compiler and torch's headers (its
wheel ships them), is built in about two seconds on first use and cached beside the kernel (`build.compiled`);
without it, or with `REPLAY_ALLOCATOR=0`, glibc's heap is tuned to keep large blocks instead. Numerics do not
depend on it: where a block lives changes no value.

Why C++ rather than the kernel's C: torch's allocator interface (`c10::Allocator`, `c10::SetCPUAllocator`) is a
C++ class in libc10; the file includes nothing else of torch, so it builds in seconds, not a torch extension's
minute.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import threading
import warnings
from pathlib import Path

import torch

from replay.training import build

SOURCE = Path(__file__).with_name("_step_allocator.cpp")
STATS = ("mapped", "live", "segments", "peak_mapped", "free_blocks", "large_min")
_LOCK = threading.Lock()
_LIB: ctypes.CDLL | bool | None = None  # None: not tried yet; False: unavailable or off


def compiler() -> str | None:
    """The C++ compiler: $CXX, else c++, g++ or clang++ on PATH; None where there is none."""
    return os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")


def _flags() -> list[str]:
    include = Path(torch.__file__).parent / "include"
    abi = int(torch.compiled_with_cxx11_abi())
    return ["-O2", "-std=c++17", "-fPIC", "-shared", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-I{include}"]


def _build() -> Path:
    cxx = compiler()
    if not cxx:
        raise OSError("no C++ compiler (c++, g++ or clang++) on PATH")
    lib = Path(torch.__file__).parent / "lib"
    libs = [f"-L{lib}", "-lc10", f"-Wl,-rpath,{lib}"]
    return build.compiled(cxx, SOURCE, [_flags()], libs, "step-allocator", f"torch {torch.__version__} {lib}")


def _load():
    lib = build.loaded("REPLAY_ALLOCATOR", _build, "step allocator unavailable, glibc's heap is tuned instead")
    if not lib:
        return False
    try:
        lib.rp_step_allocator_install.restype = ctypes.c_int
        lib.rp_step_allocator_stats.argtypes = [ctypes.c_void_p]
        lib.rp_step_allocator_check.restype = ctypes.c_int
    except AttributeError as exc:  # a library that is not this source's (a cache tampered with)
        warnings.warn(f"replay: step allocator unusable ({exc})", RuntimeWarning, stacklevel=3)
        return False
    if lib.rp_step_allocator_install() < 0:  # another allocator of higher priority holds the CPU
        return False
    return lib


def install() -> bool:
    """Make the step allocator torch's CPU allocator (once per process): whether it is."""
    global _LIB
    if _LIB is None:
        with _LOCK:
            if _LIB is None:
                _LIB = _load()
    return bool(_LIB)


def release() -> None:
    """Unmap every free block: its pages go back to the system (blocks still in use stay)."""
    if _LIB:
        _LIB.rp_step_allocator_release()


def stats() -> dict[str, int] | None:
    """Bytes mapped, bytes in live blocks, segments, the most bytes ever mapped, free blocks, and the size from which
    a block is the step allocator's; None where it is not installed."""
    if not _LIB:
        return None
    out = (ctypes.c_int64 * len(STATS))()
    _LIB.rp_step_allocator_stats(out)
    return dict(zip(STATS, out))


def check() -> int:
    """The allocator's own invariants walked (`rp_step_allocator_check`): 0 where they hold, else which failed."""
    return _LIB.rp_step_allocator_check() if _LIB else 0
