"""A witness for a chipledger log, run by another party: no Django, no database.

    python -m tlog.log_witness --url URL --key-file FILE --state-file FILE [--name NAME]
                               [--log-key VKEY] [--no-submit] [--print-key]

(``python -m ledger.witness`` runs the same with the same arguments: the command witnesses know.)
``python -m ledger.witness serve ...`` runs a C2SP tlog-witness server instead (``tlog/witness_server.py``).

Each run fetches the log's latest checkpoint, checks the log's signature with the pinned log key,
and checks that the checkpoint extends the last one this witness cosigned (same origin, no smaller
size, same root at the same size, a valid RFC 9162 consistency proof to a larger size). Only then
does it cosign (C2SP tlog-cosignature, cosignature/v1, Ed25519 with a timestamp), print the
cosignature line on stdout, submit it to the log and record the checkpoint in the state file.

The key file holds two lines: the witness name and the base64 Ed25519 seed. It is created (mode
0600) on first use, which needs --name; the witness verifier key is then printed on stderr for the
regulator to register. The state file is JSON, replaced atomically.

Exit status: 0 cosigned (and submitted); 1 refused, nothing signed, state unchanged; 2 usage,
network or HTTP error; 3 cosigned and state updated, but the log did not accept the submission.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass

import nacl.signing

from tlog import merkle, note
from tlog.logclient import DEFAULT_TIMEOUT, FetchError, LogClient

EXIT_OK, EXIT_REFUSED, EXIT_ERROR, EXIT_NOT_ACCEPTED = 0, 1, 2, 3


class WitnessError(Exception):
    """A problem with the witness's own files or arguments (exit 2)."""


class Refusal(Exception):
    """The log's checkpoint must not be cosigned (exit 1)."""


# ---------------------------------------------------------------------------------------------
# Key file


def load_or_create_key(path: str, name: str | None) -> tuple[str, nacl.signing.SigningKey, bool]:
    """(name, signing key, created). Creates the key file, mode 0600, if it does not exist."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        if not name:
            raise WitnessError(f"key file {path} does not exist; give --name to create it") from None
        _check_name(name)
        key = nacl.signing.SigningKey.generate()
        seed = base64.b64encode(bytes(key)).decode()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(f"{name}\n{seed}\n")
        return name, key, True
    lines = text.splitlines()
    if len(lines) != 2:
        raise WitnessError(f"key file {path}: expected two lines, name and base64 seed")
    file_name, seed_b64 = lines[0].strip(), lines[1].strip()
    try:
        seed = base64.b64decode(seed_b64, validate=True)
    except binascii.Error as err:
        raise WitnessError(f"key file {path}: seed is not base64") from err
    if len(seed) != 32:
        raise WitnessError(f"key file {path}: seed is not 32 bytes")
    _check_name(file_name)
    if name and name != file_name:
        raise WitnessError(f"key file {path} is for witness {file_name!r}, not {name!r}")
    return file_name, nacl.signing.SigningKey(seed), False


def _check_name(name: str) -> None:
    if not name or any(c.isspace() for c in name) or "+" in name:
        raise WitnessError(f"witness name {name!r} must be non-empty, without spaces or '+'")


def witness_verifier_key(name: str, key: nacl.signing.SigningKey) -> str:
    return note.verifier_key(name, bytes(key.verify_key), note.COSIGNATURE_V1)


# ---------------------------------------------------------------------------------------------
# State file


@dataclass(frozen=True)
class State:
    """The last checkpoint this witness cosigned, and the log key and origin it pinned."""

    origin: str
    log_key: str
    size: int
    root: bytes
    checkpoint: str

    def to_json(self) -> dict:
        return {
            "origin": self.origin,
            "log_key": self.log_key,
            "size": self.size,
            "root": base64.b64encode(self.root).decode(),
            "checkpoint": self.checkpoint,
        }

    @classmethod
    def from_json(cls, data: dict) -> State:
        try:
            root = base64.b64decode(data["root"], validate=True)
            state = cls(
                origin=data["origin"],
                log_key=data["log_key"],
                size=data["size"],
                root=root,
                checkpoint=data["checkpoint"],
            )
        except (KeyError, TypeError, binascii.Error) as err:
            raise WitnessError(f"state is malformed: {err!r}") from err
        if not isinstance(state.size, int) or isinstance(state.size, bool) or state.size < 0:
            raise WitnessError("state is malformed: size is not a non-negative integer")
        if len(root) != 32 or not all(isinstance(v, str) for v in (state.origin, state.log_key)):
            raise WitnessError("state is malformed: bad root, origin or log_key")
        return state


def load_state(path: str) -> State | None:
    """The saved state, or None if the witness has never cosigned (no file)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except ValueError as err:
        raise WitnessError(f"state file {path} is not JSON: {err}") from err
    if not isinstance(data, dict):
        raise WitnessError(f"state file {path} is not a JSON object")
    return State.from_json(data)


