"""Chip firmware simulator and the pure checker of its signed snapshot logs.

Each chip holds an Ed25519 key and, at random steps (a Poisson process, `rate` snapshots per step) and at
the end of each run (`Firmware.finish`), appends one record to its log, a JSON line:

    {"serial", "counter", "time", "shard", "hash", "prev", "sig"}

and, from firmware that counts its work (docs/transcripts.md §7), two more signed fields:

    "busy_ns": nanoseconds the chip's compute units were busy since fabrication (monotonic)
    "flops":   floating-point operations the chip executed since fabrication (monotonic, any size)

counter: 0, 1, 2, ... per chip (monotonic); time: RFC 3339 UTC; shard: index in the layout;
hash: hex SHA-256 of the chip's parameter shard (hashing.py); prev: hex SHA-256 of the previous
record's canonical bytes (signature included), 64 zeros for the first; sig: base64 Ed25519 over
the canonical bytes of the record without "sig", in base64's one canonical spelling (`b64_exact`).
Canonical bytes: JSON with sorted keys, no whitespace, ASCII (for these string/integer-only records,
identical to RFC 8785).

`verify_log(lines, public_key)` reports every problem exactly, one dict per problem, and is pure
(no I/O, no Django): the inspections app reuses it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import random
import re
from datetime import UTC, datetime, timedelta

from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

from replay.protocol import json_once
from tlog.note import canonical_b64decode

ZERO = "0" * 64
_HEX64 = re.compile(r"[0-9a-f]{64}")
_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z")
FIELDS = {"serial": str, "counter": int, "time": str, "shard": int, "hash": str, "prev": str, "sig": str}
WORK_FIELDS = {"busy_ns": int, "flops": int}  # both or neither: the work counters of firmware that counts
MAX_WORK = 2**128 - 1  # monotonic since fabrication; FLOPs of a fast chip pass 2^64 within months
EPOCH = datetime(2025, 1, 1, tzinfo=UTC)
# Bounds of a record's fields: a forged line must fail parsing (a "malformed" verdict), never the recording
# downstream — counters go on the ledger as I-JSON integers (< 2^53), shards into a 32-bit column.
MAX_COUNTER = 2**53 - 1
MAX_SHARD = 2**31 - 1
MAX_SERIAL = 64
MAX_SIG = 128  # base64 of a 64-byte Ed25519 signature is 88 characters
SIG_BYTES = 64  # an Ed25519 signature's
KEY_BYTES = 32  # an Ed25519 public key's


def b64_exact(text, size: int) -> bytes:
    """The `size` bytes that text spells in base64 (the standard alphabet, padded), where text is their one spelling;
    else ValueError. b64decode also takes a last character whose spare bits are set, a second spelling of the same
    bytes: a record's hash covers its text, so one signature would sign two records, and one key be two keys' text."""
    raw = canonical_b64decode(text)
    if len(raw) != size:
        raise ValueError(f"not the canonical base64 of {size} bytes")
    return raw


def is_digest(value) -> bool:
    """Is value a SHA-256 as the log and the transcript write one: 64 lowercase hex digits, nothing around them?"""
    return isinstance(value, str) and _HEX64.fullmatch(value) is not None


def canonical(obj: dict) -> bytes:
    fast = _canonical_record(obj)
    if fast is not None:
        return fast
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


_PLAIN = re.compile(r"[ !#-\[\]-~]*")  # printable ASCII but '"' and '\\': JSON writes it as is
_KEYS = tuple(sorted(FIELDS))
_KEYS_UNSIGNED = tuple(k for k in _KEYS if k != "sig")
_KEYS_WORK = tuple(sorted({**FIELDS, **WORK_FIELDS}))
_KEYS_WORK_UNSIGNED = tuple(k for k in _KEYS_WORK if k != "sig")


def _canonical_record(obj: dict) -> bytes | None:
    """The same bytes as json.dumps(sort_keys, compact) for a plain log record, ~4x faster: the
    checker serialises every record of every uploaded log. None for anything else."""
    keys = tuple(sorted(obj))
    if keys not in (_KEYS, _KEYS_UNSIGNED, _KEYS_WORK, _KEYS_WORK_UNSIGNED):
        return None
    parts = []
    for key in keys:
        value = obj[key]
        if type(value) is int:
            parts.append(f'"{key}":{value}')
        elif type(value) is str and _PLAIN.fullmatch(value):
            parts.append(f'"{key}":"{value}"')
        else:
            return None
    return ("{" + ",".join(parts) + "}").encode()


def record_hash(record: dict) -> str:
    return hashlib.sha256(canonical(record)).hexdigest()


def chip_key(seed: int, serial: str) -> SigningKey:
    """A simulated chip's key, derived from a seed so test runs repeat (real chips make theirs at fabrication)."""
    return SigningKey(hashlib.sha256(f"chipledger-sim:{seed}:{serial}".encode()).digest())


