"""Drill-down and stories on the desk: every dashboard figure opens the list behind it with the same count, the
organisation and chip pages tell their story, the ledger badge heads every page, jobs read as a person would."""

import html as html_lib
import re

import pytest
from django.conf import settings
from django.contrib import admin
from django.urls import reverse

from desk import tasks
from desk.models import Job
from desk.services.jobs import job_run
from inspections.models import InspectionBody
from ledger.services import append_entry
from registry.models import Chip, Organisation
from tests.desk.test_pages import inspected, mismatch  # noqa: F401  (fixtures)

pytestmark = pytest.mark.django_db
DRILL_TABLES = ("desk-plots", "desk-campaigns", "desk-tasks", "desk-verdicts", "desk-alerts", "desk-chip-status")
LINK = re.compile(r'<a (?:xlink:)?href="([^"]+)"[^>]*>\s*(?:<[^>]+>\s*)*([^<]*)')


def _section(page: str, element_id: str) -> str:
    start = page.index(f'id="{element_id}"')
    return page[start : page.index("</table>", start) if "<table" in page[start : start + 200] else None]


def _listed(page: str) -> int:
    """The count a change list states ("24 chips")."""
    return int(re.search(r'class="paginator">\s*(\d+)', page).group(1))


def test_every_dashboard_count_and_bar_opens_the_filtered_list_with_that_count(regulator, mismatch):  # noqa: F811
    page = regulator.get("/admin/").content.decode()
    checked = set()
    for element_id in DRILL_TABLES:
        section = page[page.index(f'id="{element_id}"') :].split("</table>")[0].split('<div class="desk-card"')[0]
        for url, shown in LINK.findall(section):
            url = html_lib.unescape(url)
            shown = "" if element_id == "desk-plots" else shown.strip()  # a bar carries no number
            if "?" not in url or "campaign=" in url.split("?")[1][:9]:
                continue  # the plot switch, not a list
            listed = regulator.get(url)
            assert listed.status_code == 200, url
            body = listed.content.decode()
            if shown.isdigit():  # a count: the list behind it holds exactly that many (a zero is not a link)
                assert int(shown) > 0 and _listed(body) == int(shown), url
            elif not shown:  # a bar (no number on it): a non-empty list
                assert 'id="result_list"' in body and _listed(body) > 0, url
            checked.add(url.split("?")[1].split("=")[0])
    # bars by country, owner and model; counts by chip status, task status, verdict, alert severity and state
    assert {"country", "owner", "model", "status", "result", "severity", "draw__campaign__id__exact"} <= checked


def test_campaign_names_open_the_campaign_page_and_runs_are_linked(regulator, mismatch):  # noqa: F811
    page = regulator.get("/admin/").content.decode()
    campaign = reverse("desk:campaign", args=["frontier-runs-2026"])
    assert f'class="campaign-link" href="{campaign}"' in page
    assert regulator.get(campaign).status_code == 200
    runs = reverse("admin:inspections_claim_runs")
    assert f'id="desk-runs" href="{runs}"' in page
    claim = regulator.get(reverse("desk:claim", args=[mismatch.pk])).content.decode()
    assert f'id="claim-runs" href="{runs}"' in claim
    assert "run-7" in regulator.get(runs).content.decode()


def test_a_missed_detection_target_is_flagged(regulator, world):
    from inspections.models import Campaign

    # rarer snapshots: one period's draw catches the run with less than the target
    Campaign.objects.update(detection_probability=0.999, snapshot_rate=0.001)
    from desk.services.figures import figures_refresh

    figures_refresh()
    page = regulator.get("/admin/").content.decode()
    campaigns = page[page.index('id="desk-campaigns"') :].split("</table>")[0]
    assert "below target" in campaigns and "desk-bad" in campaigns


def _serials(page: str) -> set[str]:
    return set(re.findall(r'href="/admin/desk/chip/([^/"]+)/"', page))


