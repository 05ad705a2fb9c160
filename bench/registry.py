"""Registry benchmarks (issue 3), ratios against baselines measured in the same run.

    .venv/bin/python bench/registry.py                   # PostgreSQL, registry grown to 10^6 chips
    .venv/bin/python bench/registry.py --chips 100000    # quicker

1. Bulk fabrication and shipment through HTTP (gunicorn, signed 10,000-chip requests) in chips/s,
   against inserting the same number of chip rows directly with COPY (no HTTP, no signature, no
   ledger, no lifecycle) — the ceiling.
2. Chip lookup with history (GET /api/registry/chips/<serial>: the chip, its events and each
   event's inclusion proof) p50/p99 at 10^4 chips and at the final size, against GET /api/ledger/key.
The database chipledger_rbench is dropped and recreated (BENCH_PG, default postgres://postgres@127.0.0.1:5432).
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import random
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PG = os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")
BATCH = 64  # rules.identifiers.MAX_CHIPS: one request (one ledger entry) holds at most this many chips
HTTP_BATCHES = 5
LOOKUPS = 300


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chips", type=int, default=1_000_000)
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        return run(args.chips)
    import psycopg

    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS chipledger_rbench")
        conn.execute("CREATE DATABASE chipledger_rbench")
    env = {
        **os.environ,
        "DATABASE_URL": f"{PG}/chipledger_rbench",
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "API_RATE_PER_ORGANISATION": "100000/min",
    }
    env.pop("REDIS_URL", None)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    subprocess.run([sys.executable, __file__, "--inner", "--chips", str(args.chips)], cwd=ROOT, env=env, check=True)


def run(final_size: int) -> None:
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    world = make_world()
    server, port = start_server()
    try:
        results = {"throughput": throughput(port, world), "lookup": {}}
        grow(world, 10_000)
        results["lookup"][10_000] = lookup_latency(port, world)
        grow(world, final_size)
        results["lookup"][final_size] = lookup_latency(port, world)
    finally:
        server.terminate()
        server.wait(timeout=30)
    out = ROOT / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "registry.json").write_text(json.dumps(results, indent=2))
    report(results)


def make_world() -> dict:
    from django.contrib.auth import get_user_model
    from nacl.signing import SigningKey

    from registry import services
    from registry.services.tokens import api_token_issue

    world = {"keys": {}, "tokens": {}, "serials": []}
    for slug, roles, country in (
        ("fab-tw", ["fab"], "TW"),
        ("vendor-a", ["vendor"], "US"),
        ("regulator", ["regulator"], "US"),
    ):
        org = services.organisation_register(
            slug=slug, legal_name=slug, country=country, roles=roles, actor="regulator"
        )
        key = SigningKey.generate()
        services.organisation_key_register(organisation=org, public_key=bytes(key.verify_key), actor="regulator")
        user = get_user_model().objects.create_user(username=f"bench-{slug}")
        services.member_add(user, org)
        world["keys"][slug], world["tokens"][slug] = key, api_token_issue(user)[1]
        world[slug] = org
    services.facility_register(owner=world["fab-tw"], slug="fab-1", kind="fab", country="TW", actor="fab-tw")
    services.facility_register(owner=world["vendor-a"], slug="wh-1", kind="warehouse", country="US", actor="vendor-a")
    services.chip_model_register(
        vendor=world["vendor-a"],
        slug="h100-sxm",
        name="H100",
        export_class="3A090.a",
        peak_flops_16bit=989.4e12,
        memory_bytes=80 * 2**30,
        actor="regulator",
    )
    return world


def chip_items(prefix: str, count: int) -> list[dict]:
    key = base64.b64encode(secrets.token_bytes(32)).decode()  # content is irrelevant to the timing
    return [
        {"serial": f"{prefix}{n:07d}", "model": "h100-sxm", "public_key": key, "facility": "fab-1"}
        for n in range(count)
    ]


def signed_post(port: int, world: dict, org: str, path: str, data: dict) -> dict:
    from registry import signing

    body = json.dumps({"timestamp": int(time.time()), "nonce": secrets.token_hex(12), **data}).encode()
    headers = {
        "Content-Type": "application/json",
        "Authorization": f"Token {world['tokens'][org]}",
        signing.HEADER: signing.sign(world["keys"][org], body),
    }
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    conn.request("POST", path, body, headers)
    response = conn.getresponse()
    answer = response.read()
    conn.close()
    if response.status != 201:
        raise RuntimeError(f"{path}: HTTP {response.status} {answer[:300]!r}")
    return json.loads(answer)


def throughput(port: int, world: dict) -> dict:
    from django.db import connection, transaction

    from ledger.bulk import insert_rows
    from registry.models import Chip

    batches = [chip_items(f"H{b}-", BATCH) for b in range(HTTP_BATCHES)]
    began = time.perf_counter()
    for items in batches:
        signed_post(port, world, "fab-tw", "/api/registry/chips/events/fabricate", {"chips": items})
    fabricate = HTTP_BATCHES * BATCH / (time.perf_counter() - began)
    began = time.perf_counter()
    for items in batches:
        signed_post(
            port,
            world,
            "fab-tw",
            "/api/registry/chips/events/export",
            {
                "chips": [i["serial"] for i in items],
                "consignee": "vendor-a",
                "reference": "PO-1",
                "export_licence": "EL-1",
            },
        )
    ship = HTTP_BATCHES * BATCH / (time.perf_counter() - began)
    world["serials"] += [i["serial"] for items in batches for i in items]

    # Ceiling: the same number of chip rows, COPYed straight into the chip table.
    fab, model = world["fab-tw"], Chip.objects.values_list("model_id", flat=True).first()
    columns = (
        "serial",
        "model_id",
        "fab_id",
        "public_key",
        "owner_id",
        "possessor_id",
        "country",
        "status",
        "status_before_missing",
        "packaged",
        "fabricated_seq",
        "updated_seq",
    )
    began = time.perf_counter()
    for b in range(HTTP_BATCHES):
        with transaction.atomic():
            insert_rows(
                Chip._meta.db_table,
                columns,
                [
                    (
                        f"D{b}-{n:07d}",
                        model,
                        fab.id,
                        secrets.token_bytes(32),
                        fab.id,
                        fab.id,
                        "TW",
                        "fabricated",
                        "",
                        False,
                        0,
                        0,
                    )
                    for n in range(BATCH)
                ],
            )
    direct = HTTP_BATCHES * BATCH / (time.perf_counter() - began)
    with connection.cursor() as cursor:  # the direct rows are not part of the world: remove them
        cursor.execute("DELETE FROM registry_chip WHERE serial LIKE 'D%%'")
    return {
        "fabricate_per_s": fabricate,
        "ship_per_s": ship,
        "direct_insert_per_s": direct,
        "fabricate_ratio": fabricate / direct,
        "ship_ratio": ship / direct,
    }


def grow(world: dict, size: int) -> None:
    """More chips with a few events each, through the services (no HTTP: only the lookups are timed)."""
    from registry import services
    from registry.models import Chip

    current = Chip.objects.count()
    while current < size:
        count = min(BATCH, size - current)
        items = chip_items(f"G{current:07d}-", count)
        services.chips_fabricate(organisation=world["fab-tw"], chips=items)
        serials = [i["serial"] for i in items]
        services.chips_record_event(organisation=world["fab-tw"], event="packaged", payload={"chips": serials})
        services.chips_record_event(
            organisation=world["fab-tw"],
            event="exported",
            payload={"chips": serials, "consignee": "vendor-a", "reference": "PO-2", "export_licence": "EL-2"},
        )
        services.chips_record_event(
            organisation=world["vendor-a"], event="received", payload={"chips": serials, "facility": "wh-1"}
        )
        world["serials"] += serials
        current += count
        print(f"  registry: {current:,} chips", file=sys.stderr)
    from ledger import services as ledger_services

    ledger_services.checkpoint_sign()


def lookup_latency(port: int, world: dict) -> dict:
    rng = random.Random(len(world["serials"]))
    token = world["tokens"]["regulator"]
    timings = {"key": [], "chip": []}
    for _ in range(LOOKUPS):
        serial = rng.choice(world["serials"])
        for name, path in (("key", "/api/ledger/key"), ("chip", f"/api/registry/chips/{serial}")):
            began = time.perf_counter()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request("GET", path, headers={"Authorization": f"Token {token}"})
            response = conn.getresponse()
            body = response.read()
            conn.close()
            if response.status != 200:
                raise RuntimeError(f"{path}: HTTP {response.status} {body[:200]!r}")
            timings[name].append((time.perf_counter() - began) * 1000)
    return {
        name: {"p50_ms": statistics.median(v), "p99_ms": sorted(v)[int(len(v) * 0.99) - 1]}
        for name, v in timings.items()
    }


def start_server():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen(
        [
            str(ROOT / ".venv" / "bin" / "gunicorn"),
            "config.wsgi",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "1",
            "--timeout",
            "300",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/api/ledger/key")
            conn.getresponse().read()
            return server, port
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("gunicorn did not start")


def report(results: dict) -> None:
    t = results["throughput"]
    print("\n| measure | chipledger | baseline | ratio |\n|---|---|---|---|")
    print(
        f"| bulk fabricate via HTTP (10,000/request) | {t['fabricate_per_s']:,.0f} chips/s | direct COPY {t['direct_insert_per_s']:,.0f}/s | {t['fabricate_ratio']:.2f} |"
    )
    print(
        f"| bulk export via HTTP (10,000/request) | {t['ship_per_s']:,.0f} chips/s | direct COPY {t['direct_insert_per_s']:,.0f}/s | {t['ship_ratio']:.2f} |"
    )
    for size, lat in results["lookup"].items():
        chip, key = lat["chip"], lat["key"]
        print(
            f"| chip + history + proofs @ {int(size):,} chips | p50 {chip['p50_ms']:.2f} ms, p99 {chip['p99_ms']:.2f} ms "
            f"| GET /key p50 {key['p50_ms']:.2f} ms | {chip['p50_ms'] / key['p50_ms']:.2f} |"
        )


if __name__ == "__main__":
    main()
