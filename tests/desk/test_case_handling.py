"""Case handling in the alert inbox: bulk steps (each alert checked on its own, a summary of what was done and what
was refused), a step that needs a reason or an assignee asks first; age and SLA (overdue shown and filterable);
the alert page offers only the steps that apply and shows the notices sent."""

import re

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse

from inspections.models import Alert, AlertNotification
from inspections.services.alerts import alert_act, alert_raise
from ledger import selectors as ledger

pytestmark = pytest.mark.django_db
INBOX = "/admin/inspections/alert/"


@pytest.fixture
def three(world):
    """The world's alert and two more about the same prover: one already acknowledged, one resolved."""
    prover = world["alert"].prover
    seen = alert_raise("overdue", prover, "inspection overdue (2)")
    closed = alert_raise("overdue", prover, "inspection overdue (3)")
    alert_act(seen, action="acknowledge", by="regulator")
    alert_act(closed, action="resolve", by="regulator", reason="inspected after all")
    return [world["alert"], seen, closed]


def bulk(client, action: str, alerts, **fields):
    data = {"action": f"triage_{action}", "_selected_action": [a.pk for a in alerts], **fields}
    return client.post(INBOX, data)


def test_bulk_acknowledge_does_what_applies_and_says_what_it_refused(regulator, three):
    fresh, seen, closed = three
    response = bulk(regulator, "acknowledge", three)
    assert response.status_code == 302
    said = [str(m) for m in get_messages(response.wsgi_request)]
    assert said[0] == f"Acknowledge: 1 done (#{fresh.pk}), each on the ledger."
    assert f"#{seen.pk}: this alert is already acknowledged" in said[1] and "2 refused" in said[1]
    assert f"#{closed.pk}: this alert is closed (resolved); reopen it first" in said[1]
    assert Alert.objects.get(pk=fresh.pk).state == "acknowledged"
    assert len(ledger.entries_of("alert.updated", action="acknowledge")) == 2  # the fixture's and this one


def test_bulk_resolve_asks_for_a_reason_first_and_assign_for_a_staff_member(regulator, three):
    fresh, seen, _ = three
    size = ledger.ledger_size()
    asked = bulk(regulator, "resolve", [fresh, seen])
    assert asked.status_code == 200 and 'name="reason"' in asked.content.decode() and ledger.ledger_size() == size
    empty = bulk(regulator, "resolve", [fresh, seen], apply="1", reason="")
    assert "This field is required" in empty.content.decode() and ledger.ledger_size() == size
    done = bulk(regulator, "resolve", [fresh, seen], apply="1", reason="both inspected on the 3rd")
    assert done.status_code == 302
    assert set(Alert.objects.filter(pk__in=[fresh.pk, seen.pk]).values_list("state", flat=True)) == {"resolved"}
    form = bulk(regulator, "assign", [fresh]).content.decode()
    assert '<option value="regulator">' in form and "auditor" not in re.sub(r"<p.*?</p>", "", form, flags=re.S)
    nobody = bulk(regulator, "assign", [fresh], apply="1", assignee="nosuchuser")
    assert nobody.status_code == 200 and "Select a valid choice" in nobody.content.decode()


def test_the_auditor_is_offered_no_bulk_step(auditor, world):
    html = auditor.get(INBOX).content.decode()
    assert "triage_acknowledge" not in html
    bulk(auditor, "acknowledge", [world["alert"]])
    assert Alert.objects.get(pk=world["alert"].pk).state == "open"


def test_age_and_sla_overdue_shown_and_filterable(regulator, world, settings):
    alert = world["alert"]
    within = regulator.get(INBOX, {"sla": "within"}).content.decode()
    assert f"overdue #{alert.pk}" in within and "— overdue" not in within
    assert f"overdue #{alert.pk}" not in regulator.get(INBOX, {"sla": "overdue"}).content.decode()
    settings.ALERT_SLA_HOURS = {**settings.ALERT_SLA_HOURS, "medium": 0}  # everything medium is now past its SLA
    late = regulator.get(INBOX, {"sla": "overdue"}).content.decode()
    # the world was seeded with the module's first test: its alert's age is minutes, not always 0
    assert f"overdue #{alert.pk}" in late and re.search(r"\b\d+ min — overdue", late)
    page = regulator.get(reverse("desk:alert", args=[alert.pk])).content.decode()
    assert re.search(r'id="alert-sla" class="desk-bad">close by [^<]* — overdue', page)
    alert_act(alert, action="resolve", by="regulator", reason="done")
    assert f"overdue #{alert.pk}" not in regulator.get(INBOX, {"sla": "overdue"}).content.decode()  # closed: no SLA


def test_the_alert_page_offers_the_steps_that_apply_and_shows_failed_notices(regulator, world):
    alert = world["alert"]
    alert_act(alert, action="acknowledge", by="regulator")
    AlertNotification.objects.create(
        alert=alert,
        channel="webhook",
        target="https://hooks.example/x",
        state="failed",
        attempts=8,
        last_error="try 8: HTTPError: HTTP Error 500",
    )
    html = regulator.get(reverse("desk:alert", args=[alert.pk])).content.decode()
    offered = re.findall(r'<option value="(\w+)"', html.split('name="action"')[1].split("</select>")[0])
    assert "acknowledge" not in offered and {"investigate", "resolve", "dismiss", "comment"} <= set(offered)
    assert "failed, gave up" in html and "HTTP Error 500" in html
    refused = regulator.post(reverse("desk:alert", args=[alert.pk]), {"action": "acknowledge"})
    assert "already acknowledged" in refused.content.decode()