@pytest.mark.parametrize(
    "parameter, field",
    [
        ("owner", "owner__slug"),
        ("country", "country"),
        ("facility", "facility__slug"),
        ("model", "model__name"),
        ("status", "status"),
    ],
)
def test_chips_filter_by_owner_country_facility_model_and_status(regulator, world, parameter, field):
    value = Chip.objects.exclude(**{f"{field}__isnull": True}).exclude(**{field: ""}).values_list(field, flat=True)[0]
    page = regulator.get(reverse("admin:registry_chip_changelist"), {parameter: value}).content.decode()
    expected = set(Chip.objects.filter(**{field: value}).values_list("serial", flat=True))
    assert expected and _serials(page) == expected
    assert _serials(page) != set(Chip.objects.values_list("serial", flat=True))  # the filter did narrow the list


def test_the_organisation_page_tells_its_story(regulator, mismatch):  # noqa: F811
    prover = mismatch.prover
    page = regulator.get(reverse("desk:organisation", args=[prover.slug])).content.decode()
    chips = page[page.index('id="org-chips"') :].split("</table>")[0]
    assert f"?owner={prover.slug}&status=" in chips  # chips by facility and status, each a drill-down
    total = Chip.objects.filter(owner=prover).count()
    assert f">{total}</a></h2>" in page
    assert "overdue" in page[page.index('id="org-alerts"') :].split("</table>")[0]  # its open alert
    assert "mismatch: 1" in page[page.index('id="org-verdicts"') :].split("</p>")[0]
    assert reverse("desk:claim", args=[mismatch.pk]) in page
    assert reverse("desk:campaign", args=["frontier-runs-2026"]) in page
    keys = page[page.index('id="org-keys"') :].split("</table>")[0]
    assert prover.keys.first().key_id in keys and "in use" in keys
    entries = page[page.index('id="org-entries"') :].split("</table>")[0]
    assert "organisation registered" in entries and 'title="org.registered"' in entries
    # linked from wherever an organisation is shown: its list, a chip page, an alert, search
    listing = regulator.get(reverse("admin:registry_organisation_changelist")).content.decode()
    assert reverse("desk:organisation", args=[prover.slug]) in listing and "['owner']" not in listing
    chip = Chip.objects.filter(owner=prover).first()
    assert (
        reverse("desk:organisation", args=[prover.slug])
        in regulator.get(reverse("desk:chip", args=[chip.serial])).content.decode()
    )
    found = regulator.get(reverse("desk:search"), {"q": prover.slug}).content.decode()
    assert reverse("desk:organisation", args=[prover.slug]) in found
    old = regulator.get(reverse("admin:registry_organisation_change", args=[prover.pk]))
    assert old.status_code == 302 and old.url == reverse("desk:organisation", args=[prover.slug])
    assert regulator.get(reverse("desk:organisation", args=["no-such-org"])).status_code == 404


def test_an_alert_links_its_prover_chip_task_and_claims(regulator, world, mismatch):  # noqa: F811
    alert = world["alert"]
    page = regulator.get(reverse("desk:alert", args=[alert.pk])).content.decode()
    assert reverse("desk:task", args=[alert.task.pk]) in page[page.index('id="alert-task"') :]
    assert reverse("desk:claim", args=[mismatch.pk]) in page[page.index('id="alert-claims"') :]
    assert reverse("desk:organisation", args=[alert.prover.slug]) in page
    inbox = regulator.get(reverse("admin:inspections_alert_changelist")).content.decode()
    assert reverse("desk:chip", args=[alert.chip.serial]) in inbox


def test_a_chips_timeline_tells_its_whole_story(regulator, mismatch):  # noqa: F811
    page = regulator.get(reverse("desk:chip", args=[mismatch.snapshot.chip.serial])).content.decode()
    timeline = page[page.index('id="timeline"') :].split("</table>")[0]
    for kind in ("chip.fabricated", "campaign.drawn", "inspection.accepted", "inspection.identity_checked"):
        assert f'class="f-kind">{kind}<' in timeline, kind
    for kind in ("inspection.snapshot_log", "inspection.finding", "claim.submitted", "claim.verified", "alert.raised"):
        assert f'class="f-kind">{kind}<' in timeline, kind
    assert ">identity checked<" in timeline and ">claim verdict<" in timeline  # readable names


