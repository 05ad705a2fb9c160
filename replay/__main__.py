"""Command line: record a bundled example, or verify a transcript.

    python -m replay record --arch {mlp,cnn,gpt} --steps N --out DIR [--chips 4] [--seed S]
    python -m replay verify DIR --claims FILE [--snapshots FILE] [--keys FILE] --json

verify prints the verdict and exits 0 (verified), 1 (rejected) or 2 (malformed). Both honour the
caller's thread count (OMP_NUM_THREADS; torch reads it at start-up).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .models import ARCHS
from .recorder import Recorder
from .verifier import Budget, verify

EXIT = {"verified": 0, "rejected": 1, "malformed": 2, "error": 3}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m replay", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="train a bundled example and write its transcript")
    r.add_argument("--arch", choices=sorted(ARCHS), required=True)
    r.add_argument("--steps", type=int, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--chips", type=int, default=4)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--checkpoint-interval", type=int, default=10)
    r.add_argument("--precision", choices=["det64", "float32"], default="det64")
    r.add_argument("--snapshot-rate", type=float, default=0.05, help="snapshots per chip per step (Poisson)")
    v = sub.add_parser("verify", help="verify a transcript against the prover's claims")
    v.add_argument("dir", type=Path)
    v.add_argument("--claims", type=Path, required=True)
    v.add_argument("--snapshots", type=Path, help="the chips' signed logs (JSON lines)")
    v.add_argument("--keys", type=Path, help="chip public keys {serial: base64}; default DIR/chips.json (demo only)")
    v.add_argument("--nonce", default="", help="verifier's nonce (hex), drawn after the prover committed")
    v.add_argument("--max-seconds", type=float, default=600.0)
    v.add_argument("--max-steps", type=int)
    v.add_argument("--segments", type=int, default=2, help="random segments to replay")
    v.add_argument("--max-flops", type=float, default=1e26, help="rule threshold on training compute")
    v.add_argument("--device", default="cpu")
    v.add_argument("--json", action="store_true", help="print the full verdict as JSON")
    args = p.parse_args(argv)

    if args.cmd == "record":
        out = Recorder(
            args.out,
            args.arch,
            steps=args.steps,
            seed=args.seed,
            chips=args.chips,
            checkpoint_interval=args.checkpoint_interval,
            precision=args.precision,
            snapshot_rate=args.snapshot_rate,
            progress=True,
        ).run()
        print(out)
        return 0

    try:
        nonce = bytes.fromhex(args.nonce)
    except ValueError:
        p.error("--nonce must be hex")
    keys = args.keys or (args.dir / "chips.json" if args.snapshots else None)
    verdict = verify(
        args.dir,
        args.claims,
        Budget(args.max_seconds, args.max_steps, args.segments),
        snapshots=args.snapshots,
        chip_keys=keys,
        nonce=nonce,
        rules={"max_training_flops": args.max_flops},
        device=args.device,
    )
    if args.json:
        print(json.dumps(verdict.to_json(), indent=1, default=str))
    else:
        print(verdict.verdict)
        for reason in verdict.reasons:
            print(f"  - {reason}")
    return EXIT[verdict.verdict]


if __name__ == "__main__":
    sys.exit(main())
