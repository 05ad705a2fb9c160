"""Campaigns: commit–draw–reveal on the ledger, assignment by region and capacity, audit from the ledger."""

import base64
import io
from datetime import date, timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from inspections.models import Alert, CampaignSeed, Draw, InspectionTask
from inspections.services import campaigns
from inspections.stored_draw_audit import audit_draw
from inspections.tasks import draw_due_campaigns
from ledger import services as ledger_services
from ledger.models import Entry
from registry.models import Chip
from rules import draw_ranking
from rules.inspection_planning import campaign_period
from tests.inspections.factories import H100, YEAR
from tests.registry.factories import event

pytestmark = pytest.mark.django_db


@pytest.fixture
def provers(inspections_provers):
    """The provers' world, seeded once per module (tests/inspections/conftest.py)."""


def campaign(**overrides):
    params = {
        "slug": "frontier-2026",
        "provers": ["owner-a", "owner-b"],
        "rule_flops": 20 * H100 * YEAR,
        "starts_on": timezone.now().date(),
    }
    return campaigns.campaign_create(**{**params, **overrides})


def test_the_seed_is_committed_before_and_revealed_only_after_the_draw(provers):
    camp = campaign()
    seed = CampaignSeed.objects.get(campaign=camp, period=0)
    committed = Entry.objects.get(kind="campaign.seed_committed")
    assert committed.payload["commitment"] == draw_ranking.commitment(bytes(seed.seed))
    assert not Entry.objects.filter(payload__seed=bytes(seed.seed).hex()).exists()  # secret until the draw
    draw = campaigns.campaign_draw(camp, 0)
    drawn = Entry.objects.get(seq=draw.drawn_seq)
    assert drawn.payload["seed"] == bytes(seed.seed).hex()
    assert committed.seq < draw.checkpoint_size <= drawn.seq
    assert CampaignSeed.objects.filter(campaign=camp, period=1).exists()  # next period already committed


def test_draw_samples_each_prover_by_its_plan_and_assigns_by_country_and_capacity(provers):
    draw = campaigns.campaign_draw(campaign(), 0)
    sampled = Entry.objects.get(seq=draw.drawn_seq).payload["provers"]
    assert sampled["owner-a"]["chips"] == 200 and sampled["owner-b"]["chips"] == 50
    tasks = InspectionTask.objects.filter(draw=draw).select_related("chip", "inspection_body", "prover")
    assert tasks.count() == sampled["owner-a"]["samples"] + sampled["owner-b"]["samples"] > 0
    for task in tasks:
        assert task.chip.owner == task.prover
        if task.inspection_body:
            assert task.chip.country in task.inspection_body.inspection_profile.countries
    us = [t for t in tasks if t.prover.slug == "owner-a"]
    per_body = {
        slug: sum(1 for t in us if t.inspection_body and t.inspection_body.slug == slug)
        for slug in ("inspect-us", "inspect-us-2")
    }
    assert per_body["inspect-us"] <= 3 and per_body["inspect-us-2"] <= 1
    assert sum(1 for t in us if t.inspection_body is None) == max(0, len(us) - 4)  # over capacity: unassigned


def test_an_impossible_run_draws_nothing(provers):
    draw = campaigns.campaign_draw(campaign(rule_flops=10_000 * H100 * YEAR), 0)
    sampled = Entry.objects.get(seq=draw.drawn_seq).payload["provers"]
    assert sampled["owner-a"]["samples"] == 0 and sampled["owner-a"]["chips_needed"] > 200


def test_a_country_campaign_targets_every_holder_there(provers):
    draw = campaigns.campaign_draw(campaign(provers=[], country="NL"), 0)
    assert list(Entry.objects.get(seq=draw.drawn_seq).payload["provers"]) == ["owner-b"]