def save_state(path: str, state: State) -> None:
    """Write the state atomically: a temporary file in the same folder, then os.replace."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".witness-state-", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(state.to_json(), f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


# ---------------------------------------------------------------------------------------------
# Decision


@dataclass(frozen=True)
class Decision:
    """What to do with a checkpoint, given the state.

    ``cosign`` False means refuse, for ``reason``. ``consistency_from`` is set when a consistency
    proof from that size must verify before cosigning. ``first_use`` marks trust on first use.
    """

    cosign: bool
    reason: str
    consistency_from: int | None = None
    first_use: bool = False


def decide(state: State | None, checkpoint: note.Checkpoint) -> Decision:
    """Whether ``checkpoint`` (already signature-checked) may be cosigned after ``state``."""
    if state is None:
        return Decision(True, "no previous checkpoint: trusting this one on first use", first_use=True)
    if checkpoint.origin != state.origin:
        return Decision(False, f"origin {checkpoint.origin!r} is not the pinned {state.origin!r}")
    if checkpoint.size < state.size:
        return Decision(False, f"rollback: log size {checkpoint.size} is below cosigned size {state.size}")
    if checkpoint.size == state.size:
        if checkpoint.root != state.root:
            return Decision(
                False,
                f"fork: root {checkpoint.root.hex()} at size {state.size} differs from cosigned "
                f"root {state.root.hex()}",
            )
        return Decision(True, f"same checkpoint as last cosigned, size {state.size}")
    if state.size == 0:
        if state.root != merkle.EMPTY_ROOT:
            return Decision(False, "fork: the cosigned size-0 checkpoint has a non-empty root")
        return Decision(True, f"extends the empty tree to size {checkpoint.size}")
    return Decision(
        True,
        f"extends size {state.size} to {checkpoint.size}",
        consistency_from=state.size,
    )


# ---------------------------------------------------------------------------------------------
# One run


@dataclass
class Outcome:
    state: State
    cosignature: str
    decision: Decision
    submitted: bool
    status: int | None = None  # the log's HTTP status for the submission; None: no answer
    answer: object = None  # the log's answer to the submission


def log_verifier(client: LogClient, state: State | None, log_key: str | None, say) -> tuple[str, note.Verifier]:
    """The pinned log key: from the state, else --log-key, else the served key (first use)."""
    if state is not None:
        if log_key is not None and log_key.strip() != state.log_key:
            raise Refusal(f"--log-key differs from the log key pinned in the state: {state.log_key}")
        vkey = state.log_key
    elif log_key is not None:
        vkey = log_key.strip()
    else:
        vkey = client.key()
        say(f"no --log-key and no state: trusting the served log key on first use: {vkey}")
    try:
        return vkey, note.parse_verifier_key(vkey)
    except (note.NoteError, ValueError) as err:
        raise Refusal(f"log key {vkey!r} is not a valid verifier key: {err}") from err


def run_once(
    client: LogClient,
    name: str,
    key: nacl.signing.SigningKey,
    state_path: str,
    log_key: str | None = None,
    submit: bool = True,
    now=time.time,
    say=lambda msg: None,
) -> Outcome:
    """Check the log's latest checkpoint and cosign it. Raises Refusal, FetchError, WitnessError."""
    state = load_state(state_path)
    vkey, verifier = log_verifier(client, state, log_key, say)

    text = client.latest_checkpoint()  # not the published one: that may wait for this very cosignature
    try:
        body, checkpoint = note.open_checkpoint(text, verifier)
    except (note.NoteError, ValueError) as err:
        raise Refusal(f"checkpoint does not verify with the log key: {err}") from err

    decision = decide(state, checkpoint)
    if not decision.cosign:
        raise Refusal(decision.reason)
    if decision.consistency_from is not None:
        first = decision.consistency_from
        proof = client.consistency_proof(first, checkpoint.size)
        if not merkle.verify_consistency(first, checkpoint.size, proof, state.root, checkpoint.root):
            raise Refusal(f"not an extension: consistency proof from size {first} to {checkpoint.size} is invalid")
    say(decision.reason)

    line = note.cosign(body, name, key, int(now())).rstrip("\n")
    new_state = State(
        origin=checkpoint.origin,
        log_key=vkey,
        size=checkpoint.size,
        root=checkpoint.root,
        checkpoint=text,
    )
    # Recorded before submitting: once signed, this witness is bound to the checkpoint.
    save_state(state_path, new_state)
    outcome = Outcome(state=new_state, cosignature=line, decision=decision, submitted=False)
    if submit:
        outcome.submitted = True
        try:
            outcome.status, outcome.answer = client.submit_cosignature(text, line)
        except FetchError as err:
            outcome.answer = str(err)
    return outcome


