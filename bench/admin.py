"""Regulator's desk benchmark (issue 13): server-side render time of the admin at national scale.

    .venv/bin/python bench/admin.py                                  # 10^6 chips, 3x10^6 ledger entries
    .venv/bin/python bench/admin.py --chips 200000 --entries 600000  # what fits ~10 minutes on 2 cores
    .venv/bin/python bench/admin.py --keep                           # measure again on the loaded database

Loads the chips (and two events each) with COPY, and the ledger through ``append_entries`` (real
hashes, tree nodes and the desk's entry index, 10,000 entries per batch). Then, for each change list,
the chip page and the dashboard, the p50 of a server-side render (Django test client, no HTTP) against
the p50 of a plain SELECT of the same page of rows, in the same run. The database (BENCH_DB, default
chipledger_abench) is dropped and recreated (BENCH_PG, default postgres://postgres@127.0.0.1:5432).
"""

from __future__ import annotations

import argparse
import gc
import os
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PG = os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")
# BENCH_DB (or BENCH_ADMIN_DATABASE): a database of one's own, dropped and made again unless --keep
DB = os.environ.get("BENCH_DB") or os.environ.get("BENCH_ADMIN_DATABASE") or "chipledger_abench"
RUNS = 25
BATCH = 64  # rules.identifiers.MAX_CHIPS: one request (one ledger entry) holds at most this many chips


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chips", type=int, default=1_000_000)
    parser.add_argument("--entries", type=int, default=3_000_000)
    parser.add_argument(
        "--keep", action="store_true", help="measure the database a previous run loaded (migrated to this code)"
    )
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        return run(args.chips, args.entries, args.keep)
    import psycopg

    if not args.keep:
        with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {DB}")
            conn.execute(f"CREATE DATABASE {DB}")
    env = {**os.environ, "DATABASE_URL": f"{PG}/{DB}", "DJANGO_SETTINGS_MODULE": "config.settings"}
    env.pop("REDIS_URL", None)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    command = [sys.executable, __file__, "--inner", "--chips", str(args.chips), "--entries", str(args.entries)]
    subprocess.run(command + (["--keep"] if args.keep else []), cwd=ROOT, env=env, check=True)


def run(chips: int, entries: int, keep: bool) -> None:
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.db import connection

    from desk.tasks import refresh_figures
    from ledger.selectors import ledger_size
    from registry.models import Chip

    began = time.perf_counter()
    world = make_world(keep)
    if keep:
        chips, entries = Chip.objects.filter(serial__startswith="S").count(), ledger_size()
    else:
        grow_ledger(entries)
        load_chips(world, chips)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    figures_at = time.perf_counter()
    refresh_figures()  # the beat task: the figures, then the dashboard's plots
    refresh = time.perf_counter() - figures_at
    print(f"  loaded in {time.perf_counter() - began:.0f} s; figures refresh {refresh:.1f} s", file=sys.stderr)
    gc.freeze()  # as config/wsgi.py does in each gunicorn worker once the app is loaded
    report(chips, entries, measure(world), refresh)


def make_world(keep: bool) -> dict:
    from django.contrib.auth import get_user_model

    from inspections.demo_campaign import seed_inspections
    from registry.demo_registry import seed_demo

    if not keep:
        seed_demo("bench-pass-123", chips=60)
        seed_inspections()
    user = get_user_model().objects.get(username="regulator")
    from registry.models import ChipModel, Facility, Organisation

    return {
        "user": user,
        "owners": list(Organisation.objects.filter(slug__startswith="owner-").values_list("id", flat=True)),
        "fab": Organisation.objects.get(slug="fab-tw").id,
        "models": list(ChipModel.objects.values_list("id", flat=True)),
        "facilities": list(Facility.objects.values_list("id", flat=True)),
    }


def grow_ledger(size: int) -> None:
    from ledger import selectors, services
    from ledger.services import NewEntry

    current = selectors.ledger_size()
    while current < size:
        count = min(BATCH, size - current)
        services.append_entries(
            [
                NewEntry(
                    "chip.shipped", {"chips": [f"B{n:09d}"], "consignee": "owner-b", "reference": "PO-1"}, "vendor-a"
                )
                for n in range(current, current + count)
            ]
        )
        current += count
        if current % 200_000 < BATCH:
            print(f"  ledger: {current:,} entries", file=sys.stderr)
    services.checkpoint_sign()


