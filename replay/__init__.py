"""Deterministic training replay (PyTorch, never Django). See docs/transcripts.md.

On CPU its hot loops run in an optional C kernel (native.py); without it, the same bits from torch.

Prover: `Recorder(out, arch, steps=N).run()` writes a transcript. Verifier: `verify(dir, claims,
Budget(...))` replays it bit-exactly on any thread count or device and returns a `Verdict`.

The package imports nothing eagerly: `replay.protocol.firmware` (the chip simulator and log checker) runs
without torch; the names below are loaded from their modules on first use.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Budget": "protocol.engine",
    "MalformedTranscript": "protocol.transcript_errors",
    "Recorder": "prover.recorder",
    "Transcript": "protocol.transcript",
    "Verdict": "protocol.verifier",
    "verify": "protocol.verifier",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
