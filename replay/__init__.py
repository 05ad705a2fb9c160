"""Deterministic training replay (PyTorch, never Django). See DESIGN §6.

On CPU its hot loops run in an optional C kernel (native.py); without it, the same bits from torch.

Prover: `Recorder(out, arch, steps=N).run()` writes a transcript. Verifier: `verify(dir, claims,
Budget(...))` replays it bit-exactly on any thread count or device and returns a `Verdict`.
"""
from .recorder import Recorder
from .transcript import MalformedTranscript, Transcript
from .verifier import Budget, Verdict, verify

__all__ = ["Budget", "MalformedTranscript", "Recorder", "Transcript", "Verdict", "verify"]
