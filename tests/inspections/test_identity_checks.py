"""Identity check outcomes have a projection (``IdentityCheck``): the portal reads a task's checks by task, never by
scanning the ledger for the kind; the projection equals its rebuild, and migration 0015 projects checks already on
an upgraded deployment's ledger, once."""

import base64
import importlib

import pytest
from django.apps import apps
from django.db import connection
from django.test.utils import CaptureQueriesContext
from nacl.signing import SigningKey

from inspections import portal_selectors
from inspections.models import IdentityCheck
from inspections.rebuild_inspections import differences, rebuild
from inspections.services import inspectors
from ledger.models import Entry
from tests.inspections.factories import accepted
from tests.inspections.services.test_inspectors import a_task, with_chip_key

pytestmark = pytest.mark.django_db
MIGRATION = importlib.import_module("inspections.migrations.0015_identity_check_projection")


def checked_twice(task):
    """One failed check (a wrong key), then one that passes."""
    body, key = accepted(task).inspection_body, with_chip_key(task)
    for signer in (SigningKey.generate(), key):
        challenge = inspectors.identity_challenge_issue(task, body)
        signature = signer.sign(inspectors.identity_message(task.chip.serial, challenge.nonce)).signature
        inspectors.identity_answer_check(task, body, challenge.nonce, base64.b64encode(signature).decode())


def test_the_portal_reads_a_tasks_identity_checks_without_scanning_the_ledger(draw):
    task = a_task("inspect-eu")
    checked_twice(task)
    with CaptureQueriesContext(connection) as queries:
        results = portal_selectors.identity_results(task)
    assert [r["passed"] for r in results] == [False, True]
    assert results[0]["reason"] and results[1]["reason"] is None
    ledger = list(Entry.objects.filter(kind="inspection.identity_checked").order_by("seq"))
    assert [r["seq"] for r in results] == [e.seq for e in ledger]
    assert [r["time"] for r in results] == [e.time for e in ledger]
    assert not [q["sql"] for q in queries.captured_queries if "ledger_entry" in q["sql"]]


def test_the_projection_equals_its_rebuild(draw):
    task = a_task("inspect-eu")
    checked_twice(task)  # (with_chip_key gave the chip a key off the ledger: only identity check rows are compared)
    assert [line for line in differences(rebuild()) if line.startswith("identity check")] == []
    IdentityCheck.objects.filter(passed=True).update(passed=False)
    assert [line for line in differences(rebuild()) if line.startswith("identity check")]


def test_the_migration_projects_the_checks_already_on_the_ledger_once(draw):
    task = a_task("inspect-eu")
    checked_twice(task)
    projected = list(IdentityCheck.objects.order_by("seq").values_list("task", "seq", "checked_at", "passed", "reason"))
    IdentityCheck.objects.all().delete()  # a ledger from before the projection existed
    MIGRATION.project_existing(apps, None)
    MIGRATION.project_existing(apps, None)  # idempotent
    again = list(IdentityCheck.objects.order_by("seq").values_list("task", "seq", "checked_at", "passed", "reason"))
    assert again == projected and len(again) == 2
