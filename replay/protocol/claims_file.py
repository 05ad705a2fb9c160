"""The claims file the verifier is handed, read without trusting it: {"manifest": <hash>, "claims": [...]}
with the optional context the ledger and the registry supply (history, prover_chips, replayed_segments,
earlier_draws, pending_segments, coverage_target, run_snapshots). Anything out of shape raises MalformedTranscript(reason)."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from fractions import Fraction

from replay.protocol import chips_and_time, coverage, json_once
from replay.protocol.firmware import MAX_COUNTER, is_digest, log_lines
from replay.protocol.transcript import Transcript
from replay.protocol.transcript_errors import MalformedTranscript

DEFAULT_COVERAGE = 0.9
CLAIMS_KEYS = {"manifest", "claims"}
CLAIM_KEYS = {"serial", "counter", "shard", "hash", "step"}
CLAIMS_OPTIONAL = {
    "history",
    "prover_chips",
    "replayed_segments",
    "earlier_draws",
    "pending_segments",
    "coverage_target",
    "run_snapshots",
}
MAX_DRAWS = coverage.MAX_DRAWS
MAX_CLAIMS = 100_000
READ_MAX = 64 << 20  # bytes of a claims, keys or snapshots file read
API_BODY_KEYS = {"run", "location"}  # fields of the claims API's body (docs/claims.md §1), none of this file's


def _api_body_hint(raw) -> str:
    """A pointer to the right file when the caller handed over the claims API's body instead of this one."""
    items = raw.get("claims") if isinstance(raw, dict) else None
    if isinstance(items, list) and any(isinstance(c, dict) and API_BODY_KEYS & set(c) for c in items):
        return (
            ": this is the claims API's body (python -m replay claim); verify reads the recorder's claims.json "
            "(its claims carry shard, hash and time), e.g. DIR/claims.json"
        )
    return ""


def read_json(obj_or_path, what: str):
    """A dict or list as given, or the JSON of the file at that path (at most READ_MAX bytes of it read)."""
    if obj_or_path is None or isinstance(obj_or_path, (dict, list)):
        return obj_or_path
    try:
        return json_once.loads(_head(obj_or_path).decode("utf-8"))
    except json_once.MemberTwice as e:
        raise MalformedTranscript(f"{what} is not readable JSON: {e}") from None
    except NothingPiped as e:
        raise MalformedTranscript(f"{what} {e}") from None
    except (OSError, ValueError, RecursionError) as e:  # (ValueError: not UTF-8, not JSON, an over-long integer)
        raise MalformedTranscript(f"{what} is not readable JSON ({type(e).__name__})") from None


class NothingPiped(OSError):
    """A FIFO or pipe read nothing: a mistake, not an empty file (a snapshots file read as empty would leave every
    claim unexplained, evidence against the prover for the verifier's slip)."""


def _head(path) -> bytes:
    """The first READ_MAX bytes of the file: read that far and no further (a larger file, or /dev/zero, is not
    read whole to be cut after). Opened without waiting: a FIFO that no process writes (one a prover left in its
    transcript as chips.json) is refused at once (NothingPiped), where a plain open waits for a writer for ever; one
    that a process writes (`--claims <(...)`) is read as it comes."""
    with open(path, "rb", opener=lambda name, flags: os.open(name, flags | os.O_NONBLOCK)) as handle:
        os.set_blocking(handle.fileno(), True)
        data = handle.read(READ_MAX)
        if not data and stat.S_ISFIFO(os.fstat(handle.fileno()).st_mode):
            raise NothingPiped("is a pipe that gave nothing to read (a FIFO that no process writes?)")
        return data


def read_lines(path) -> list[str]:
    """The lines of a snapshot log file (at most READ_MAX bytes of it read; bytes that are not UTF-8 replaced)."""
    try:
        return log_lines(_head(path).decode("utf-8", errors="replace"))
    except NothingPiped as e:
        raise MalformedTranscript(f"snapshots {path} {e}") from None
    except OSError as e:
        raise MalformedTranscript(f"snapshots are not readable ({type(e).__name__})") from None


