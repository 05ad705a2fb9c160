"""Project hygiene that users rely on: a complete, valid OpenAPI schema, and no missing migrations."""

import io

import pytest
from django.core.management import call_command

pytestmark = pytest.mark.django_db


def test_openapi_schema_validates_without_warnings(tmp_path):
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(tmp_path / "schema.yml"))
    schema = (tmp_path / "schema.yml").read_text()
    for path in (
        "/api/registry/chips/events/{event}",
        "/api/epcis/capture",
        "/api/inspections/tasks",
        "/api/inspections/claims",
        "/api/ledger/proof/consistency",
    ):
        assert path in schema


def test_models_and_migrations_agree():
    call_command("makemigrations", "--check", "--dry-run", stdout=io.StringIO())
