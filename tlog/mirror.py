"""Copy a log's C2SP tlog-tiles into a directory any static file server can serve: no Django.

    python -m tlog.mirror --url https://log.example/tlog/ --out DIR --key VKEY [--jobs N]

Fetches the checkpoint, checks it with the pinned log key, fetches every tile and entry bundle of its
tree that the directory lacks (full ones never change; partial ones are fetched again), audits the whole
copy against the checkpoint (``tlog.log_verifier.audit_tiles``), and only then writes the checkpoint,
so a mirror never serves a checkpoint its tiles do not back. Exit 0 done, 1 the log does not verify,
2 it could not be read.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from tlog import note, tiles
from tlog.chain import LedgerFault
from tlog.log_verifier import audit_tiles, check_checkpoint, default_jobs, parse_key
from tlog.logclient import LIMIT_BUNDLE, LIMIT_SMALL, LIMIT_TILE, FetchError, LogClient


def mirror(url: str, out: Path, key: str, jobs: int = 1) -> tuple[int, int]:
    """(tree size, files fetched). Raises LedgerFault or FetchError."""
    source = LogClient.mirror_only([url])
    text = (source.tile_resource("checkpoint", LIMIT_SMALL) or b"").decode("utf-8", "replace")
    if not text:
        raise FetchError(f"{url}: no checkpoint")
    checkpoint = check_checkpoint(text, parse_key(key))
    wanted = [(tiles.tile_path(*tile), LIMIT_TILE) for tile in tiles.tiles_for_size(checkpoint.size)]
    wanted += [(tiles.bundle_path(*bundle), LIMIT_BUNDLE) for bundle in tiles.bundles_for_size(checkpoint.size)]
    fetched = 0
    for path, limit in wanted:
        target = out / path
        if target.exists() and ".p/" not in path:
            continue
        data = source.tile_resource(path, limit)
        if data is None:
            raise FetchError(f"{url}{path}: not served")
        _write(target, data)
        fetched += 1
    audit_tiles(LogClient.mirror_only([out.resolve().as_uri()]), checkpoint.size, checkpoint.root, jobs=jobs)
    _write(out / "checkpoint", text.encode())
    return checkpoint.size, fetched


def _write(target: Path, data: bytes) -> None:
    """Atomically: a reader of the mirror sees the old file or the new one, never half of one."""
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tlog.mirror", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="the log's tiles prefix, e.g. https://host/tlog/")
    parser.add_argument("--out", required=True, type=Path, help="the mirror's directory")
    parser.add_argument("--key", required=True, help="the log's verifier key")
    parser.add_argument(
        "--jobs", type=int, default=default_jobs(), metavar="N", help="audit in N processes (default: the CPU count)"
    )
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs is at least 1, not {args.jobs}")
    try:
        size, fetched = mirror(args.url, args.out, args.key, args.jobs)
    except LedgerFault as fault:
        print(fault.line(), file=sys.stderr)
        return 1
    except (FetchError, ValueError, OSError, note.NoteError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"OK entries={size} fetched={fetched}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
