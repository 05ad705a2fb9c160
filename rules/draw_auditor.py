"""Audit an inspection draw from a chipledger log's public API: no Django, no database.

    python -m rules.draw_auditor --url URL --campaign SLUG --period N [--key VKEY] [--mirror URL ...] [--json]

(``python -m inspections.drawaudit`` runs the same with the same arguments.)

Checks the log's signed checkpoint, reads every entry up to it (from the log's C2SP tlog-tiles entry
bundles, then each ``--mirror`` in order) through the hash chain, finds the
campaign's creation, the period's seed commitment and its draw, then replays the registry's
entries up to the checkpoint the draw used (proved a prefix of the signed log by a consistency
proof) and recomputes every prover's sample (docs/draws.md).

Exit status: 0 the draw matches its recomputation; 1 it does not (``MISMATCH reason``); 2 the log
could not be read or does not verify; 3 the period is not drawn yet, or there is no such campaign.
Imports only the standard library, PyNaCl and the pure packages ``tlog`` and ``rules``.
"""

from __future__ import annotations

import argparse
import json
import sys

from rules.draw_recompute import MATCH, MISMATCH, Audit, DrawRecords, check_draw
from rules.registry_world import Scratch, apply
from tlog import merkle, note, tiles
from tlog.chain import ChainVerifier, LedgerFault
from tlog.log_verifier import check_checkpoint, log_key, parse_key
from tlog.logclient import DEFAULT_TIMEOUT, FetchError, LogClient


def audit_from_log(client: LogClient, campaign: str, period: int, pinned_key: str | None = None) -> Audit:
    """Raises LedgerFault (the log does not verify) or FetchError (it cannot be read)."""
    served_key = log_key(client, pinned_key)
    checkpoint = check_checkpoint(client.checkpoint(), parse_key(served_key, "served key"))
    records = _find_draw(client, checkpoint, campaign, period)
    size = records.checkpoint_size
    if records.drawn is None or size is None or not 0 < size <= checkpoint.size:
        return check_draw(records, Scratch(), b"")  # not drawn / no such campaign / a size the log lacks
    world, root = _world_at(client, size, checkpoint.size)
    # The prefix's root comes from the same leaves that made the signed root, read again: their consistency
    # is checked all the same, from tiles alone (RFC 9162 proof over the tiles' hashes).
    proof = _consistency_from_tiles(client, size, checkpoint.size)
    if not merkle.verify_consistency(size, checkpoint.size, proof, root, checkpoint.root):
        raise LedgerFault("checkpoint", f"the first {size} entries served are not a prefix of the signed log")
    return check_draw(records, world, root)


def _consistency_from_tiles(client: LogClient, first: int, second: int) -> list[bytes]:
    ranges = merkle.consistency_ranges(first, second)
    nodes = {node: _node_from_tiles(client, node, second) for node in merkle.nodes_for_ranges(ranges)}
    return merkle.hashes_for_ranges(ranges, nodes)


def _node_from_tiles(client: LogClient, node: merkle.NodeId, size: int) -> bytes:
    """The hash of the perfect subtree ``node`` from the tile that holds its bottom row."""
    level, index = node
    tile_level, height = divmod(level, tiles.TILE_HEIGHT)
    first = index << height
    tile_index, offset = divmod(first, tiles.TILE_WIDTH)
    width = tiles.tile_width(size, tile_level, tile_index)
    data = client.tile(tile_level, tile_index, None if width == tiles.TILE_WIDTH else width)
    row = data[32 * offset : 32 * (offset + (1 << height))]
    if len(row) != 32 << height:
        raise LedgerFault("checkpoint", f"tile {tile_level}/{tile_index} is too short for node {node}")
    return tiles.perfect_root(row)


def _find_draw(client: LogClient, checkpoint: note.Checkpoint, campaign: str, period: int) -> DrawRecords:
    """First pass: every entry under the signed checkpoint, through the chain, keeping the draw's three."""
    records, chain = DrawRecords(campaign, period), ChainVerifier()
    for seq, leaf in client.iter_leaves(0, checkpoint.size, checkpoint.size):
        _, parsed = chain.feed(seq, leaf)
        records.take(seq, parsed["kind"], parsed["payload"])
    if chain.root() != checkpoint.root:
        raise LedgerFault("checkpoint", "the entries served do not make the signed root")
    return records


def _world_at(client: LogClient, size: int, tree_size: int) -> tuple[Scratch, bytes]:
    """Second pass: the registry as the first ``size`` entries make it, and their root."""
    world, chain = Scratch(), ChainVerifier()
    for seq, leaf in client.iter_leaves(0, size, tree_size):
        _, parsed = chain.feed(seq, leaf)
        apply(world, seq, parsed["kind"], parsed["actor"], parsed["payload"])
    return world, chain.root()


PROG = "python -m rules.draw_auditor"  # what --help and usage errors name; the compatibility entry point passes its own


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="base URL of the log, e.g. https://host")
    parser.add_argument("--campaign", required=True)
    parser.add_argument("--period", required=True, type=int)
    parser.add_argument("--key", help="pinned verifier key of the log; the served one must match")
    parser.add_argument(
        "--mirror", action="append", default=[], metavar="URL", help="a tlog-tiles mirror (http(s) or file://)"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    args = build_parser(prog).parse_args(argv)
    try:
        audit = audit_from_log(
            LogClient(args.url, timeout=args.timeout, mirrors=args.mirror), args.campaign, args.period, args.key
        )
    except ValueError as error:  # not an http(s) URL
        print(f"error: {error}", file=sys.stderr)
        return 2
    except LedgerFault as fault:
        print(fault.line(), file=sys.stderr)
        return 2
    except FetchError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"outcome": audit.outcome, "problems": audit.problems, "provers": audit.provers}))
    if audit.outcome == MATCH:
        drawn = sum(len(sample["drawn"]) for sample in audit.provers.values())
        if not args.json:
            print(f"MATCH campaign={audit.campaign} period={audit.period} provers={len(audit.provers)} drawn={drawn}")
        return 0
    word = "MISMATCH" if audit.outcome == MISMATCH else audit.outcome.upper()
    for problem in audit.problems:
        print(f"{word} {problem}", file=sys.stderr)
    return 1 if audit.outcome == MISMATCH else 3


if __name__ == "__main__":
    sys.exit(main())
