"""The regulator's check-then-insert writes raced on PostgreSQL: two desks create the same campaign, witness or
record the same export licence at once. Each service takes the ledger's lock before its duplicate check,
so the second sees the first's row and refuses by the field's name (the service's own error, as for a
later duplicate), never the database's unique violation (a 500 in the admin)."""

import threading

import nacl.signing
import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.utils import timezone

from inspections.models import Campaign
from inspections.services import campaigns
from ledger import services as ledger
from registry import services
from registry.models import ExportLicence
from tests.helpers import requires_postgres
from tests.inspections.factories import H100, YEAR, make_provers
from tests.registry.factories import organisation

pytestmark = [pytest.mark.postgres, requires_postgres, pytest.mark.django_db(transaction=True)]


def race(monkeypatch, write) -> list:
    """write() in two threads that meet before their ledger appends where they can: twins that checked
    before either inserted both get there (the race); a service that checks under the ledger's lock keeps
    the second waiting on it, so the meeting times out and the first goes on alone."""
    meet = threading.Barrier(2)
    append = ledger.append_entry

    def append_when_the_twin_is_here(*args, **kwargs):
        try:
            meet.wait(timeout=3)
        except threading.BrokenBarrierError:
            pass
        return append(*args, **kwargs)

    monkeypatch.setattr(ledger, "append_entry", append_when_the_twin_is_here)
    outcomes = [None, None]

    def run(n):
        try:
            outcomes[n] = write()
        except Exception as exc:  # what each twin ended with, to assert on
            outcomes[n] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return outcomes


def _refused_by_field(outcomes, kind, field: str) -> None:
    made = [o for o in outcomes if isinstance(o, kind)]
    refused = [o for o in outcomes if isinstance(o, ValidationError)]
    assert len(made) == 1 and len(refused) == 1, outcomes
    assert field in refused[0].message_dict, refused[0]


def test_two_campaigns_of_one_slug(monkeypatch):
    make_provers()
    fields = {
        "slug": "raced-2026",
        "provers": ["owner-a"],
        "rule_flops": 20 * H100 * YEAR,
        "starts_on": timezone.now().date(),
    }
    outcomes = race(monkeypatch, lambda: campaigns.campaign_create(**fields))
    _refused_by_field(outcomes, Campaign, "slug")
    assert Campaign.objects.filter(slug="raced-2026").count() == 1


def test_two_export_licences_of_one_id(monkeypatch):
    organisation("exp-r", ["owner"], "NL")
    organisation("con-r", ["owner"], "DE")
    fields = {
        "licence_id": "EL-RACE-1",
        "exporter": "exp-r",
        "consignee": "con-r",
        "from_country": "NL",
        "to_country": "DE",
        "quantity": 5,
        "expires_on": "2099-12-31",
    }
    outcomes = race(monkeypatch, lambda: services.export_licence_grant(**fields))
    _refused_by_field(outcomes, ExportLicence, "licence_id")
    assert ExportLicence.objects.filter(licence_id="EL-RACE-1").count() == 1


def test_two_registrations_of_one_witness_key(monkeypatch):
    from ledger.models import Witness
    from tlog.log_witness import witness_verifier_key

    vkey = witness_verifier_key("witness.example/raced", nacl.signing.SigningKey.generate())
    outcomes = race(monkeypatch, lambda: ledger.witness_register(vkey, actor="regulator"))
    _refused_by_field(outcomes, Witness, "verifier_key")
    assert Witness.objects.filter(verifier_key=vkey).count() == 1
