"""No desk or portal page scrolls sideways at 1280 or 1920 px (real Chromium via Playwright).

Every page a regulator or an inspector opens: the dashboard, each change list and one change page per model,
the chip and organisation stories, search, a campaign, a draw, a task, a claim (with a long transcript URL),
an alert, a job, and the portal's task list and task. Long hashes and URLs wrap or are cut with an ellipsis.
Screenshots land in var/screenshots/overflow/ (CI artefacts).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from django.conf import settings
from django.contrib import admin
from django.urls import reverse

from desk.models import Job
from inspections.models import Alert, Campaign, Claim, Draw, InspectionTask
from ledger import services as ledger
from registry.models import Chip, Organisation
from tests.desk.test_browser import browser  # noqa: F401 (fixture)
from tests.desk.test_pages import inspected, mismatch  # noqa: F401 (fixtures)

CHROMIUM = Path("/usr/bin/chromium")
WIDTHS = (1280, 1920)
SHOTS = Path(settings.BASE_DIR) / "var" / "screenshots" / "overflow"

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium: apt-get install -y chromium"),
]

# The widest elements past the right edge, to name the culprit when a page overflows.
OVERFLOW = """() => {
  const doc = document.scrollingElement;
  const wide = [...document.querySelectorAll('body *')]
    .filter(el => el.getBoundingClientRect().right > window.innerWidth + 1)
    .map(el => el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') + (el.className && el.className.baseVal === undefined
      ? '.' + String(el.className).trim().split(/\\s+/).join('.') : '') + ' ' + Math.round(el.getBoundingClientRect().right))
    .slice(-5);
  return {scroll: doc.scrollWidth, inner: window.innerWidth, wide};
}"""


def desk_pages(world, claim: Claim) -> list[str]:
    """Every desk page: the dashboard, change lists, one change page per model, the desk's own pages."""
    job = Job.objects.create(
        kind=Job.Kind.INTEGRITY_SWEEP,
        state=Job.State.DONE,
        progress=1.0,
        started_by="regulator",
        result={"ok": True, "entries": 42, "root": "ab" * 32},
    )
    urls = ["/admin/"]
    for model in admin.site._registry:
        app, name = model._meta.app_label, model._meta.model_name
        urls.append(reverse(f"admin:{app}_{name}_changelist"))
        first = model.objects.order_by("pk").first()
        if first is not None:
            urls.append(reverse(f"admin:{app}_{name}_change", args=[first.pk]))
    task = world["task"]
    owner = Organisation.objects.filter(slug="owner-a").get()
    urls += [
        reverse("desk:chip", args=[task.chip.serial]),
        reverse("desk:organisation", args=[owner.slug]),
        reverse("desk:search") + "?q=owner",
        reverse("desk:search") + f"?q={Chip.objects.order_by('serial').first().serial[:4]}",
        reverse("desk:campaign", args=[Campaign.objects.order_by("pk").first().slug]),
        reverse("desk:draw", args=[Draw.objects.order_by("pk").first().pk]),
        reverse("desk:task", args=[task.pk]),
        reverse("desk:claim", args=[claim.pk]),
        reverse("desk:alert", args=[Alert.objects.order_by("pk").first().pk]),
        reverse("desk:job", args=[job.pk]),
    ]
    return urls


def portal_pages() -> list[str]:
    task = InspectionTask.objects.order_by("pk").first()
    return [reverse("portal:tasks"), reverse("portal:task", args=[task.pk])]


@pytest.fixture
def chromium(browser):  # noqa: F811 - test_browser's fixture, under the name this file uses
    return browser


def logged_in(chromium, live_server, width: int, username: str, login_path: str, landing: str):
    page = chromium.new_page(viewport={"width": width, "height": 900})
    page.set_default_timeout(60_000)
    page.goto(f"{live_server.url}{login_path}")
    page.fill("#id_username", username)
    page.fill("#id_password", "demo-pass-123")
    page.locator("main form button, #login-form [type=submit]").first.click()
    page.wait_for_url(f"{live_server.url}{landing}")
    return page


def overflowing(page, live_server, urls: list[str], width: int) -> list[str]:
    found = []
    for url in urls:
        answer = page.goto(f"{live_server.url}{url}")
        assert answer.status == 200, (url, answer.status)
        measured = page.evaluate(OVERFLOW)
        if measured["scroll"] > measured["inner"]:
            found.append(
                f"{url} at {width}px: scrollWidth {measured['scroll']} > {measured['inner']}: {measured['wide']}"
            )
            name = url.strip("/").replace("/", "_").replace("?", "_") or "dashboard"
            page.screenshot(path=str(SHOTS / f"{name}-{width}.png"), full_page=True)
    return found


def test_no_desk_or_portal_page_scrolls_sideways_at_1280_or_1920_px(chromium, live_server, world, mismatch):  # noqa: F811
    SHOTS.mkdir(parents=True, exist_ok=True)
    ledger.checkpoint_sign()
    desk, portal = desk_pages(world, mismatch), portal_pages()
    found = []
    for width in WIDTHS:
        page = logged_in(chromium, live_server, width, "regulator", "/admin/login/", "/admin/")
        found += overflowing(page, live_server, desk, width)
        page.close()
        page = logged_in(chromium, live_server, width, "inspector-a", "/accounts/login/?next=/portal/", "/portal/")
        found += overflowing(page, live_server, portal, width)
        page.close()
    assert not found, "\n".join(found)
