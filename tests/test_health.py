"""GET /healthz reports database, broker and ledger head."""

from unittest import mock

import pytest

from ledger import services
from ledger.models import Checkpoint
from tests.factories import append_sample_entries

pytestmark = pytest.mark.django_db


def test_healthy(client):
    append_sample_entries(5)
    services.checkpoint_sign()
    append_sample_entries(2)
    response = client.get("/healthz")
    body = response.json()
    assert response.status_code == 200 and body["ok"] is True
    assert body["database"]["ok"] and body["broker"]["ok"]
    assert body["ledger"]["size"] == 7 and body["ledger"]["checkpoint_size"] == 5
    assert body["ledger"]["unsigned_entries"] == 2


def test_broker_down_gives_503(client):
    with mock.patch("config.health._broker", side_effect=ConnectionError("broker unreachable")):
        response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["broker"] == {"ok": False, "error": "ConnectionError: broker unreachable"}


@pytest.mark.parametrize("forged_size", [9, 7])  # fewer entries than signed for; the same size, another root
def test_a_log_that_does_not_extend_its_checkpoint_is_503(client, forged_size):
    append_sample_entries(5)
    append_sample_entries(2)
    Checkpoint.objects.create(size=forged_size, root=b"\x07" * 32, note="forged\n")
    response = client.get("/healthz")
    body = response.json()["ledger"]
    assert response.status_code == 503 and body["ok"] is False and "checkpoint" in body["error"]
    assert body["unsigned_entries"] >= 0
