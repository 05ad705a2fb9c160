"""A claim's verdict and findings in plain words, for the prover (the claims API) and the regulator (the desk).

The verifier's findings are heuristics with their evidence (docs/claims.md §3): they never decide a result,
and an honest run can trip them. A bare "screen flagged [10, 12]" reads like an accusation; these sentences
say what was measured, what it would mean, and that it decided nothing. Pure: no database, no Django.
"""

from __future__ import annotations

RESULTS = {
    "pending": "Not verified yet: a worker copies the transcript, then replays it.",
    "verified": "Verified: the replayed steps reproduced the snapshot's weights bit for bit and every rule holds.",
    "mismatch": "Mismatch: replaying the transcript did not reproduce what it claims (see the first divergent step).",
    "rule_violated": "Rule violated: the transcript replays, but it breaks a rule (compute, chips or counted work).",
    "malformed": "Malformed: the transcript or its location could not be read as a transcript; nothing was replayed.",
    "unavailable": "Unavailable: the transcript could not be copied from its location after several attempts.",
    "timed_out": "Timed out (an old verdict): the replay ran out of time.",
    "error": "Verifier error: our verifier failed; it is retried and never held against the prover.",
}

FINDINGS = {
    "screen": (
        "The Proof-of-Training-Data screen compares, at each checkpoint, how much the loss fell on the batch the "
        "run had just trained on against a batch it had not yet seen. At the checkpoints of steps {steps} it found no such "
        "trace of having trained on their declared batches — what a checkpoint made elsewhere (other data, more "
        "compute) would look like, and what an honest checkpoint shows now and then by chance. A screen, not proof: "
        "it decided nothing; the replayed segments are exact."
    ),
    "straight_line": (
        "Checkpoints around steps {steps} lie nearly on a straight line in weight space. Interpolated (made-up) "
        "checkpoints look like this; so do honest runs with momentum that are converging. It decided nothing."
    ),
    "update_jump": (
        "The size of the weights' updates per unit of learning rate changes sharply between checkpoint intervals "
        "({jump}). A run resumed from other weights can look like this; so can an honest schedule change. It "
        "decided nothing."
    ),
    "loss_trend": (
        "The training loss did not fall from the run's first quarter to its last. Unusual for real training, but "
        "possible with a tiny learning rate or a short run. It decided nothing."
    ),
    "unaccounted_work": (
        "The chip's firmware counted more (or less) compute between two snapshots than the claimed steps need: "
        "work the transcript does not account for. {detail}"
    ),
}


def result_explained(result: str) -> str:
    return RESULTS.get(result, f"Result {result}.")


def finding_explained(finding: dict) -> str:
    """One finding in words; an unknown kind falls back to the verifier's own detail."""
    kind = finding.get("kind")
    evidence = finding.get("evidence") if isinstance(finding.get("evidence"), dict) else {}
    steps = evidence.get("flagged") or evidence.get("collinear_at") or []
    steps = steps if isinstance(steps, list) else []
    shown = ", ".join(str(s) for s in steps[:20]) + (", ..." if len(steps) > 20 else "")
    jump = evidence.get("max_jump")
    words = FINDINGS.get(kind) if isinstance(kind, str) else None
    if words is None:
        return str(finding.get("detail") or kind or "a finding")
    return words.format(
        steps=shown or "(none named)",
        jump=f"{jump:.1f}x, more than the {evidence.get('allowed')}x allowed" if type(jump) in (int, float) else "",
        detail=str(finding.get("detail") or ""),
    )


def findings_explained(report: dict | None) -> list[dict]:
    """[{kind, detail, meaning}] for each finding of a claim's report (malformed entries left out)."""
    findings = report.get("findings") if isinstance(report, dict) else None
    if not isinstance(findings, list):
        return []
    return [
        {"kind": f.get("kind"), "detail": f.get("detail"), "meaning": finding_explained(f)}
        for f in findings
        if isinstance(f, dict)
    ]
