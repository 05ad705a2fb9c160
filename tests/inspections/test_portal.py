"""The inspector's portal pages, driven as a person would: log in, accept, challenge, answer, record."""

import base64

import pytest
from django.contrib.auth import get_user_model
from nacl.signing import SigningKey

from inspections.demo_campaign import seed_inspections
from inspections.models import InspectionTask
from ledger.models import Entry
from registry.demo_registry import seed_demo
from registry.models import Chip

pytestmark = pytest.mark.django_db


@pytest.fixture
def inspector(client):
    seed_demo("demo-pass-123", chips=60)
    seed_inspections()
    assert client.login(username="inspector-a", password="demo-pass-123")
    return client


def test_login_page_and_redirect(client):
    assert client.get("/accounts/login/").status_code == 200
    assert client.get("/portal/").status_code == 302


def test_task_list_shows_only_this_bodys_tasks(inspector):
    html = inspector.get("/portal/").content.decode()
    tasks = InspectionTask.objects.all()
    assert tasks.exists() and all(t.chip.serial in html for t in tasks)


def test_accept_challenge_answer_and_record_a_finding(inspector):
    task = InspectionTask.objects.select_related("chip").first()
    key = SigningKey.generate()
    Chip.objects.filter(pk=task.chip_id).update(public_key=bytes(key.verify_key))
    page = f"/portal/tasks/{task.pk}/"
    assert inspector.post(page, {"action": "accept"}).status_code == 302
    assert inspector.post(page, {"action": "challenge"}).status_code == 302
    inspector.get("/portal/")  # away and back: the challenge is kept server-side until answered or expired
    message = challenge_message(inspector.get(page).content.decode())
    assert challenge_message(inspector.get(page).content.decode()) == message
    nonce = message.strip().splitlines()[-1]
    signature = base64.b64encode(key.sign(message.encode()).signature).decode()
    answered = inspector.post(page, {"action": "identity", "nonce": nonce, "signature": signature}, follow=True)
    html = answered.content.decode()
    assert "Identity verified." in html and 'id="identity-verified"' in html
    assert 'value="challenge"' not in html  # passed: no fresh challenge offered
    recorded = inspector.post(
        page,
        {
            "action": "finding",
            "chip_found": "true",
            "owner_refused": "false",
            "seal_intact": "true",
            "tamper_evidence": "",  # not checked
            "location_matches": "false",
            "photo_hashes": "ab" * 32,
            "notes": "all good",
        },
        follow=True,
    )
    html = recorded.content.decode()
    assert "Finding recorded on the ledger." in html
    finding = Entry.objects.get(kind="inspection.finding")
    assert finding.payload["chip_found"] is True and finding.payload["photo_hashes"] == ["ab" * 32]
    assert finding.payload["seal_intact"] is True and finding.payload["location_matches"] is False
    assert "tamper_evidence" not in finding.payload  # an unanswered question is no assertion
    # done: the result is shown, and nothing more is offered
    assert 'id="finding-result"' in html and "not checked" in html
    for action in ("challenge", "identity", "log", "finding", "accept"):
        assert f'value="{action}"' not in html
    from django.core.files.uploadedfile import SimpleUploadedFile

    from inspections.models import SnapshotLog

    upload = SimpleUploadedFile("chip.log", b'{"serial": "x"}\n')
    stale = inspector.post(page, {"action": "log", "log": upload}, follow=True).content.decode()  # a stale tab
    assert "nothing more is taken" in stale and not SnapshotLog.objects.filter(task=task).exists()


def challenge_message(html: str) -> str:
    return html.split('<pre id="challenge-message">')[1].split("</pre>")[0].replace("&#x27;", "'")


def test_an_unticked_checklist_records_no_answers(inspector):
    task = InspectionTask.objects.first()
    page = f"/portal/tasks/{task.pk}/"
    inspector.post(page, {"action": "accept"})
    inspector.post(page, {"action": "finding", "chip_found": "true", "owner_refused": "false"}, follow=True)
    payload = Entry.objects.get(kind="inspection.finding").payload
    assert not {"seal_intact", "tamper_evidence", "location_matches"} & set(payload)
    assert payload["owner_refused"] is False


def test_the_task_list_is_filtered_and_paged(inspector):
    from django.utils import timezone

    first = InspectionTask.objects.get()
    others = Chip.objects.exclude(pk=first.chip_id)[:30]  # a busy body: more tasks than one page holds
    InspectionTask.objects.bulk_create(
        [
            InspectionTask(
                draw=first.draw,
                chip=chip,
                prover=first.prover,
                inspection_body=first.inspection_body,
                due_on=first.due_on + timezone.timedelta(days=30),
                assigned_seq=first.assigned_seq,
            )
            for chip in others
        ]
    )
    tasks = list(InspectionTask.objects.order_by("due_on", "id"))
    InspectionTask.objects.filter(pk=tasks[0].pk).update(status="done")
    InspectionTask.objects.filter(pk=tasks[1].pk).update(due_on=timezone.localdate())
    open_page = inspector.get("/portal/").content.decode()
    assert f">{tasks[0].chip.serial}<" not in open_page and "page 1 of" in open_page
    assert f"open (not done) ({len(tasks) - 1})" in open_page
    second = inspector.get("/portal/?show=open&page=2").content.decode()
    assert f">{tasks[-1].chip.serial}<" in second or "page 2 of" in second
    done = inspector.get("/portal/?show=done").content.decode()
    assert f">{tasks[0].chip.serial}<" in done and f">{tasks[1].chip.serial}<" not in done
    due = inspector.get("/portal/?show=due").content.decode()
    assert f">{tasks[1].chip.serial}<" in due
    assert inspector.get("/portal/?show=nonsense&page=9999").status_code == 200


