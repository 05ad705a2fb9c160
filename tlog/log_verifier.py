"""Verify a chipledger log from the outside: no Django, no database.

    python -m tlog.log_verifier --url https://ledger.example [--key VKEY] [--witness VKEY ...]
                                [--quorum K] [--mirror URL ...] [--tiles-only [--jobs N]] [--json]
    python -m tlog.log_verifier --extract FILE [--key VKEY] [--witness VKEY ...] [--quorum K] [--json]

(``python -m ledger.verify`` runs the same with the same arguments: the command third parties know.)

Fetches the log's verifier key and latest signed checkpoint, checks the log's signature, reads every
entry from the log's C2SP tlog-tiles entry bundles (``<url>/tlog/``, then each ``--mirror`` in order),
re-runs the hash chain and the RFC 9162 tree over the leaf bytes, compares the recomputed root with
the signed one, and checks every hash tile against the recomputed hashes. Witness cosignatures on the
checkpoint are counted for the witness keys given. One inclusion proof and one consistency proof, at
positions the server cannot predict, are checked against the log's proof endpoints (skipped, when
mirrors are given, if the log itself cannot be reached). ``--tiles-only`` checks the checkpoint and then
only every tile and bundle against it, in ``--jobs`` worker processes.

``--extract FILE`` checks a ledger extract offline instead (``tlog.extract``: entries about one organisation or
campaign, each with its inclusion proof against a signed checkpoint); nothing is fetched.

Exit status: 0 the log (or the extract) checks out; 1 it does not (``FAIL seq=K: reason`` or ``FAIL checkpoint:
reason`` on stderr); 2 the log could not be fetched (network, HTTP or protocol error).

Only the standard library, PyNaCl and the pure modules ``tlog.merkle``, ``tlog.note`` and
``tlog.chain`` are imported here; third parties run this without the application.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import functools
import json
import multiprocessing
import os
import random
import sys
import threading
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field

from tlog import extract as extracts
from tlog import merkle, note, tiles
from tlog.chain import ChainVerifier, LedgerFault
from tlog.logclient import DEFAULT_TIMEOUT, FetchError, LogClient

# ---------------------------------------------------------------------------------------------
# Verification


@dataclass
class WitnessResult:
    name: str
    key: str
    valid: bool
    timestamp: int | None = None
    reason: str = ""


@dataclass
class Report:
    origin: str
    size: int
    root: str  # hex
    key: str
    key_pinned: bool
    witnesses: list[WitnessResult] = field(default_factory=list)
    quorum: int = 0
    inclusion_checked: int | None = None  # the index whose inclusion proof was checked
    consistency_checked: int | None = None  # the first size whose consistency proof was checked
    tiles_checked: int | None = None  # with --tiles-only: how many hash tiles were checked

    @property
    def valid_cosignatures(self) -> int:
        return sum(w.valid for w in self.witnesses)

    def line(self) -> str:
        return f"OK entries={self.size} root={self.root}"

    def to_json(self) -> dict:
        out = asdict(self)
        out["ok"] = True
        out["valid_cosignatures"] = self.valid_cosignatures
        return out


def parse_key(vkey: str, what: str = "key") -> note.Verifier:
    try:
        verifier = note.parse_verifier_key(vkey.strip())
    except (note.NoteError, ValueError) as err:
        raise LedgerFault("checkpoint", f"{what} is not a valid verifier key: {err}") from err
    return verifier


def check_checkpoint(text: str, verifier: note.Verifier) -> note.Checkpoint:
    """The log's signature on the note, and the checkpoint it carries. Raises LedgerFault."""
    try:
        return note.open_checkpoint(text, verifier)[1]
    except (note.NoteError, ValueError) as err:
        raise LedgerFault("checkpoint", str(err)) from err


def check_cosignatures(text: str, witnesses: list[note.Verifier]) -> list[WitnessResult]:
    """For each witness key, whether the note carries a valid cosignature from it."""
    body, signatures = note.split_note(text)
    results = []
    for w in witnesses:
        vkey = note.verifier_key(w.name, w.public_key, w.sig_type)
        result = WitnessResult(name=w.name, key=vkey, valid=False, reason="no cosignature")
        for sig in signatures:
            if sig.name != w.name or sig.key_id != w.key_id:
                continue
            try:
                timestamp = note.verify_cosignature(body, sig, w)
            except (note.NoteError, ValueError) as err:
                result.reason = f"invalid cosignature: {err}"
                continue
            result = WitnessResult(name=w.name, key=vkey, valid=True, timestamp=timestamp)
            break
        results.append(result)
    return results


