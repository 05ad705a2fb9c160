"""Throttling is per organisation: its users share one budget; other organisations keep theirs."""

import secrets

import pytest

from api.throttles import OrganisationRateThrottle
from tests.registry.factories import SignedClient, organisation

pytestmark = pytest.mark.django_db


def test_users_of_one_organisation_share_a_budget(monkeypatch):
    monkeypatch.setattr(OrganisationRateThrottle, "THROTTLE_RATES", {"organisation": "3/min"})
    run = secrets.token_hex(4)  # fresh slugs: the cache (Redis on PostgreSQL legs) outlives the test database
    org, key = organisation(f"vendor-{run}", ["vendor"])
    other, other_key = organisation(f"other-{run}", ["vendor"])
    alice, bob, carol = SignedClient(org, key), SignedClient(org, key), SignedClient(other, other_key)
    codes = [client.get("/api/registry/chips").status_code for client in (alice, bob, alice)]
    assert codes == [200, 200, 200]
    assert bob.get("/api/registry/chips").status_code == 429
    assert carol.get("/api/registry/chips").status_code == 200
