"""The prover's answer, in the claims API's own format (docs/claims.md §1), from a recorded transcript.

The recorder's ``claims.json`` is the *verifier's* input: for every snapshot the chips logged, its
shard, hash, time and the step that produced it. ``POST /api/inspections/claims`` wants, for the
snapshots an inspector read off your chips, {serial, counter, run, step, manifest, location}:

    python -m replay claim var/transcripts/lab-honest/run-6 --serials H000004 > body.json

The run's name defaults to the transcript folder's name, so the regulator's desk shows the name
you filed under (``run-6``, not some other label); the location defaults to the folder's absolute
path (a directory under the regulator's ``TRANSCRIPT_ROOTS``) — give ``--location`` for an http(s) URL.
"""

from __future__ import annotations

from pathlib import Path

from replay.protocol import claims_file
from replay.protocol.manifest_schema import CLAIMABLE_PRECISIONS, PRECISIONS
from replay.protocol.transcript_errors import MalformedTranscript
from replay.prover import listed

MAX_RUN_NAME = 128  # the API's limit


def recorded_claims(transcript) -> dict:
    """The recorder's claims.json of a transcript folder: {"manifest", "claims": [...]}; ValueError if absent."""
    path = Path(transcript) / "claims.json"
    if not path.exists():
        raise ValueError(f"{path} does not exist: is {transcript} a transcript folder (python -m replay record)?")
    try:  # as the verifier reads it: a FIFO not waited on, /dev/zero not read whole, nesting and repeats refused
        recorded = claims_file.read_json(path, str(path))
    except MalformedTranscript as error:
        raise ValueError(error.reason) from None
    if not isinstance(recorded, dict) or not {"manifest", "claims"} <= set(recorded):
        raise ValueError(f"{path} is not a recorder's claims.json (it has no manifest and claims)")
    if not isinstance(recorded["manifest"], str) or not isinstance(recorded["claims"], list):
        raise ValueError(f"{path} is not a recorder's claims.json (manifest: a hash, claims: a list)")
    for i, claim in enumerate(recorded["claims"]):
        if not _recorded_claim(claim):
            raise ValueError(f"{path}: claims[{i}] is not a recorded claim ({{serial, counter, step, ...}})")
    return recorded


def _check_claimable(transcript: Path) -> None:
    """ValueError where the transcript's manifest says it was recorded in a plain precision: the verifier refuses
    such a transcript (its replay depends on the machine), so a body answering with it could only be refused. A
    manifest that cannot be read is the verifier's to judge."""
    try:
        manifest = claims_file.read_json(transcript / "manifest.json", "manifest.json")
    except MalformedTranscript:
        return
    precision = manifest.get("precision") if isinstance(manifest, dict) else None
    if precision in PRECISIONS and precision not in CLAIMABLE_PRECISIONS:  # (no precision at all: the verifier's)
        raise ValueError(
            f"the run in {transcript} was recorded in {precision!r}, a plain baseline for benchmarks: no "
            f"verifier replays it, so none of its snapshots can be claimed (record in "
            f"{' or '.join(CLAIMABLE_PRECISIONS)})"
        )


def _recorded_claim(claim) -> bool:
    """A claim as the recorder writes it: a serial, and a counter and step that are integers from 0."""
    return (
        isinstance(claim, dict)
        and isinstance(claim.get("serial"), str)
        and all(type(claim.get(k)) is int and claim[k] >= 0 for k in ("counter", "step"))
    )


def serials_option(text: str | None) -> list[str] | None:
    """--serials's comma-separated serials, or None (every chip of the run) where it is not given; ValueError for an
    empty one (a stray comma): `record --serials` refuses it too, and here it had quietly answered every chip."""
    if text is None:
        return None
    serials = text.split(",")
    if "" in serials:
        raise ValueError(f"--serials {text[:80]!r} names an empty serial (a stray comma?)")
    return serials


def claims_body(transcript, serials: list[str] | None = None, run: str | None = None, location=None) -> dict:
    """The API's claims body answering every snapshot the transcript's chips logged (only ``serials``', if
    given: the chips an inspector read). ValueError names a serial the run never used, or a bad run name."""
    transcript = Path(transcript)
    recorded = recorded_claims(transcript)
    _check_claimable(transcript)
    run = run or transcript.resolve().name
    if not 0 < len(run) <= MAX_RUN_NAME:
        raise ValueError(f"the run's name must be 1 to {MAX_RUN_NAME} characters")
    logged = {c["serial"] for c in recorded["claims"]}
    if not logged:  # the API refuses an empty body: say why there is nothing to send
        raise ValueError(
            f"the run in {transcript} logged no snapshot (no chip, or none logged in its steps at its snapshot "
            "rate): there is nothing to claim"
        )
    unknown = sorted(set(serials or []) - logged)
    if unknown:
        raise ValueError(f"no snapshot of {listed(unknown)} in this run (its chips logged: {listed(sorted(logged))})")
    wanted = set(serials) if serials else logged
    return {
        "claims": [
            {
                "serial": claim["serial"],
                "counter": claim["counter"],
                "run": run,
                "step": claim["step"],
                "manifest": recorded["manifest"],
                "location": str(location or transcript.resolve()),
            }
            for claim in recorded["claims"]
            if claim["serial"] in wanted
        ]
    }
