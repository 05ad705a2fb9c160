"""The regulator's desk through Django's test client: pages render, act through services, refuse the auditor."""

import csv
import importlib
import io
import re

import pytest
from django.core.cache import cache
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape

from desk import search_selectors, selectors, tasks
from desk.models import EntrySubject, Figure, Job
from desk.rebuild_index import differences
from desk.services import index, jobs
from desk.services.figures import figures_refresh
from desk.services.jobs import job_run, job_start
from inspections import queue
from inspections.admin import _plan_line
from inspections.models import Alert, Campaign, Draw
from inspections.services import inspectors
from ledger.models import Entry
from registry.models import Chip

pytestmark = pytest.mark.django_db


def test_the_dashboard_is_the_admin_home_with_plots_and_figures(regulator):
    html = regulator.get("/admin/").content.decode()
    assert html.count("<svg") >= 5  # chips by country, owner, model; the time series; the detection curve
    assert "frontier-runs-2026" in html and "Open campaigns" in html
    assert "Run a full integrity sweep" in html and "Chips by country" in html


def test_the_dashboard_does_not_group_the_chips_per_request(regulator, django_assert_max_num_queries):
    regulator.get("/admin/")  # cold start: the figures are computed once
    with django_assert_max_num_queries(25):
        html = regulator.get("/admin/").content.decode()
    assert "<svg" in html


def test_the_beat_task_draws_the_plots_so_the_dashboard_does_not(regulator, monkeypatch):
    tasks.refresh_figures()
    drawn = regulator.get("/admin/").content.decode()
    monkeypatch.setattr("desk.services.charts.plots.bars", lambda *a, **k: pytest.fail("drawn per request"))
    monkeypatch.setattr("desk.services.charts.plots.lines", lambda *a, **k: pytest.fail("drawn per request"))
    cache.clear()
    html = regulator.get("/admin/").content.decode()
    assert html.count("<svg") >= 5 and html.count("<svg") == drawn.count("<svg")
    # Another campaign's curve, or figures newer than the drawn plots: drawn on request.
    Figure.objects.filter(name="chips_by_country").update(computed_at=timezone.now())
    cache.clear()
    with pytest.raises(pytest.fail.Exception, match="drawn per request"):
        regulator.get("/admin/")


def test_a_serial_search_opens_the_chip_page_with_its_timeline(regulator):
    chip = Chip.objects.order_by("serial").first()
    response = regulator.get(reverse("desk:search"), {"q": chip.serial})
    assert response.status_code == 302 and response.url == reverse("desk:chip", args=[chip.serial])
    html = regulator.get(response.url).content.decode()
    assert "chip.fabricated" in html and "Verify in this browser" in html and chip.owner.slug in html
    prefix = regulator.get(reverse("desk:search"), {"q": chip.serial[:-1]}).content.decode()
    assert chip.serial in prefix


def test_search_finds_ledger_entries_about_an_organisation(regulator):
    html = regulator.get(reverse("desk:search"), {"q": "owner-a"}).content.decode()
    assert "org.registered" in html and "campaign.created" in html
    assert regulator.get(reverse("desk:search"), {"q": "\x00"}).status_code == 400  # NUL refused before the view


def test_a_drawn_chip_timeline_shows_its_draw_and_alert(regulator, world):
    html = regulator.get(reverse("desk:chip", args=[world["task"].chip.serial])).content.decode()
    assert "campaign.drawn" in html and "alert.raised" in html


def test_triage_records_who_and_why_on_the_ledger(regulator, world):
    alert = world["alert"]
    url = reverse("desk:alert", args=[alert.pk])
    refused = regulator.post(url, {"action": "resolve", "reason": ""})
    assert refused.status_code == 200 and "say why" in refused.content.decode()
    response = regulator.post(url, {"action": "resolve", "reason": "inspected on the 3rd"})
    assert response.status_code == 302
    alert.refresh_from_db()
    assert alert.state == Alert.State.RESOLVED
    entry = Entry.objects.get(seq=alert.updated_seq)
    # the reason is private case text: a salted commitment on the ledger, the text for staff on the page
    assert entry.payload["by"] == "regulator" and entry.payload["reason"].startswith("sha256:")
    assert "inspected on the 3rd" not in bytes(entry.leaf).decode()
    assert "inspected on the 3rd" in regulator.get(url).content.decode()


