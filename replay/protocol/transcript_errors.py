"""The two ways a transcript fails to be read: not a transcript at all, or not what the manifest committed to."""

from __future__ import annotations


class MalformedTranscript(Exception):
    """Input that is not a transcript (schema, bounds, file format); the verdict is "malformed"."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class BeyondThisVerifier(Exception):
    """A well-formed transcript one step of which costs more than this verifier's budgets (its device's memory
    or FLOPs, replay/protocol/limits.py), though within what a verifier may hold: this verifier's limit, not the
    prover's fault. The verdict is "error": retried, where a worker with larger budgets can take it."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class CommitmentMismatch(Exception):
    """A file or batch differs from what the manifest committed to."""