def parse_claims(raw, tr: Transcript) -> list[dict]:
    """The claims, each checked against the shard layout and the run, with its parsed time as "at"."""
    if raw is None:
        return []
    if (
        not isinstance(raw, dict)
        or not CLAIMS_KEYS <= set(raw) <= CLAIMS_KEYS | CLAIMS_OPTIONAL
        or not isinstance(raw["claims"], list)
    ):
        raise MalformedTranscript(
            'claims must be {"manifest": <hash>, "claims": [...]} (optional: history, ...)' + _api_body_hint(raw)
        )
    if not is_digest(raw["manifest"]):  # (no transcript's hash, nor another's: the file is malformed, not the claims)
        raise MalformedTranscript("claims.manifest must be the transcript's manifest hash, 64 lowercase hex digits")
    if len(raw["claims"]) > MAX_CLAIMS:
        raise MalformedTranscript(f"more than {MAX_CLAIMS} claims")
    shard_of = {s["serial"]: i for i, s in enumerate(tr.layout)}
    out, seen = [], {}
    for i, c in enumerate(raw["claims"]):
        # time is part of the contract; a caller that omits it loses the order and pace checks of that
        # claim (reported as untimed), never the replay
        if not isinstance(c, dict) or not CLAIM_KEYS <= set(c) <= CLAIM_KEYS | {"time"} | chips_and_time.WORK_KEYS:
            raise MalformedTranscript(
                f"claims[{i}] must have serial, counter, shard, hash, step, time" + _api_body_hint(raw)
            )
        chips_and_time.check_work(c, f"claims[{i}]")
        wrong = [k for k in ("counter", "shard", "step") if type(c[k]) is not int]
        wrong += [k for k in ("hash", "serial") if not isinstance(c[k], str)]
        if wrong:  # (named: a hash given as a number is that field's slip)
            raise MalformedTranscript(f"claims[{i}] has fields of the wrong type: {', '.join(wrong)}")
        if not is_digest(c["hash"]):  # no shard hashes to it: a slip in the file, never a replay's evidence
            raise MalformedTranscript(f"claims[{i}].hash must be a snapshot hash, 64 lowercase hex digits")
        if not 0 <= c["counter"] <= MAX_COUNTER:
            raise MalformedTranscript(f"claims[{i}].counter must be an integer in [0, {MAX_COUNTER}]")
        snapshot = (c["serial"], c["counter"])
        if snapshot in seen:  # one snapshot answered twice: a malformed file, never a second claim to weigh
            raise MalformedTranscript(
                f"claims[{i}] repeats claims[{seen[snapshot]}] (chip {str(c['serial'])[:64]!r}, counter {c['counter']})"
            )
        seen[snapshot] = i
        if c["serial"] not in shard_of or c["shard"] != shard_of[c["serial"]]:
            raise MalformedTranscript(
                f"claims[{i}]: chip {str(c['serial'])[:64]!r} does not hold shard {c['shard']} in the layout"
            )
        if not 0 <= c["step"] <= tr.steps:
            raise MalformedTranscript(f"claims[{i}]: step {c['step']} outside the run (0..{tr.steps})")
        out.append({**c, "at": chips_and_time.parse_time(c["time"], f"claims[{i}].time") if "time" in c else None})
    return out


@dataclass(frozen=True)
class CoverageContext:
    """What the ledger says of the run's coverage so far (docs/claims.md §4)."""

    target: float
    replayed: set[int]  # segments of this run replayed by earlier verifications
    missed: Fraction  # P(a segment no claim forced escaped every earlier draw): coverage.missed(earlier_draws)
    pending: set[int]  # draws an earlier verification's budget cut: replayed first


def coverage_context(
    raw, tr: Transcript, coverage_target=None, replayed_segments=None, earlier_draws=None, pending_segments=None
) -> CoverageContext:
    """The claims file's coverage fields, checked; the arguments win over the file's fields."""
    raw = raw or {}
    target = raw.get("coverage_target", DEFAULT_COVERAGE) if coverage_target is None else coverage_target
    if type(target) not in (int, float) or not 0 <= target <= 1:
        raise MalformedTranscript("coverage_target must be a number in [0, 1]")
    earlier = raw.get("replayed_segments", []) if replayed_segments is None else replayed_segments
    starts = set(tr.checkpoints[:-1])
    pending = raw.get("pending_segments", []) if pending_segments is None else pending_segments
    for name, value in (("replayed_segments", earlier), ("pending_segments", pending)):
        if not isinstance(value, list) or not all(type(s) is int and s in starts for s in value):
            raise MalformedTranscript(f"{name} must list start steps of this run's segments")
    draws = raw.get("earlier_draws", []) if earlier_draws is None else earlier_draws
    if not isinstance(draws, list) or len(draws) > MAX_DRAWS or not all(_draw_pair(d, len(starts)) for d in draws):
        raise MalformedTranscript(
            f"earlier_draws must list at most {MAX_DRAWS} [pool, drawn] pairs of integers, "
            f"0 <= drawn <= pool <= the run's {len(starts)} segments"
        )
    return CoverageContext(float(target), set(earlier), coverage.missed(draws), set(pending))


def _draw_pair(d, segments: int) -> bool:
    """[pool, drawn]: a pool is segments of this run, so no larger than the run."""
    return isinstance(d, list) and len(d) == 2 and all(type(x) is int for x in d) and 0 <= d[1] <= d[0] <= segments
