"""Load test (issue 11): 16 signed writers and 16 proof readers against gunicorn + PostgreSQL on loopback.

    .venv/bin/python bench/load.py               # 5 minutes
    .venv/bin/python bench/load.py --seconds 60  # shorter

Writers each act for an organisation of their own (fab role, own key): signed, 10-chip fabrications.
Readers fetch the latest checkpoint and an inclusion proof of a random entry under it. The main thread signs
a checkpoint every 5 s (as beat does). Bounded by time. Reports zero-5xx, throughput and p50/p99 per endpoint,
then runs verify_ledger and rebuild_projections --check. Binds 127.0.0.1 only; the database chipledger_lbench
is dropped and recreated (BENCH_PG, default postgres://postgres@127.0.0.1:5432).
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import random
import secrets
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PG = os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")
WRITERS = READERS = 16
CHIPS_PER_WRITE = 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=300)
    parser.add_argument("--workers", type=int, default=4, help="gunicorn workers")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    env = {
        **os.environ,
        "DATABASE_URL": f"{PG}/chipledger_lbench",
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "API_RATE_PER_ORGANISATION": "1000000/min",
    }
    env.pop("REDIS_URL", None)
    if args.inner:
        return run(args.seconds, args.workers, env)
    import psycopg

    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS chipledger_lbench")
        conn.execute("CREATE DATABASE chipledger_lbench")
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    subprocess.run([*manage, "ledger_open"], cwd=ROOT, env=env, check=True, capture_output=True)
    command = [sys.executable, __file__, "--inner", "--seconds", str(args.seconds), "--workers", str(args.workers)]
    subprocess.run(command, cwd=ROOT, env=env, check=True)
    for check in (["verify_ledger"], ["rebuild_projections", "--check"]):
        done = subprocess.run([*manage, *check], cwd=ROOT, env=env, capture_output=True, text=True)
        print(f"{' '.join(check)}: exit {done.returncode} {done.stdout.strip().splitlines()[-1:]}")
        if done.returncode:
            sys.exit(done.stderr)


def run(seconds: int, workers: int, env: dict) -> None:
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from ledger.tasks import checkpoint_if_grown

    world = make_world()
    checkpoint_if_grown()
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "config.wsgi", "--bind", f"127.0.0.1:{port}", "--workers", str(workers)],
        cwd=ROOT,
        env=env,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_listening(port)
        timings: dict[str, list[float]] = defaultdict(list)
        statuses: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
        stop = time.monotonic() + seconds
        threads = [threading.Thread(target=writer, args=(port, org, stop, timings, statuses)) for org in world]
        threads += [threading.Thread(target=reader, args=(port, stop, timings, statuses)) for _ in range(READERS)]
        began = time.monotonic()
        for thread in threads:
            thread.start()
        while time.monotonic() < stop:  # beat's job: sign what the writers appended
            time.sleep(5)
            checkpoint_if_grown()
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - began
    finally:
        server.terminate()
        server.wait(timeout=30)
    report(timings, statuses, elapsed, seconds, workers)


def make_world() -> list[dict]:
    from django.contrib.auth import get_user_model
    from nacl.signing import SigningKey

    from registry import services
    from registry.services.tokens import api_token_issue

    vendor = services.organisation_register(
        slug="vendor-a", legal_name="Vendor A", country="US", roles=["vendor"], actor="regulator"
    )
    services.chip_model_register(
        vendor=vendor,
        slug="h100-sxm",
        name="H100",
        export_class="3A090.a",
        peak_flops_16bit=989.4e12,
        memory_bytes=80 * 2**30,
        actor="regulator",
    )
    world = []
    for n in range(WRITERS):
        slug = f"fab-{n:02d}"
        org = services.organisation_register(slug=slug, legal_name=slug, country="TW", roles=["fab"], actor="regulator")
        key = SigningKey.generate()
        services.organisation_key_register(organisation=org, public_key=bytes(key.verify_key), actor="regulator")
        user = get_user_model().objects.create_user(username=f"load-{slug}")
        services.member_add(user, org)
        services.facility_register(owner=org, slug=f"{slug}-site", kind="fab", country="TW", actor=slug)
        world.append({"slug": slug, "key": key, "token": api_token_issue(user, "load")[1]})
    return world


def request(port: int, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    began = time.perf_counter()
    conn.request(method, path, body, headers or {})
    response = conn.getresponse()
    answer = response.read()
    conn.close()
    return response.status, answer, time.perf_counter() - began


def writer(port, org, stop, timings, statuses) -> None:
    from registry import signing

    public_key = base64.b64encode(secrets.token_bytes(32)).decode()
    n = 0
    while time.monotonic() < stop:
        chips = [
            {"serial": f"{org['slug']}-{n + i:08d}", "model": "h100-sxm", "public_key": public_key}
            | {"facility": f"{org['slug']}-site"}
            for i in range(CHIPS_PER_WRITE)
        ]
        n += CHIPS_PER_WRITE
        body = json.dumps({"timestamp": int(time.time()), "nonce": secrets.token_hex(12), "chips": chips}).encode()
        headers = {
            "Content-Type": "application/json",
            "Authorization": f"Token {org['token']}",
            signing.HEADER: signing.sign(org["key"], body),
        }
        status, _, took = request(port, "POST", "/api/registry/chips/events/fabricate", body, headers)
        timings["POST fabricate"].append(took)
        statuses["POST fabricate"][status] += 1


def reader(port, stop, timings, statuses) -> None:
    rng = random.Random()
    while time.monotonic() < stop:
        status, note, took = request(port, "GET", "/api/ledger/checkpoint")
        timings["GET checkpoint"].append(took)
        statuses["GET checkpoint"][status] += 1
        size = int(note.decode().splitlines()[1]) if status == 200 else 1
        path = f"/api/ledger/proof/inclusion?index={rng.randrange(size)}&size={size}"
        status, _, took = request(port, "GET", path)
        timings["GET proof/inclusion"].append(took)
        statuses["GET proof/inclusion"][status] += 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def report(timings, statuses, elapsed, seconds, workers) -> None:
    results = {}
    print(f"{WRITERS} writers + {READERS} readers, {elapsed:.0f} s, gunicorn {workers} workers, 127.0.0.1")
    print(f"{'endpoint':24} {'requests':>9} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8}  statuses")
    for name, took in sorted(timings.items()):
        ordered = sorted(took)
        p50 = statistics.median(ordered) * 1000
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000
        codes = dict(sorted(statuses[name].items()))
        results[name] = {"requests": len(took), "per_s": len(took) / elapsed, "p50_ms": p50, "p99_ms": p99}
        results[name]["statuses"] = codes
        print(f"{name:24} {len(took):9d} {len(took) / elapsed:8.1f} {p50:8.1f} {p99:8.1f}  {codes}")
    server_errors = sum(n for codes in statuses.values() for code, n in codes.items() if code >= 500)
    print(f"5xx: {server_errors}")
    out = ROOT / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "load.json").write_text(json.dumps({"seconds": elapsed, "results": results}, indent=2))
    if server_errors:
        sys.exit("server errors under load")


if __name__ == "__main__":
    main()