def public_key_b64(key: SigningKey) -> str:
    return base64.b64encode(bytes(key.verify_key)).decode()


class Chip:
    """One chip's firmware: a counter, the hash of its last record, its key, and its work counters (busy
    nanoseconds and FLOPs executed since fabrication; None for firmware that does not count)."""

    def __init__(self, serial: str, shard: int, key: SigningKey, busy_ns: int | None = 0, flops: int | None = 0):
        self.serial, self.shard, self.key = serial, shard, key
        self.counter, self.prev = 0, ZERO
        self.busy_ns, self.flops = busy_ns, flops

    def work(self, seconds: float, flops: int) -> None:
        """The compute units ran: the firmware's counters only go up."""
        if self.flops is not None and flops > 0:
            self.busy_ns += max(0, round(seconds * 1e9))
            self.flops += int(flops)

    def snapshot(self, when: datetime, shard_hash: str) -> str:
        rec = {
            "serial": self.serial,
            "counter": self.counter,
            "time": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "shard": self.shard,
            "hash": shard_hash,
            "prev": self.prev,
        }
        if self.flops is not None:
            rec["busy_ns"], rec["flops"] = self.busy_ns, self.flops
        rec["sig"] = base64.b64encode(self.key.sign(canonical(rec)).signature).decode()
        self.counter += 1
        self.prev = record_hash(rec)
        return canonical(rec).decode()


class Firmware:
    """All chips of a shard layout; `tick(step)` says which chips snapshot after that step."""

    def __init__(
        self,
        layout: list[dict],
        seed: int,
        rate: float,
        step_seconds: float = 60.0,
        chips: list[Chip] | None = None,
        start: datetime = EPOCH,
    ):
        # `chips`: real firmware state (keys, counters) of the layout's chips, in layout order (replay.prover.chipsim).
        self.chips = chips or [Chip(s["serial"], i, chip_key(seed, s["serial"])) for i, s in enumerate(layout)]
        self.rng, self.start = random.Random(seed), start
        self.p = 1.0 - math.exp(-rate)  # P(at least one Poisson event during a step)
        self.step_seconds = step_seconds
        self.lines: list[str] = []
        self.logged_at: dict[int, set[str]] = {}  # step -> serials that snapshotted at it (finish adds none twice)
        # FLOPs of one training step of the whole model (set by the recorder); each chip counts its shard's part
        self.step_flops: int | None = None
        sizes = [s["end"] - s["start"] for s in layout]
        self.share = [n / max(1, sum(sizes)) for n in sizes]

    def tick(self, step: int, hashes: list[str]) -> list[tuple[Chip, dict]]:
        """After `step` steps: each chip counts the step's work on its shard, then snapshots with probability p.
        Returns (chip, record) pairs."""
        out = []
        if self.step_flops is not None:
            for chip, share in zip(self.chips, self.share):
                chip.work(self.step_seconds * (share > 0), round(self.step_flops * share))
        for chip in self.chips:
            if self.rng.random() < self.p:
                out.append(self._log(chip, step, hashes))
        return out

    def finish(self, step: int, hashes: list[str]) -> list[tuple[Chip, dict]]:
        """The run's end (the job frees the device): every chip that did not snapshot at `step` logs one now.
        Firmware snapshots at random steps, so without this a chip could end a run, or a whole short run, with
        nothing logged, and the work it counted would fall on its next run's first snapshot as unaccounted
        work: an honest prover accused. Real firmware does the same when a job releases the device."""
        done = self.logged_at.get(step, set())
        return [self._log(chip, step, hashes) for chip in self.chips if chip.serial not in done]

    def _log(self, chip: Chip, step: int, hashes: list[str]) -> tuple[Chip, dict]:
        line = chip.snapshot(self.start + timedelta(seconds=step * self.step_seconds), hashes[chip.shard])
        self.lines.append(line)
        self.logged_at.setdefault(step, set()).add(chip.serial)
        return chip, json.loads(line)

    def public_keys(self) -> dict[str, str]:
        return {c.serial: public_key_b64(c.key) for c in self.chips}


