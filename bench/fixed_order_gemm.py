"""How fast is a float32 GEMM with a fixed order of operations? (An experiment for issue 5.)

    .venv/bin/python bench/fixed_order_gemm.py

The deterministic mode of replay/ computes in float64 and logs close calls (docs/transcripts.md, The rounding log). Its cost
on CPUs is bounded below by float64 GEMM, ~2x float32 here. The alternative the brief names is
RepOps: fix the order of floating-point operations, so float32 itself gives the same bits
everywhere. `fixed_order_gemm.c` is such a GEMM (see its header). This script checks that its bits
do not depend on the instruction set it was compiled for (AVX-512, AVX2 + FMA, or SSE2 with libm's
fmaf), and measures it against MKL's float32 GEMM
and float64 GEMM (torch, 1 thread) at the shapes of the bundled and the wide GPT. Prints a
markdown table; not used by replay/.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("fixed_order_gemm.c")
SHAPES = [(512, 64, 192), (512, 256, 64), (512, 64, 256), (1024, 256, 768), (1024, 1024, 256), (1024, 256, 1024)]


def build(out: Path, arch: str) -> ctypes.CDLL:
    lib = out / f"gemm-{arch}.so"
    flags = ["-O3", f"-march={arch}", "-ffp-contract=off", "-fno-math-errno", "-fPIC", "-shared", "-std=c99"]
    subprocess.run(["cc", *flags, "-o", str(lib), str(SOURCE), "-lm"], check=True)
    so = ctypes.CDLL(str(lib))
    so.gemm_fixed.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3
    return so


def fixed(lib, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    c = torch.empty(a.shape[0], b.shape[1])
    lib.gemm_fixed(a.data_ptr(), b.data_ptr(), c.data_ptr(), a.shape[0], b.shape[1], a.shape[1])
    return c


def best(fn, reps: int = 7) -> float:
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        native = build(Path(d), "native")
        others = [build(Path(d), arch) for arch in ("x86-64-v3", "x86-64")]  # AVX2 + FMA; SSE2 with libm's fmaf
        print(f"torch {torch.__version__}, 1 thread, CPU capability {torch.backends.cpu.get_cpu_capability()}\n")
        print(
            "| M x K x N | MKL float32 | MKL float64 | fixed-order float32 | fixed / MKL float32 | float64 / float32 "
            "| same bits: native, AVX2, SSE2 builds |"
        )
        print("|---|---|---|---|---|---|---|")
        g = torch.Generator().manual_seed(0)
        for m, k, n in SHAPES:
            a, b = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
            a64, b64 = a.double(), b.double()
            bits = fixed(native, a, b).view(torch.int32)
            same = all(torch.equal(bits, fixed(lib, a, b).view(torch.int32)) for lib in others)
            f32 = best(lambda: a @ b)
            f64 = best(lambda: a64 @ b64)
            fx = best(lambda: fixed(native, a, b))
            print(
                f"| {m}x{k}x{n} | {f32 * 1e3:.3f} ms | {f64 * 1e3:.3f} ms | {fx * 1e3:.3f} ms | {fx / f32:.2f} | "
                f"{f64 / f32:.2f} | {same} |",
                flush=True,
            )


if __name__ == "__main__":
    sys.exit(main())
