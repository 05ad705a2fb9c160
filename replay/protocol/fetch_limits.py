"""The bounds of one fetch of a prover's material: the refusal it raises, what is left of its bytes, files and
time, and the caps the process environment tightens (``REPLAY_FETCH_MAX_BYTES``, ``REPLAY_FETCH_MAX_FILES``,
``REPLAY_FETCH_SECONDS``: the worker bounds whatever the command line asks for). Standard library only."""

from __future__ import annotations

import math
import os
import time

MAX_MANIFEST_BYTES = 32 << 20  # a transcript's manifest.json: the fetch's cap on it and the reader's (transcript.py)


class FetchRefused(Exception):
    """The transcript could not be fetched; the message is safe to show the prover."""

    def __init__(self, reason: str, transient: bool = False, ours: bool = False):
        super().__init__(reason)
        self.reason = reason
        self.transient = transient  # a failure that may not recur (a read, a transfer, a deadline), not a refusal
        # over this fetch's own byte or file cap: the verifier's limit (a larger one may take it), not the prover's
        # fault (an honest GPT-2-small transcript of 100 steps is some 20 GB)
        self.ours = ours


class FetchBudget:
    """What is left of the fetch's bytes, files and time."""

    def __init__(self, max_bytes: int, max_files: int, deadline_s: float):
        self.bytes, self.files, self.max_files, self.seconds = max_bytes, max_files, max_files, deadline_s
        self.deadline = time.monotonic() + deadline_s

    def take_file(self, name: str) -> None:
        if self.files <= 0:
            raise FetchRefused(f"{name}: more than the {self.max_files} files allowed", ours=True)
        self.files -= 1

    def left(self) -> float:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise FetchRefused(f"fetching the transcript took longer than {self.seconds:g} s", transient=True)
        return remaining


def caps_or(max_bytes: int, max_files: int, deadline_s: float) -> tuple[int, int, float]:
    """The caps the environment sets (``REPLAY_FETCH_MAX_BYTES``, ``REPLAY_FETCH_MAX_FILES``, ``REPLAY_FETCH_SECONDS``),
    each as large as it is set, else the given one: the claim's copy, which the worker starts with its own."""
    return _positive(_environment_caps(max_bytes, max_files, deadline_s))


def _environment_caps(max_bytes: int, max_files: int, deadline_s: float) -> tuple[int, int, float]:
    """Each cap the environment sets, else the one given."""
    try:
        return (
            int(os.environ.get("REPLAY_FETCH_MAX_BYTES", max_bytes)),
            int(os.environ.get("REPLAY_FETCH_MAX_FILES", max_files)),
            float(os.environ.get("REPLAY_FETCH_SECONDS", deadline_s)),
        )
    except ValueError:
        raise FetchRefused("a REPLAY_FETCH_* limit in the environment is not a number") from None


def _positive(caps: tuple[int, int, float]) -> tuple[int, int, float]:
    """The caps, each a positive finite number: a deadline of NaN never passed (the copy ran unbounded in time), and a
    cap of 0 or -1 called every transcript over it."""
    if not all(math.isfinite(c) and c > 0 for c in caps):
        raise FetchRefused("a REPLAY_FETCH_* limit in the environment is not a positive number")
    return caps


def tightened_caps(max_bytes: int, max_files: int, deadline_s: float) -> tuple[int, int, float]:
    """The caps, tightened by the environment of the process (the worker sets them for the verifier it starts,
    whatever the command line passes): ``REPLAY_FETCH_MAX_BYTES``, ``REPLAY_FETCH_MAX_FILES``, ``REPLAY_FETCH_SECONDS``."""
    given = (max_bytes, max_files, deadline_s)
    return _positive(tuple(min(mine, set_) for mine, set_ in zip(given, _environment_caps(*given))))
