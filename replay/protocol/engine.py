"""The replay engine: replay transcript steps against a budget (shared by the verifier and the dispute bisection).

`Replayer(tr, Budget(...)).run(start, until)` replays from the checkpoint at `start`; a step whose rounding
log or recorded loss does not fit the replay raises `Mismatch`, a spent budget `BudgetExhausted`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from replay.protocol.transcript import Transcript
from replay.protocol.transcript_errors import BeyondThisVerifier, MalformedTranscript
from replay.training import architectures as models
from replay.training.determinism import LogMismatch, Rounder, decode_log_flat
from replay.training.train import State, frozen_heap, train_step


@dataclass
class Budget:
    """What the verifier may spend: wall-clock seconds, replayed steps, and random segments to replay."""

    max_seconds: float = 600.0
    max_steps: int | None = None
    segments: int = 2


class BudgetExhausted(Exception):
    pass


class Mismatch(Exception):
    """The replay does not reproduce the transcript at `step`."""

    def __init__(self, step: int, what: str):
        super().__init__(f"step {step}: {what}")
        self.step, self.what = step, what


class Replayer:
    """Replays transcript steps on a device, counting them against the budget."""

    def __init__(self, tr: Transcript, budget: Budget, device="cpu", started: float | None = None):
        """BeyondThisVerifier where a step of `tr` costs more than this verifier's budgets (`tr.beyond_budget`)."""
        if tr.beyond_budget:
            raise BeyondThisVerifier(tr.beyond_budget)
        self.tr, self.budget, self.device = tr, budget, torch.device(device)
        self.model = models.build(tr.arch, tr.config)
        self.started, self.steps = started or time.monotonic(), 0
        self.max_window = 0.0  # widest applied rounding-log window relative to its point's scale

    def step(self, state: State, t: int, batch: dict, log: bytes | None) -> State:
        """One step from the transcript's batch and rounding log; the loss must be the recorded one."""
        if self.budget.max_steps is not None and self.steps >= self.budget.max_steps:
            raise BudgetExhausted(f"step budget ({self.budget.max_steps}) spent")
        if time.monotonic() - self.started > self.budget.max_seconds:
            raise BudgetExhausted(f"time budget ({self.budget.max_seconds} s) spent")
        self.steps += 1
        rounder = None
        if self.tr.precision == "det64":
            try:
                rounder = Rounder("replay", entries=decode_log_flat(log, self.tr.log_entries))
            except ValueError as e:
                raise MalformedTranscript(f"step {t}: {e}") from None
        try:
            state, loss = train_step(
                self.model, state, batch, self.tr.manifest["optimizer"], self.tr.precision, rounder
            )
        except LogMismatch as e:
            raise Mismatch(t, f"rounding log does not fit the replay ({e})") from None
        if rounder is not None:
            self.max_window = max(self.max_window, rounder.max_ratio)
        if loss != self.tr.manifest["records"][t]["loss"]:
            raise Mismatch(
                t, f"replayed loss {loss!r} differs from the recorded {self.tr.manifest['records'][t]['loss']!r}"
            )
        return state

    def run(self, start: int, until: int, each=None) -> State:
        """Replay from the checkpoint at `start` through step `until` (state after `until` steps)."""
        state = self.tr.checkpoint(start).to(self.device)
        if each:
            each(state)
        with frozen_heap():
            for t, batch, log in self.tr.segment(start) if until > start else []:
                if t >= until:
                    break
                state = self.step(state, t, batch, log)
                if each:
                    each(state)
        return state
