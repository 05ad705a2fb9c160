"""A cheap whole-run screen in the manner of Proof-of-Training-Data (Choi, Shavit, Duvenaud 2023).

    result = screen(tr, tick)   # {"checked": int, "flagged": [step, ...], "z": {step: z}}

Forward passes only. A checkpoint that was really reached by training on its declared batches
carries their signature: the batch it took its last step on lost more loss between the previous
checkpoint and this one than a batch it has not trained on yet. For checkpoint c_k (k >= 1):

    R = the batch of step c_k - 1 (the last one trained on before c_k)
    O = the batch of step c_{k+1} - 1 (trained on only after c_k); for the last checkpoint, the
        batch of step c_{k-1} - 1 (trained on before c_{k-1}); none: c_k is not checked
    d_i = loss(c_{k-1}, R_i) - loss(c_k, R_i)     per example of R (a sequence's mean token loss)
    e_j = loss(c_{k-1}, O_j) - loss(c_k, O_j)     per example of O
    z_k = (mean d - mean e) / sqrt(var d / |R| + var e / |O|)      (Welch's statistic)

Paired per example, so how hard an example is cancels out; what remains is how much more the
step's own batch improved than other committed data. c_k is flagged when z_k < Z_FLAG. A
checkpoint trained elsewhere (say, 10x the declared compute on other data) has seen neither
batch: z ~ N(0, 1), flagged with probability ~Phi(Z_FLAG). An interpolated checkpoint between
c_{k-1} and c_{k+1} has partly seen O too (c_{k+1} trained on it): z drops.

Cost: each checkpoint is evaluated on at most three batches (R of its own, O of its own, and the
next checkpoint's O on the previous), float32 forwards under no_grad: about one float32 training
step per checkpoint, ~0.4 of a deterministic one (bench/replay.py). Losses are float32 and the
forward's summation order is the machine's; z moves by ~1e-6 between machines, which decides a
flag only if z lies that close to Z_FLAG.

What it does not catch: a forger who also trains the fabricated state on the declared recent
batches (the prover chooses those batches unless the data is bound to a committed sampler), or a
fabricated checkpoint whose segment is replayed (the replay catches that). A screen, not a proof.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.func import functional_call

from replay.protocol.transcript_errors import CommitmentMismatch
from replay.training import architectures as models
from replay.training.ops import Plain

Z_FLAG = 2.0


class _PerExample(Plain):
    """Plain float32 ops whose loss is per token / per example (no mean)."""

    @staticmethod
    def cross_entropy(logits, targets, name):
        return F.cross_entropy(logits, targets, reduction="none")


def example_losses(model, params: dict, batch: dict) -> torch.Tensor:
    """float64 per-example losses of a float32 forward (a sequence's mean token loss for a GPT)."""
    x, y = batch["x"], batch["y"]
    with torch.no_grad():
        out = functional_call(model, params, (x, y, _PerExample))
    return out.reshape(x.shape[0], -1).double().mean(1)


def welch_z(d: torch.Tensor, e: torch.Tensor) -> float:
    """(mean d - mean e) / its standard error; +-inf when both samples are constant."""
    diff = float(d.mean() - e.mean())
    var = (float(d.var()) if d.numel() > 1 else 0.0) / d.numel() + (
        float(e.var()) if e.numel() > 1 else 0.0
    ) / e.numel()
    if math.isnan(diff) or math.isnan(var):
        return math.nan  # non-finite losses: flagged
    if var > 0:
        return diff / math.sqrt(var)
    return math.copysign(math.inf, diff) if diff else 0.0


def sample(segment: list) -> dict:
    """One batch's worth of examples from a whole segment: every m-th row of its m batches, in order."""
    m = len(segment)
    x = torch.cat([b["x"] for _, b, _ in segment])
    y = torch.cat([b["y"] for _, b, _ in segment])
    return {"x": x[::m].contiguous(), "y": y[::m].contiguous()}


def plan(checkpoints: list[int]) -> dict[int, tuple[int, int]]:
    """{checkpoint index k: (R, O) as indices of segments (segment j runs from checkpoint j to j + 1)}."""
    out = {}
    for k in range(1, len(checkpoints)):
        if k < len(checkpoints) - 1:
            out[k] = (k - 1, k)
        elif k >= 2:
            out[k] = (k - 1, k - 2)
    return out


def screen(tr, tick=lambda: None) -> dict:
    """Run the screen over every checkpoint of a transcript, streaming (a few samples and one state held)."""
    cps = tr.checkpoints
    jobs = plan(cps)
    needs: dict[int, set[int]] = {}  # checkpoint index -> segments whose sample it is evaluated on
    for k, (r, o) in jobs.items():
        for idx in (k - 1, k):
            needs.setdefault(idx, set()).update((r, o))
    last_use: dict[int, int] = {}
    for idx, segs in needs.items():
        for j in segs:
            last_use[j] = max(last_use.get(j, -1), idx)
    model = models.build(tr.arch, tr.config)
    samples: dict[int, dict] = {}
    losses: dict[tuple[int, int], torch.Tensor] = {}
    z: dict[int, float] = {}
    for idx, c in enumerate(cps):
        if idx not in needs:
            continue
        tick()
        for j in sorted(needs[idx] - set(samples)):
            samples[j] = sample(tr.segment(cps[j]))
        params = tr.params(c)
        for j in sorted(needs[idx]):
            losses[idx, j] = example_losses(model, params, samples[j])
        if idx in jobs:
            r, o = jobs[idx]
            z[c] = welch_z(losses[idx - 1, r] - losses[idx, r], losses[idx - 1, o] - losses[idx, o])
        for key in [key for key in losses if key[0] < idx]:
            del losses[key]
        for j in [j for j in samples if last_use[j] <= idx]:
            del samples[j]
    flagged = sorted(c for c, v in z.items() if not v >= Z_FLAG)  # NaN flags too
    return {"checked": len(z), "flagged": flagged, "z": {str(c): round(v, 3) for c, v in z.items()}}


def screen_or_reason(tr, tick) -> tuple[dict | None, list[str]]:
    """screen() for the verifier: (result, reasons). A commitment the screen cannot read is a reason, the
    screen's result then None. Flags are reported, not reasons (see docs/replay-limits.md)."""
    try:
        return screen(tr, tick), []
    except CommitmentMismatch as e:
        return None, [str(e)]