def test_a_finding_on_an_unaccepted_task_shows_the_error(inspector):
    task = InspectionTask.objects.first()
    response = inspector.post(f"/portal/tasks/{task.pk}/", {"action": "finding", "chip_found": "false"}, follow=True)
    assert "accept it first" in response.content.decode()


def test_non_inspectors_are_refused(client):
    seed_demo("demo-pass-123", chips=60)
    seed_inspections()
    client.login(username="owner-a", password="demo-pass-123")
    assert client.get("/portal/").status_code == 403
    client.force_login(get_user_model().objects.get(username="regulator"))
    assert client.get(f"/portal/tasks/{InspectionTask.objects.first().pk}/").status_code == 403


def test_staff_are_refused_by_the_portal_even_as_members_of_an_inspection_body(client):
    from registry.models import Member, Organisation

    seed_demo("demo-pass-123", chips=60)
    seed_inspections()
    staff = get_user_model().objects.get(username="regulator-staff")
    Member.objects.filter(user=staff).update(organisation=Organisation.objects.get(slug="inspect-eu"))  # past edit
    client.force_login(staff)
    assert client.get("/portal/").status_code == 403
    assert client.post(f"/portal/tasks/{InspectionTask.objects.first().pk}/", {"action": "accept"}).status_code == 403


def test_regulator_starts_a_campaign_in_the_admin(client):
    seed_demo("demo-pass-123", chips=60)
    seed_inspections()
    client.force_login(get_user_model().objects.get(username="regulator"))
    for page in (
        "/admin/inspections/campaign/",
        "/admin/inspections/alert/",
        "/admin/inspections/inspectiontask/",
        "/admin/inspections/campaign/add/",
    ):
        assert client.get(page).status_code == 200, page
    response = client.post(
        "/admin/inspections/campaign/add/",
        {
            "slug": "nl-2027",
            "country": "nl",
            "rule_flops": "1e24",
            "detection_probability": "0.9",
            "snapshot_rate": "0.1",
            "period_days": "30",
            "run_days": "365",
            "starts_on": "2027-01-01",
            "step": "create",
        },
    )
    assert response.status_code == 302
    assert Entry.objects.filter(kind="campaign.created", payload__slug="nl-2027", payload__country="NL").exists()
    refused = client.post(
        "/admin/inspections/campaign/add/",
        {
            "slug": "bad",
            "rule_flops": "1e24",
            "detection_probability": "0.9",
            "snapshot_rate": "0.1",
            "period_days": "30",
            "run_days": "365",
            "starts_on": "2027-01-01",
        },
    )
    assert refused.status_code == 200 and "name the provers" in refused.content.decode()


def test_the_campaign_seed_is_nowhere_in_the_admin_or_api(inspector):
    from django.contrib import admin as django_admin

    from inspections.models import CampaignSeed

    assert CampaignSeed not in django_admin.site._registry
    seed = CampaignSeed.objects.filter(campaign__draws__isnull=True).first() or CampaignSeed.objects.last()
    hex_seed = bytes(seed.seed).hex()
    for page in ("/portal/", "/api/inspections/tasks", "/api/schema/"):
        assert hex_seed not in inspector.get(page).content.decode()


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"rule_flops": "1e40"}, "not representable"),
        ({"snapshot_rate": "0"}, "snapshot_rate"),
        ({"snapshot_rate": "-1"}, "snapshot_rate"),
        ({"ends_on": "2026-12-01"}, "must not be before the start"),
        ({"country": "xx"}, "XX is not an ISO 3166-1 country code"),
        ({"starts_on": "2020-01-01"}, "must not be in the past"),
        ({"country": "FR"}, "no prover"),  # Create refused server-side: nobody holds chips in France
        ({"period_days": str(2**31), "run_days": str(2**31)}, "whole number of days"),
    ],
)
def test_an_unusable_campaign_is_a_form_error_naming_the_field(client, change, says):
    seed_demo("demo-pass-123", chips=60)
    seed_inspections()
    client.force_login(get_user_model().objects.get(username="regulator"))
    size = Entry.objects.count()
    form = {
        "slug": "typo-2027",
        "country": "nl",
        "rule_flops": "1e26",
        "detection_probability": "0.9",
        "snapshot_rate": "0.1",
        "period_days": "30",
        "run_days": "365",
        "starts_on": "2027-01-01",
        "step": "create",
    }
    response = client.post("/admin/inspections/campaign/add/", {**form, **change})
    html = response.content.decode()
    assert response.status_code == 200 and "errorlist" in html and says in html.replace("&#x27;", "'"), html[-2000:]
    assert Entry.objects.count() == size
