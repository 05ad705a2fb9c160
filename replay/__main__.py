"""Command line: record a bundled example, or verify a transcript.

    python -m replay record --arch {mlp,cnn,gpt} --steps N --out DIR [--chips 4] [--seed S]
        [--preset gpt2-small] [--config JSON] [--batch B] [--device cpu|cuda|auto]
        [--precision det64|float32|float64] [--commitments steps|ops|none]
        [--chip-dir var/chip-keys --serials H000000,H000001]
    python -m replay claim DIR [--serials H000004] [--run NAME] [--location URL] [--out body.json]
    python -m replay verify SOURCE --claims FILE --json [--nonce HEX] [--snapshots FILE] [--keys FILE]

record trains on simulated chips (SIM-...) that no registry knows, unless --chip-dir and --serials name
your registered chips whose firmware the chip simulator holds (replay.prover.chipsim): only their
snapshots can be claimed. claim prints the body of POST /api/inspections/claims answering the
snapshots an inspector read off --serials (docs/claims.md); the transcript's own claims.json is the
verifier's input, not that body.

SOURCE is a transcript directory or an http(s) URL of one (fetched first, in this process, by
replay.protocol.fetch). verify prints the verdict and exits 0 (verified), 1 (rejected), 2 (malformed), 3
(error: the verifier itself failed -- never the prover's fault) or 4 (incomplete: the budget ran out before
the claim's own checks); a bad budget option is a usage error (exit 2, no verdict). record and claim exit
2 naming a bad argument before anything is written (record: the verifier's own manifest bounds; --out a
new or empty folder). --nonce must carry at least 16
bytes; when omitted one is drawn (secrets.token_hex(16)) and reported. Both commands honour the
caller's thread count (OMP_NUM_THREADS; torch reads it at start-up). docs/transcripts.md has the
output's fields.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import sys
import tempfile
import traceback
from pathlib import Path

from replay.protocol import json_once
from replay.protocol import manifest_schema as schema
from replay.protocol.engine import Budget
from replay.protocol.verifier import verify
from replay.prover import listed
from replay.prover.recorder import DEFAULT_INTERVAL, MAX_SNAPSHOT_RATE, Recorder, check_out
from replay.training.architectures import ARCHS, DEFAULTS, PRESETS, validate_config

EXIT = {"verified": 0, "rejected": 1, "malformed": 2, "error": 3, "incomplete": 4}
MIN_NONCE_BYTES = 16
FETCH_MAX_BYTES = 8 << 30
FETCH_MAX_FILES = 100_000


def main(argv: list[str] | None = None) -> int:
    """The command line. A bad argument exits 2 naming it (verify: a usage error, or the verdict "malformed"
    naming --nonce); a crash of the verifier itself is the verdict "error" (exit 3), never a rejection."""
    return _main(argv)


def _verify_or_error(args) -> int:
    try:
        return _verify_source(args)
    except BaseException as e:  # MemoryError, RecursionError, a bug: the verifier failed, not the prover
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        traceback.print_exc(file=sys.stderr)
        _emit({"verdict": "error", "reasons": [f"the verifier failed: {type(e).__name__}"]}, as_json=True)
        return EXIT["error"]


EMPTY = {  # every field of the contract's output, for verdicts reached before any check ran
    "mismatch_step": None,
    "nonce": "",
    "segments_replayed": [],
    "segments_drawn": [],
    "segments_total": 0,
    "coverage": 0.0,
    "screen": None,
    "flops": 0.0,
    "steps": 0,
    "rules": {},
}


def _emit(out: dict, as_json: bool) -> None:
    out = {**EMPTY, **out}
    if as_json:  # JSON as RFC 8259 has it, which a strict reader (another government's) takes: no NaN, no Infinity
        print(json.dumps(_finite(out), indent=1, default=str, allow_nan=False))
    else:
        print(out["verdict"])
        for reason in out["reasons"]:
            print(f"  - {reason}")
        dispute = out.get("dispute") or {}
        if dispute.get("step") is not None:
            print(f"  first divergent step: {dispute['step']}, operation: {dispute.get('op')}")
        for finding in out.get("findings") or []:
            print(f"  finding ({finding['kind']}): {finding['detail']}")


def _finite(v):
    """v with each NaN or infinite number as null (a screen's z where a sample is constant or a loss not finite: its
    `flagged` list carries the screen's decision)."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


def _usage_error(parser: argparse.ArgumentParser, message: str) -> int:
    """argparse's own form (usage, then "prog: error: message"), returned as exit 2 rather than raised."""
    parser.print_usage(sys.stderr)
    print(f"{parser.prog}: error: {message}", file=sys.stderr)
    return 2


def _finite_positive(text: str) -> float:
    """A float option that must be a finite positive number (nan and inf are operator typos, not settings)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite positive number, not {text!r}")
    return value


def _integer_from(lo: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = lo - 1
        if value < lo:
            raise argparse.ArgumentTypeError(f"must be an integer of at least {lo}, not {text!r}")
        return value

    return parse


def _refuse(reason: str, as_json: bool, nonce: str = "") -> int:
    _emit({"verdict": "malformed", "reasons": [reason], "nonce": nonce}, as_json)
    return EXIT["malformed"]


def _main(argv: list[str] | None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m replay", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="train a bundled example and write its transcript")
    r.add_argument("--arch", choices=sorted(ARCHS), help="required unless --preset names the architecture")
    r.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="a named model shape (gpt2-small: 12x768, vocab 50257, block 1024; 163M parameters, the head untied)",
    )
    r.add_argument("--config", help='JSON object of shape fields over the preset or defaults, e.g. {"block": 64}')
    r.add_argument("--batch", type=int, help=f"examples per step, 1 to {schema.MAX_BATCH} (default: per architecture)")
    r.add_argument("--device", default="cpu", help="cpu, cuda[:n] or auto (cuda where there is one)")
    r.add_argument("--steps", type=int, required=True, help=f"training steps, 1 to {schema.MAX_STEPS}")
    r.add_argument("--out", type=Path, required=True, help="a new or empty folder (a transcript is never overwritten)")
    r.add_argument(
        "--chips", type=int, help=f"simulated chips, 1 to {schema.MAX_SHARDS} (default 4; not with --serials)"
    )
    r.add_argument("--seed", type=int, default=0, help=f"0 to {schema.MAX_SEED}")
    r.add_argument(
        "--checkpoint-interval",
        type=int,
        help=f"steps between checkpoints, 1 to --steps (default: {DEFAULT_INTERVAL}, or --steps when fewer)",
    )
    r.add_argument(
        "--precision",
        choices=schema.PRECISIONS,
        default="det64",
        help="det64 (the only claimable mode); float32 and float64 are plain baselines for benchmarks",
    )
    r.add_argument(
        "--snapshot-rate",
        type=float,
        default=0.05,
        help=f"snapshots per chip per step (a Poisson rate in [0, {MAX_SNAPSHOT_RATE:g}])",
    )
    r.add_argument(
        "--commitments",
        choices=["steps", "ops", "none"],
        default="steps",
        help="per-step commitments a dispute is bisected against: steps (each tensor of the state after every "
        "step; the default), ops (also every rounded output: names the first divergent operation; about twice the "
        "recording time) or none",
    )
    r.add_argument("--chip-dir", type=Path, help="the chip simulator's folder of your registered chips (var/chip-keys)")
    r.add_argument("--serials", help="comma-separated serials of your registered chips to train on (with --chip-dir)")
    c = sub.add_parser("claim", help="the claims API's body answering the snapshots an inspector read")
    c.add_argument("dir", type=Path, help="the transcript folder `record` wrote")
    c.add_argument("--serials", help="comma-separated serials the inspector read (default: every chip of the run)")
    c.add_argument("--run", help="your name for the run (default: the folder's name)")
    c.add_argument("--location", help="where the verifier reads the transcript (default: the folder's absolute path)")
    c.add_argument("--out", type=Path, help="write the body here (default: print it)")
    v = sub.add_parser("verify", help="verify a transcript against the prover's claims")
    v.add_argument("dir", help="transcript directory, or an http(s) URL of one")
    v.add_argument("--claims", type=Path, required=True)
    v.add_argument("--snapshots", type=Path, help="the chips' signed logs (JSON lines)")
    v.add_argument("--keys", type=Path, help="chip public keys {serial: base64}; default DIR/chips.json (demo only)")
    v.add_argument("--nonce", help="verifier's nonce (hex, >= 16 bytes), drawn after the prover committed")
    v.add_argument("--max-seconds", type=_finite_positive, default=600.0, help="the replay's time budget")
    v.add_argument("--max-steps", type=_integer_from(1), help="the replay's budget of training steps")
    v.add_argument("--segments", type=_integer_from(0), default=2, help="random segments to replay")
    v.add_argument(
        "--max-flops", type=_finite_positive, default=1e26, help="rule threshold on training compute (FLOPs)"
    )
    v.add_argument(
        "--device", default=os.environ.get("REPLAY_DEVICE") or "cpu", help="default: $REPLAY_DEVICE, else cpu"
    )
    v.add_argument("--json", action="store_true", help="print the full verdict as JSON")
    v.add_argument("--allow-host", action="append", default=[], help="a host the fetch may reach though private")
    args = p.parse_args(argv)

    if args.cmd == "claim":
        return _claim(args, c)
    if args.cmd == "record":
        return _record(args, r)
    return _verify_or_error(args)


def _verify_source(args) -> int:
    raw = secrets.token_hex(MIN_NONCE_BYTES) if args.nonce is None else args.nonce
    try:
        nonce = bytes.fromhex(raw)
    except ValueError:
        return _refuse("--nonce must be hex", args.json)
    if len(nonce) < MIN_NONCE_BYTES:
        return _refuse(f"--nonce must carry at least {MIN_NONCE_BYTES} bytes of randomness", args.json, raw)
    if args.keys is not None and args.snapshots is None:  # (it checked nothing: a garbage file came out verified)
        return _refuse("--keys checks the chips' logs: give --snapshots", args.json, nonce.hex())
    with tempfile.TemporaryDirectory(prefix="replay-fetch-") as tmp:
        if args.dir.startswith(("http://", "https://")):
            from replay.protocol.fetch import FetchRefused, fetch_transcript

            try:
                src = fetch_transcript(
                    args.dir,
                    Path(tmp),
                    max_bytes=FETCH_MAX_BYTES,
                    max_files=FETCH_MAX_FILES,
                    deadline_s=args.max_seconds,
                    allowed_hosts=frozenset(args.allow_host),
                )
            except FetchRefused as e:
                if e.transient or e.ours:  # a transfer that failed, or over this verifier's caps: not the prover's
                    _emit(
                        {"verdict": "error", "reasons": [f"transcript not fetched: {e}"], "nonce": nonce.hex()},
                        args.json,
                    )
                    return EXIT["error"]
                return _refuse(f"transcript not fetched: {e}", args.json, nonce.hex())
        else:
            src = Path(args.dir)
        return _verify(args, src, nonce)


def _record(args, parser: argparse.ArgumentParser) -> int:
    """Every argument is checked (against the verifier's own bounds) before anything is written: a bad one
    exits 2 naming it, with --out and every chip log untouched."""
    if (args.chip_dir is None) != (args.serials is None):
        return _usage_error(parser, "--chip-dir and --serials go together")
    if args.serials is not None and args.chips is not None:
        return _usage_error(parser, "--chips counts simulated chips: with --serials the chips are the serials named")
    if args.chip_dir is not None and args.precision != "det64":
        # a registered chip's snapshots of such a run could never be answered (verify refuses the transcript), and a
        # chip's log keeps them for good
        return _usage_error(
            parser, f"--precision {args.precision} is a plain baseline, not claimable: train registered chips in det64"
        )
    try:
        check_out(args.out)
        arch, config = _model_shape(args)
        options = {
            "steps": args.steps,
            "seed": args.seed,
            "config": config,
            "batch": args.batch,
            "checkpoint_interval": args.checkpoint_interval,
            "precision": args.precision,
            "snapshot_rate": args.snapshot_rate,
            "progress": True,
            "device": args.device,
            "commitments": args.commitments,
        }
        if args.chip_dir is not None:
            return _record_on_chips(args, arch, options)
        recorder = Recorder(args.out, arch, chips=4 if args.chips is None else args.chips, **options)
        recorder.check()
        out = recorder.run()
    except ValueError as e:
        return _usage_error(parser, str(e))
    print(out)
    if args.precision not in schema.CLAIMABLE_PRECISIONS:
        print(
            f"record: a {args.precision} run is a plain baseline for benchmarks: no verifier replays it (its replay "
            f"depends on the machine), and none of its snapshots can be claimed (record in det64)",
            file=sys.stderr,
        )
        return 0
    print(
        f"record: chips {listed(recorder.serials)} are simulated and in no registry: a verifier can replay this "
        "run, but no snapshot of it can be claimed (train with --chip-dir and --serials on your registered chips)",
        file=sys.stderr,
    )
    return 0


def _record_on_chips(args, arch: str, options: dict) -> int:
    """Train on the prover's registered chips: their own firmware (the simulator's keys) logs the snapshots."""
    from replay.prover.chipsim import ChipStore

    out = ChipStore(args.chip_dir).train(args.serials.split(","), args.out, arch=arch, **options)
    print(out)
    print(
        f"record: once an inspector has read a chip, answer it: python -m replay claim {out} --serials SERIAL",
        file=sys.stderr,
    )
    return 0


def _claim(args, parser: argparse.ArgumentParser) -> int:
    from replay.prover.claim_body import claims_body, serials_option

    if args.out is not None and args.out.is_dir():
        return _usage_error(parser, f"--out {args.out} is a folder: name the file to write the body to")
    try:
        body = claims_body(args.dir, serials_option(args.serials), args.run, args.location)
    except (OSError, ValueError) as e:
        return _usage_error(parser, str(e))
    text = json.dumps(body, indent=1) + "\n"
    if args.out is None:
        sys.stdout.write(text)
        return 0
    try:
        args.out.write_text(text)
    except OSError as e:
        return _usage_error(parser, f"--out {args.out}: cannot write it ({e.strerror or type(e).__name__})")
    print(f"claim: {len(body['claims'])} claim(s) written to {args.out}", file=sys.stderr)
    return 0


def _model_shape(args) -> tuple[str, dict]:
    """(architecture, config) from --preset / --arch and --config; ValueError names the bad field."""
    if args.preset:
        arch, config = PRESETS[args.preset]
        if args.arch and args.arch != arch:
            raise ValueError(f"--arch {args.arch} does not match --preset {args.preset} ({arch})")
    elif args.arch:
        arch, config = args.arch, DEFAULTS[args.arch]
    else:
        raise ValueError("give --arch or --preset")
    config = dict(config)
    if args.config is not None:
        try:
            fields = json_once.loads(args.config)
        except json_once.MemberTwice as e:
            raise ValueError(f"--config gives {e.name} more than once") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"--config is not JSON ({e.msg})") from None
        except RecursionError:
            raise ValueError("--config is nested too deeply") from None
        except ValueError:  # an integer of over 4300 digits: Python's own limit, its own words
            raise ValueError("--config holds a number too long") from None
        if not isinstance(fields, dict):
            raise ValueError("--config must be a JSON object of shape fields")
        config.update(fields)
    validate_config(arch, config)
    return arch, config


def _verify(args, src: Path, nonce: bytes) -> int:
    keys = args.keys or (src / "chips.json" if args.snapshots else None)
    verdict = verify(
        src,
        args.claims,
        Budget(args.max_seconds, args.max_steps, args.segments),
        snapshots=args.snapshots,
        chip_keys=keys,
        nonce=nonce,
        rules={"max_training_flops": args.max_flops},
        device=args.device,
    )
    import torch

    _emit({**verdict.to_json(), "torch": torch.__version__}, args.json)  # with "device": where it was reached
    return EXIT[verdict.verdict]


if __name__ == "__main__":
    sys.exit(main())
