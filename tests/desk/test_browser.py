"""The regulator's desk in a real browser: Playwright driving Debian's Chromium against the live server.

Needs /usr/bin/chromium (``apt-get install -y chromium``); never downloads a browser. Screenshots of the
dashboard, a chip page, an alert, a campaign and a campaign's preview land in var/screenshots/ (CI artefacts).
"""

import os
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from inspections.models import Draw
from ledger import services as ledger
from ledger.models import Entry
from ledger.selectors import ledger_size
from registry.models import Chip
from tests.helpers import subprocess_database_url

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--headless=new",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SHOTS = Path(settings.BASE_DIR) / "var" / "screenshots"
WAIT_MS = 60_000

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium: apt-get install -y chromium"),
]


@pytest.fixture
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # Playwright's sync API runs an event loop in this thread
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def job_worker(settings):
    """A Celery worker on a queue of its own, taking the desk's jobs."""
    queue = f"test-desk-{uuid.uuid4().hex[:12]}"
    settings.DESK_JOB_QUEUE = queue
    env = {**os.environ, "DATABASE_URL": subprocess_database_url()}
    command = [sys.executable, "-m", "celery", "-A", "config", "worker", "--pool=solo", "-Q", queue]
    command += ["--without-heartbeat", "--without-gossip", "--without-mingle", "--loglevel=WARNING"]
    process = subprocess.Popen(command, env=env, cwd=settings.BASE_DIR)
    yield queue
    process.terminate()
    process.wait(timeout=30)


def _login(browser, live_server, username: str):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(WAIT_MS)
    page.goto(f"{live_server.url}/admin/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", "demo-pass-123")
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server.url}/admin/")
    return page


def test_a_regulator_works_the_desk(browser, live_server, world, job_worker):
    SHOTS.mkdir(parents=True, exist_ok=True)
    ledger.checkpoint_sign()  # the chip's entries must be covered by a signed checkpoint
    page = _login(browser, live_server, "regulator")

    # The dashboard and its plots.
    assert page.locator("#desk-plots svg").count() >= 5
    page.screenshot(path=str(SHOTS / "dashboard.png"), full_page=True)

    # Find a drawn chip by its serial; open its timeline; verify it in the browser.
    serial = world["task"].chip.serial
    page.fill("input[name=q]", serial)
    page.press("input[name=q]", "Enter")
    page.wait_for_url(f"**/admin/desk/chip/{serial}/")
    rows = page.locator("#timeline tbody tr")
    assert rows.count() >= 3 and "chip.fabricated" in page.inner_text("#timeline")
    page.click("#verify-all")
    page.wait_for_selector("#verify-summary[data-done]")
    assert page.inner_text("#verify-summary").startswith("OK:"), page.inner_text("#verify-summary")
    assert page.locator(".verify-bad").count() == 0
    page.screenshot(path=str(SHOTS / "chip.png"), full_page=True)

    # The server (or a proxy) lies about a proof: the check fails visibly.
    def tampered(route):
        response = route.fetch()
        body = response.json()
        if body["hashes"]:
            body["hashes"][0] = ("A" if body["hashes"][0][0] != "A" else "B") + body["hashes"][0][1:]
        route.fulfill(response=response, json=body)

    page.route("**/api/ledger/proof/inclusion*", tampered)
    page.click("#verify-all")
    page.wait_for_selector("#verify-summary[data-done=fail]")
    assert "FAILED" in page.inner_text("#verify-summary")
    assert page.locator(".verify-bad").count() >= 1
    page.unroute("**/api/ledger/proof/inclusion*")

    # Triage the alert.
    alert = world["alert"]
    page.goto(f"{live_server.url}/admin/inspections/alert/?state=open")
    page.click(f"a[href='/admin/desk/alert/{alert.pk}/']")
    page.select_option("#id_action", "assign")
    page.select_option("#id_assignee", "regulator-staff")  # a staff user who may triage
    page.fill("#id_reason", "please look at this")
    page.click("input[type=submit][value='Record on the ledger']")
    page.wait_for_selector("#alert-history >> text=please look at this")
    page.select_option("#id_action", "acknowledge")
    page.click("input[type=submit][value='Record on the ledger']")
    page.wait_for_selector("#alert-state >> text=acknowledged")
    page.screenshot(path=str(SHOTS / "alert.png"), full_page=True)

    # Start a draw audit and watch it finish (a real Celery worker runs it).
    draw = Draw.objects.get()
    page.goto(f"{live_server.url}/admin/desk/draw/{draw.pk}/")
    page.click("#start-audit")
    page.wait_for_selector("#audits tr.job[data-state=done]", timeout=120_000)
    assert "matches its recomputation" in page.inner_text("#audits")