def test_audit_recomputes_the_draw_from_the_ledger(provers):
    camp = campaign()
    campaigns.campaign_draw(camp, 0)
    chip = Chip.objects.filter(owner__slug="owner-a").select_related("owner").first()
    event(chip.owner, "reported_lost", [chip.serial])  # what happens after the draw does not change it
    out = io.StringIO()
    call_command("audit_draw", "frontier-2026", "0", stdout=out)
    assert out.getvalue().startswith("MATCH campaign=frontier-2026 period=0 provers=2")


def test_audit_catches_a_draw_that_is_not_the_recomputation(provers):
    camp = campaign()
    real = Entry.objects.get(seq=campaigns.campaign_draw(camp, 0).drawn_seq).payload
    seed = draw_ranking.new_seed()
    ledger_services.append_entry(
        "campaign.seed_committed",
        {"campaign": camp.slug, "period": 9, "commitment": draw_ranking.commitment(seed)},
        "regulator",
    )
    checkpoint = ledger_services.checkpoint_sign()
    forged = {
        **real,
        "period": 9,
        "seed": seed.hex(),
        "checkpoint": {"size": checkpoint.size, "root": base64.b64encode(bytes(checkpoint.root)).decode()},
    }
    ledger_services.append_entry("campaign.drawn", forged, "regulator")  # the old sample, a new seed: a cherry-pick
    audit = audit_draw(camp.slug, 9)
    assert not audit.matches and any("differs" in problem for problem in audit.problems)
    with pytest.raises(SystemExit) as exit_:
        call_command("audit_draw", camp.slug, "9", stderr=io.StringIO())
    assert exit_.value.code == 1


def test_audit_catches_a_seed_that_does_not_match_its_commitment(provers):
    camp = campaign()
    ledger_services.append_entry(
        "campaign.seed_committed",
        {"campaign": camp.slug, "period": 7, "commitment": draw_ranking.commitment(b"x" * 32)},
        "regulator",
    )
    checkpoint = ledger_services.checkpoint_sign()
    ledger_services.append_entry(
        "campaign.drawn",
        {
            "campaign": camp.slug,
            "period": 7,
            "seed": (b"y" * 32).hex(),
            "provers": {},
            "assignments": {},
            "checkpoint": {"size": checkpoint.size, "root": base64.b64encode(bytes(checkpoint.root)).decode()},
        },
        "regulator",
    )
    assert any("commitment" in problem for problem in audit_draw(camp.slug, 7).problems)


def test_beat_task_draws_each_due_period_once(provers):
    started = timezone.now().date() - timedelta(days=45)
    campaign(starts_on=started, today=started)  # created 45 days ago: now in period 1
    assert draw_due_campaigns() == ["frontier-2026:1"]
    assert draw_due_campaigns() == []
    assert Draw.objects.get().period == 1


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"provers": [], "country": ""}, "provers"),
        ({"provers": ["nobody"]}, "provers"),
        ({"rule_flops": 0}, "rule_flops"),
        ({"detection_probability": 1.0}, "detection_probability"),
        ({"period_days": 400}, "period_days"),
        ({"rule_flops": 1e40}, "rule_flops"),  # a typo for 1e26: needs more than 2^53 - 1 chips, not representable
        ({"rule_flops": float("nan")}, "rule_flops"),
        ({"rule_flops": "1e26"}, "rule_flops"),
        ({"snapshot_rate": 0}, "snapshot_rate"),
        ({"snapshot_rate": -1}, "snapshot_rate"),
        ({"snapshot_rate": float("inf")}, "snapshot_rate"),
        ({"ends_on": date(2000, 1, 1)}, "ends_on"),
        ({"period_days": 2**31, "run_days": 2**31}, "period_days"),
        ({"run_days": 2**31}, "run_days"),
        ({"period_days": True}, "period_days"),
        ({"starts_on": date(9999, 12, 1)}, "starts_on"),
    ],
)
def test_bad_campaigns_are_refused_and_write_nothing(provers, overrides, field):
    from django.core.exceptions import ValidationError

    size = Entry.objects.count()
    with pytest.raises(ValidationError) as error:
        campaign(**overrides)
    assert field in error.value.message_dict and Entry.objects.count() == size


