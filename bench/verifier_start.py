"""A claim's verification as the worker runs it (``inspections.verification.claim_check``): the default verifier
spawned afresh (``REPLAY_VERIFIER_FORKSERVER`` off: ``python -m replay verify`` imports torch per claim) against
the same verifier forked from the fork server (on), alternating, in one process; the server's own start is
timed apart (the first claim a worker verifies pays it once).

    .venv/bin/python bench/verifier_start.py                 # a 12-step mlp transcript, 6 rounds
    .venv/bin/python bench/verifier_start.py --arch gpt --steps 8 --rounds 4

Prints seconds per claim (median of the rounds) and the ratio forked / spawned.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
NONCE = "00112233445566778899aabbccddeeff"


def one(transcript: Path, work: Path, forked: bool, n: int) -> float:
    from django.conf import settings

    from inspections import verification

    settings.REPLAY_VERIFIER_FORKSERVER = forked
    scratch = work / f"{'forked' if forked else 'spawned'}-{n}"
    scratch.mkdir()
    request = json.loads((transcript / "claims.json").read_text())
    started = time.perf_counter()
    verdict = verification.claim_check(transcript, request, 1e21, scratch, NONCE)
    assert verdict.verdict == "verified", verdict
    return time.perf_counter() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="mlp")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args()
    # Django here, not at import: a forked child runs this script's top as multiprocessing's __mp_main__
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        transcript = work / "run"
        record = [sys.executable, "-m", "replay", "record", "--arch", args.arch, "--steps", str(args.steps)]
        subprocess.run([*record, "--out", str(transcript)], check=True, capture_output=True, cwd=ROOT)
        server = one(transcript, work, True, -1)  # starts the server: its imports, then the first claim
        times = {False: [], True: []}
        for n in range(args.rounds):
            for forked in (False, True):
                times[forked].append(one(transcript, work, forked, n))
    spawned, forked = statistics.median(times[False]), statistics.median(times[True])
    print("| transcript | spawned s/claim | forked s/claim | forked / spawned | first forked claim (server start) |")
    print("|---|---|---|---|---|")
    print(f"| {args.arch}, {args.steps} steps | {spawned:.2f} | {forked:.2f} | {forked / spawned:.2f} | {server:.2f} |")


if __name__ == "__main__":
    main()
