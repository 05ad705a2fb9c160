"""Concurrent retries of one signed write with one Idempotency-Key: one wins, the others get its answer or 409."""

import threading

import pytest
from django.db import connection

from registry.models import Chip
from tests.helpers import requires_postgres
from tests.registry.factories import SignedClient, chip_model, chip_public_key, new_serials, organisation

RETRIES = 8


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_retries_never_get_403_and_write_once():
    fab, key = organisation("fab-race", ["fab"], "TW")
    model = chip_model(fab, "race-model")
    client = SignedClient(fab, key)
    body = client.body(
        {"chips": [{"serial": s, "model": model.slug, "public_key": chip_public_key()} for s in new_serials(3)]}
    )
    start, answers = threading.Barrier(RETRIES), []

    def retry():
        try:
            start.wait()
            response = client.post("/api/registry/chips/events/fabricate", raw=body, idempotency_key="race-1")
            answers.append((response.status_code, response.json()))
        finally:
            connection.close()

    threads = [threading.Thread(target=retry) for _ in range(RETRIES)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    statuses = sorted(status for status, _ in answers)
    assert len(answers) == RETRIES and set(statuses) <= {201, 409}, statuses
    assert len({str(answer) for status, answer in answers if status == 201}) == 1
    assert Chip.objects.count() == 3