# ---------------------------------------------------------------------------------------------
# Command line


PROG = "python -m tlog.log_witness"  # what --help and usage errors name; the compatibility entry point passes its own


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Cosign a chipledger log's checkpoint if it extends the last one cosigned.",
    )
    parser.add_argument("--url", help="base URL of the log, e.g. https://host")
    parser.add_argument("--key-file", required=True, help="witness key file (created if missing)")
    parser.add_argument("--state-file", help="JSON file recording the last cosigned checkpoint")
    parser.add_argument("--name", help="witness name; needed to create the key file")
    parser.add_argument("--log-key", help="the log's verifier key to pin")
    parser.add_argument("--no-submit", action="store_true", help="cosign but do not POST it")
    parser.add_argument("--print-key", action="store_true", help="print the witness key, exit")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:  # the C2SP tlog-witness server (tlog/witness_server.py)
        from tlog import witness_server

        return witness_server.main(argv[1:], prog, load_or_create_key, witness_verifier_key)
    parser = build_parser(prog)
    args = parser.parse_args(argv)

    def say(msg: str) -> None:
        print(f"witness: {msg}", file=sys.stderr)

    try:
        name, key, created = load_or_create_key(args.key_file, args.name)
    except (WitnessError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_ERROR
    vkey = witness_verifier_key(name, key)
    if created:
        say(f"created key file {args.key_file}; register this witness key with the log:")
        print(vkey, file=sys.stderr)
    if args.print_key:
        print(vkey)
        return EXIT_OK
    if not args.url or not args.state_file:
        parser.error("--url and --state-file are required (unless --print-key)")

    try:
        client = LogClient(args.url, timeout=args.timeout)
        outcome = run_once(client, name, key, args.state_file, args.log_key, not args.no_submit, say=say)
    except Refusal as err:
        print(f"REFUSED: {err}", file=sys.stderr)
        return EXIT_REFUSED
    except (FetchError, WitnessError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_ERROR

    print(outcome.cosignature)
    size = outcome.state.size
    if not outcome.submitted:
        say(f"cosigned size {size}; not submitted (--no-submit)")
        return EXIT_OK
    if outcome.status is not None and 200 <= outcome.status < 300:
        say(f"cosigned size {size}; the log accepted it: {json.dumps(outcome.answer)}")
        return EXIT_OK
    say(f"cosigned size {size}; the log REJECTED it: HTTP {outcome.status}: {json.dumps(outcome.answer)}")
    return EXIT_NOT_ACCEPTED


if __name__ == "__main__":
    sys.exit(main())