def test_the_alert_inbox_filters_by_severity_and_state(regulator):
    medium = regulator.get("/admin/inspections/alert/", {"severity": "medium", "state": "open"}).content.decode()
    assert "overdue #" in medium
    high = regulator.get("/admin/inspections/alert/", {"severity": "high"}).content.decode()
    assert "overdue #" not in high


def test_the_auditor_reads_but_cannot_act(auditor, world):
    alert, draw = world["alert"], Draw.objects.get()
    assert auditor.get(reverse("desk:alert", args=[alert.pk])).status_code == 200
    assert auditor.post(reverse("desk:alert", args=[alert.pk]), {"action": "acknowledge"}).status_code == 403
    assert auditor.post(reverse("desk:draw", args=[draw.pk])).status_code == 403
    assert auditor.post(reverse("desk:sweep")).status_code == 403
    assert not Job.objects.exists()
    html = auditor.get(reverse("desk:draw", args=[draw.pk])).content.decode()
    assert "Audit this draw" not in html


def test_a_vendor_at_the_admin_login_is_sent_to_the_api_docs(client, world):
    response = client.post("/admin/login/", {"username": "vendor-a", "password": "demo-pass-123"})
    assert response.status_code == 302 and response.url == reverse("docs")
    assert client.get("/admin/login/").url == reverse("docs")
    inspector = client.__class__()
    response = inspector.post("/admin/login/", {"username": "inspector-a", "password": "demo-pass-123"})
    assert response.url == reverse("portal:tasks")
    wrong = client.__class__().post("/admin/login/", {"username": "vendor-a", "password": "nope"})
    assert wrong.status_code == 200


def test_a_draw_audit_job_recomputes_the_draw(regulator, django_capture_on_commit_callbacks):
    draw = Draw.objects.get()
    with django_capture_on_commit_callbacks(execute=False):
        response = regulator.post(reverse("desk:draw", args=[draw.pk]))
    assert response.status_code == 302
    job = Job.objects.get()
    assert job.state == Job.State.QUEUED and job.started_by == "regulator"
    assert job_run(job.pk) == Job.State.DONE
    job.refresh_from_db()
    assert job.result["matches"] is True and job.progress == 1.0
    status = regulator.get(reverse("desk:job", args=[job.pk]), {"format": "json"}).json()
    assert status["state"] == "done"


def test_an_integrity_sweep_job_reports_the_ledger_intact(world, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False):
        job = job_start(Job.Kind.INTEGRITY_SWEEP, {}, "regulator")
    job_run(job.pk)
    job.refresh_from_db()
    assert job.result["intact"] is True and job.result["entries"] == Entry.objects.count()


def test_a_job_is_queued_after_commit_by_name_through_the_one_queueing_helper(
    world, settings, monkeypatch, django_capture_on_commit_callbacks
):
    settings.DESK_JOB_QUEUE = "desk-jobs"
    sent = []
    fake = type("App", (), {"send_task": lambda self, name, args, **options: sent.append((name, args, options))})()
    monkeypatch.setattr(queue, "current_app", fake)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        job = job_start(Job.Kind.INTEGRITY_SWEEP, {}, "regulator")
    assert sent == [] and len(callbacks) == 1  # nothing leaves before the row is committed
    callbacks[0]()
    assert sent == [(jobs.RUN_JOB, (job.pk,), {"queue": "desk-jobs"})]
    assert tasks.run_job.name == jobs.RUN_JOB


def test_the_detection_curve_of_a_campaign_crosses_its_target_at_the_planned_samples(world):
    campaign = selectors.figures()["open_campaigns"].data[0]
    found = selectors.detection_curves(campaign)
    assert found is not None and found["chips"] == campaign["provers"][found["prover"]]["chips"]
    for model, points in found["curves"].items():
        probabilities = [p for _, p in points]
        assert probabilities == sorted(probabilities) and probabilities[0] > 0 and probabilities[-1] <= 1
        planned = found["planned"][model]
        below = [p for s, p in points if s < planned - 1]
        at_or_above = [p for s, p in points if s >= planned]
        assert all(p < campaign["target"] for p in below), model
        assert all(p >= campaign["target"] for p in at_or_above), model
    impossible = {
        **campaign,
        "provers": {slug: {**row, "impossible": True} for slug, row in campaign["provers"].items()},
    }
    assert selectors.detection_curves(impossible) is None


def test_the_entry_index_is_kept_on_append_and_matches_its_rebuild(world):
    assert EntrySubject.objects.filter(subject="org:owner-a").exists()
    assert differences() == []
    EntrySubject.objects.filter(subject="org:owner-a").delete()
    assert any("org:owner-a" in line for line in differences())


