"""Disputes: find the first step, then the first op of that step, where prover and verifier part.

When a replayed segment [a, b) does not reach the recorded checkpoint b, the verifier asks the
prover's transcript store for intermediate states and bisects: both sides agree on the state at a
(the checkpoint), disagree at b; the state at mid is fetched and compared with the verifier's own
replay, halving the interval until one step t is left (states at t agree, at t+1 not): log2(b - a)
fetches. Then the store's per-op trace of step t (every rounded output, keyed as in the rounding
log) is compared with the verifier's trace, in the verifier's execution order: the first op whose
output differs is the disagreement, and only that op needs recomputing in a court of arbitration.

In production no prover answers queries: `divergence_from_commitments` bisects against what the
transcript committed to, per step: its recorded loss and rounding log (the replay stops at the first
step whose committed loss or log does not replay: that step, and the rounding point whose logged
close call does not fit, or "loss" when the forward of that step already disagrees), and, when every
step replays, the checkpoint: its last step's update, naming the first tensor whose bits differ.

A store is anything with `state(step) -> State` and `trace(step) -> {key: (name, float32 tensor)}`;
its answers are untrusted (a malformed answer counts as disagreement).
"""

from __future__ import annotations

import re
from typing import Protocol

import torch

from replay.protocol.engine import Budget, Mismatch, Replayer
from replay.protocol.hashing import same_bits
from replay.protocol.transcript import Transcript
from replay.training.determinism import Rounder, decode_log
from replay.training.train import State, train_step


class TranscriptStore(Protocol):
    def state(self, step: int) -> State: ...

    def trace(self, step: int) -> dict[int, tuple[str, torch.Tensor]]: ...


def bits_equal(a, b) -> bool:
    """Two training states hold the same bit patterns in every tensor (-0.0 is not +0.0; NaN payloads count)."""
    x, y = a.tensors(), b.tensors()
    return x.keys() == y.keys() and all(same_bits(x[k], y[k]) for k in x)


def first_differing_tensor(a, b) -> str | None:
    x, y = a.tensors(), b.tensors()
    for k in x:
        if k not in y or not same_bits(x[k], y[k]):
            return k
    return None


_POINT = re.compile(r"rounding point (\S+?):")


def divergence_from_commitments(start: int, end: int, failure, replayed, checkpoint, differing) -> dict:
    """First divergent step and op of segment [start, end) from the transcript's own commitments.

    failure: the replay's Mismatch (or None when every step replayed); replayed / checkpoint: the
    replayed and committed states at `end` when every step replayed; differing(a, b): the first tensor
    whose bits differ."""
    if failure is not None and hasattr(failure, "step"):
        point = _POINT.search(failure.what)
        op = point.group(1) if point else ("loss" if "loss" in failure.what else "step")
        return {"step": failure.step, "op": op, "detail": failure.what[:300], "source": "commitments"}
    tensor = differing(replayed, checkpoint) if replayed is not None else None
    return {
        "step": end - 1,
        "op": f"update of {tensor}" if tensor else None,
        "detail": f"every step of {start}..{end} replays its committed loss and log; the checkpoint at {end} "
        f"differs from the replay{f' first in {tensor}' if tensor else ''}",
        "source": "commitments",
    }


def _same(ours: State, theirs) -> bool:
    try:
        return isinstance(theirs, State) and theirs.step == ours.step and bits_equal(ours, theirs)
    except (RuntimeError, TypeError, AttributeError):
        return False


def step_trace(
    tr: Transcript, model, state: State, batch: dict, log: bytes | None
) -> list[tuple[int, str, torch.Tensor]]:
    """Run one step and keep every rounded output: [(key, name, float32)] in execution order."""
    trace: list = []
    rounder = (
        Rounder("replay", entries=decode_log(log, tr.log_entries), trace=trace, lenient=True)
        if log is not None
        else None
    )
    train_step(model, state, batch, tr.manifest["optimizer"], tr.precision, rounder)
    return trace


def dispute(tr: Transcript, start: int, end: int, store: TranscriptStore, replayer) -> dict:
    """First divergent step in [start, end) and its first divergent op, asking `store` for the prover's side."""
    items = tr.segment(start)
    ours = [tr.checkpoint(start).to(replayer.device)]
    for t, batch, log in items:  # keep every replayed state: bisection then costs no further replay
        try:
            ours.append(replayer.step(ours[-1], t, batch, log))
        except Mismatch:  # a step that does not replay (its log or recorded loss) is itself a divergence
            break
    lo, hi, fetched = start, start + len(ours) - 1, 0
    if hi == end:
        fetched += 1
        if _same(ours[-1], store.state(end)):
            return {
                "step": None,
                "op": None,
                "fetched_states": fetched,
                "detail": "the prover's store agrees with the replay, not with its own checkpoint",
            }
    else:
        hi += 1  # the step that failed to replay
    while hi - lo > 1:
        mid = (lo + hi) // 2
        fetched += 1
        if _same(ours[mid - start], store.state(mid)):
            lo = mid
        else:
            hi = mid
    t = lo
    _, batch, log = items[t - start]
    mine = step_trace(tr, replayer.model, ours[t - start], batch, log)
    theirs = store.trace(t)
    op = key = None
    for k, name, value in mine:
        other = theirs.get(k) if isinstance(theirs, dict) else None
        if not (
            isinstance(other, tuple)
            and len(other) == 2
            and isinstance(other[1], torch.Tensor)
            and other[1].shape == value.shape
            and other[1].dtype == value.dtype
            and torch.equal(other[1].cpu().view(torch.int32), value.cpu().view(torch.int32))
        ):
            op, key = name, k
            break
    return {"step": t, "op": op, "key": key, "fetched_states": fetched}


class RecomputingStore:
    """The prover's store: any intermediate state or per-op trace, recomputed from its own transcript."""

    def __init__(self, root, device="cpu"):
        self.tr = Transcript(root)
        self.replayer = Replayer(self.tr, Budget(max_seconds=float("inf")), device)

    def state(self, step: int) -> State:
        return self.replayer.run(self.tr.segment_start(step), step)

    def trace(self, step: int) -> dict:
        start = self.tr.segment_start(step)
        state = self.replayer.run(start, step)
        _, batch, log = self.tr.segment(start)[step - start]
        return {k: (name, v) for k, name, v in step_trace(self.tr, self.replayer.model, state, batch, log)}
