"""Everything on the Django side that touches ``replay`` (DESIGN §2): no other module imports it.

* Snapshot logs are checked in-process with replay's pure, torch-free firmware checker.
* Claims are verified by ``python -m replay verify`` in a subprocess with a wall-clock and
  address-space limit, so a hostile transcript can make it fail but never hang or exhaust the worker.
"""

from __future__ import annotations

import json
import resource
import secrets
import subprocess
import sys
from pathlib import Path

from django.conf import settings

from replay.firmware import parse_record, verify_log

from . import transcripts


def snapshot_log_check(text: str, public_key: bytes, serial: str) -> tuple[list[dict], list[dict]]:
    """(problems, authentic records) of a chip's firmware log: lines flagged malformed or forged are not records."""
    lines = [line for line in text.splitlines() if line.strip()]
    problems = verify_log(lines, public_key, serial=serial)
    flagged = {p["line"] for p in problems if p["kind"] in ("malformed", "forged")}
    records = [parse_record(line) for n, line in enumerate(lines) if n not in flagged]
    return problems, records


def log_serials(text: str) -> set[str]:
    """The chip serials a firmware log's well-formed lines name (an inspector may upload another chip's log)."""
    serials = set()
    for line in text.splitlines():
        try:
            serials.add(parse_record(line)["serial"])
        except ValueError:
            continue
    return serials


def claim_check(claim, rule_flops: float, scratch: Path) -> tuple[dict | None, str | None]:
    """(the replay verifier's verdict, None), or (None, why it could not run) — "timeout" when it ran too long."""
    try:
        return _run_verifier(claim, rule_flops, scratch), None
    except transcripts.TranscriptUnavailable as unavailable:
        return None, str(unavailable)
    except subprocess.TimeoutExpired:
        return None, "timeout"


def verifier_command(directory: Path, claims_file: Path, rule_flops: float) -> list[str]:
    return [
        sys.executable,
        "-m",
        "replay",
        "verify",
        str(directory),
        "--claims",
        str(claims_file),
        "--json",
        "--nonce",
        secrets.token_hex(16),
        "--max-seconds",
        str(settings.REPLAY_MAX_SECONDS),
        "--max-flops",
        repr(rule_flops),
    ]


def _run_verifier(claim, rule_flops: float, scratch: Path) -> dict:
    if claim.location.startswith(("http://", "https://")):
        directory = transcripts.download(claim.location, scratch / "transcript")
    else:
        directory = transcripts.local_directory(claim.location)
    snapshot = claim.snapshot
    claims_file = scratch / "claims.json"
    claims_file.write_text(
        json.dumps(
            {
                "manifest": claim.manifest,
                "claims": [
                    {
                        "serial": snapshot.chip.serial,
                        "counter": snapshot.counter,
                        "shard": snapshot.shard,
                        "hash": snapshot.hash,
                        "step": claim.step,
                    }
                ],
            }
        )
    )
    done = subprocess.run(
        verifier_command(directory, claims_file, rule_flops),
        capture_output=True,
        text=True,
        cwd=settings.BASE_DIR,
        timeout=settings.REPLAY_MAX_SECONDS + 60,
        preexec_fn=_limit_memory,
    )
    try:
        return json.loads(done.stdout)
    except ValueError:
        return {"verdict": "malformed", "reasons": [f"the verifier failed: {done.stderr[-500:]}"]}


def _limit_memory() -> None:
    limit = settings.REPLAY_MAX_MEMORY_BYTES
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