def test_one_failing_campaign_raises_an_alert_and_the_others_still_draw(provers, monkeypatch):
    started = timezone.now().date() - timedelta(days=45)
    broken = campaign(slug="a-broken", starts_on=started, today=started)  # created 45 days ago
    campaign(slug="b-healthy", starts_on=started, today=started)
    real = campaigns.campaign_draw

    def failing(camp, period, *args, **kwargs):
        if camp.slug == "a-broken":
            real(camp, period, *args, **kwargs)  # writes its entries, then fails: all of it must roll back
            raise RuntimeError("disk on fire")
        return real(camp, period, *args, **kwargs)

    monkeypatch.setattr(campaigns, "campaign_draw", failing)
    assert draw_due_campaigns() == ["b-healthy:1"]
    assert not Draw.objects.filter(campaign=broken).exists()
    assert not Entry.objects.filter(kind="campaign.drawn", payload__campaign="a-broken").exists()
    alert = Alert.objects.get(kind="draw_failed")
    assert alert.detail == "campaign a-broken: the due draw failed (RuntimeError: disk on fire)"
    assert draw_due_campaigns() == [] and Alert.objects.filter(kind="draw_failed").count() == 1  # not re-raised


def test_an_unrepresentable_plan_of_an_old_campaign_is_recorded_not_a_crash(provers):
    """H = 1e40 accepted before the planner's check: the draw records the plan error, later campaigns still draw."""
    started = timezone.now().date() - timedelta(days=45)
    broken = campaign(slug="a-typo", starts_on=started, today=started)
    campaign(slug="b-healthy", starts_on=started, today=started)
    type(broken).objects.filter(pk=broken.pk).update(rule_flops=1e40)
    assert draw_due_campaigns() == ["a-typo:1", "b-healthy:1"]
    drawn = Entry.objects.get(kind="campaign.drawn", payload__campaign="a-typo").payload
    assert all("not representable" in sample["plan_error"] for sample in drawn["provers"].values())


def test_a_period_is_drawn_once(provers):
    from django.core.exceptions import ValidationError

    camp = campaign()
    campaigns.campaign_draw(camp, 0)
    with pytest.raises(ValidationError):
        campaigns.campaign_draw(camp, 0)
    with pytest.raises(ValidationError):
        campaigns.campaign_draw(camp, 5)  # no seed committed for it
    assert campaign_period(camp, camp.starts_on - timedelta(days=1)) is None
    assert campaign_period(camp, date.fromordinal(camp.starts_on.toordinal() + 61)) == 2


def test_a_missed_period_is_committed_first_and_drawn_on_the_next_run(provers):
    started = timezone.now().date() - timedelta(days=70)
    camp = campaign(starts_on=started, today=started)  # started 70 days ago, created in period 2
    CampaignSeed.objects.filter(campaign=camp).delete()  # as if nothing was ever committed
    assert draw_due_campaigns() == []  # commits period 2's seed
    assert CampaignSeed.objects.filter(campaign=camp, period=2).exists() and not Draw.objects.exists()
    assert draw_due_campaigns() == ["frontier-2026:2"]


def test_the_database_ranks_chips_exactly_as_the_python_reference(provers):
    """On PostgreSQL the draw ranks inside the database (pgcrypto); it must equal draw_ranking.draw."""
    from inspections.services.campaigns import _ranked_in_database
    from registry.models import Organisation
    from rules.inspection_planning import ELIGIBLE

    owner = Organisation.objects.get(slug="owner-a")
    serials = list(Chip.objects.filter(owner=owner, status__in=ELIGIBLE).values_list("serial", flat=True))
    for k in (1, 7, 200):
        seed, root = draw_ranking.new_seed(), draw_ranking.new_seed()
        assert _ranked_in_database(owner, seed, root, "camp-x", k) == draw_ranking.draw(
            seed, root, "camp-x", serials, k
        )


