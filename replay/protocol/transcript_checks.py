"""The cheap whole-transcript checks: every data commitment, the seed-derived initial weights, update sizes
against the learning-rate schedule (trajectory.py), and the loss trend (a finding, never a reason)."""

from __future__ import annotations

from replay.protocol.trajectory import trajectory_checks
from replay.protocol.transcript import Transcript
from replay.protocol.transcript_errors import CommitmentMismatch
from replay.training import architectures as models
from replay.training.train import initial_state


def data_commitment_checks(tr: Transcript, report: dict, tick) -> list[str]:
    """Every segment's batches and files against the manifest's commitments: no model is built, no step replayed
    (so they also run where a step is beyond this verifier's budgets)."""
    reasons = []
    for start in tr.checkpoints[:-1]:
        tick()
        try:
            tr.segment(start)
        except CommitmentMismatch as e:
            reasons.append(str(e))
    report["checks"]["data_commitments"] = not reasons
    return reasons


def whole_transcript_checks(tr: Transcript, report: dict, tick) -> list[str]:
    """Data commitments, seed-derived init, update sizes vs. the LR schedule, loss trend. tick() enforces the budget."""
    reasons = data_commitment_checks(tr, report, tick)

    init = initial_state(models.init_params(tr.arch, tr.config, tr.manifest["seed"]), tr.manifest["optimizer"])
    ok = tr.differing_tensor(0, init) is None  # streamed against the derived state: one copy of the state held
    del init  # not held through the trajectory checks
    report["checks"]["initialisation"] = ok
    if not ok:
        reasons.append("the checkpoint at step 0 is not the initialisation derived from the committed seed")

    reasons += trajectory_checks(tr, report, tick)

    losses = [r["loss"] for r in tr.manifest["records"]]
    if len(losses) < 2:  # one step has no trend (its first quarter is its last)
        report["checks"]["loss_trend"] = {"ok": None, "steps": len(losses)}
        return reasons
    q = max(1, len(losses) // 4)
    head, tail = sum(losses[:q]) / q, sum(losses[-q:]) / q
    # informational only: a schedule the manifest allows may barely move the weights (the screen tests learning)
    report["checks"]["loss_trend"] = {"ok": tail < head, "first_quarter": head, "last_quarter": tail}
    if not tail < head:
        report.setdefault("findings", []).append(
            {
                "kind": "loss_trend",
                "detail": "the loss did not go down from the run's first quarter to its last",
                "evidence": {"first_quarter": head, "last_quarter": tail},
            }
        )
    return reasons