def test_the_in_browser_check_fails_closed(browser, live_server, world):
    """An old (validly signed) checkpoint, a field the page shows that its leaf does not say, or a changed log
    key each fail the run; none reads as OK."""
    from ledger.models import Checkpoint
    from ledger.selectors import checkpoint_text

    old = Checkpoint.objects.order_by("size").first()
    ledger.checkpoint_sign()
    page = _login(browser, live_server, "regulator")
    serial = world["task"].chip.serial
    chip_page = f"{live_server.url}/admin/desk/chip/{serial}/"

    def run() -> str:
        page.click("#verify-all")
        page.wait_for_selector("#verify-summary[data-done]")
        return page.get_attribute("#verify-summary", "data-done") + ": " + page.inner_text("#verify-summary")

    page.goto(chip_page)
    assert run().startswith("pass: OK"), page.inner_text("#verify-summary")

    old_note = checkpoint_text(old)  # validly signed, but older than every entry shown
    page.route("**/api/ledger/checkpoint", lambda route: route.fulfill(status=200, body=old_note))
    page.goto(chip_page)
    assert run().startswith("fail: FAILED")
    page.unroute("**/api/ledger/checkpoint")

    for cell in (".f-counterparty", ".f-country", ".f-facility", ".f-place"):  # the server lies about one field
        page.goto(chip_page)
        if page.locator(cell).count() == 0:
            continue
        page.eval_on_selector(cell, "c => { c.textContent = c.textContent + 'X'; }")
        assert run().startswith("fail: FAILED"), cell
        assert page.locator(".verify-bad").count() >= 1

    page.goto(chip_page)
    page.evaluate("localStorage.setItem('chipledger.verifierKey', 'another.example/log+00000000+AQ==')")
    verdict = run()
    assert verdict.startswith("fail: FAILED") and "differs from the one pinned" in verdict


def test_an_auditor_finds_nothing_to_change_and_no_secret(browser, live_server, world):
    page = _login(browser, live_server, "auditor")
    home = page.content()
    assert "Run a full integrity sweep" not in home
    for path in ("/admin/registry/chip/", "/admin/inspections/campaign/", "/admin/ledger/entry/"):
        page.goto(live_server.url + path)
        assert page.locator("a.addlink").count() == 0, path
    page.goto(f"{live_server.url}/admin/desk/alert/{world['alert'].pk}/")
    assert page.locator("#id_action").count() == 0
    page.goto(f"{live_server.url}/admin/desk/draw/{Draw.objects.get().pk}/")
    assert page.locator("#start-audit").count() == 0
    chip = Chip.objects.order_by("serial").first()
    page.goto(f"{live_server.url}/admin/desk/chip/{chip.serial}/")
    # Nothing secret anywhere it can reach: no API tokens, no unrevealed seeds, no signing keys.
    page.goto(f"{live_server.url}/admin/")
    assert "Tokens" not in page.inner_text("#content") and "seed" not in page.inner_text("#content").lower()
    assert page.goto(f"{live_server.url}/admin/authtoken/tokenproxy/").status in (403, 404)


