"""The chips' signed snapshot logs against the claims: every log intact and signed by its chip's key, every
logged snapshot claimed with the same hash and time (and every claim logged), and the work counters of each
claimed snapshot taken from the signed log, the authority over a claims file's own counters."""

from __future__ import annotations

import binascii
import json

from nacl.signing import VerifyKey

from replay.protocol import chips_and_time
from replay.protocol.firmware import KEY_BYTES, b64_exact, parse_record, verify_log
from replay.protocol.transcript import Transcript
from replay.protocol.transcript_errors import MalformedTranscript


def check_keys(keys) -> dict:
    """The chip keys file {serial: base64 Ed25519 public key}, every key usable: a key that is not one is a
    malformed input (the registry's or the caller's), not evidence against the chip whose log it would check."""
    if not isinstance(keys, dict):
        raise MalformedTranscript("chip keys must be an object {serial: base64 public key}")
    for serial, key in keys.items():
        try:
            VerifyKey(b64_exact(key, KEY_BYTES))
        except (TypeError, ValueError, binascii.Error):
            raise MalformedTranscript(
                f"chip keys[{str(serial)[:64]!r}] is not a base64 Ed25519 public key (32 bytes, canonical base64)"
            ) from None
    return keys


def check_snapshots(lines: list[str], keys: dict, claims: list[dict], tr: Transcript) -> list[str]:
    """The chips' signed logs must be intact, and every snapshot claimed with the same hash (and vice versa)."""
    reasons, by_serial, lowest = [], {}, {}
    serials = {s["serial"] for s in tr.layout}
    for n, line in enumerate(lines):
        try:
            rec = parse_record(line)
        except ValueError as e:
            reasons.append(f"snapshots line {n}: malformed ({e})")
            continue
        serial = rec["serial"]
        if serial not in serials:
            reasons.append(f"snapshots line {n}: chip {serial[:64]!r} is not in the transcript's shard layout")
            continue
        by_serial.setdefault(serial, []).append(line)
        # a run's excerpt of the chip's log starts at its lowest counter: a chip's second run starts past 0 (checked
        # from 0, every honest second run had a gap before it); what came before the excerpt, and records deleted
        # from its start, are the chip's whole log's to show, as an inspector reads it (verify_log from 0)
        lowest[serial] = min(lowest.get(serial, rec["counter"]), rec["counter"])
    claimed = {(c["serial"], c["counter"]): c for c in claims}
    logged = set()
    for serial, chip_lines in sorted(by_serial.items()):
        try:
            key = b64_exact(keys[serial], KEY_BYTES)
            VerifyKey(key)
        except (KeyError, TypeError, ValueError, binascii.Error):
            reasons.append(f"chip {serial}: no usable public key to check its log")
            continue
        for p in verify_log(chip_lines, key, serial=serial, first_counter=lowest[serial]):
            reasons.append(
                f"chip {serial}: {p['kind']} at its log line {p['line']} (counter {p['counter']}): {p['detail']}"
            )
        for line in chip_lines:
            rec = json.loads(line)
            logged.add((serial, rec["counter"]))
            c = claimed.get((serial, rec["counter"]))
            if c is None:
                reasons.append(f"snapshot {serial}#{rec['counter']} is not explained by any claim")
            elif c["hash"] != rec["hash"]:
                reasons.append(
                    f"claim {serial}#{rec['counter']} quotes hash {c['hash'][:16]}..., the chip logged {rec['hash'][:16]}..."
                )
            elif c.get("at") is not None and c["at"] != chips_and_time.parse_time(rec["time"], "the log's time"):
                reasons.append(
                    f"claim {serial}#{rec['counter']} quotes time {c['time']}, the chip logged {rec['time']}"
                )
    for key in sorted(set(claimed) - logged):
        reasons.append(f"claim {key[0]}#{key[1]} has no logged snapshot")
    return reasons


def work_from_logs(lines: list[str], claims: list[dict]) -> None:
    """The work counters of each claimed snapshot, and its time where the claim gives none, from the chip's signed log
    (the log, checked above, is the authority; a claims file's own counters are replaced by the signed ones, and a
    claim without a time, which would skip the order and pace checks as untimed, is held to the one its chip signed)."""
    by_key = {(c["serial"], c["counter"]): c for c in claims}
    for line in lines:
        try:
            rec = parse_record(line)
        except ValueError:
            continue
        c = by_key.get((rec["serial"], rec["counter"]))
        if c is None:
            continue
        if "flops" in rec:
            c["flops"], c["busy_ns"] = rec["flops"], rec["busy_ns"]
        if c.get("at") is None:
            c["time"], c["at"] = rec["time"], chips_and_time.parse_time(rec["time"], "the log's time")