def load_chips(world: dict, total: int) -> None:
    from django.db import transaction

    from ledger.bulk import insert_rows
    from registry.models import Chip, ChipEvent

    columns = (
        "serial", "model_id", "fab_id", "public_key", "owner_id", "possessor_id", "country", "status",
        "status_before_missing", "packaged", "fabricated_seq", "updated_seq", "facility_id",
    )  # fmt: skip
    statuses, countries = ["installed", "in_stock", "in_transit", "packaged"], ["US", "NL", "DE", "AE", "TW", "JP"]
    key = secrets.token_bytes(32)
    first = Chip.objects.count()
    for start in range(0, total, 50_000):
        rows = []
        for n in range(start, min(start + 50_000, total)):
            owner = world["owners"][n % len(world["owners"])]
            rows.append(
                (f"S{n:09d}", world["models"][n % len(world["models"])], world["fab"], key, owner, owner,
                 countries[n % 6], statuses[n % 4], "", True, 1 + n % 1000, 2 + n % 1000,
                 world["facilities"][n % len(world["facilities"])])
            )  # fmt: skip
        with transaction.atomic():
            insert_rows(Chip._meta.db_table, columns, rows)
        print(f"  chips: {start + len(rows):,}", file=sys.stderr)
    ids = Chip.objects.filter(serial__startswith="S").order_by("id").values_list("id", flat=True)
    batch = []
    for n, chip_id in enumerate(ids.iterator(chunk_size=50_000)):
        batch += [
            (chip_id, 1 + n % 1000, "chip.fabricated", "fab-tw"),
            (chip_id, 2 + n % 1000, "chip.shipped", "fab-tw"),
        ]
        if len(batch) >= 100_000:
            insert_rows(ChipEvent._meta.db_table, ("chip_id", "seq", "kind", "actor"), batch)
            batch = []
    insert_rows(ChipEvent._meta.db_table, ("chip_id", "seq", "kind", "actor"), batch)
    print(f"  chips in table: {Chip.objects.count() - first:,} loaded", file=sys.stderr)


def detail_pages(select) -> list[tuple]:
    """The alert, claim, campaign, draw and task pages of the first of each the demo world holds."""
    from inspections.models import Alert, Campaign, Claim, Draw, InspectionTask

    pages = []
    for name, model, url, table in (
        ("alert page", Alert, "/admin/desk/alert/{}/", "inspections_alert"),
        ("claim page", Claim, "/admin/desk/claim/{}/", "inspections_claim"),
        ("draw page", Draw, "/admin/desk/draw/{}/", "inspections_draw"),
        ("task page", InspectionTask, "/admin/desk/task/{}/", "inspections_inspectiontask"),
    ):
        pk = model.objects.order_by("pk").values_list("pk", flat=True).first()
        if pk is not None:
            pages.append((name, url.format(pk), select(f"SELECT * FROM {table} WHERE id = %s", [pk])))
    slug = Campaign.objects.order_by("pk").values_list("slug", flat=True).first()
    if slug:
        pages.append(
            (
                "campaign page",
                f"/admin/desk/campaign/{slug}/",
                select("SELECT * FROM inspections_campaign WHERE slug = %s", [slug]),
            )
        )
    return pages


def p50(fn) -> float:
    fn()  # warm
    samples = []
    for _ in range(RUNS):
        began = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - began) * 1000)
    return statistics.median(samples)