def test_change_lists_export_as_csv_without_formulas(regulator):
    response = regulator.get("/admin/desk/export/registry/chip.csv", {"status": "installed"})
    lines = response.content.decode().splitlines()
    assert response.status_code == 200 and lines[0] == "serial,model,status,owner,possessor,facility,country"
    assert all(",installed," in line for line in lines[1:]) and len(lines) > 1
    crosstab = regulator.get(reverse("desk:crosstab"))
    assert crosstab.content.decode().splitlines()[0].startswith("prover,")
    assert any(line.startswith("owner-a,") for line in crosstab.content.decode().splitlines())
    today = timezone.localdate().isoformat()
    assert crosstab["Content-Disposition"] == f'attachment; filename="prover-by-country-{today}.csv"'


def test_a_csv_is_named_after_its_list_its_filters_and_the_day(regulator):
    """Filtered or not, on two days: never the same name; the cells are plain text (no HTML, no formula)."""
    today = timezone.localdate().isoformat()
    filtered = regulator.get(
        "/admin/desk/export/registry/chip.csv", {"owner": "owner-a", "status": "installed", "o": "2"}
    )
    assert filtered["Content-Disposition"] == f'attachment; filename="chips-owner-owner-a-status-installed-{today}.csv"'
    whole = regulator.get("/admin/desk/export/registry/chip.csv")
    assert whole["Content-Disposition"] == f'attachment; filename="chips-{today}.csv"'
    exact = regulator.get("/admin/desk/export/inspections/inspectiontask.csv", {"status__exact": "assigned"})
    assert exact["Content-Disposition"] == f'attachment; filename="inspection-tasks-status-assigned-{today}.csv"'
    odd = regulator.get("/admin/desk/export/registry/chip.csv", {"q": '../"x y"/..'})
    assert odd["Content-Disposition"] == f'attachment; filename="chips-q-x-y-{today}.csv"'
    rows = list(csv.reader(io.StringIO(filtered.content.decode())))
    assert len(rows) > 1 and all(row[2] == "installed" for row in rows[1:])
    assert not any("<" in cell or "href" in cell for row in rows for cell in row)


def test_link_columns_export_as_plain_text(regulator):
    lines = regulator.get("/admin/desk/export/registry/chip.csv").content.decode().splitlines()
    assert len(lines) > 1 and not any("<a " in line or "href" in line for line in lines)


@pytest.mark.parametrize(
    "value",
    ["=1+1", "+1", "-1", "@SUM(A1)", '\t=HYPERLINK("http://x")', "\r=1", "\n=1", " =1", "\uff1d1+1", "\t"],
)
def test_no_cell_starts_a_formula(value):
    from desk.exports import csv_cell as _csv_cell

    cell = _csv_cell(value)
    assert cell.startswith("'") and cell[1:] == value


def test_plain_cells_are_left_alone():
    from django.utils.html import format_html

    from desk.exports import csv_cell as _csv_cell

    assert _csv_cell("owner-a") == "owner-a" and _csv_cell(None) == "" and _csv_cell(3) == "3"
    assert _csv_cell(format_html('<a href="/x">{}</a>', "=evil & co")) == "'=evil & co"


def test_admin_lists_read_as_titles_and_engineering_units(regulator):
    html = regulator.get("/admin/registry/chipmodel/").content.decode()
    assert "989 TFLOP/s" in html and "80 GiB" in html
    assert "object (" not in regulator.get("/admin/inspections/alert/").content.decode()


def test_a_campaign_is_amended_on_its_page_and_the_auditor_may_not(client, world):
    from inspections.demo_campaign import DEMO_CAMPAIGN

    page = reverse("desk:campaign", args=[DEMO_CAMPAIGN])
    client.force_login(world["users"].get(username="auditor"))
    html = client.get(page).content.decode()
    assert 'id="next-draw"' in html and 'id="campaign-versions"' in html and 'id="amend-campaign"' not in html
    assert client.post(page, {"action": "stop", "stop-on": timezone.localdate().isoformat()}).status_code == 403
    client.force_login(world["users"].get(username="regulator-staff"))
    refused = client.post(page, {"action": "stop", "stop-on": "2020-01-01"})
    assert refused.status_code == 200 and "must not be in the past" in refused.content.decode()
    assert not Entry.objects.filter(kind="campaign.stopped").exists()
    response = client.post(page, {"action": "stop", "stop-on": timezone.localdate().isoformat()})
    assert response.status_code == 302 and Entry.objects.filter(kind="campaign.stopped").count() == 1


