"""A stand-in for ``python -m replay verify`` that speaks the verifier contract (docs/claims.md).

What it does comes from $STUB_VERIFIER (JSON): {"mode": "verdict" | "crash" | "signal" | "garbage" | "memory" |
"hang" | "inconsistent" | "other-nonce", "verdict": ..., "segments": [...], "drawn": [...] (those of the segments a
random draw chose; default all of them), "total": N, "pool": N (default: as the verifier counts it), "cut": S (the
draw a spent budget cut), "extra": {more output keys},
"pairs": true (list the claim's pairs across runs whose other run has no figures, as the verifier does)}. Each run appends its
argv, claims file, $TMPDIR and $REPLAY_FETCH_* as one JSON line to $STUB_RECORD.
"""

import json
import os
import signal
import sys
import threading
from pathlib import Path

EXIT = {"verified": 0, "rejected": 1, "malformed": 2, "error": 3, "incomplete": 4}


def unchecked_pairs(claims: dict) -> list[dict]:
    """The claim's chip's snapshots at counter +- 1 of another run without that run's figures (run_steps)."""
    out = []
    for c in claims["claims"]:
        for h in claims.get("history", {}).get(c["serial"], []):
            if abs(h["counter"] - c["counter"]) == 1 and h["manifest"] != claims["manifest"] and "run_steps" not in h:
                out.append({"serial": c["serial"], "counters": sorted([h["counter"], c["counter"]])})
    return out


def main() -> int:
    args = sys.argv[1:]
    spec = json.loads(os.environ.get("STUB_VERIFIER") or "{}")
    claims = json.loads(Path(args[args.index("--claims") + 1]).read_text())
    nonce = args[args.index("--nonce") + 1]
    with open(os.environ["STUB_RECORD"], "a") as record:
        env = {k: v for k, v in os.environ.items() if k == "TMPDIR" or k.startswith("REPLAY_FETCH_")}
        record.write(json.dumps({"argv": args, "claims": claims, "env": env}) + "\n")
    mode = spec.get("mode", "verdict")
    if mode == "signal":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "garbage":
        print("Traceback (most recent call last): ...")
        return 1
    if mode == "memory":
        hog = bytearray(spec["bytes"])  # beyond RLIMIT_AS: MemoryError, an uncaught traceback, exit 1
        return len(hog) and 0
    if mode == "hang":
        threading.Event().wait()
    verdict = spec.get("verdict", "verified")
    segments = spec.get("segments", [0])
    total = spec.get("total", 10)
    drawn = spec.get("drawn", segments)
    earlier = set(claims.get("replayed_segments", []))
    replayed = set(segments) | earlier
    # as the verifier counts: the pool is what was never replayed, forced now or pending; the miss probability
    # the product of (pool - drawn) / pool over the run's verifications (replay/protocol/coverage.py)
    forced, pending = set(segments) - set(drawn), set(claims.get("pending_segments", []))
    pool = spec.get("pool", total - len(earlier | forced | pending))
    missed = 1.0
    for p, d in [*claims.get("earlier_draws", []), [pool, len(drawn)]]:
        missed *= (p - d) / p if p else 1.0
    out = {
        "verdict": "error" if mode == "crash" else verdict,
        "reasons": spec.get("reasons", ["the verifier hit a bug"] if mode == "crash" else []),
        "mismatch_step": spec.get("mismatch_step"),
        "nonce": "00" * 16 if mode == "other-nonce" else nonce,
        "segments_replayed": segments,
        "segments_drawn": drawn,
        "draw_pool": pool,
        "draw_cut": spec.get("cut"),
        "segments_total": total,
        "coverage": 1.0 if len(replayed) >= total else 1 - missed,
        "screen": None,
        "flops": 1.0e9,
        "steps": 20,
        "rules": {},
        **({"across_runs_unchecked": unchecked_pairs(claims)} if spec.get("pairs") else {}),
        **spec.get("extra", {}),
    }
    print(json.dumps(out))
    if mode == "inconsistent":
        return 0 if verdict != "verified" else 1
    return 3 if mode == "crash" else EXIT[verdict]


if __name__ == "__main__":
    sys.exit(main())
