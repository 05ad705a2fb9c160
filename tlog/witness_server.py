"""A C2SP tlog-witness server: cosigns any configured log's checkpoints that extend what it cosigned before.

    python -m ledger.witness serve --key-file F --state-db S --log-key VKEY [--log-key VKEY ...]
                                   [--listen 127.0.0.1:8099] [--prefix /] [--name NAME]

``POST <prefix>add-checkpoint`` with ``old <size>``, up to 63 base64 consistency-proof lines, an empty line
and the signed checkpoint. Answers (tlog-witness): 404 unknown origin; 403 no valid signature by the
origin's key; 400 malformed, or an old size above the checkpoint's; 409 the old size is not the size this
witness last cosigned for the origin (body: that size and a newline, ``text/x.tlog.size``); 422 a size-0
checkpoint with a non-empty root, a proof with old size 0, a failed consistency proof, or another root at
the cosigned size; 200 a ``cosignature/v1`` line (tlog-cosignature, Ed25519, with the time).

The latest cosigned (size, root) per origin lives in SQLite: the old-size check and the write of the new
size happen in one ``BEGIN IMMEDIATE`` transaction (one writer at a time, across threads and processes),
committed with ``synchronous=FULL`` before the answer is sent. No Django; standard library, PyNaCl, ``tlog``.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import re
import sqlite3
import sys
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import nacl.signing

from tlog import merkle, note

MAX_BODY = 64 * 1024
MAX_PROOF_LINES = 63
SIZE_TYPE = "text/x.tlog.size"
_OLD_LINE = re.compile(r"old (0|[1-9][0-9]{0,19})")


@dataclass(frozen=True)
class Answer:
    status: int
    body: str
    content_type: str = "text/plain; charset=utf-8"


class Malformed(ValueError):
    """A request body that is not an add-checkpoint request (400)."""


@dataclass(frozen=True)
class Request:
    old: int
    proof: list[bytes]
    checkpoint: str


def parse_request(raw: bytes) -> Request:
    """Split an add-checkpoint body. Raises Malformed."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise Malformed("the body is not UTF-8") from err
    head, sep, checkpoint = text.partition("\n\n")
    if not sep:
        raise Malformed("no empty line between the old size and proof, and the checkpoint")
    lines = head.split("\n")
    match = _OLD_LINE.fullmatch(lines[0])
    if match is None:
        raise Malformed("the first line must be 'old <size>', a decimal without leading zeros")
    old = int(match.group(1))
    if old >= 1 << 64:
        raise Malformed("old size does not fit 64 bits")
    if len(lines) - 1 > MAX_PROOF_LINES:
        raise Malformed(f"more than {MAX_PROOF_LINES} consistency proof lines")
    proof = []
    for number, line in enumerate(lines[1:], start=1):
        try:
            digest = base64.b64decode(line, validate=True)
        except (binascii.Error, ValueError) as err:
            raise Malformed(f"proof line {number} is not base64") from err
        if len(digest) != merkle.HASH_SIZE or base64.b64encode(digest).decode() != line:
            raise Malformed(f"proof line {number} is not a canonical base64 SHA-256 hash")
        proof.append(digest)
    return Request(old, proof, checkpoint)


class Store:
    """The latest cosigned (size, root) per origin, in SQLite (one connection per call: threads and processes)."""

    def __init__(self, path: str):
        self.path = path
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("CREATE TABLE IF NOT EXISTS latest (origin TEXT PRIMARY KEY, size INTEGER NOT NULL, root BLOB)")

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        db.execute("PRAGMA synchronous=FULL")  # the new size is on disk before the cosignature leaves
        return db

    def latest(self, origin: str) -> tuple[int, bytes | None]:
        db = self._connect()
        try:
            row = db.execute("SELECT size, root FROM latest WHERE origin = ?", (origin,)).fetchone()
        finally:
            db.close()
        return (0, None) if row is None else (row[0], bytes(row[1]))

    def advance(self, origin: str, decide) -> Answer:
        """Run ``decide(stored size, stored root) -> (Answer, new (size, root) or None)`` under the write lock;
        store the new state and commit before returning the answer."""
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")
            row = db.execute("SELECT size, root FROM latest WHERE origin = ?", (origin,)).fetchone()
            size, root = (0, None) if row is None else (row[0], bytes(row[1]))
            answer, new = decide(size, root)
            if new is not None:
                db.execute(
                    "INSERT INTO latest (origin, size, root) VALUES (?, ?, ?) "
                    "ON CONFLICT(origin) DO UPDATE SET size = excluded.size, root = excluded.root",
                    (origin, new[0], new[1]),
                )
            db.execute("COMMIT")
            return answer
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        finally:
            db.close()


