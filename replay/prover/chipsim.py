"""The chips' side of the story: a simulator of chip firmware that holds real keys (no Django).

A chip makes its Ed25519 key at fabrication and never lets it go; here each simulated chip keeps
its key and its signed snapshot log in one folder (``var/chip-keys/`` in the demo — never in the
database the regulator's server reads):

    <dir>/<serial>.key   base64 32-byte Ed25519 seed (mode 0600)
    <dir>/<serial>.log   the chip's firmware log, one signed record a line (replay.protocol.firmware format)
    <dir>/<serial>.state the firmware's monotonic work counters as the chip holds them now (JSON: busy_ns, flops)

What the chip does, and what an inspector or a prover asks of it:

    python -m replay.prover.chipsim --dir var/chip-keys make P000001 P000002     # keys; prints public keys (JSON)
    python -m replay.prover.chipsim --dir var/chip-keys answer P000001 NONCE     # sign the portal's challenge
    python -m replay.prover.chipsim --dir var/chip-keys export P000001 > log     # the log, as an inspector reads it
    python -m replay.prover.chipsim --dir var/chip-keys train --chips P000001,P000002 --out DIR [--arch mlp --steps 30]
    python -m replay.prover.chipsim claims DIR --serials P000001 [--run RUN]     # the prover's claims body (JSON)

``train`` runs the replay recorder on those chips: while the prover trains, each chip logs
Poisson-timed hashes of its weight shard, signed with its own key, and the counters carry on from
the chip's earlier runs. The transcript goes to DIR (its ``claims.json`` names, for each snapshot,
the step that produced it: the prover's answers).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import stat
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from nacl.signing import SigningKey

from replay.protocol.firmware import (
    MAX_WORK,
    ZERO,
    Chip,
    Firmware,
    log_lines,
    parse_record,
    public_key_b64,
    record_hash,
)
from replay.prover.claim_body import claims_body, serials_option

SERIAL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
STEP_SECONDS = 60  # the simulated chips' clock: a minute a training step
WORK = ("busy_ns", "flops")


def identity_message(serial: str, nonce: str) -> bytes:
    """What the chip signs for an inspector's challenge (the server checks the same bytes)."""
    return f"chipledger identity challenge v1\n{serial}\n{nonce}\n".encode()


# The most a chip's file may hold, in characters: a key or a state is a line (a folder's stray 2 GB file in their place
# is read no further), a log is a chip's lifetime of records (the inspectors' API takes 5 MiB of one at a time)
SMALL_FILE = 1 << 16
LOG_FILE = 1 << 30


def _read(path: Path, serial: str, most: int = SMALL_FILE) -> str:
    """A chip's file as text, of at most `most` characters; ValueError naming the chip and the file where it cannot be
    read (a folder in its place, or no regular file: a link to /dev/zero or a FIFO would be read without end, or wait
    for ever), or holds more."""
    try:
        with open(path, encoding="utf-8", opener=lambda name, flags: os.open(name, flags | os.O_NONBLOCK)) as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise ValueError(f"chip {serial}: {path.name} is not a regular file")
            text = f.read(most + 1)
            if len(text) > most:
                raise ValueError(f"chip {serial}: {path.name} holds over {most:,} characters, more than a chip's file")
            return text
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"chip {serial}: cannot read {path.name} ({getattr(e, 'strerror', None) or e})") from None