def test_the_campaign_list_reads_the_stored_plans_of_open_campaigns(regulator):
    figures_refresh()
    listing = regulator.get("/admin/inspections/campaign/").content.decode()
    live = selectors.stored_campaign_plans(Campaign.objects.get(slug="frontier-runs-2026").pk)
    assert live and all(escape(_plan_line(slug, row)) in listing for slug, row in live.items())
    stored = Figure.objects.get(name="open_campaigns")
    for campaign in stored.data:
        for row in campaign["provers"].values():
            row["chips"], row["impossible"] = 987654, True  # what the beat task counted, not what a request would
    stored.save()
    assert "987,654 chips" in regulator.get("/admin/inspections/campaign/").content.decode()
    Figure.objects.filter(name="open_campaigns").delete()
    assert "987,654 chips" not in regulator.get("/admin/inspections/campaign/").content.decode()


def test_an_owner_of_many_chips_gets_stored_counts_with_their_time(regulator, world, monkeypatch):
    owner = Chip.objects.values_list("owner__slug", flat=True).first()
    url = reverse("desk:organisation", args=[owner])
    total = Chip.objects.filter(owner__slug=owner).count()
    assert f">{total}</a></h2>" in regulator.get(url).content.decode()  # a small owner: counted now
    figures_refresh()
    stored = Figure.objects.get(name="owner_facility_status")
    stored.data[owner] = [["", "installed", 777777]]
    stored.save()
    assert "777777" not in regulator.get(url).content.decode()
    monkeypatch.setattr(selectors, "STORED_OWNER_ABOVE", total - 1)  # now it is a big owner
    page = regulator.get(url).content.decode()
    assert ">777777</a></h2>" in page and 'id="org-chips-as-of"' in page


def test_the_entry_index_names_the_task_and_campaign_an_entry_is_about():
    assert index.subjects("inspection.identity_checked", "body-nl", {"task": 7, "chip": "S1"}) == {
        "org:body-nl",
        "task:7",
    }
    assert "campaign:frontier" in index.subjects("campaign.seed_committed", "regulator", {"campaign": "frontier"})
    assert not any(s.startswith("task:") for s in index.subjects("x", "a", {"task": True}))  # a flag, not a task


def test_the_task_page_reads_identity_checks_through_the_entry_index(regulator, world):
    task = world["task"]
    body = task.inspection_body
    inspectors.task_accept(task, body)
    challenge = inspectors.identity_challenge_issue(task, body)
    inspectors.identity_answer_check(task, body, challenge.nonce, "A" * 86 + "==")
    page = regulator.get(reverse("desk:task", args=[task.pk])).content.decode()
    checked = EntrySubject.objects.get(subject=f"task:{task.pk}", kind="inspection.identity_checked").seq
    table = page[page.index('id="task-identity"') :].split("</table>")[0]
    assert f">#{checked}</a>" in table and "FAILED" in table


def test_migration_0004_adds_the_task_and_campaign_rows_of_entries_already_on_the_ledger(world):
    from django.apps import apps

    migration = importlib.import_module("desk.migrations.0004_entry_index_tasks_campaigns")
    expected = set(EntrySubject.objects.filter(subject__regex=r"^(task|campaign):").values_list("subject", "seq"))
    assert any(s.startswith("campaign:") for s, _ in expected)
    EntrySubject.objects.filter(subject__regex=r"^(task|campaign):").delete()  # a ledger indexed before 0004
    migration.add_rows(apps, None)
    migration.add_rows(apps, None)  # twice: nothing doubled
    assert (
        set(EntrySubject.objects.filter(subject__regex=r"^(task|campaign):").values_list("subject", "seq")) == expected
    )
    assert not differences()


def test_a_serial_prefix_search_lists_the_matching_chips_by_serial(regulator):
    serials = sorted(Chip.objects.values_list("serial", flat=True))
    prefix = serials[len(serials) // 2][:-1]
    expected = [s for s in serials if s.startswith(prefix)]
    page = regulator.get(reverse("admin:registry_chip_changelist"), {"q": prefix}).content.decode()
    listed = [s for s in re.findall(r'href="/admin/desk/chip/([^/"]+)/"', page)]
    assert listed == expected  # all of them, in serial order (the index walk from the prefix)
    found = search_selectors.search(prefix)["chips"]["rows"]
    assert [chip.serial for chip in found] == expected[: search_selectors.CHIP_PAGE]
