"""Disputes: find the first step, then the first op of that step, where prover and verifier part.

When a replayed segment [a, b) does not reach the recorded checkpoint b, the verifier asks the
prover's transcript store for intermediate states and bisects: both sides agree on the state at a
(the checkpoint), disagree at b; the state at mid is fetched and compared with the verifier's own
replay, halving the interval until one step t is left (states at t agree, at t+1 not): log2(b - a)
fetches. Then the store's per-op trace of step t (every rounded output, keyed as in the rounding
log) is compared with the verifier's trace, in the verifier's execution order: the first op whose
output differs is the disagreement, and only that op needs recomputing in a court of arbitration.

In production no prover answers queries after the nonce: it answered them all before, in its
transcript. `committed_dispute` bisects against the transcript's per-step commitments
(transcript_layout.state_digests: each tensor of the state after every step; optionally op_digests:
every rounded output of every step): the first step whose committed state differs from the
verifier's replay from the agreed checkpoint, then the first operation of that step whose committed
output differs from the verifier's (in the verifier's execution order); without op commitments, the
rounding point of a step that does not replay, or the update of the first tensor whose bits differ.
Every step is a commitment made before the nonce existed, so the prover's word is never asked.
A transcript without step commitments falls back to `divergence_from_commitments`: its recorded
loss and rounding log (the replay stops at the first step whose committed loss or log does not
replay: that step, and the rounding point whose logged close call does not fit, or "loss" when the
forward of that step already disagrees), and, when every step replays, the checkpoint: its last
step's update, naming the first tensor whose bits differ.

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
from replay.protocol.transcript_layout import op_digest, state_digests
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


def _replayed_states(tr: Transcript, start: int, replayer) -> tuple[list, list[State], Mismatch | None]:
    """(the segment's steps, every state the replay reaches from the checkpoint at `start`, the Mismatch that
    stopped it or None): a bisection then costs no further replay."""
    items = tr.segment(start)
    ours = [tr.checkpoint(start).to(replayer.device)]
    for t, batch, log in items:
        try:
            ours.append(replayer.step(ours[-1], t, batch, log))
        except Mismatch as failure:  # a step that does not replay (its log or recorded loss) is itself a divergence
            return items, ours, failure
    return items, ours, None


def committed_dispute(tr: Transcript, start: int, end: int, replayer) -> dict | None:
    """First divergent step of the segment [start, end) and its first divergent operation, bisected against the
    transcript's per-step commitments (module docstring); None when the transcript commits no step states."""
    commits = tr.step_commitments(start)
    if not any(state is not None for state, _ in commits.values()):
        return None
    items, ours, failure = _replayed_states(tr, start, replayer)
    names = sorted(ours[0].tensors())

    def differing(done: int) -> str | None:
        """The first tensor (by name) of our state after `done` steps that differs from the committed one."""
        committed = commits.get(done - 1, (None, None))[0]
        mine = state_digests(ours[done - start])
        if committed is None or len(committed) != len(mine):
            return "(no commitment)"
        for i, name in enumerate(names):
            if mine[32 * i : 32 * i + 32] != committed[32 * i : 32 * i + 32]:
                return name
        return None

    lo, hi, compared = start, start + len(ours) - 1, 0
    if failure is None:
        compared += 1
        if differing(end) is None:  # the commitments agree with our replay: the checkpoint is not what they say
            tensor = first_differing_tensor(ours[-1], tr.checkpoint(end))
            return {
                "step": end - 1,
                "op": "checkpoint",
                "tensor": tensor,
                "compared_states": compared,
                "detail": f"every step of {start}..{end} replays to the state the transcript committed; the "
                f"checkpoint at {end} is not that state (first in {tensor})",
                "source": "step commitments",
            }
    else:
        hi += 1  # the step that failed to replay
    while hi - lo > 1:
        mid = (lo + hi) // 2
        compared += 1
        if differing(mid) is None:
            lo = mid
        else:
            hi = mid
    t = lo
    out = {"step": t, "op": None, "compared_states": compared, "source": "step commitments"}
    tensor = differing(t + 1) if t + 1 - start < len(ours) else None
    ops = commits.get(t, (None, None))[1]
    if ops is not None:
        _, batch, log = items[t - start]
        for key, name, value in step_trace(tr, replayer.model, ours[t - start], batch, log):
            if ops.get(key) != op_digest(value):
                return {
                    **out,
                    "op": name,
                    "key": key,
                    "detail": f"step {t}: the first operation whose output "
                    f"differs from the transcript's commitment is {name}",
                }
    if ops is not None and tensor is not None:
        return {
            **out,
            "op": f"state after the step ({tensor})",
            "tensor": tensor,
            "detail": f"step {t}: every operation's output matches the transcript's commitment, the state it "
            f"committed after the step is not their result (first in {tensor})",
        }
    if failure is not None and failure.step == t:
        named = divergence_from_commitments(start, end, failure, None, None, first_differing_tensor)
        return {**out, "op": named["op"], "detail": f"step {t} does not replay: {failure.what[:300]}"}
    return {
        **out,
        "op": f"update of {tensor}",
        "tensor": tensor,
        "detail": f"step {t}: the state after it differs from the transcript's commitment first in {tensor} "
        "(no per-op commitments to name an earlier operation)",
    }


class RecomputingStore:
    """The prover's store: any intermediate state or per-op trace, recomputed from its own transcript."""

    def __init__(self, root, device="cpu"):
        self.tr = Transcript(root, device)
        self.replayer = Replayer(self.tr, Budget(max_seconds=float("inf")), device)

    def state(self, step: int) -> State:
        return self.replayer.run(self.tr.segment_start(step), step)

    def trace(self, step: int) -> dict:
        start = self.tr.segment_start(step)
        state = self.replayer.run(start, step)
        _, batch, log = self.tr.segment(start)[step - start]
        return {k: (name, v) for k, name, v in step_trace(self.tr, self.replayer.model, state, batch, log)}