class ChipStore:
    """The simulated chips kept in one folder: their keys and their logs."""

    def __init__(self, folder):
        self.folder = Path(folder)

    def _path(self, serial: str, suffix: str) -> Path:
        if not SERIAL.fullmatch(serial):
            raise ValueError(f"not a chip serial: {serial!r}")
        return self.folder / f"{serial}{suffix}"

    def make(self, serial: str) -> str:
        """Make the chip's key (once; an existing chip keeps its key). Returns its base64 public key."""
        path = self._path(serial, ".key")
        if not path.exists():
            self.folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(base64.b64encode(bytes(SigningKey.generate())).decode() + "\n")
        return public_key_b64(self.key(serial))

    def key(self, serial: str) -> SigningKey:
        path = self._path(serial, ".key")
        if not path.exists():
            raise ValueError(f"no chip {serial} in {self.folder}")
        text = _read(path, serial)
        try:
            return SigningKey(base64.b64decode(text.strip(), validate=True))
        except ValueError:  # (binascii's "Incorrect padding", nacl's seed length: neither names the chip)
            raise ValueError(f"chip {serial}: {path.name} is not a base64 32-byte Ed25519 seed") from None

    def answer(self, serial: str, nonce: str) -> str:
        """The chip's signature over an identity challenge, base64."""
        return base64.b64encode(self.key(serial).sign(identity_message(serial, nonce)).signature).decode()

    def export(self, serial: str) -> str:
        """The chip's whole log, as the firmware hands it to an inspector ("" if it never logged)."""
        self.key(serial)  # an unknown chip is an error, not an empty log
        path = self._path(serial, ".log")
        return _read(path, serial, LOG_FILE) if path.exists() else ""

    def firmware_chip(self, serial: str, shard: int) -> Chip:
        """The chip's firmware state for a run where it holds ``shard``: its record counter and chain go on from
        its log; its work counters from what the chip holds (``.state``), never below its last record. The counters
        count every FLOP the chip executed, logged or not: the work of an earlier run after the chip's last
        snapshot of it (or of a run it logged nothing in) is still in them, as in real firmware; restarting them
        from the last record would forget it -- counters going backwards, and hidden work erased."""
        chip = Chip(serial, shard, self.key(serial))
        last = self._last_record(serial)
        chip.counter, chip.prev = (last["counter"] + 1, record_hash(last)) if last else (0, ZERO)
        held = self._held(serial)
        if held is not None:
            chip.busy_ns, chip.flops = held["busy_ns"], held["flops"]
        elif last is not None:  # a folder from before .state: the last record is all that is known
            chip.busy_ns, chip.flops = last.get("busy_ns"), last.get("flops")
        if last is not None and chip.flops is not None and last.get("flops") is not None:
            chip.busy_ns, chip.flops = max(chip.busy_ns, last["busy_ns"]), max(chip.flops, last["flops"])
        return chip

    def _held(self, serial: str) -> dict | None:
        """The work counters the chip holds ({busy_ns, flops}: ints, or None for firmware that never counted)."""
        path = self._path(serial, ".state")
        if not path.exists():
            return None
        text = _read(path, serial)  # (one that cannot be read, or no regular file: refused, naming it)
        try:
            held = json.loads(text)
        except (ValueError, RecursionError):  # (not JSON, nested too deep, an integer of over 4300 digits)
            held = None
        # (counters the firmware would sign into the chip's log for good: in the range a verifier reads, or refused)
        counted = lambda v: v is None or (type(v) is int and 0 <= v <= MAX_WORK)
        if not isinstance(held, dict) or not all(counted(held.get(k)) for k in WORK):
            raise ValueError(f"chip {serial}: its state file is not {{busy_ns, flops}}, each an integer in 0..2^128-1")
        return {k: held.get(k) for k in WORK}

    def hold(self, chip: Chip) -> None:
        """Keep the chip's work counters after a run (written whole, then renamed: a crash leaves the old ones,
        and ``firmware_chip`` never reads them below the log's last record)."""
        path = self._path(chip.serial, ".state")
        scratch = path.with_suffix(".state.tmp")
        scratch.write_text(json.dumps({"busy_ns": chip.busy_ns, "flops": chip.flops}) + "\n")
        os.replace(scratch, path)

    def _last_time(self, serial: str) -> datetime:
        """When the chip last logged (its clock never runs backwards: the checker calls that a rollback)."""
        last = self._last_record(serial)
        if last is None:
            return datetime.min.replace(tzinfo=UTC)
        return datetime.fromisoformat(last["time"].replace("Z", "+00:00"))

    def _last_record(self, serial: str) -> dict | None:
        """The chip's last logged record (None if it never logged), or ValueError naming the chip and its log where
        that line is no record: the firmware goes on from it (its counter, its chain)."""
        lines = [line for line in log_lines(self.export(serial)) if line.strip()]
        if not lines:
            return None
        try:
            return parse_record(lines[-1])
        except ValueError as e:
            raise ValueError(f"chip {serial}: the last line of {serial}.log is no record ({e})") from None

    def append(self, serial: str, lines: list[str]) -> None:
        if lines:
            with self._path(serial, ".log").open("a") as handle:
                handle.write("".join(line + "\n" for line in lines))

    def clock(
        self, serials: list[str], steps: int, now: datetime | None = None, not_before: datetime | None = None
    ) -> tuple[datetime, float]:
        """(start, seconds per step) of the chips' clock for a run of ``steps`` steps that ends by ``now``: a
        minute a step, the run dated so that it has just finished (a chip never logs a time in the future).
        After a recent run on the same chips the steps are squeezed into the time since their last record (a
        chip's clock never runs backwards: the checker calls that a rollback), at least a second a step: a run
        started within seconds of the last one may end up to a second a step ahead of the clock. ``not_before``:
        the run cannot have started earlier (the chips were bought then: a snapshot before that is the seller's)."""
        now = (now or datetime.now(UTC)).replace(microsecond=0)
        floor = [not_before.replace(microsecond=0) + timedelta(seconds=1)] if not_before else []
        last = max([self._last_time(s) for s in serials] + floor, default=datetime.min.replace(tzinfo=UTC))
        start = now - timedelta(seconds=steps * STEP_SECONDS)
        if start > last:
            return start, float(STEP_SECONDS)
        return last, max(1.0, (now - last).total_seconds() // (steps + 1))

    def train(
        self,
        serials: list[str],
        out,
        *,
        arch: str = "mlp",
        steps: int = 30,
        not_before: datetime | None = None,
        **recorder_options,
    ) -> Path:
        """The prover trains on these chips: run the recorder with the chips' own firmware; their logs grow.
        ``not_before``: when the prover got the chips (the run's snapshots are dated after it)."""
        from replay.prover.recorder import Recorder  # torch only when training

        made: list[Firmware] = []

        def firmware(layout, seed, rate):
            assert [item["serial"] for item in layout] == list(serials)  # shard i is held by serials[i]
            made.append(Firmware(layout, seed, rate, step_seconds=step_seconds, chips=chips, start=start))
            return made[-1]

        # everything checked and read before anything is written: the options (a repeated serial would fork a
        # chip's log for good), then every chip's key, log and counters; only then the transcript, then the logs
        recorder = Recorder(out, arch, steps=steps, serials=serials, firmware=firmware, **recorder_options)
        chips = [self.firmware_chip(serial, shard) for shard, serial in enumerate(serials)]
        start, step_seconds = self.clock(serials, steps, not_before=not_before)
        out = recorder.run()
        for serial in serials:
            self.append(serial, [line for line in made[0].lines if json.loads(line)["serial"] == serial])
        for chip in made[0].chips:  # after the log: a crash in between leaves counters no lower than the log's
            self.hold(chip)
        return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m replay.prover.chipsim",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--dir", type=Path, default=Path("var/chip-keys"), help="where the chips' keys and logs are")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("make", help="make chips' keys; print their public keys").add_argument("serials", nargs="+")
    answer = sub.add_parser("answer", help="sign an inspector's identity challenge")
    answer.add_argument("serial")
    answer.add_argument("nonce")
    sub.add_parser("export", help="print the chip's signed snapshot log").add_argument("serial")
    train = sub.add_parser("train", help="train on these chips; they log snapshots")
    train.add_argument("--chips", required=True, help="comma-separated serials")
    train.add_argument("--out", type=Path, required=True, help="a new or empty folder")
    train.add_argument("--arch", default="mlp")
    train.add_argument("--steps", type=int, default=30)
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--snapshot-rate", type=float, default=0.05, help="snapshots per chip per step (Poisson)")
    claims = sub.add_parser("claims", help="the claims body answering the snapshots read off these chips")
    claims.add_argument("transcript", type=Path)
    claims.add_argument("--serials", help="comma-separated serials the inspector read (default: every chip)")
    claims.add_argument("--run", help="your name for the training run (default: the transcript folder's name)")
    claims.add_argument("--location", help="where the verifier reads the transcript (default: its path)")
    args = p.parse_args(argv)
    store = ChipStore(args.dir)
    try:
        if args.cmd == "make":
            print(json.dumps({serial: store.make(serial) for serial in args.serials}, indent=1))
        elif args.cmd == "answer":
            print(store.answer(args.serial, args.nonce))
        elif args.cmd == "export":
            sys.stdout.write(store.export(args.serial))
        elif args.cmd == "train":
            serials = args.chips.split(",")
            options = {"seed": args.seed, "snapshot_rate": args.snapshot_rate}
            from replay.prover.recorder import check_out

            check_out(args.out)  # a new or empty folder: never another run's transcript
            print(store.train(serials, args.out, arch=args.arch, steps=args.steps, **options))
        else:
            body = claims_body(args.transcript, serials_option(args.serials), args.run, args.location)
            print(json.dumps(body, indent=1))
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
