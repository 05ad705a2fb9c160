"""A campaign's lifecycle: what creating one refuses, whom a country campaign targets, and amend / stop as
superseding ledger entries (the created entry is never edited; the rebuild and the draw audit follow them)."""

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from desk.models import EntrySubject
from desk.rebuild_index import differences as index_differences
from inspections.models import Campaign, Draw
from inspections.rebuild_inspections import differences, rebuild
from inspections.services import campaigns
from inspections.stored_draw_audit import audit_draw
from ledger.models import Entry
from rules import sampling_plans
from rules.inspection_planning import next_draw, plan_error_words, prover_plan
from tests.inspections.factories import H100, YEAR
from tests.registry.factories import chip_model, event, fabricate, facility, organisation

pytestmark = pytest.mark.django_db
RULE = 20 * H100 * YEAR


@pytest.fixture
def provers(inspections_provers):
    """The provers' world, seeded once per module (tests/inspections/conftest.py)."""


def create(**overrides) -> Campaign:
    params = {"slug": "c-2027", "provers": ["owner-a", "owner-b"], "rule_flops": RULE}
    return campaigns.campaign_create(**{"starts_on": timezone.now().date(), **params, **overrides})


def refused(field: str, **overrides) -> str:
    size = Entry.objects.count()
    with pytest.raises(ValidationError) as error:
        create(**overrides)
    assert field in error.value.message_dict, error.value.message_dict
    assert Entry.objects.count() == size
    return " ".join(error.value.message_dict[field])


def test_a_country_not_in_iso_3166_is_refused_naming_the_field(provers):
    assert "'XX' is not an ISO 3166-1 country code" in refused("country", provers=[], country="xx")
    assert create(provers=[], country="us").country == "US"


def test_a_campaign_is_never_backdated(provers):
    yesterday = timezone.now().date() - timedelta(days=1)
    says = refused("starts_on", starts_on=yesterday)
    assert "must not be in the past" in says and timezone.now().date().isoformat() in says
    assert create().starts_on == timezone.now().date()  # today is fine


def test_no_campaign_without_a_prover(provers):
    assert "no prover" in refused("country", provers=[], country="FR")  # nobody holds chips in France
    organisation("vendor-x", ["vendor"], "US")
    assert "not an owner/operator" in refused("provers", provers=["owner-a", "vendor-x"])
    assert "unknown" in refused("provers", provers=["nobody"])


def test_a_country_campaign_does_not_target_a_vendors_warehouse_stock(provers):
    """Chips a vendor holds in stock in the US (bought from the fab, not yet sold) are no prover's chips."""
    fab = organisation("fab-us", ["fab"], "US")[0]
    vendor = organisation("vendor-us", ["vendor"], "US")[0]
    facility(vendor, "wh-vendor-us", kind="warehouse")
    serials = fabricate(fab, chip_model(fab, "b200"), 30)
    event(fab, "shipped", serials, consignee="vendor-us", reference="PO-1")
    event(vendor, "received", serials, facility="wh-vendor-us")
    event(fab, "transfer_offered", serials, to_owner="vendor-us")
    event(vendor, "transfer_accepted", serials)
    campaign = create(provers=[], country="US")
    assert Entry.objects.get(seq=campaign.created_seq).payload["holders"] == "owners"
    draw = campaigns.campaign_draw(campaign, 0)
    drawn = Entry.objects.get(seq=draw.drawn_seq).payload
    assert sorted(drawn["provers"]) == ["owner-a"]  # not vendor-us, not fab-us
    assert audit_draw(campaign.slug, 0).matches


def test_amend_supersedes_the_entry_in_force_and_the_draws_follow_it(provers):
    campaign = create()
    created = Entry.objects.get(seq=campaign.created_seq)
    campaigns.campaign_draw(campaign, 0)
    first = campaigns.campaign_amend(campaign, detection_probability=0.99, provers=["owner-a"])
    amended = Entry.objects.get(kind="campaign.amended")
    assert amended.payload["supersedes"] == campaign.created_seq
    assert amended.payload["changed"] == ["detection_probability", "provers"]
    assert amended.payload["params"]["detection_probability"] == 0.99
    assert Entry.objects.get(seq=created.seq).payload == created.payload  # the created entry stands as it was
    assert first.amended_seq == amended.seq and first.detection_probability == 0.99
    assert list(first.provers.values_list("slug", flat=True)) == ["owner-a"]

    second = campaigns.campaign_amend(first, model="exact")
    assert Entry.objects.get(seq=second.amended_seq).payload["supersedes"] == amended.seq
    campaigns.campaign_draw(second, 1)
    drawn = Entry.objects.get(kind="campaign.drawn", payload__period=1).payload
    assert sorted(drawn["provers"]) == ["owner-a"]
    assert audit_draw(campaign.slug, 0).matches and audit_draw(campaign.slug, 1).matches  # each with its params
    assert differences(rebuild()) == []
    about_owner_a = EntrySubject.objects.filter(subject="org:owner-a", kind="campaign.amended").count()
    assert about_owner_a == 2
    # the amendment that dropped owner-b is in owner-b's history; the next one, which does not concern it, is not
    dropped = EntrySubject.objects.filter(subject="org:owner-b", kind="campaign.amended")
    assert list(dropped.values_list("seq", flat=True)) == [amended.seq]
    assert index_differences() == []