def log_key(client: LogClient, pinned_key: str | None) -> str:
    """The log's verifier key: the served one, which must be the pinned one if given.

    With mirrors, a log that cannot be reached leaves the pinned key (mirrors serve tiles, not keys).
    """
    try:
        served_key = client.key()
    except FetchError:
        if pinned_key is None or len(client.tile_bases) == 1:
            raise
        return pinned_key.strip()
    if pinned_key is not None and pinned_key.strip() != served_key:
        raise LedgerFault("checkpoint", f"served key {served_key!r} is not the pinned key {pinned_key.strip()!r}")
    return served_key


def _audit(step, *args) -> None:
    try:
        step(*args)
    except tiles.TileMismatch as mismatch:
        raise LedgerFault(mismatch.first_leaf, str(mismatch)) from None


def check_entry(seq: int, entry: dict, chain: ChainVerifier) -> tuple[bytes, dict]:
    """Feed one served entry to the chain; check the served metadata against the leaf itself.

    Returns (leaf hash, the parsed leaf)."""
    if entry.get("seq") != seq:
        raise LedgerFault(seq, f"served seq {entry.get('seq')!r} where {seq} was expected")
    try:
        leaf = base64.b64decode(entry.get("leaf", ""), validate=True)
    except (TypeError, binascii.Error) as err:
        raise LedgerFault(seq, "leaf is not base64") from err
    leaf_hash, parsed = chain.feed(seq, leaf)
    if entry.get("hash") != leaf_hash.hex():
        raise LedgerFault(seq, f"served hash {entry.get('hash')!r} is not the leaf's hash {leaf_hash.hex()}")
    for name in ("seq", "kind", "actor", "time"):
        if name not in entry:
            continue  # the summary fields are a convenience; the leaf is what is signed for
        if entry[name] != parsed.get(name):
            raise LedgerFault(seq, f"served {name} {entry[name]!r} differs from the leaf's {parsed.get(name)!r}")
    return leaf_hash, parsed


def open_log(
    client: LogClient, pinned_key: str | None, witnesses: list[str], quorum: int
) -> tuple[str, note.Checkpoint, list[WitnessResult]]:
    """The log's key, its signed checkpoint, and its witnesses' cosignatures (at least ``quorum`` valid)."""
    witness_keys = [parse_key(w, f"witness key {w!r}") for w in witnesses]
    served_key = log_key(client, pinned_key)
    verifier = parse_key(served_key, "served key")
    text = client.checkpoint()
    checkpoint = check_checkpoint(text, verifier)
    cosigs = check_cosignatures(text, witness_keys)
    valid = sum(c.valid for c in cosigs)
    if valid < quorum:
        raise LedgerFault("checkpoint", f"{valid} valid witness cosignature(s), quorum is {quorum}")
    return served_key, checkpoint, cosigs


def audit_log(
    client: LogClient, pinned_key: str | None = None, witnesses: list[str] = (), quorum: int = 0, jobs: int = 1
) -> Report:
    """``--tiles-only``: the checkpoint as in ``verify_log``, then every tile and bundle against it
    (``audit_tiles``, in ``jobs`` processes), without the hash chain over the leaves' JSON or the proof
    endpoints: what a mirror or a monitor of any tlog-tiles log checks. Raises LedgerFault or FetchError."""
    served_key, checkpoint, cosigs = open_log(client, pinned_key, witnesses, quorum)
    checked = audit_tiles(client, checkpoint.size, checkpoint.root, jobs=jobs)
    return Report(
        origin=checkpoint.origin,
        size=checkpoint.size,
        root=checkpoint.root.hex(),
        key=served_key,
        key_pinned=pinned_key is not None,
        witnesses=cosigs,
        quorum=quorum,
        tiles_checked=checked,
    )


