"""Training compute, counted from the architecture and the batch shapes (never taken from the prover), and the
rules on it: the threshold (max_training_flops) and the prover's declaration (under-reporting)."""

from __future__ import annotations

from replay.protocol.transcript import Transcript
from replay.training import architectures as models

DEFAULT_RULES = {"max_training_flops": 1e26}


def count_compute(tr: Transcript, rules: dict) -> tuple[dict, list[str]]:
    """({flops_per_step, flops, steps, examples, tokens, reported_flops, rules}, reasons): the count and its rules."""
    spec = tr.spec
    per_step = models.training_flops(tr.arch, tr.config, spec)
    total = per_step * tr.steps
    batch = spec["x"][1][0]
    out = {
        "flops_per_step": per_step,
        "flops": total,
        "steps": tr.steps,
        "examples": tr.steps * batch,
        "tokens": tr.steps * batch * spec["x"][1][1] if tr.arch == "gpt" else None,
        "reported_flops": tr.manifest["reported_flops"],
        "rules": {},
    }
    reasons = []
    limit = rules["max_training_flops"]
    ok = total <= limit
    out["rules"]["max_training_flops"] = {"threshold": limit, "value": total, "ok": ok}
    if not ok:
        reasons.append(f"rule violated: training compute {total:.3e} FLOPs exceeds the threshold {limit:.3e}")
    ok = tr.manifest["reported_flops"] >= total
    out["rules"]["compute_reported"] = {"reported": tr.manifest["reported_flops"], "counted": total, "ok": ok}
    if not ok:
        reasons.append(
            f"compute under-reported: declared {tr.manifest['reported_flops']:.3e} FLOPs, "
            f"the architecture and batch shapes give {total:.3e}"
        )
    return out, reasons