def test_regulator_staff_read_a_campaign_then_preview_and_create_one(browser, live_server, world):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = _login(browser, live_server, "regulator-staff")

    # From the campaign list to the campaign's page: its plan per prover, progress and draws.
    page.goto(f"{live_server.url}/admin/inspections/campaign/")
    page.click("a[href='/admin/desk/campaign/frontier-runs-2026/']")
    page.wait_for_selector("#campaign-plan tr[data-prover=owner-a]")
    assert "the run is impossible here" in page.inner_text("#campaign-plan tr[data-prover=owner-b]")
    assert page.inner_text("#achieved") != "-" and page.locator("#campaign-draws a").count() == 1
    page.screenshot(path=str(SHOTS / "campaign.png"), full_page=True)

    # Start a campaign: the preview shows the plan and cost and writes nothing; Create writes it.
    size = ledger_size()
    page.goto(f"{live_server.url}/admin/inspections/campaign/add/")
    assert page.locator("#id_provers option[value=vendor-a]").count() == 0
    page.fill("#id_slug", "fleet-2027")
    page.select_option("#id_provers", ["owner-a", "owner-b"])
    page.fill("#id_rule_flops", "1e24")
    page.fill("#id_starts_on", "2027-01-01")
    page.click("#preview-campaign")
    page.wait_for_selector("#preview-cost")
    assert page.locator("#preview-plan tr[data-prover=owner-a]").count() == 1
    assert "inspections per year" in page.inner_text("#preview-cost").lower() and ledger_size() == size
    page.screenshot(path=str(SHOTS / "campaign-preview.png"), full_page=True)
    page.click("#create-campaign")
    page.wait_for_url("**/admin/desk/campaign/fleet-2027/")
    assert "created at ledger seq" in page.inner_text("ul.messagelist")
    assert Entry.objects.filter(kind="campaign.created", payload__slug="fleet-2027").count() == 1