def verify_log(
    client: LogClient,
    pinned_key: str | None = None,
    witnesses: list[str] = (),
    quorum: int = 0,
    rng: random.Random | None = None,
    progress=None,
) -> Report:
    """Verify the whole log behind ``client``. Raises LedgerFault or FetchError.

    ``progress(done, total)`` is called now and then while entries are checked.
    """
    rng = rng or random.SystemRandom()
    served_key, checkpoint, cosigs = open_log(client, pinned_key, witnesses, quorum)
    size, root = checkpoint.size, checkpoint.root

    # Spot checks at positions drawn before any entry is seen.
    inclusion_index = rng.randrange(size) if size > 0 else None
    consistency_first = rng.randrange(1, size) if size > 1 else None
    inclusion_hash = consistency_root = None

    chain = ChainVerifier()
    auditor = tiles.TileAuditor(client.tile)
    seq = 0
    for index, width in tiles.bundles_for_size(size):
        leaves = client.bundle(index, width)
        hashes = tiles.leaf_hashes(leaves)
        _audit(auditor.add_bundle, index, hashes)
        for position, leaf in enumerate(leaves):
            leaf_hash = hashes[tiles.HASH_SIZE * position : tiles.HASH_SIZE * (position + 1)]
            chain.feed(seq, leaf, leaf_hash)
            if seq == inclusion_index:
                inclusion_hash = leaf_hash
            seq += 1
            if seq == consistency_first:
                consistency_root = chain.root()
            if progress is not None and seq % 1000 == 0:
                progress(seq, size)
    recomputed = chain.root()
    if recomputed != root:
        raise LedgerFault("checkpoint", f"root {root.hex()} is not the root {recomputed.hex()} of the entries")
    _audit(auditor.finish)

    try:
        if inclusion_index is not None:
            proof = client.inclusion_proof(inclusion_index, size)
            if not merkle.verify_inclusion(inclusion_hash, inclusion_index, size, proof, root):
                raise LedgerFault(inclusion_index, f"inclusion proof in tree of size {size} is invalid")
        if consistency_first is not None:
            proof = client.consistency_proof(consistency_first, size)
            if not merkle.verify_consistency(consistency_first, size, proof, consistency_root, root):
                raise LedgerFault("checkpoint", f"consistency proof from size {consistency_first} to {size} is invalid")
    except FetchError:
        if len(client.tile_bases) == 1:
            raise
        inclusion_index = consistency_first = None  # the log is down; the mirrors serve no proof endpoints

    return Report(
        origin=checkpoint.origin,
        size=size,
        root=root.hex(),
        key=served_key,
        key_pinned=pinned_key is not None,
        witnesses=cosigs,
        quorum=quorum,
        inclusion_checked=inclusion_index,
        consistency_checked=consistency_first,
    )


AUDIT_CHUNK = 256  # entry bundles per worker task: 65,536 entries, one level-1 tile


def audit_tiles(client: LogClient, size: int, root: bytes, jobs: int = 1, chunk: int = AUDIT_CHUNK) -> int:
    """Authenticate every entry bundle and hash tile of the tree of ``size`` leaves against ``root``.

    The tiles-only part of ``verify_log`` (no chain, no JSON): each leaf is hashed once, each tile compared
    with the recomputed hashes, the root recomputed from the leaves. Returns the number of tiles checked.
    Raises LedgerFault or FetchError.

    ``jobs`` > 1 audits runs of ``chunk`` bundles (their level-0 tiles and the bundles' roots: nearly all
    the hashing) in that many worker processes; the levels above are checked here from the roots, in
    order. The outcome is the same as with one job, the same first fault included: a run's fault is
    raised only after every tile the one-job audit would have checked before it.
    """
    auditor = tiles.TileAuditor(client.tile)
    bundle_roots: list[bytes] = []  # the tree above level 8 is folded from full bundles' roots
    tail = b""
    for roots, run_tail, checked, fault in _bundle_runs(client, size, jobs, chunk):
        auditor.tiles_checked += checked
        for start in range(0, len(roots), tiles.HASH_SIZE):
            bundle_root = roots[start : start + tiles.HASH_SIZE]
            _audit(auditor.add_root, bundle_root)
            bundle_roots.append(bundle_root)
        if fault is not None:
            raise fault
        tail = tail or run_tail
    high, _ = merkle.append_leaves([], 0, bundle_roots)
    low, _ = merkle.append_leaves([], 0, [tail[i : i + tiles.HASH_SIZE] for i in range(0, len(tail), tiles.HASH_SIZE)])
    if merkle.fold_range(high + low) != root:
        raise LedgerFault("checkpoint", f"root {root.hex()} is not the root of the entry bundles")
    _audit(auditor.finish)
    return auditor.tiles_checked