def _problem(kind: str, line: int, counter, detail: str) -> dict:
    return {"kind": kind, "line": line, "counter": counter, "detail": detail}


def log_lines(text: str) -> list[str]:
    """A firmware log's lines as JSON Lines reads them: split at "\\n" alone, a CRLF line's "\\r" dropped, no empty
    line after the last newline. str.splitlines also splits at \\x1c-\\x1e, \\x85, \\u2028 and a lone "\\r": two
    authentic records joined by one would be two records to us and one malformed line to every JSON Lines reader."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def _cut(text: str, limit: int) -> str:
    """text, or its words up to `limit` characters and "...": a parser's message names the input's own
    characters (an integer of 5,000 digits), and is not cut mid-word."""
    if len(text) <= limit:
        return text
    window = text[: limit + 1]  # (a word that ends at the limit is kept whole)
    head = window.rsplit(" ", 1)[0] if " " in window else ""
    return (head or text[:limit]) + "..."


def parse_record(line: str) -> dict:
    """One log line -> record dict; raises ValueError if it is not a well-formed record."""
    try:
        rec = json_once.loads(line)
    except json_once.MemberTwice as e:  # one record to us, another to a parser that keeps the first member
        raise ValueError(str(e)) from None
    except (ValueError, RecursionError) as e:  # (an integer of over 4300 digits is a ValueError, not a JSONDecodeError)
        ends = " (a log's lines end at \\n alone, not \\r)" if "\r" in line else ""  # (`log_lines`: an old Mac's)
        raise ValueError(f"not JSON: {_cut(str(e), 120)}{ends}") from None
    if not isinstance(rec, dict) or set(rec) not in (set(FIELDS), set(FIELDS) | set(WORK_FIELDS)):
        raise ValueError(f"fields must be exactly {sorted(FIELDS)} (and both of {sorted(WORK_FIELDS)}, or neither)")
    for k, t in {**FIELDS, **WORK_FIELDS}.items():
        if k in rec and type(rec[k]) is not t:
            raise ValueError(f"{k} must be a {t.__name__}")
    for k in WORK_FIELDS:
        if k in rec and not 0 <= rec[k] <= MAX_WORK:
            raise ValueError(f"{k} must be in 0..2^128-1")
    if not 0 <= rec["counter"] <= MAX_COUNTER:
        raise ValueError(f"counter must be in 0..{MAX_COUNTER}")
    if not 0 <= rec["shard"] <= MAX_SHARD:
        raise ValueError(f"shard must be in 0..{MAX_SHARD}")
    if not 0 < len(rec["serial"]) <= MAX_SERIAL or "\x00" in rec["serial"]:
        raise ValueError(f"serial must be 1 to {MAX_SERIAL} characters, no NUL")
    if len(rec["sig"]) > MAX_SIG:
        raise ValueError(f"sig must be at most {MAX_SIG} characters")
    try:
        b64_exact(rec["sig"], SIG_BYTES)
    except ValueError:
        raise ValueError(
            f"sig must be a {SIG_BYTES}-byte signature in canonical base64 (padded, spare bits zero)"
        ) from None
    for k in ("hash", "prev"):
        if not _HEX64.fullmatch(rec[k]):
            raise ValueError(f"{k} must be 64 lowercase hex digits")
    # Shape by regex, calendar by fromisoformat: both C-fast (strptime cost more than the signature check).
    try:
        if not _TIME.fullmatch(rec["time"]):
            raise ValueError
        datetime.fromisoformat(rec["time"][:-1])
    except ValueError:
        raise ValueError("time must be RFC 3339 UTC (YYYY-MM-DDTHH:MM:SSZ)") from None
    return rec


def verify_log(
    lines: list[str], public_key: bytes | str, *, serial: str | None = None, first_counter: int = 0
) -> list[dict]:
    """Every problem of one chip's log, exactly; [] if the log is intact. Sorted by line.

    A problem is {"kind", "line" (0-based), "counter", "detail"}, kind one of:
      malformed  the line is not a well-formed record (then ignored);
      forged     the signature does not verify under the chip's key, or the serial is not the chip's
                 (then ignored; its counter still fills its slot, so a tampered record is reported
                 once, as forged, not also as the gap or broken link it leaves);
      rollback   a counter used twice, a record whose prev does not link to its predecessor (a forked
                 history), or time going backwards: the chip's state was rolled back;
      reordered  an authentic record after one with a higher counter (sorted, the chain is fine);
      gap        counters missing before this record (records deleted).
    A log cut short at the end is not detectable from the log alone.
    """
    if isinstance(public_key, str):  # (its bytes: a key's spelling is in no record's hash, and the ledger keeps the
        public_key = base64.b64decode(public_key, validate=True)  # registry's text as filed, any spelling)
    vk = VerifyKey(public_key)
    problems, authentic, forged = [], [], set()
    for n, line in enumerate(lines):
        try:
            rec = parse_record(line)
        except ValueError as e:
            problems.append(_problem("malformed", n, None, str(e)))
            continue
        full = canonical(rec)
        # Keys sort as ...,"shard","sig","time": dropping the sig member leaves exactly the signed bytes,
        # which saves a second serialisation per record (the log checker's hot path).
        signed = full.replace(b',"sig":' + json.dumps(rec["sig"]).encode(), b"", 1)
        try:
            vk.verify(signed, base64.b64decode(rec["sig"], validate=True))
            ok = True
        except (BadSignatureError, ValueError):
            ok = False
        rec["_hash"] = hashlib.sha256(full).hexdigest()
        if not ok or (serial is not None and rec["serial"] != serial):
            why = (
                "signature does not verify under the chip's key"
                if not ok
                else f"serial {rec['serial']} is not {serial}"
            )
            problems.append(_problem("forged", n, rec["counter"], why))
            forged.add(rec["counter"])
            continue
        authentic.append((n, rec))

    seen, top, chain = {}, None, []
    for n, rec in authentic:  # file order: duplicates and disorder
        c = rec["counter"]
        if c in seen:
            problems.append(_problem("rollback", n, c, f"counter {c} already used on line {seen[c]}"))
            continue
        seen[c] = n
        if top is not None and c < top:
            problems.append(_problem("reordered", n, c, f"counter {c} after counter {top}"))
        top = c if top is None else max(top, c)
        chain.append((n, rec))

    expect, prev = first_counter, None
    for n, rec in sorted(chain, key=lambda nr: nr[1]["counter"]):  # counter order: holes and links
        c = rec["counter"]
        missing = (c - expect) - sum(1 for k in forged if expect <= k < c)
        if missing > 0:
            problems.append(_problem("gap", n, c, f"{missing} record(s) missing among counters {expect}..{c - 1}"))
        if prev is not None and prev["counter"] == c - 1 and rec["prev"] != prev["_hash"]:
            problems.append(_problem("rollback", n, c, f"prev does not link to counter {c - 1}: a forked history"))
        if c == 0 and rec["prev"] != ZERO:
            problems.append(_problem("rollback", n, c, "the first record links to an earlier history"))
        if prev is not None and rec["time"] < prev["time"]:
            problems.append(_problem("rollback", n, c, f"time {rec['time']} is before {prev['time']}"))
        for k in WORK_FIELDS:
            if prev is not None and k in rec and k in prev and rec[k] < prev[k]:
                problems.append(_problem("rollback", n, c, f"work counter {k} went down ({prev[k]} to {rec[k]})"))
        expect, prev = c + 1, rec
    return sorted(problems, key=lambda p: (p["line"], p["kind"]))