def test_inspectors_get_one_email_per_body_listing_their_chips(
    provers, mailoutbox, django_capture_on_commit_callbacks, django_assert_max_num_queries
):
    """The notice is a row written with the draw and mailed by the worker (so a lost message is re-sent by the
    notice sweep); only bodies with members who have an email get one."""
    from django.conf import settings
    from django.contrib.auth import get_user_model

    from inspections.models import AlertNotification
    from inspections.services import notifications
    from inspections.tasks import deliver_alert_notice
    from registry import services as registry
    from registry.models import Organisation

    user = get_user_model().objects.create_user("eu-inspector", email="eu@inspect.example")
    registry.member_add(user, Organisation.objects.get(slug="inspect-eu"))
    with django_capture_on_commit_callbacks(execute=False) as queued:
        draw = campaigns.campaign_draw(campaign(), 0)
    (notice,) = AlertNotification.objects.filter(draw=draw)
    assert (notice.inspection_body.slug, notice.target, notice.state, notice.alert) == (
        "inspect-eu",
        "eu@inspect.example",
        "queued",
        None,
    )
    assert len(queued) >= 1 and mailoutbox == []  # nothing is mailed inside the draw
    with django_capture_on_commit_callbacks(execute=False) as resent:  # its message lost: the sweep re-sends it
        late = timezone.now() + timedelta(seconds=settings.ALERT_NOTIFY_SWEEP_GRACE + 1)
        assert notifications.notices_resend(late) == {"resent": 1, "failed": 0}
    assert len(resent) == 1
    # the take, one query for the notice, one for the tasks with chips and facilities, one for the members, the save
    with django_assert_max_num_queries(6):
        assert deliver_alert_notice.apply(args=[notice.pk]).get() is True
    assert len(mailoutbox) == 1 and mailoutbox[0].to == ["eu@inspect.example"]
    tasks = InspectionTask.objects.filter(draw=draw, inspection_body__slug="inspect-eu").select_related("chip")
    assert tasks.exists()
    for task in tasks:
        assert f"{task.chip.serial} at dc-owner-b" in mailoutbox[0].body
    assert deliver_alert_notice.apply(args=[notice.pk]).get() is True and len(mailoutbox) == 1  # once


def test_the_campaign_normalises_and_checks_its_country(provers):
    camp = campaign(provers=[], country=" nl ")
    assert camp.country == "NL" and Entry.objects.get(kind="campaign.created").payload["country"] == "NL"
    from django.core.exceptions import ValidationError

    for bad in ("NLD", "N", "1L", "NL\nX"):
        with pytest.raises(ValidationError) as error:
            campaign(slug="bad", provers=[], country=bad)
        assert "country" in error.value.message_dict


def test_the_campaign_records_its_sampling_model_and_draws_by_it(provers):
    from django.core.exceptions import ValidationError

    assert campaign().model == "paper"
    assert Entry.objects.get(kind="campaign.created", payload__slug="frontier-2026").payload["model"] == "paper"
    with pytest.raises(ValidationError) as error:
        campaign(slug="bad", model="binomial")
    assert "model" in error.value.message_dict
    # one 365-day period, p = 0.999, a run on 10 H100s: the paper asks for 135 of owner-a's 200, the exact plan 91
    params = {"rule_flops": 10 * H100 * YEAR, "period_days": 365, "detection_probability": 0.999}
    samples = {}
    for model in ("paper", "exact"):
        camp = campaign(slug=f"{model}-2026", model=model, **params)
        assert Entry.objects.get(kind="campaign.created", payload__slug=camp.slug).payload["model"] == model
        drawn = Entry.objects.get(seq=campaigns.campaign_draw(camp, 0).drawn_seq).payload["provers"]
        samples[model] = drawn["owner-a"]["samples"], drawn["owner-b"]["samples"]
        assert audit_draw(camp.slug, 0).matches
    assert samples == {"paper": (135, 31), "exact": (91, 21)}
