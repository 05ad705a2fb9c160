"""The inspector's portal in a real browser (Playwright, Debian's Chromium): the challenge survives leaving the
page, and photographs are hashed in the browser (WebCrypto), their SHA-256 filling the finding's field."""

import base64
import hashlib
import os
from pathlib import Path

import pytest
from nacl.signing import SigningKey

from inspections.demo_campaign import seed_inspections
from inspections.models import InspectionTask
from ledger.models import Entry
from registry.demo_registry import seed_demo
from registry.models import Chip

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--headless=new", "--disable-background-networking", "--no-first-run"]

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium: apt-get install -y chromium"),
]


@pytest.fixture
def page(live_server):
    sync_api = pytest.importorskip("playwright.sync_api")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # Playwright's sync API runs an event loop in this thread
    seed_demo("demo-pass-123", chips=60)
    seed_inspections()
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        page = chromium.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(20_000)
        page.goto(f"{live_server.url}/accounts/login/?next=/portal/")
        page.fill("#id_username", "inspector-a")
        page.fill("#id_password", "demo-pass-123")
        page.click("main form button")
        page.wait_for_url(f"{live_server.url}/portal/")
        yield page
        chromium.close()


def test_an_inspector_works_a_task_in_the_browser(page, live_server, tmp_path):
    task = InspectionTask.objects.select_related("chip").first()
    key = SigningKey.generate()
    Chip.objects.filter(pk=task.chip_id).update(public_key=bytes(key.verify_key))
    page.click(f"text={task.chip.serial}")
    page.click("button[value=accept]")
    page.click("button[value=challenge]")
    message = page.inner_text("#challenge-message")
    page.click("text=← all tasks")  # away and back: the same challenge is still there to answer
    page.click(f"text={task.chip.serial}")
    assert page.inner_text("#challenge-message") == message
    signed = key.sign((message.strip() + "\n").encode()).signature
    page.fill("#id_signature", base64.b64encode(signed).decode())
    page.click("button[value=identity]")
    page.wait_for_selector("#identity-verified")
    assert page.locator("button[value=challenge]").count() == 0

    photos = [tmp_path / "front.jpg", tmp_path / "seal.jpg"]
    for n, photo in enumerate(photos):
        photo.write_bytes(bytes([n]) * 1000 + b"\xff\xd8 a photograph")
    page.check("input[name=chip_found][value=true]")
    page.check("input[name=seal_intact][value=true]")
    page.set_input_files("#photo-files", [str(p) for p in photos])
    page.wait_for_selector("#photo-status[data-done='2']")
    expected = [hashlib.sha256(p.read_bytes()).hexdigest() for p in photos]
    assert sorted(page.input_value("#id_photo_hashes").split()) == sorted(expected)
    page.click("button[value=finding]")
    page.wait_for_selector("#finding-result")
    payload = Entry.objects.get(kind="inspection.finding").payload
    assert sorted(payload["photo_hashes"]) == sorted(expected)
    assert payload["seal_intact"] is True and "tamper_evidence" not in payload
    assert page.locator("form button").count() == 1  # only "log out": a done task offers nothing more
