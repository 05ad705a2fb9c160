"""Cheating provers: recorders that write consistent transcripts (every hash re-committed) of runs
that did not happen as declared. Each is the honest Recorder with one method overridden."""

from __future__ import annotations

import torch

from replay import Recorder
from replay.training.determinism import Rounder
from replay.training.train import train_step


class ChosenBatches(Recorder):
    """Trains on examples it picks (the lowest indices, in order), with valid inclusion proofs for them."""

    def draw(self, t):
        data = self.batches.data
        idx = [(t * self.batch + j) % data.size for j in range(self.batch)]
        proofs = b"".join(b"".join(data.tree.proof(i)) for i in idx)
        i = torch.tensor(idx)
        return {"x": data.x[i].contiguous(), "y": data.y[i].contiguous()}, proofs


class MadeUpBatches(Recorder):
    """Trains on the sampler's draw with one value changed: an example that is not in the dataset."""

    def draw(self, t):
        batch, proofs = super().draw(t)
        batch["x"] = batch["x"].clone()
        batch["x"].view(-1)[0] += 0.25
        return batch, proofs


class HiddenCompute(Recorder):
    """At checkpoint `at`, swaps in the state of `extra` more steps trained off the books (the
    'trained elsewhere' state), then records honestly from there: every segment but the one ending
    at `at` replays."""

    def __init__(self, *a, at: int, extra: int, **kw):
        super().__init__(*a, **kw)
        self.at, self.extra = at, extra

    def after_step(self, model, state):
        if state.step != self.at:
            return state
        hidden, step = state, state.step
        for k in range(self.extra):
            hidden, _ = train_step(model, hidden, self.batches(10_000 + k), self.optimizer, "float32")
        hidden.step = step
        return hidden


class _SkewedRounder(Rounder):
    """Rounds as recorded, but one rounding point's input is 0.1% off: a doctored (or faulty) kernel."""

    target: int = -1

    def __call__(self, key, v, bound):
        return super().__call__(key, v * (1 + 1e-3) if key == self.target else v, bound)


class SkewedOp(Recorder):
    """At step `at`, the operation of rounding point `key` computes 0.1% off; everything after follows from it,
    and the transcript (losses, logs, checkpoints, per-step commitments) is what the prover computed."""

    def __init__(self, *a, at: int, key: int, **kw):
        super().__init__(*a, **kw)
        self.at, self.key = at, key

    def rounder(self, t):
        honest = super().rounder(t)
        if t != self.at:
            return honest
        skewed = _SkewedRounder("record", trace=honest.trace)
        skewed.target = self.key
        return skewed
