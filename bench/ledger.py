"""Ledger benchmarks (issue 2), each reported as a ratio against a baseline measured in the same run.

    .venv/bin/python bench/ledger.py                      # PostgreSQL to 10^6 entries, SQLite to 10^5
    .venv/bin/python bench/ledger.py --database sqlite --entries 100000
    .venv/bin/python bench/ledger.py --database postgres --tiles-only   # the C2SP tlog-tiles figures alone

Per database it grows one fresh bench log and measures, in order:
  * proof latency through HTTP (gunicorn) at 10^3, 10^5 (and 10^6) entries: inclusion and
    consistency p50/p99, against GET /api/ledger/key on the same server (baseline);
  * append throughput, batched (1,000 a transaction) and single, against inserting the same
    rows into an unindexed table without hashing (the ceiling), same insert path;
  * verify_ledger over the whole log: leaf bytes/s against hashlib.sha256 over the same leaves;
  * tlog-tiles (issue 21): tile and bundle read p50 through HTTP at each size against GET /api/ledger/key;
    the cost of producing every tile and bundle of the appended entries, per append, as a fraction of
    the batched append rate; and the outside verifier's full tiles audit (tlog.log_verifier.audit_tiles,
    every bundle and tile, from a file:// copy of the tiles; one process, then --jobs = the CPU count)
    against hashlib.sha256 over the same leaves.
PostgreSQL must be reachable at BENCH_PG (default postgres://postgres@127.0.0.1:5432); the
database chipledger_bench is dropped and recreated.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"
PG = os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")
BENCH_DB = os.environ.get("BENCH_DB", "chipledger_bench")  # dropped and recreated: name your own on a shared host
BATCH = 1000
THROUGHPUT_BATCHED = 50_000
THROUGHPUT_SINGLE = 2_000
PROOF_REQUESTS = 300
AUDIT_ROUNDS = 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database", choices=["postgres", "sqlite", "both"], default="both")
    parser.add_argument("--entries", type=int, help="final log size (default: 10^6 PostgreSQL, 10^5 SQLite)")
    parser.add_argument("--tiles-only", action="store_true", help="only the tlog-tiles measurements")
    parser.add_argument("--leg", choices=["postgres", "sqlite"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.leg:
        return run_leg(args.leg, args.entries, args.tiles_only)
    legs = ["postgres", "sqlite"] if args.database == "both" else [args.database]
    for leg in legs:
        entries = args.entries or (1_000_000 if leg == "postgres" else 100_000)
        url = prepare_database(leg)
        env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "config.settings"}
        env.pop("REDIS_URL", None)
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
        subprocess.run(
            [sys.executable, __file__, "--leg", leg, "--entries", str(entries)]
            + (["--tiles-only"] if args.tiles_only else []),
            cwd=ROOT,
            env=env,
            check=True,
        )


def prepare_database(leg: str) -> str:
    if leg == "postgres":
        import psycopg

        with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {BENCH_DB}")
            conn.execute(f"CREATE DATABASE {BENCH_DB}")
        return f"{PG}/{BENCH_DB}"
    path = ROOT / "var" / "bench" / "bench.sqlite3"
    path.parent.mkdir(parents=True, exist_ok=True)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return f"sqlite:///{path}"


# --- inside the leg process (Django configured for the bench database) ------------------


def run_leg(leg: str, entries: int, tiles_only: bool = False) -> None:
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    results: dict = {"database": leg, "entries": entries, "latency": {}, "tile_latency": {}}
    sizes = [n for n in (1_000, 100_000, 1_000_000) if n <= entries]
    grow_to(sizes[0])
    if not tiles_only:
        results["latency"][sizes[0]] = proof_latency()
    results["tile_latency"][sizes[0]] = tile_latency()
    results["append"] = append_throughput()
    results["tile_production"] = tile_production(results["append"]["batched_per_s"])
    for size in sizes[1:]:
        grow_to(size)
        if not tiles_only:
            results["latency"][size] = proof_latency()
        results["tile_latency"][size] = tile_latency()
    grow_to(entries)
    if not tiles_only:
        results["verify"] = verify_throughput()
    results["tiles_audit"] = tiles_audit()
    OUT.mkdir(parents=True, exist_ok=True)
    name = f"ledger-{leg}-tiles.json" if tiles_only else f"ledger-{leg}.json"
    (OUT / name).write_text(json.dumps(results, indent=2))
    print_report(results)


def sample_batch(start: int, count: int) -> list:
    from ledger.services import NewEntry

    return [
        NewEntry(
            "chip.shipped",
            {"serial": f"SN-{n:09d}", "from": "vendor-a", "to": "owner-b", "reference": "PO-2026-00042", "units": 1},
            "vendor-a",
        )
        for n in range(start, start + count)
    ]


def grow_to(size: int) -> None:
    from ledger import selectors, services

    current = selectors.ledger_size()
    while current < size:
        count = min(10_000, size - current)
        services.append_entries(sample_batch(current, count))
        current += count
    services.checkpoint_sign()
    print(f"  log size {size}", file=sys.stderr)


def append_throughput() -> dict:
    from django.db import connection, transaction

    from ledger import selectors, services
    from ledger.bulk import insert_rows
    from ledger.models import Entry

    start = selectors.ledger_size()
    batches = [sample_batch(start + i, BATCH) for i in range(0, THROUGHPUT_BATCHED, BATCH)]
    began = time.perf_counter()
    for batch in batches:
        services.append_entries(batch)
    batched = THROUGHPUT_BATCHED / (time.perf_counter() - began)

    singles = sample_batch(start + THROUGHPUT_BATCHED, THROUGHPUT_SINGLE)
    began = time.perf_counter()
    for item in singles:
        services.append_entry(item.kind, item.payload, item.actor)
    single = THROUGHPUT_SINGLE / (time.perf_counter() - began)

    # The ceiling: the very same rows, inserted the same way, into a table with no
    # key, no index, no trigger, and no hashing, locking or tree work.
    rows = list(Entry.objects.filter(seq__gte=start).order_by("seq").values_list(*services.ENTRY_COLUMNS))
    rows = [(s, t, k, a, json.dumps(p), bytes(leaf), bytes(h)) for s, t, k, a, p, leaf, h in rows]
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS bench_ceiling")
        payload_type = "jsonb" if connection.vendor == "postgresql" else "text"
        cursor.execute(
            f"CREATE TABLE bench_ceiling (seq bigint, time timestamp with time zone, kind varchar(64), "
            f"actor varchar(128), payload {payload_type}, leaf bytea, hash bytea)"
            if connection.vendor == "postgresql"
            else "CREATE TABLE bench_ceiling (seq integer, time datetime, kind varchar(64), actor varchar(128), "
            "payload text, leaf blob, hash blob)"
        )
    began = time.perf_counter()
    for offset in range(0, THROUGHPUT_BATCHED, BATCH):
        with transaction.atomic():
            insert_rows("bench_ceiling", services.ENTRY_COLUMNS, rows[offset : offset + BATCH])
    ceiling_batched = THROUGHPUT_BATCHED / (time.perf_counter() - began)
    began = time.perf_counter()
    for row in rows[THROUGHPUT_BATCHED:]:
        with transaction.atomic():
            insert_rows("bench_ceiling", services.ENTRY_COLUMNS, [row])
    ceiling_single = THROUGHPUT_SINGLE / (time.perf_counter() - began)
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE bench_ceiling")
    return {
        "batched_per_s": batched,
        "ceiling_batched_per_s": ceiling_batched,
        "batched_ratio": batched / ceiling_batched,
        "single_per_s": single,
        "ceiling_single_per_s": ceiling_single,
        "single_ratio": single / ceiling_single,
    }


def verify_throughput() -> dict:
    from ledger.integrity import verify_stored_ledger
    from ledger.models import Entry

    began = time.perf_counter()
    report = verify_stored_ledger()
    verify_seconds = time.perf_counter() - began
    leaves = [bytes(leaf) for leaf in Entry.objects.order_by("seq").values_list("leaf", flat=True).iterator(10_000)]
    total = sum(len(leaf) for leaf in leaves)
    sha256 = hashlib.sha256
    began = time.perf_counter()
    for leaf in leaves:
        sha256(b"\x00" + leaf).digest()
    hash_seconds = time.perf_counter() - began
    return {
        "entries": report.entries,
        "leaf_bytes": total,
        "verify_seconds": verify_seconds,
        "verify_bytes_per_s": total / verify_seconds,
        "sha256_seconds": hash_seconds,
        "sha256_bytes_per_s": total / hash_seconds,
        "ratio": hash_seconds / verify_seconds,
    }


def tile_latency() -> dict:
    """p50/p99 of random full level-0 tiles, level-1 tiles (when the log has them) and entry bundles."""
    from ledger import selectors
    from tlog import tiles

    size = selectors.ledger_size()
    full = size // tiles.TILE_WIDTH
    rng = random.Random(size)
    paths = {
        "tile0": [tiles.tile_path(0, rng.randrange(full)) for _ in range(PROOF_REQUESTS)],
        "bundle": [tiles.bundle_path(rng.randrange(full)) for _ in range(PROOF_REQUESTS)],
    }
    level1 = size // tiles.TILE_WIDTH**2
    paths["tile1"] = [
        tiles.tile_path(1, i, None) if i < level1 else tiles.tile_path(1, i, full % tiles.TILE_WIDTH)
        for i in (rng.randrange(level1 + 1) for _ in range(PROOF_REQUESTS))
    ]
    with _gunicorn() as port:
        timings = {"key": _timed(port, ["/api/ledger/key"] * PROOF_REQUESTS)}
        timings.update({name: _timed(port, ["/tlog/" + p for p in batch]) for name, batch in paths.items()})
    return {name: _percentiles(values) for name, values in timings.items()}


def tile_production(append_per_s: float) -> dict:
    """Producing the tiles of appended entries: every tile and bundle of the last 50,000 entries, read and
    encoded once (what the first mirror fetch of each costs), per entry, against the batched append's time."""
    from ledger import selectors
    from ledger import tile_reads as ledger_tiles
    from tlog import tiles

    size = selectors.ledger_size()
    first = (size - THROUGHPUT_BATCHED) // tiles.TILE_WIDTH
    last = size // tiles.TILE_WIDTH
    began = time.perf_counter()
    for index in range(first, last):
        assert ledger_tiles.tile(0, index, None) is not None
        assert ledger_tiles.entry_bundle(index, None) is not None
        if index % tiles.TILE_WIDTH == tiles.TILE_WIDTH - 1:
            assert ledger_tiles.tile(1, index // tiles.TILE_WIDTH, None) is not None
    per_entry = (time.perf_counter() - began) / ((last - first) * tiles.TILE_WIDTH)
    with_tiles = 1 / (1 / append_per_s + per_entry)
    return {"per_entry_us": per_entry * 1e6, "append_with_tiles_per_s": with_tiles, "ratio": with_tiles / append_per_s}


def tiles_audit() -> dict:
    """The outside verifier's full tiles audit from a file:// copy of every tile and bundle, in one process
    and in one per CPU (``--jobs``), each against hashlib over the same leaves: AUDIT_ROUNDS rounds of the
    three, the fastest run of each."""
    import shutil
    import tempfile

    from ledger import selectors
    from ledger import tile_reads as ledger_tiles
    from tlog import tiles
    from tlog.log_verifier import audit_tiles, default_jobs
    from tlog.logclient import LogClient

    checkpoint = selectors.checkpoint_latest()
    size, root = checkpoint.size, bytes(checkpoint.root)
    copy = Path(tempfile.mkdtemp(prefix="tiles-", dir=ROOT / "var"))
    leaves = []
    jobs = default_jobs()
    audits = {}
    try:
        for level, index, width in tiles.tiles_for_size(size):
            _write(copy / tiles.tile_path(level, index, width), ledger_tiles.tile(level, index, width))
        for index, width in tiles.bundles_for_size(size):
            data = ledger_tiles.entry_bundle(index, width)
            _write(copy / tiles.bundle_path(index, width), data)
            leaves += tiles.decode_bundle(data)
        client = LogClient.mirror_only([copy.as_uri()])
        hash_seconds = float("inf")
        for _ in range(AUDIT_ROUNDS):  # interleaved, best of each: on a shared machine the least disturbed run
            hash_seconds = min(hash_seconds, _sha256_seconds(leaves))
            for n in sorted({1, jobs}):
                began = time.perf_counter()
                checked = audit_tiles(client, size, root, jobs=n)
                audits[n] = min(audits.get(n, float("inf")), time.perf_counter() - began)
    finally:
        shutil.rmtree(copy)
    total = sum(len(leaf) for leaf in leaves)
    return {
        "entries": size,
        "tiles_checked": checked,
        "leaf_bytes": total,
        "jobs": jobs,
        "load_average": os.getloadavg()[0],
        "sha256_seconds": hash_seconds,
        "sha256_bytes_per_s": total / hash_seconds,
        "audits": {
            n: {"seconds": seconds, "bytes_per_s": total / seconds, "ratio": hash_seconds / seconds}
            for n, seconds in audits.items()
        },
    }


def _sha256_seconds(leaves: list[bytes]) -> float:
    sha256 = hashlib.sha256
    began = time.perf_counter()
    for leaf in leaves:
        sha256(b"\x00" + leaf).digest()
    return time.perf_counter() - began


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


class _gunicorn:
    def __enter__(self) -> int:
        self.port = _free_port()
        self.server = subprocess.Popen(
            [
                str(ROOT / ".venv" / "bin" / "gunicorn"),
                "config.wsgi",
                "--bind",
                f"127.0.0.1:{self.port}",
                "--workers",
                "1",
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_for(self.port)
        return self.port

    def __exit__(self, *exc) -> None:
        self.server.terminate()
        self.server.wait(timeout=30)


def proof_latency() -> dict:
    from ledger import selectors

    size = selectors.ledger_size()
    port = _free_port()
    server = subprocess.Popen(
        [str(ROOT / ".venv" / "bin" / "gunicorn"), "config.wsgi", "--bind", f"127.0.0.1:{port}", "--workers", "1"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for(port)
        rng = random.Random(size)
        timings = {
            "key": _timed(port, ["/api/ledger/key"] * PROOF_REQUESTS),
            "inclusion": _timed(
                port,
                [f"/api/ledger/proof/inclusion?index={rng.randrange(size)}&size={size}" for _ in range(PROOF_REQUESTS)],
            ),
            "consistency": _timed(
                port,
                [
                    f"/api/ledger/proof/consistency?first={rng.randrange(1, size)}&second={size}"
                    for _ in range(PROOF_REQUESTS)
                ],
            ),
        }
    finally:
        server.terminate()
        server.wait(timeout=30)
    return {name: _percentiles(values) for name, values in timings.items()}


def _timed(port: int, paths: list[str]) -> list[float]:
    _get(port, paths[0])  # warm the worker's connection and caches
    out = []
    for path in paths:
        began = time.perf_counter()
        _get(port, path)
        out.append((time.perf_counter() - began) * 1000)
    return out


def _get(port: int, path: str) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path)
    response = conn.getresponse()
    body = response.read()
    conn.close()
    if response.status != 200:
        raise RuntimeError(f"{path}: HTTP {response.status} {body[:200]!r}")
    return body


def _percentiles(values: list[float]) -> dict:
    ordered = sorted(values)
    return {"p50_ms": statistics.median(ordered), "p99_ms": ordered[int(len(ordered) * 0.99) - 1]}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            _get(port, "/api/ledger/key")
            return
        except (OSError, RuntimeError):
            time.sleep(0.2)
    raise RuntimeError("gunicorn did not start")


def print_report(r: dict) -> None:
    a = r["append"]
    print(f"\n## {r['database']} — {r['entries']:,} entries\n")
    print("| measure | chipledger | baseline | ratio |\n|---|---|---|---|")
    t, p = r["tiles_audit"], r["tile_production"]
    print(
        f"| append, batched, with its tiles produced | {p['append_with_tiles_per_s']:,.0f} entries/s "
        f"({p['per_entry_us']:.2f} µs/entry for tiles) | append {a['batched_per_s']:,.0f}/s | {p['ratio']:.2f} |"
    )
    for jobs, audit in t["audits"].items():
        print(
            f"| tiles audit, --jobs {jobs} ({t['entries']:,} entries, {t['tiles_checked']:,} tiles, "
            f"{t['leaf_bytes'] / 1e6:.0f} MB) | {audit['bytes_per_s'] / 1e6:.1f} MB/s, {audit['seconds']:.2f} s | "
            f"sha256 {t['sha256_bytes_per_s'] / 1e6:.1f} MB/s | {audit['ratio']:.2f} |"
        )
    print(f"(load average {t['load_average']:.1f} on {os.cpu_count()} CPUs during the audit)")
    for size, lat in r["tile_latency"].items():
        key = lat["key"]["p50_ms"]
        for kind in ("tile0", "tile1", "bundle"):
            q = lat[kind]
            print(
                f"| GET {kind} @ {int(size):,} | p50 {q['p50_ms']:.2f} ms, p99 {q['p99_ms']:.2f} ms | "
                f"GET /key p50 {key:.2f} ms | {q['p50_ms'] / key:.2f} |"
            )
    if "verify" not in r:
        return
    v = r["verify"]
    print(
        f"| append, batched 1,000/txn | {a['batched_per_s']:,.0f} entries/s | ceiling {a['ceiling_batched_per_s']:,.0f}/s | {a['batched_ratio']:.2f} |"
    )
    print(
        f"| append, single | {a['single_per_s']:,.0f} entries/s | ceiling {a['ceiling_single_per_s']:,.0f}/s | {a['single_ratio']:.2f} |"
    )
    print(
        f"| verify_ledger ({v['entries']:,} entries, {v['leaf_bytes'] / 1e6:.0f} MB) | {v['verify_bytes_per_s'] / 1e6:.1f} MB/s, "
        f"{v['verify_seconds']:.1f} s | sha256 {v['sha256_bytes_per_s'] / 1e6:.1f} MB/s | {v['ratio']:.2f} |"
    )
    for size, lat in r["latency"].items():
        key = lat["key"]["p50_ms"]
        for kind in ("inclusion", "consistency"):
            p = lat[kind]
            print(
                f"| {kind} proof @ {int(size):,} | p50 {p['p50_ms']:.2f} ms, p99 {p['p99_ms']:.2f} ms | "
                f"GET /key p50 {key:.2f} ms | {p['p50_ms'] / key:.2f} |"
            )


if __name__ == "__main__":
    main()