def test_the_ledger_badge_heads_every_desk_page_and_goes_stale(regulator, world):
    pages = ["/admin/", reverse("desk:chip", args=[world["task"].chip.serial]), "/admin/registry/chip/"]
    for url in pages:
        assert 'id="ledger-badge"' in regulator.get(url).content.decode(), url
    assert ">never swept<" in regulator.get("/admin/").content.decode()
    job = Job.objects.create(kind=Job.Kind.INTEGRITY_SWEEP, params={}, started_by="test")
    job_run(job.pk)
    badge = regulator.get("/admin/registry/chip/").content.decode()
    badge = badge[badge.index('id="ledger-badge"') :].split("</a>")[0]
    from ledger.selectors import ledger_size

    size = ledger_size()
    assert f"intact ({size} of {size} entries" in badge and 'data-stale="0"' in badge.split("badge-checkpoint")[0]
    append_entry("org.note", {"org": "owner-a"}, "system")  # the ledger grew past the sweep
    badge = regulator.get("/admin/").content.decode()
    badge = badge[badge.index('id="ledger-badge"') :].split("</a>")[0]
    assert f"({size} of {size + 1} entries" in badge and "stale" in badge and "ledger-warn" in badge


def test_beat_schedules_the_integrity_sweep_without_piling_up(world):
    entry = settings.CELERY_BEAT_SCHEDULE["desk-integrity-sweep"]
    assert entry["task"] == tasks.sweep_integrity.name
    first = tasks.sweep_integrity()
    assert Job.objects.get(pk=first).kind == Job.Kind.INTEGRITY_SWEEP
    assert tasks.sweep_integrity() is None  # one queued: the next beat starts none
    job_run(first)
    assert tasks.sweep_integrity() not in (None, first)


def test_a_job_page_reads_as_a_person_would(regulator, world):
    job = Job.objects.create(kind=Job.Kind.INTEGRITY_SWEEP, params={}, started_by="test")
    job_run(job.pk)
    page = regulator.get(reverse("desk:job", args=[job.pk])).content.decode()
    title = re.search(r"<h1>(.*?)</h1>", page, re.S).group(1)
    assert "(queued)" not in title and "Ledger integrity sweep" in title
    assert "the whole ledger" in page and "{}" not in page
    result = page[page.index('id="job-result"') :].split("</table>")[0]
    assert "ledger intact" in result and "<code>yes</code>" in result and "{&#x27;" not in page


def test_the_project_names_itself_and_speaks_plurals(regulator, world):
    page = regulator.get("/admin/registry/").content.decode()
    assert "chipledger" in page and "Django administration" not in page
    assert admin.site.site_title == "chipledger desk"
    assert str(InspectionBody._meta.verbose_name_plural) == "inspection bodies"
    assert Organisation.objects.exists()


def test_one_date_format_on_change_lists_and_desk_pages(regulator, world):
    alert = world["alert"]
    inbox = regulator.get(reverse("admin:inspections_alert_changelist")).content.decode()
    page = regulator.get(reverse("desk:alert", args=[alert.pk])).content.decode()
    from django.utils import timezone

    shown = timezone.localtime(alert.raised_at).strftime("%Y-%m-%d %H:%M")
    assert shown in inbox and shown in page
    assert not re.search(r"(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)\.? \d{1,2}, 20\d\d", inbox)


def test_the_facility_list_opens_each_facilitys_chips_and_owner(regulator, world):
    facility = Chip.objects.exclude(facility=None).select_related("facility__owner").first().facility
    listing = regulator.get(reverse("admin:registry_facility_changelist")).content.decode()
    chips = reverse("admin:registry_chip_changelist") + f"?facility={facility.slug}"
    assert chips in listing and reverse("desk:organisation", args=[facility.owner.slug]) in listing
    assert _serials(regulator.get(chips).content.decode()) == set(
        Chip.objects.filter(facility=facility).values_list("serial", flat=True)
    )


def test_an_overdue_task_stands_out_in_the_task_list(regulator, world):
    import datetime

    from inspections.models import InspectionTask

    url = reverse("admin:inspections_inspectiontask_changelist")
    assert "— overdue" not in regulator.get(url).content.decode()
    InspectionTask.objects.filter(pk=world["task"].pk).update(due_on=datetime.date(2020, 1, 1))
    listing = regulator.get(url, {"overdue": "yes"}).content.decode()
    assert "assigned — overdue" in listing and _listed(listing) == 1
    assert 'class="desk-bad"' in regulator.get("/admin/").content.decode()