def test_amend_refuses_what_it_cannot_change(provers):
    campaign = create()
    for changes, field in (
        ({"detection_probability": 0.9}, "campaign"),  # nothing changes
        ({"starts_on": timezone.now().date()}, "starts_on"),
        ({"detection_probability": 1.5}, "detection_probability"),
        ({"ends_on": timezone.now().date() - timedelta(days=1)}, "ends_on"),
        ({"provers": []}, "provers"),
    ):
        with pytest.raises(ValidationError) as error:
            campaigns.campaign_amend(campaign, **changes)
        assert field in error.value.message_dict, (changes, error.value.message_dict)
    assert not Entry.objects.filter(kind="campaign.amended").exists()


def test_stop_supersedes_and_no_draw_follows(provers):
    today = timezone.now().date()
    campaign = create()
    with pytest.raises(ValidationError) as error:
        campaigns.campaign_stop(campaign, on=today - timedelta(days=1))
    assert "must not be in the past" in error.value.message_dict["on"][0]
    stopped = campaigns.campaign_stop(campaign)
    entry = Entry.objects.get(kind="campaign.stopped")
    assert entry.payload == {
        "campaign": "c-2027",
        "supersedes": campaign.created_seq,
        "ends_on": (today - timedelta(days=1)).isoformat(),
    }
    assert stopped.stopped_seq == entry.seq
    assert campaigns.campaigns_draw_due(today) == [] and not Draw.objects.exists()
    assert next_draw(stopped, today, set()) is None
    for act in (lambda: campaigns.campaign_stop(stopped), lambda: campaigns.campaign_amend(stopped, model="exact")):
        with pytest.raises(ValidationError, match="was stopped"):
            act()
    assert differences(rebuild()) == []


def test_the_next_draw_is_the_undrawn_period_or_the_next_ones_first_day(provers):
    campaign = create()
    today = timezone.now().date()
    assert next_draw(campaign, today, set()) == (0, today)  # due: beat draws it on its next run
    assert next_draw(campaign, today, {0}) == (1, today + timedelta(days=30))
    later = create(slug="later", starts_on=today + timedelta(days=10))
    assert next_draw(later, today, set()) == (0, today + timedelta(days=10))


def test_an_unattainable_target_is_explained_in_words():
    """A one-period run on 1 of 1 chips: inspecting it catches the run with 1 − e^(−3) ≈ 0.950 at most."""
    rule = sampling_plans.DEFAULT_FLOPS_PER_CHIP_SECOND * 86_400 * 30
    with pytest.raises(sampling_plans.UnattainableTarget) as error:
        sampling_plans.plan(rule, 1, p=0.999, exact=True, period_days=30, run_days=30)
    words = plan_error_words(error.value)
    assert words.startswith("the target 0.999 cannot be reached: even inspecting its only chip every period")
    assert "at most 0.950" not in words and "probability 0.950 at most" in words and "p=" not in words
    campaign = Campaign(
        rule_flops=rule, detection_probability=0.999, snapshot_rate=0.1, period_days=30, run_days=30, model="exact"
    )
    row = prover_plan(campaign, 1, None)
    assert row["exact"]["error"] == words
    assert row["paper"]["words"].startswith("its only chip each period (the model asks ")


def test_a_due_draw_uses_the_campaign_as_it_is_when_drawn_not_as_the_beat_read_it(provers):
    """The beat reads every campaign, then draws each in turn: one amended or stopped in between (a regulator at
    the desk while a long draw holds the ledger) is drawn with its parameters in force, or not at all."""
    amended, stopped = create(slug="c-amended"), create(slug="c-stopped")
    today = timezone.now().date()
    stale = {c.slug: Campaign.objects.get(pk=c.pk) for c in (amended, stopped)}  # what the beat's loop holds
    campaigns.campaign_amend(amended, detection_probability=0.99, model="exact")
    campaigns.campaign_stop(stopped)
    assert campaigns._draw_if_due(stale["c-amended"], today) == "c-amended:0"
    assert audit_draw("c-amended", 0).matches  # drawn with the amended parameters, which the audit applies
    assert campaigns._draw_if_due(stale["c-stopped"], today) is None
    assert not Draw.objects.filter(campaign=stopped).exists()
