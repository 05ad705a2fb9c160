"""Inspections benchmarks (issue 4), ratios against baselines measured in the same run.

    .venv/bin/python bench/inspections.py                 # PostgreSQL: 10 provers x 10^6 chips in one country
    .venv/bin/python bench/inspections.py --per-prover 100000

1. Plan + draw (campaign_draw: checkpoint, plan, pgcrypto ranking, assignment, ledger entries) for one
   prover of 10^6 chips and for a country of 10^7 chips, against a bare COUNT(*) scan of the same chips.
2. Snapshot-log verification (replay.protocol.firmware.verify_log: parse, signature, counters, hash chain) in
   records/s, against bare PyNaCl verify of the same records' signed bytes.
The chips are inserted with one INSERT ... SELECT generate_series (they bypass the ledger: only the draw
is timed). The database chipledger_ibench is dropped and recreated (BENCH_PG).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PG = os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")
PROVERS = 10
LOG_RECORDS = 20_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-prover", type=int, default=1_000_000)
    parser.add_argument("--log-only", action="store_true", help="only the snapshot-log verification (no database)")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.log_only:
        sys.path.insert(0, str(ROOT))
        return report({"draw": {}, "log": log_verification()})
    if args.inner:
        return run(args.per_prover)
    import psycopg

    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS chipledger_ibench")
        conn.execute("CREATE DATABASE chipledger_ibench")
    env = {**os.environ, "DATABASE_URL": f"{PG}/chipledger_ibench", "DJANGO_SETTINGS_MODULE": "config.settings"}
    env.pop("REDIS_URL", None)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    subprocess.run(
        [sys.executable, __file__, "--inner", "--per-prover", str(args.per_prover)], cwd=ROOT, env=env, check=True
    )


def run(per_prover: int) -> None:
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    provers = populate(per_prover)
    results = {"per_prover": per_prover, "draw": draw_timings(provers, per_prover), "log": log_verification()}
    out = ROOT / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "inspections.json").write_text(json.dumps(results, indent=2))
    report(results)


def populate(per_prover: int) -> list:
    from django.db import connection

    from registry import services

    fab = services.organisation_register(
        slug="fab-tw", legal_name="Fab", country="TW", roles=["fab"], actor="regulator"
    )
    model = services.chip_model_register(
        vendor=fab,
        slug="h100-sxm",
        name="H100",
        export_class="3A090.a",
        peak_flops_16bit=989.4e12,
        memory_bytes=80 * 2**30,
        actor="regulator",
    )
    provers = [
        services.organisation_register(
            slug=f"prover-{n}", legal_name=f"Prover {n}", country="US", roles=["owner"], actor="regulator"
        )
        for n in range(PROVERS)
    ]
    began = time.perf_counter()
    with connection.cursor() as cursor:
        for prover in provers:
            cursor.execute(
                "INSERT INTO registry_chip (serial, model_id, fab_id, public_key, owner_id, possessor_id, country, "
                "status, status_before_missing, packaged, fabricated_seq, updated_seq) "
                "SELECT %s || lpad(n::text, 8, '0'), %s, %s, '\\x00'::bytea, %s, %s, 'US', 'installed', '', true, 0, 0 "
                "FROM generate_series(1, %s) AS n",
                [f"{prover.slug}-", model.pk, fab.pk, prover.pk, prover.pk, per_prover],
            )
        cursor.execute("ANALYZE registry_chip")
    print(f"  inserted {PROVERS * per_prover:,} chips in {time.perf_counter() - began:.0f} s", file=sys.stderr)
    return provers


def draw_timings(provers, per_prover: int) -> dict:
    from django.db import connection
    from django.utils import timezone as django_tz

    from inspections.services import campaigns as services
    from rules.inspection_planning import ELIGIBLE

    today = django_tz.now().date()
    one = services.campaign_create(slug="one-prover", provers=[provers[0].slug], rule_flops=1e26, starts_on=today)
    country = services.campaign_create(slug="country", country="US", rule_flops=1e26, starts_on=today)
    timings = {}
    for name, campaign, owners in (("prover", one, [provers[0].pk]), ("country", country, [p.pk for p in provers])):
        began = time.perf_counter()
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM registry_chip WHERE owner_id = ANY(%s) AND status = ANY(%s)", [owners, ELIGIBLE]
            )
            chips = cursor.fetchone()[0]
        scan = time.perf_counter() - began
        began = time.perf_counter()
        draw = services.campaign_draw(campaign, 0)
        seconds = time.perf_counter() - began
        timings[name] = {
            "chips": chips,
            "draw_seconds": seconds,
            "scan_seconds": scan,
            "ratio": seconds / scan,
            "tasks": draw.tasks.count(),
        }
    return timings


def log_verification() -> dict:
    from nacl.signing import SigningKey

    from replay.protocol.firmware import canonical, record_hash, verify_log

    key, serial, prev = SigningKey.generate(), "A000001", "0" * 64
    start = datetime(2026, 1, 1, tzinfo=UTC)
    lines, signed = [], []
    for counter in range(LOG_RECORDS):
        record = {
            "serial": serial,
            "counter": counter,
            "time": (start + timedelta(minutes=counter)).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "shard": 0,
            "hash": f"{counter:064x}",
            "prev": prev,
        }
        message = canonical(record)
        signature = key.sign(message).signature
        record["sig"] = base64.b64encode(signature).decode()
        lines.append(canonical(record).decode())
        signed.append((message, signature))
        prev = record_hash(record)
    verify_key = key.verify_key
    began = time.perf_counter()
    for message, signature in signed:
        verify_key.verify(message, signature)
    bare = time.perf_counter() - began
    began = time.perf_counter()
    problems = verify_log(lines, bytes(verify_key), serial=serial)
    full = time.perf_counter() - began
    assert problems == [], problems[:3]
    return {
        "records": LOG_RECORDS,
        "records_per_s": LOG_RECORDS / full,
        "bare_per_s": LOG_RECORDS / bare,
        "ratio": bare / full,
    }


def report(results: dict) -> None:
    print("\n| measure | chipledger | baseline | ratio |\n|---|---|---|---|")
    for name, t in results["draw"].items():
        print(
            f"| plan + draw, {name} of {t['chips']:,} chips ({t['tasks']} tasks) | {t['draw_seconds']:.2f} s "
            f"| COUNT(*) scan {t['scan_seconds']:.2f} s | {t['ratio']:.2f} |"
        )
    log = results["log"]
    print(
        f"| snapshot-log verification ({log['records']:,} records) | {log['records_per_s']:,.0f} records/s "
        f"| bare PyNaCl verify {log['bare_per_s']:,.0f}/s | {log['ratio']:.2f} |"
    )


if __name__ == "__main__":
    main()
