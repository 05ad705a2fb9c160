"""Concurrent twins on PostgreSQL: both pass the service's check, the database keeps one, the other gets a 409."""

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
    fab, key = organisation("fab-tw", ["fab"], "TW")
    facility(fab, "fab-tw-1", kind="fab")
    chip_model(fab)
    clients = [SignedClient(fab, key), SignedClient(fab, key)]
    chip = {"serial": "RACE-1", "model": "h100-sxm", "facility": "fab-tw-1"}
    won, lost = race(
        monkeypatch,
        [
            lambda c=c: c.post(
                "/api/registry/chips/events/fabricate", {"chips": [{**chip, "public_key": chip_public_key()}]}
            )
            for c in clients
        ],
    )
    assert (won.status_code, lost.status_code) == (201, 409) and "serial" in lost.json()
    assert Chip.objects.filter(serial="RACE-1").count() == 1


def test_two_registrations_of_one_facility_slug(monkeypatch):
    owner, key = organisation("owner-a", ["owner"], "US")
    clients = [SignedClient(owner, key), SignedClient(owner, key)]
    body = {"slug": "dc-race", "kind": "datacentre", "country": "US"}
    won, lost = race(monkeypatch, [lambda c=c: c.post("/api/registry/facilities", body) for c in clients])
    assert (won.status_code, lost.status_code) == (201, 409) and "slug" in lost.json()
    assert Facility.objects.filter(slug="dc-race").count() == 1
