"""Bulk triage and the search across everything, in Chromium (Playwright) against the live server: the fixtures of
tests/desk/test_browser.py (Debian's /usr/bin/chromium, never a downloaded browser)."""

import pytest

from inspections.models import Alert
from inspections.services.alerts import alert_act, alert_raise
from registry.models import Chip, ChipModel, Organisation
from tests.desk.test_browser import CHROMIUM, SHOTS, browser  # noqa: F401 - browser is a fixture
from tests.desk.test_browser import _login as signed_in
from tests.registry.factories import fabricate

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium: apt-get install -y chromium"),
]


def pick(page, *alerts) -> None:
    for alert in alerts:
        page.check(f"input.action-select[value='{alert.pk}']")


def run_action(page, action: str) -> None:
    page.select_option("select[name=action]", action)
    page.click("button[name=index]")


def test_a_regulator_triages_alerts_in_bulk(browser, live_server, world):  # noqa: F811
    SHOTS.mkdir(parents=True, exist_ok=True)
    fresh, prover = world["alert"], world["alert"].prover
    seen = alert_raise("overdue", prover, "inspection overdue (2)")
    alert_act(seen, action="acknowledge", by="regulator")
    page = signed_in(browser, live_server, "regulator")
    page.goto(f"{live_server.url}/admin/inspections/alert/")
    assert page.locator("#changelist-filter a[href*='sla=overdue']").count() == 1
    assert page.locator("td.field-age").count() == Alert.objects.count()

    # Acknowledge both: the fresh one is acknowledged, the other refused with the reason, on one page.
    pick(page, fresh, seen)
    run_action(page, "triage_acknowledge")
    page.wait_for_selector("ul.messagelist li.warning")
    said = page.text_content("ul.messagelist")
    assert f"Acknowledge: 1 done (#{fresh.pk})" in said
    assert f"#{seen.pk}: this alert is already acknowledged; nothing was changed" in said
    page.screenshot(path=str(SHOTS / "alerts-bulk.png"), full_page=True)

    # Resolve both: the reason is asked for first, then each is resolved on the ledger.
    pick(page, fresh, seen)
    run_action(page, "triage_resolve")
    page.wait_for_selector("#bulk-triage")
    assert page.locator("#bulk-alerts li").count() == 2
    page.fill("#id_reason", "both inspected on the 3rd")
    page.click("#bulk-triage input[name=apply]")
    page.wait_for_selector("ul.messagelist li.success")
    assert "Resolve: 2 done" in page.text_content("ul.messagelist")
    assert set(Alert.objects.filter(pk__in=[fresh.pk, seen.pk]).values_list("state", flat=True)) == {"resolved"}

    # The alert's page now offers reopening, not acknowledging.
    page.goto(f"{live_server.url}/admin/desk/alert/{fresh.pk}/")
    offered = page.eval_on_selector_all("#id_action option", "options => options.map(o => o.value)")
    assert "reopen" in offered and "acknowledge" not in offered


def test_a_regulator_searches_across_everything(browser, live_server, world):  # noqa: F811
    owner = Organisation.objects.get(slug="fab-tw")
    fabricate(owner, ChipModel.objects.get(slug="h100-sxm"), 120)
    owned = Chip.objects.filter(owner=owner).count()
    page = signed_in(browser, live_server, "regulator")
    page.goto(f"{live_server.url}/admin/desk/search/")

    def search(query: str) -> None:
        page.fill("input[name=q]", query)
        page.press("input[name=q]", "Enter")
        page.wait_for_selector("#chip-results")

    search("fab-tw")
    assert f"1–50 of {owned}" in page.inner_text("#chip-count")
    first_page = page.locator("#chip-results a").all_inner_texts()
    page.click("#chip-next")
    page.wait_for_url("**page=2")
    second_page = page.locator("#chip-results a").all_inner_texts()
    assert len(second_page) == 50 and not set(first_page) & set(second_page)

    search("Amsterdam")  # a city
    assert "dc-owner-b-ams" in page.inner_text("#facility-results")
    search("AE")  # a country code
    assert "owner-c" in page.inner_text("#organisation-results") and "Chips in AE" in page.inner_text("#content")
    search("SO-owner-b")  # an order reference
    assert page.locator("#reference-results a").count() >= 1
    search("overdue")  # an alert kind
    page.click(f"#alert-results a[href='/admin/desk/alert/{world['alert'].pk}/']")
    page.wait_for_url(f"**/admin/desk/alert/{world['alert'].pk}/")
    page.screenshot(path=str(SHOTS / "search-to-alert.png"), full_page=True)
