"""Concurrent writers from separate processes: no fork, no gap, one valid chain."""

import multiprocessing
import os
from unittest import mock

import pytest

from ledger.integrity import verify_stored_ledger
from ledger.models import Entry
from tests.helpers import append_writer, requires_postgres, subprocess_database_url
from tlog import merkle


def run_writers(processes: int, appends: int) -> None:
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=append_writer, args=(w, appends)) for w in range(processes)]
    with mock.patch.dict(os.environ, {"DATABASE_URL": subprocess_database_url()}):
        for process in workers:
            process.start()
    for process in workers:
        process.join(timeout=300)
        assert process.exitcode == 0, f"writer exited with {process.exitcode}"


def assert_one_contiguous_valid_chain(processes: int, appends: int) -> None:
    rows = list(Entry.objects.order_by("seq").values_list("seq", "hash", "payload"))
    assert [seq for seq, _, _ in rows] == list(range(processes * appends))
    for worker in range(processes):  # each writer's own appends keep their order
        assert [p["n"] for _, _, p in rows if p["worker"] == worker] == list(range(appends))
    report = verify_stored_ledger()
    assert report.entries == processes * appends
    assert report.root == merkle.root_from_leaf_hashes([bytes(h) for _, h, _ in rows])


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_eight_processes_times_five_hundred_appends_on_postgres():
    run_writers(8, 500)
    assert_one_contiguous_valid_chain(8, 500)


@pytest.mark.django_db(transaction=True)
def test_concurrent_writers_on_the_embedded_database():
    run_writers(4, 50)
    assert_one_contiguous_valid_chain(4, 50)
