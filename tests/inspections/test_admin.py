"""The regulator's admin: inspection bodies are registered through the service; campaigns show both plans."""

import pytest
from django.contrib.auth import get_user_model

from inspections.demo_campaign import seed_inspections
from inspections.models import InspectionBody
from ledger.models import Entry
from registry.demo_registry import seed_demo

pytestmark = pytest.mark.django_db


@pytest.fixture
def regulator(client):
    seed_demo("demo-pass-123", chips=60)
    seed_inspections()
    client.force_login(get_user_model().objects.get(username="regulator"))
    return client


def test_the_demo_registers_its_inspection_body_on_the_ledger(regulator):
    entry = Entry.objects.get(kind="inspection_body.registered")
    assert entry.payload == {
        "organisation": "inspect-eu",
        "countries": ["AE", "DE", "NL", "TW", "US"],
        "capacity_per_period": 200,
    }


def test_editing_an_inspection_body_registers_it_again(regulator):
    body = InspectionBody.objects.get()
    response = regulator.post(
        f"/admin/inspections/inspectionbody/{body.pk}/change/", {"countries": "nl, de", "capacity_per_period": "7"}
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    body.refresh_from_db()
    assert (body.countries, body.capacity_per_period) == (["DE", "NL"], 7)
    latest = Entry.objects.filter(kind="inspection_body.registered").latest("seq")
    assert latest.payload["countries"] == ["DE", "NL"] and body.registered_seq == latest.seq
    refused = regulator.post(
        f"/admin/inspections/inspectionbody/{body.pk}/change/", {"countries": "NLD", "capacity_per_period": "7"}
    )
    assert refused.status_code == 200 and "alpha-2" in refused.content.decode()
    unassigned = regulator.post(
        f"/admin/inspections/inspectionbody/{body.pk}/change/", {"countries": "nl, qq", "capacity_per_period": "7"}
    )
    assert unassigned.status_code == 200 and "&#x27;QQ&#x27; is not an ISO 3166-1 country code" in (
        unassigned.content.decode()
    )
    assert Entry.objects.filter(kind="inspection_body.registered").count() == 2


def test_the_campaign_list_shows_each_provers_plan_in_words(regulator):
    html = regulator.get("/admin/inspections/campaign/").content.decode()
    assert "owner-a: " in html and " chips each period, detecting the run with probability " in html
    assert "as created" in html and "samples_per_period" not in html and "p=" not in html
