"""The two ways a transcript fails to be read: not a transcript at all, or not what the manifest committed to."""

from __future__ import annotations


class MalformedTranscript(Exception):
    """Input that is not a transcript (schema, bounds, file format); the verdict is "malformed"."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class CommitmentMismatch(Exception):
    """A file or batch differs from what the manifest committed to."""