def measure(world: dict) -> list[tuple]:
    from django.db import connection
    from django.test import Client

    client = Client()
    client.force_login(world["user"])

    def get(path):
        def fetch():
            response = client.get(path)
            assert response.status_code == 200, (path, response.status_code)

        return fetch

    def select(sql, params=()):
        def fetch():
            with connection.cursor() as cursor:
                cursor.execute(sql, params)
                cursor.fetchall()

        return fetch

    from registry.models import Chip

    serial = (
        Chip.objects.filter(serial__startswith="S")
        .order_by("serial")
        .values_list("serial", flat=True)[Chip.objects.filter(serial__startswith="S").count() // 2]
    )
    owner, country = Chip.objects.filter(serial=serial).values_list("owner__slug", "country").get()
    from ledger import selectors as ledger

    middle = ledger.ledger_size() // 2
    leaf_hash = ledger.entry_leaf_hash(middle).hex()
    page = "SELECT * FROM {} ORDER BY {} LIMIT 50"
    chip_join = (
        "SELECT c.*, m.name, o.slug, p.slug, f.slug FROM registry_chip c JOIN registry_chipmodel m ON m.id = c.model_id "
        "JOIN registry_organisation o ON o.id = c.owner_id JOIN registry_organisation p ON p.id = c.possessor_id "
        "LEFT JOIN registry_facility f ON f.id = c.facility_id "
    )
    cases = [
        ("chips change list", "/admin/registry/chip/", select(chip_join + "ORDER BY c.id DESC LIMIT 50")),
        (
            "chips filtered (status=installed)",
            "/admin/registry/chip/?status__exact=installed",
            select(chip_join + "WHERE c.status = 'installed' ORDER BY c.id DESC LIMIT 50"),
        ),
        (
            "chips search by serial prefix",
            f"/admin/registry/chip/?q={serial[:-2]}",
            select(
                chip_join + "WHERE c.serial LIKE %s AND c.serial >= %s ORDER BY c.serial LIMIT 50",
                [serial[:-2] + "%", serial[:-2]],
            ),
        ),
        (
            "chips filtered (owner and country, a dashboard bar's list)",
            f"/admin/registry/chip/?owner={owner}&country={country}",
            select(chip_join + "WHERE o.slug = %s AND c.country = %s ORDER BY c.id DESC LIMIT 50", [owner, country]),
        ),
        (
            "organisation page (chips by facility and status)",
            f"/admin/desk/organisation/{owner}/",
            select(
                "SELECT c.facility_id, c.status, COUNT(*) FROM registry_chip c JOIN registry_organisation o "
                "ON o.id = c.owner_id WHERE o.slug = %s GROUP BY 1, 2",
                [owner],
            ),
        ),
        ("ledger entries change list", "/admin/ledger/entry/", select(page.format("ledger_entry", "seq DESC"))),
        (
            "alerts change list",
            "/admin/inspections/alert/",
            select(page.format("inspections_alert", "raised_seq DESC")),
        ),
        (
            "inspection tasks change list",
            "/admin/inspections/inspectiontask/",
            select(page.format("inspections_inspectiontask", "id DESC")),
        ),
        (
            "organisations change list",
            "/admin/registry/organisation/",
            select(page.format("registry_organisation", "slug")),
        ),
        (
            "chip page (timeline)",
            f"/admin/desk/chip/{serial}/",
            select(
                "SELECT * FROM registry_chipevent WHERE chip_id = (SELECT id FROM registry_chip WHERE serial = %s)",
                [serial],
            ),
        ),
        (
            "search: an owner's chips (page 2 of 50, with the total)",
            f"/admin/desk/search/?q={owner}&page=2",
            select(chip_join + "WHERE o.slug = %s ORDER BY c.serial LIMIT 51 OFFSET 50", [owner]),
        ),
        (
            "search: a country (organisations, facilities, its chips)",
            f"/admin/desk/search/?q={country}",
            select(chip_join + "WHERE c.country = %s ORDER BY c.serial LIMIT 51", [country]),
        ),
        (
            "search: an entry by leaf hash",
            f"/admin/desk/search/?q={leaf_hash}",
            select("SELECT seq FROM ledger_entry WHERE seq = %s", [middle]),
        ),
        (
            "alerts inbox, open past their SLA",
            "/admin/inspections/alert/?sla=overdue",
            select(page.format("inspections_alert", "raised_seq DESC")),
        ),
        (
            "search: an owner's slug",
            f"/admin/desk/search/?q={owner}",
            select("SELECT * FROM registry_organisation WHERE slug LIKE %s LIMIT 50", [owner + "%"]),
        ),
        (
            "search: a serial prefix",
            f"/admin/desk/search/?q={serial[:-3]}",
            select(
                "SELECT * FROM registry_chip WHERE serial LIKE %s AND serial >= %s ORDER BY serial LIMIT 20",
                [serial[:-3] + "%", serial[:-3]],
            ),
        ),
        ("facilities change list", "/admin/registry/facility/", select(page.format("registry_facility", "id DESC"))),
        ("claims change list", "/admin/inspections/claim/", select(page.format("inspections_claim", "id DESC"))),
        ("campaigns change list", "/admin/inspections/campaign/", select(page.format("inspections_campaign", "id"))),
        ("draws change list", "/admin/inspections/draw/", select(page.format("inspections_draw", "id DESC"))),
        ("checkpoints change list", "/admin/ledger/checkpoint/", select(page.format("ledger_checkpoint", "id DESC"))),
        ("jobs change list", "/admin/desk/job/", select(page.format("desk_job", "id DESC"))),
        *detail_pages(select),
        ("dashboard", "/admin/", select(page.format("registry_chip", "id DESC"))),
        (
            "dashboard, cache cleared (plots drawn by the beat task)",
            "/admin/",
            select(page.format("registry_chip", "id DESC")),
        ),
    ]
    results = []
    from django.core.cache import cache

    def cold(path):
        def fetch():
            cache.clear()
            get(path)()

        return fetch

    for name, path, baseline in cases:
        render = cold(path) if "cache cleared" in name else get(path)
        results.append((name, path, p50(render), p50(baseline)))
        print(f"  {name}: {results[-1][2]:.1f} ms (SELECT {results[-1][3]:.2f} ms)", file=sys.stderr)
    return results


def report(chips: int, entries: int, results: list[tuple], refresh: float) -> None:
    print(f"\nScale: {chips:,} chips (+60 demo), {entries:,} ledger entries; p50 of {RUNS} renders")
    print(f"Dashboard figures and plots refresh (beat task, not per request): {refresh:.1f} s\n")
    print("| page | p50 render | p50 plain SELECT of the page | ratio | < 300 ms |")
    print("|---|---|---|---|---|")
    for name, _path, render, baseline in results:
        ok = "yes" if render < 300 else "NO"
        print(f"| {name} | {render:.1f} ms | {baseline:.2f} ms | {render / max(baseline, 0.001):.0f}x | {ok} |")


if __name__ == "__main__":
    main()