def default_jobs() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _bundle_runs(client: LogClient, size: int, jobs: int, chunk: int):
    """``audit_bundle_run`` over consecutive runs of ``chunk`` bundles, in order, in ``jobs`` processes."""
    bundles = -(-size // tiles.TILE_WIDTH)
    starts = range(0, bundles, chunk)
    ends = [min(start + chunk, bundles) for start in starts]
    run = functools.partial(audit_bundle_run, client, size)
    if jobs <= 1 or len(starts) <= 1:
        yield from map(run, starts, ends)
        return
    pool = ProcessPoolExecutor(min(jobs, len(starts)), mp_context=multiprocessing.get_context(_start_method()))
    try:
        yield from pool.map(run, starts, ends)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _start_method() -> str:
    """fork where it is safe (Linux, one thread: a worker starts in milliseconds, importing nothing), else
    spawn (a fresh interpreter: a caller holding threads, such as a test's live server, cannot hand a
    worker a lock held by a thread that does not exist there)."""
    return "fork" if sys.platform == "linux" and threading.active_count() == 1 else "spawn"


def audit_bundle_run(client: LogClient, size: int, first: int, end: int) -> tuple[bytes, bytes, int, Exception | None]:
    """Bundles [first, end) of the tree of ``size`` leaves, each against its level-0 tile.

    Returns (the joined roots of the full bundles checked, the partial bundle's joined leaf hashes if it is
    in the run, how many tiles were checked, the fault that stopped the run or None). A worker's task:
    the fault is returned, not raised, so the caller first checks what came before it.
    """
    roots, tail, checked = [], b"", 0
    try:
        for index in range(first, end):
            width = tiles.tile_width(size, 0, index)
            width = None if width == tiles.TILE_WIDTH else width
            hashes = tiles.leaf_hashes(client.bundle(index, width))
            tiles.check_tile(client.tile, 0, index, width, hashes)
            checked += 1
            if width is None:
                roots.append(tiles.perfect_root(hashes))
            else:
                tail = hashes
    except tiles.TileMismatch as mismatch:
        return b"".join(roots), tail, checked, LedgerFault(mismatch.first_leaf, str(mismatch))
    except (LedgerFault, FetchError) as fault:
        return b"".join(roots), tail, checked, fault
    return b"".join(roots), tail, checked, None


# ---------------------------------------------------------------------------------------------
# Command line


PROG = "python -m tlog.log_verifier"  # what --help and usage errors name; the compatibility entry point passes its own


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Verify a chipledger transparency log end to end.",
    )
    parser.add_argument("--url", help="base URL of the log, e.g. https://host (or --extract)")
    parser.add_argument("--extract", metavar="FILE", help="check a ledger extract (JSON) offline instead of a log")
    parser.add_argument("--key", help="pinned verifier key of the log; the served one must match")
    parser.add_argument("--witness", action="append", default=[], metavar="VKEY", help="witness verifier key")
    parser.add_argument("--quorum", type=int, default=0, metavar="K", help="require K valid witness cosignatures")
    parser.add_argument(
        "--mirror",
        action="append",
        default=[],
        metavar="URL",
        help="a tlog-tiles mirror of the log (http(s) or file://), tried in order after the log's own /tlog/",
    )
    parser.add_argument(
        "--tiles-only",
        action="store_true",
        help="only authenticate every tile and entry bundle against the checkpoint (no chain, no proof endpoints)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=default_jobs(),
        metavar="N",
        help="with --tiles-only: audit in N worker processes (default: the CPU count)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help=argparse.SUPPRESS)
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    return parser


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if (args.url is None) == (args.extract is None):
        parser.error("give --url (a log) or --extract (an extract file), one of the two")
    if args.quorum < 0 or args.quorum > len(args.witness):
        print(f"error: --quorum {args.quorum} needs that many --witness keys", file=sys.stderr)
        return 2
    if args.jobs < 1:
        print(f"error: --jobs is at least 1, not {args.jobs}", file=sys.stderr)
        return 2
    if args.extract is not None:
        return extract_main(args)
    try:
        client = LogClient(args.url, timeout=args.timeout, mirrors=args.mirror)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    def progress(done: int, total: int) -> None:
        if not args.quiet:
            print(f"checked {done}/{total} entries", file=sys.stderr)

    if args.key is None:
        print("warning: no --key given; trusting the key the log serves", file=sys.stderr)
    try:
        if args.tiles_only:
            report = audit_log(client, args.key, args.witness, args.quorum, jobs=args.jobs)
        else:
            report = verify_log(client, args.key, args.witness, args.quorum, progress=progress)
    except LedgerFault as fail:
        print(fail.line(), file=sys.stderr)
        if args.json:
            print(json.dumps({"ok": False, "where": fail.where, "reason": fail.reason}))
        return 1
    except FetchError as err:
        print(f"error: {err}", file=sys.stderr)
        if args.json:
            print(json.dumps({"ok": False, "error": str(err)}))
        return 2

    if not args.quiet:
        for w in report.witnesses:
            state = f"valid (time {w.timestamp})" if w.valid else w.reason
            print(f"witness {w.name}: {state}", file=sys.stderr)
    print(json.dumps(report.to_json()) if args.json else report.line())
    return 0


def extract_main(args) -> int:
    """Check an extract file: 0 it checks out, 1 it does not (``FAIL ...``), 2 it cannot be read."""
    try:
        with open(args.extract, "rb") as handle:
            document = json.loads(handle.read())
    except (OSError, ValueError) as err:
        print(f"error: {args.extract}: {err}", file=sys.stderr)
        return 2
    if args.key is None:
        print("warning: no --key given; trusting the key the extract names", file=sys.stderr)
    try:
        report = extracts.check_extract(document, args.key, args.witness, args.quorum)
    except LedgerFault as fail:
        print(fail.line(), file=sys.stderr)
        if args.json:
            print(json.dumps({"ok": False, "where": fail.where, "reason": fail.reason}))
        return 1
    print(json.dumps({"ok": True, **asdict(report)}) if args.json else report.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
