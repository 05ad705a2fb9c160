"""Concurrent twins on PostgreSQL: both pass the service's check, the database keeps one, the other gets a 409.

The twins come from two organisations: one organisation's signed writes take its row's lock first
(`signed_key_current`), so its own twins are served one after the other and the second fails the check itself."""

import threading

import pytest
from django.db import connection

from ledger import services as ledger
from registry.models import Chip, Facility
from tests.helpers import requires_postgres
from tests.registry.factories import SignedClient, chip_model, chip_public_key, facility, organisation

pytestmark = [pytest.mark.postgres, requires_postgres, pytest.mark.django_db(transaction=True)]


def race(monkeypatch, posts) -> list:
    """Run the posts in threads that meet after their checks, just before their ledger appends."""
    meet = threading.Barrier(len(posts), timeout=30)
    append = ledger.append_entry

    def append_after_the_twin_checked(*args, **kwargs):
        meet.wait()
        return append(*args, **kwargs)

    monkeypatch.setattr(ledger, "append_entry", append_after_the_twin_checked)
    answers = [None] * len(posts)

    def run(n):
        try:
            answers[n] = posts[n]()
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(posts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return sorted(answers, key=lambda response: response.status_code)


def test_two_fabrications_of_one_serial(monkeypatch):
    clients = []
    for n in (1, 2):
        fab, key = organisation(f"fab-tw{n}", ["fab"], "TW")
        facility(fab, f"fab-tw{n}-1", kind="fab")
        clients.append(SignedClient(fab, key))
    chip_model(clients[0].org)
    chip = {"serial": "RACE-1", "model": "h100-sxm"}
    won, lost = race(
        monkeypatch,
        [
            lambda c=c: c.post(
                "/api/registry/chips/events/fabricate",
                {"chips": [{**chip, "facility": f"{c.org.slug}-1", "public_key": chip_public_key()}]},
            )
            for c in clients
        ],
    )
    assert (won.status_code, lost.status_code) == (201, 409) and "serial" in lost.json()
    assert Chip.objects.filter(serial="RACE-1").count() == 1


def test_two_registrations_of_one_facility_slug(monkeypatch):
    clients = [SignedClient(*organisation(slug, ["owner"], "US")) for slug in ("owner-a", "owner-b")]
    body = {"slug": "dc-race", "kind": "datacentre", "country": "US"}
    won, lost = race(monkeypatch, [lambda c=c: c.post("/api/registry/facilities", body) for c in clients])
    assert (won.status_code, lost.status_code) == (201, 409) and "slug" in lost.json()
    assert Facility.objects.filter(slug="dc-race").count() == 1


def test_one_organisations_twins_are_served_in_turn():
    """Twins of one organisation: the second waits for the first's transaction, then fails the service's own
    check, as a later duplicate does (400 naming the field), never a database error."""
    from tests.inspections.test_lock_order import in_thread

    client = SignedClient(*organisation("owner-t", ["owner"], "US"))
    body = {"slug": "dc-twin", "kind": "datacentre", "country": "US"}
    runs = [in_thread(lambda: client.post("/api/registry/facilities", body)) for _ in range(2)]
    for thread, _ in runs:
        thread.join(timeout=60)
    answers = sorted((outcome["value"] for _, outcome in runs), key=lambda response: response.status_code)
    assert [a.status_code for a in answers] == [201, 400] and "slug" in answers[1].json(), answers
    assert Facility.objects.filter(slug="dc-twin").count() == 1
