"""The verifying machine's floating-point environment: IEEE subnormals, or no verification.

    problem = float_environment_problem()   # None, or why this process must not verify

With flush-to-zero (FTZ: subnormal results become 0) or denormals-are-zero (DAZ: subnormal
inputs read as 0) on, float32 and float64 results near zero differ from an IEEE machine's while
every error bound still claims them exact, so a replay could diverge silently (or be steered).
Both are per-thread CPU modes (MXCSR on x86, FPCR on ARM) that a library, a build flag
(-ffast-math links crtfastmath.o) or torch.set_flush_denormal(True) may switch on. This probes
them where the replay computes: torch on the CPU, float32 and float64, a vectorised kernel and a
scalar one, and Python floats; any subnormal result that comes out 0, or subnormal input read as 0,
is a problem. The verdict is then "error" (the verifier's machine is at fault, never the prover).
"""

from __future__ import annotations

import torch

PROBES = {torch.float32: 2.0**-140, torch.float64: 2.0**-1060}  # subnormal in each format


def float_environment_problem() -> str | None:
    """None if subnormals behave as IEEE 754 requires here, else a reason naming the mode."""
    for dtype, tiny in PROBES.items():
        name = str(dtype).removeprefix("torch.")
        for n in (1, 64):  # a scalar path and a vectorised one
            sub = torch.full((n,), tiny, dtype=dtype)
            if not bool((sub * 1.0 != 0).all()):  # DAZ: a subnormal input reads as 0
                return f"denormals-are-zero is on for {name} on this CPU (subnormal inputs read as 0)"
            half = torch.full((n,), tiny * 2.0**40, dtype=dtype) * 2.0**-40  # a normal * 2^-40: subnormal
            if not bool((half != 0).all()):  # FTZ: a subnormal result becomes 0
                return f"flush-to-zero is on for {name} on this CPU (subnormal results become 0)"
    x = float(PROBES[torch.float64]) * 2.0**40
    if x * 2.0**-40 == 0.0:
        return "flush-to-zero is on for Python floats in this process"
    return None
