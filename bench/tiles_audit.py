"""The outside verifier's full tiles audit in CPU seconds, without a database (issue 21).

    .venv/bin/python bench/tiles_audit.py [--entries 1000000]

Writes a synthetic log's tiles and bundles (leaves of 270-290 random bytes, about the ledger's) into a
temporary directory, then, best of three rounds each: hashlib.sha256 over the leaves (the baseline),
``audit_tiles`` in one process and with ``jobs=2`` (wall time), and the same audit's runs of 256 bundles
in two worker processes, each worker's CPU seconds counted. CPU time, unlike wall time, does not depend
on what other sessions run on a shared machine; the two-job CPU figure (the busiest worker's CPU time)
is what the wall time would be on two free cores. bench/ledger.py measures the same audit in wall time
over a PostgreSQL-grown log.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import random
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tlog import merkle, tiles
from tlog.log_verifier import AUDIT_CHUNK, audit_bundle_run, audit_tiles
from tlog.logclient import LogClient


def write_log(folder: Path, size: int) -> tuple[list[bytes], bytes]:
    rng = random.Random(1)
    leaves = [rng.randbytes(270 + rng.randrange(21)) for _ in range(size)]
    levels = [[merkle.leaf_hash(leaf) for leaf in leaves]]
    while len(levels[-1]) >= tiles.TILE_WIDTH:
        below = b"".join(levels[-1])
        step = tiles.TILE_WIDTH * tiles.HASH_SIZE
        levels.append([tiles.perfect_root(below[i : i + step]) for i in range(0, len(below) - step + 1, step)])
    for level, index, width in tiles.tiles_for_size(size):
        first = index * tiles.TILE_WIDTH
        _write(folder / tiles.tile_path(level, index, width), b"".join(levels[level][first : first + (width or 256)]))
    for index, width in tiles.bundles_for_size(size):
        first = index * tiles.TILE_WIDTH
        _write(folder / tiles.bundle_path(index, width), tiles.encode_bundle(leaves[first : first + (width or 256)]))
    return leaves, merkle.root_from_leaf_hashes(levels[0])


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _run_cpu(client: LogClient, size: int, first: int, end: int) -> tuple[int, float]:
    began = time.process_time()
    audit_bundle_run(client, size, first, end)
    return os.getpid(), time.process_time() - began


def measure(folder: Path, leaves: list[bytes], root: bytes, rounds: int = 3) -> dict:
    size = len(leaves)
    client = LogClient.mirror_only([folder.as_uri()])
    bundles = -(-size // tiles.TILE_WIDTH)
    starts = list(range(0, bundles, AUDIT_CHUNK))
    ends = [min(start + AUDIT_CHUNK, bundles) for start in starts]
    best: dict[str, float] = defaultdict(lambda: float("inf"))
    for _ in range(rounds):
        began, wall = time.process_time(), time.perf_counter()
        for leaf in leaves:
            hashlib.sha256(b"\x00" + leaf).digest()
        best["sha256"] = min(best["sha256"], time.process_time() - began)
        best["wall_sha256"] = min(best["wall_sha256"], time.perf_counter() - wall)
        began, wall = time.process_time(), time.perf_counter()
        audit_tiles(client, size, root, jobs=1)
        best["audit_1_job"] = min(best["audit_1_job"], time.process_time() - began)
        best["wall_audit_1_job"] = min(best["wall_audit_1_job"], time.perf_counter() - wall)
        wall = time.perf_counter()
        audit_tiles(client, size, root, jobs=2)
        best["wall_audit_2_jobs"] = min(best["wall_audit_2_jobs"], time.perf_counter() - wall)
        per_worker: dict[int, float] = defaultdict(float)
        context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
        with ProcessPoolExecutor(2, mp_context=context) as pool:
            for pid, seconds in pool.map(_run_cpu, [client] * len(starts), [size] * len(starts), starts, ends):
                per_worker[pid] += seconds
        best["busiest_of_2_workers"] = min(best["busiest_of_2_workers"], max(per_worker.values()))
        best["both_workers"] = min(best["both_workers"], sum(per_worker.values()))
    return dict(best)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=1_000_000)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="tiles-audit-"))
    try:
        leaves, root = write_log(folder, args.entries)
        cpu = measure(folder, leaves, root)
    finally:
        shutil.rmtree(folder)
    print(f"{args.entries:,} entries, {sum(map(len, leaves)) / 1e6:.0f} MB of leaves; load {os.getloadavg()[0]:.1f}")
    for name, seconds in cpu.items():
        print(f"  {name:22s} {seconds:.3f} s")
    print(f"CPU ratio, 1 job: {cpu['sha256'] / cpu['audit_1_job']:.2f}")
    print(f"CPU ratio, 2 jobs on two free cores (busiest worker): {cpu['sha256'] / cpu['busiest_of_2_workers']:.2f}")
    print(f"wall ratio, 1 job: {cpu['wall_sha256'] / cpu['wall_audit_1_job']:.2f}")
    print(
        f"wall ratio, 2 jobs: {cpu['wall_sha256'] / cpu['wall_audit_2_jobs']:.2f} (needs two free cores: see RESULTS.md)"
    )


if __name__ == "__main__":
    main()