class Witness:
    """The add-checkpoint logic, HTTP aside."""

    def __init__(self, name: str, key: nacl.signing.SigningKey, log_keys: list[str], store: Store, clock=time.time):
        self.name, self.key, self.store, self.clock = name, key, store, clock
        self.logs: dict[str, note.Verifier] = {}
        for vkey in log_keys:
            verifier = note.parse_verifier_key(vkey.strip())
            if verifier.sig_type != note.ED25519:
                raise ValueError(f"log key {vkey!r} is not an Ed25519 note key")
            self.logs[verifier.name] = verifier

    def add_checkpoint(self, raw: bytes) -> Answer:
        try:
            request = parse_request(raw)
            body, _ = note.split_note(request.checkpoint)
            checkpoint = note.parse_checkpoint(body)
        except (Malformed, note.NoteError, ValueError) as err:
            return Answer(400, f"malformed add-checkpoint request: {err}\n")
        verifier = self.logs.get(checkpoint.origin)
        if verifier is None:
            return Answer(404, f"unknown log origin {checkpoint.origin!r}\n")
        try:
            note.verify_note(request.checkpoint, verifier)
        except (note.NoteError, ValueError) as err:
            return Answer(403, f"checkpoint not signed by the log's key: {err}\n")
        if request.old > checkpoint.size:
            return Answer(400, f"old size {request.old} is above the checkpoint's size {checkpoint.size}\n")

        def decide(stored_size: int, stored_root: bytes | None):
            if request.old != stored_size:
                return Answer(409, f"{stored_size}\n", SIZE_TYPE), None
            problem = _inconsistency(request, checkpoint, stored_root)
            if problem:
                return Answer(422, problem + "\n"), None
            line = note.cosign(body, self.name, self.key, int(self.clock()))
            return Answer(200, line), (checkpoint.size, checkpoint.root)

        return self.store.advance(checkpoint.origin, decide)


def _inconsistency(request: Request, checkpoint: note.Checkpoint, stored_root: bytes | None) -> str | None:
    if checkpoint.size == 0 and checkpoint.root != merkle.EMPTY_ROOT:
        return "a checkpoint of size 0 must have the empty tree's root"
    if request.old == 0:
        return "old size 0 needs an empty proof" if request.proof else None
    if request.old == checkpoint.size:
        if checkpoint.root != stored_root:
            return f"the root at size {checkpoint.size} differs from the one cosigned"
        return "a proof between equal sizes must be empty" if request.proof else None
    if not merkle.verify_consistency(request.old, checkpoint.size, request.proof, stored_root, checkpoint.root):
        return f"the consistency proof from size {request.old} to {checkpoint.size} does not verify"
    return None


def make_server(witness: Witness, host: str, port: int, prefix: str = "/") -> ThreadingHTTPServer:
    path = prefix.rstrip("/") + "/add-checkpoint"

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as tlog-witness asks

        def log_message(self, *args):
            pass

        def _send(self, answer: Answer) -> None:
            data = answer.body.encode("utf-8")
            self.send_response(answer.status)
            self.send_header("Content-Type", answer.content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):
            if self.path != path:
                self.close_connection = True
                return self._send(Answer(404, "not found\n"))
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                self.close_connection = True
                return self._send(Answer(411 if "Content-Length" not in self.headers else 400, "Content-Length\n"))
            if not 0 <= length <= MAX_BODY:
                self.close_connection = True
                return self._send(Answer(400, f"the body is larger than {MAX_BODY} bytes\n"))
            self._send(witness.add_checkpoint(self.rfile.read(length)))

        def do_GET(self):
            self.close_connection = True
            self._send(Answer(405 if self.path == path else 404, "use POST add-checkpoint\n"))

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def build_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"{prog} serve", description="A C2SP tlog-witness server.")
    parser.add_argument("--key-file", required=True, help="witness key file (created if missing, with --name)")
    parser.add_argument("--name", help="witness name; needed to create the key file")
    parser.add_argument("--state-db", required=True, help="SQLite file of the latest cosigned size per log")
    parser.add_argument("--log-key", action="append", default=[], metavar="VKEY", help="a log this witness serves")
    parser.add_argument("--listen", default="127.0.0.1:8099", help="HOST:PORT (default 127.0.0.1:8099)")
    parser.add_argument("--prefix", default="/", help="the submission prefix (default /)")
    return parser


def main(argv: list[str], prog: str, load_key, verifier_key) -> int:
    """``load_key(path, name) -> (name, key, created)`` and ``verifier_key(name, key)`` come from
    ``tlog.log_witness`` (which calls this), so both share one key-file format."""
    args = build_parser(prog).parse_args(argv)
    if not args.log_key:
        print("error: give at least one --log-key", file=sys.stderr)
        return 2
    try:
        name, key, created = load_key(args.key_file, args.name)
        witness = Witness(name, key, args.log_key, Store(args.state_db))
        host, _, port = args.listen.rpartition(":")
        server = make_server(witness, host or "127.0.0.1", int(port), args.prefix)
    except Exception as err:  # WitnessError, OSError, ValueError, NoteError: a usage error either way
        print(f"error: {err}", file=sys.stderr)
        return 2
    if created:
        print(f"witness: created key file {args.key_file}; register this witness key with the log:", file=sys.stderr)
    print(f"witness: {verifier_key(name, key)}", file=sys.stderr)
    print(f"witness: listening on http://{args.listen}{args.prefix.rstrip('/')}/add-checkpoint", file=sys.stderr)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
