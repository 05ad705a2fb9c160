"""Schemathesis against the project's own OpenAPI schema, in process (WSGI), on PostgreSQL: no 5xx, and every
answer conforms to the schema (documented status code, content type and body shape). Bounded: a few minutes."""

import os

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from nacl.signing import SigningKey
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from config.wsgi import application
from tests.helpers import requires_postgres
from tests.registry.factories import SignedClient, chip_model, fabricate, facility, organisation

pytestmark = [pytest.mark.postgres, requires_postgres, pytest.mark.django_db]
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
EXAMPLES = int(os.environ.get("SCHEMATHESIS_EXAMPLES", "30"))  # per operation: 25 operations, ~2 minutes


@pytest.fixture(autouse=True)
def _keep_the_test_connection():
    """The app runs in process on the test's own connection: like Django's test client, requests do not close it."""
    from django.core import signals
    from django.db import close_old_connections

    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", application)


@pytest.fixture
def token():
    """A fab with a facility, a model and chips, so reads find something; its token authenticates the calls."""
    org, _ = organisation("fab-tw", ["fab", "vendor"], "TW")
    facility(org, "fab-tw-1", kind="fab")
    fabricate(org, chip_model(org), 3, "fab-tw-1")
    return SignedClient(org, SigningKey.generate()).api._credentials["HTTP_AUTHORIZATION"]


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_server_errors_and_answers_as_documented(case, token):
    case.call_and_validate(headers={"Authorization": token}, checks=CHECKS)