def test_a_campaigns_lifecycle_from_the_form_to_amend_and_stop(browser, live_server, world):
    """The form refuses a backdated start and a campaign without a prover (Create disabled, and refused when
    forced); a valid one shows its plan in words, counts down to its first draw, is amended and stopped as new
    ledger entries, and its compliance report downloads under a dated name."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    today = timezone.localdate()
    page = _login(browser, live_server, "regulator-staff")
    page.goto(f"{live_server.url}/admin/inspections/campaign/add/")
    assert page.get_attribute("#id_starts_on", "type") == "date"
    assert page.get_attribute("#id_starts_on", "min") == today.isoformat()
    assert page.locator("#id_country option[value=FR]").inner_text() == "FR — France"

    # Backdated: the date picker will not submit it; forced past the browser, the server refuses it.
    page.fill("#id_slug", "fr-2027")
    page.select_option("#id_country", "FR")
    page.fill("#id_rule_flops", "1e24")
    page.fill("#id_starts_on", (today - timedelta(days=3)).isoformat())
    assert page.eval_on_selector("#id_starts_on", "input => input.validity.rangeUnderflow")
    page.eval_on_selector("#campaign-preview", "form => form.noValidate = true")
    page.click("#preview-campaign")
    page.wait_for_selector(".errorlist")
    assert "must not be in the past" in page.inner_text("#campaign-preview")

    # Nobody holds chips in France: the preview says so and Create is disabled; forced, the server refuses it.
    size = ledger_size()
    page.fill("#id_starts_on", today.isoformat())
    page.click("#preview-campaign")
    page.wait_for_selector("#no-prover")
    assert page.is_disabled("#create-campaign") and "No prover" in page.inner_text("#no-prover")
    page.eval_on_selector("#create-campaign", "button => button.disabled = false")
    page.click("#create-campaign")
    page.wait_for_selector(".errorlist")
    assert "no prover" in page.inner_text("#campaign-preview") and ledger_size() == size

    # Named provers, starting in three days: the plan in words, created on the ledger.
    page.select_option("#id_country", "")
    page.select_option("#id_provers", ["owner-a"])
    page.fill("#id_slug", "fleet-2027")
    page.fill("#id_starts_on", (today + timedelta(days=3)).isoformat())
    page.click("#preview-campaign")
    page.wait_for_selector("#preview-plan tr[data-prover=owner-a]")
    shown = page.inner_text("#content")
    assert "chips each period" in page.inner_text("#preview-plan") and "Rule (H)" in shown
    assert "rule_flops" not in shown and "detection_probability" not in shown
    page.screenshot(path=str(SHOTS / "campaign-form-preview.png"), full_page=True)
    page.click("#create-campaign")
    page.wait_for_url("**/admin/desk/campaign/fleet-2027/")
    page.wait_for_function("document.querySelector('#next-draw .countdown').textContent.startsWith('in 2 d')")

    # Amend: a new entry superseding the created one.
    page.click("#amend-campaign summary")
    page.fill("#id_amend-detection_probability", "0.95")
    page.click("#amend-submit")
    page.wait_for_selector("ul.messagelist")
    assert "amended at ledger seq" in page.inner_text("ul.messagelist")
    created = Entry.objects.get(kind="campaign.created", payload__slug="fleet-2027")
    amended = Entry.objects.get(kind="campaign.amended", payload__campaign="fleet-2027")
    assert amended.payload["supersedes"] == created.seq and amended.payload["changed"] == ["detection_probability"]
    assert page.locator("#campaign-versions tr.version").count() == 2

    # Stop: no draw from today on; nothing more to amend or stop.
    page.click("#stop-campaign summary")
    page.click("#stop-submit")
    page.wait_for_selector("ul.messagelist")
    assert "stopped at ledger seq" in page.inner_text("ul.messagelist")
    assert "none: stopped" in page.inner_text("#next-draw") and page.locator("#amend-campaign").count() == 0
    stopped = Entry.objects.get(kind="campaign.stopped", payload__campaign="fleet-2027")
    assert stopped.payload["supersedes"] == amended.seq
    page.screenshot(path=str(SHOTS / "campaign-stopped.png"), full_page=True)

    # Its compliance report, under a dated name.
    with page.expect_download() as download:
        page.click("#campaign-reports a:text('CSV')")
    assert download.value.suggested_filename == f"compliance-campaign-fleet-2027-{today.isoformat()}.csv"


OVERFLOW = "document.documentElement.scrollWidth > document.documentElement.clientWidth"


def test_a_regulator_drills_down_from_the_dashboard(browser, live_server, world):
    """A bar in the chart opens the chips behind it; a campaign's name opens its page; an owner opens its story;
    the ledger badge heads each page; no page scrolls sideways at 1280 or 1920 px."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = _login(browser, live_server, "regulator")
    for width in (1280, 1920):
        page.set_viewport_size({"width": width, "height": 1000})
        page.goto(f"{live_server.url}/admin/")
        assert not page.evaluate(OVERFLOW), f"the dashboard overflows at {width} px"
        page.screenshot(path=str(SHOTS / f"desk-dashboard-{width}.png"), full_page=True)
    assert "intact" in page.inner_text("#ledger-badge") or "never swept" in page.inner_text("#ledger-badge")
    country = Chip.objects.exclude(country="").values_list("country", flat=True).first()
    bar = page.locator(f'#desk-plots a[*|href$="?country={country}"]')
    bar.click()  # a bar of "Chips by country"
    page.wait_for_url(lambda url: url.endswith(f"/admin/registry/chip/?country={country}"))
    rows = page.locator("#result_list tbody tr").count()
    assert rows == Chip.objects.filter(country=country).count() and rows > 0
    assert page.locator("#ledger-badge").is_visible()
    page.goto(f"{live_server.url}/admin/")
    page.click("#desk-campaigns a.campaign-link")
    page.wait_for_url("**/admin/desk/campaign/frontier-runs-2026/")
    page.goto(f"{live_server.url}/admin/")
    owner = page.locator("#desk-campaigns tbody tr td:nth-child(2) a").first
    slug = owner.inner_text()
    owner.click()
    page.wait_for_url(f"**/admin/desk/organisation/{slug}/")
    for width in (1280, 1920):
        page.set_viewport_size({"width": width, "height": 1000})
        assert not page.evaluate(OVERFLOW), f"the organisation page overflows at {width} px"
    page.screenshot(path=str(SHOTS / "desk-organisation.png"), full_page=True)
    page.click("#org-chips-all")
    page.wait_for_url(lambda url: url.endswith(f"/admin/registry/chip/?owner={slug}"))
    assert page.locator("#result_list tbody tr").count() == Chip.objects.filter(owner__slug=slug).count()
