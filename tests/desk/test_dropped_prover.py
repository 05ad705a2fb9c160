"""A campaign amendment that drops a prover stays in the dropped organisation's history: the entry index files the
amendment under it, its page lists the campaign as one that no longer targets it, and the search finds it. Migration
desk 0005 adds such rows (and the ref:/hash: rows) to an upgraded deployment's index."""

import importlib

import pytest
from django.apps import apps
from django.contrib.auth import get_user_model
from django.db.models import Q
from django.urls import reverse
from django.utils import timezone

from desk import search_selectors
from desk.models import EntrySubject
from desk.rebuild_index import differences, reindex
from inspections.services import campaigns
from tests.inspections.factories import H100, YEAR, make_provers

pytestmark = pytest.mark.django_db


@pytest.fixture
def dropped():
    make_provers()
    campaign = campaigns.campaign_create(
        slug="c-drop", provers=["owner-a", "owner-b"], rule_flops=20 * H100 * YEAR, starts_on=timezone.now().date()
    )
    return campaigns.campaign_amend(campaign, provers=["owner-a"])


def test_the_dropped_provers_page_and_search_still_find_the_campaign(client, dropped):
    client.force_login(get_user_model().objects.create_superuser("reg", password="x"))
    page = client.get(reverse("desk:organisation", args=["owner-b"])).content.decode()
    campaigns_listed = page[page.index('id="org-campaigns"') :].split("</ul>")[0]
    assert "c-drop" in campaigns_listed and "no longer targets owner-b" in campaigns_listed
    kept = client.get(reverse("desk:organisation", args=["owner-a"])).content.decode()
    assert "no longer targets" not in kept[kept.index('id="org-campaigns"') :].split("</ul>")[0]
    found = search_selectors.search("owner-b")
    assert dropped.amended_seq in [e["seq"] for e in found["about"]]


def test_the_rebuilt_index_files_the_amendment_under_the_dropped_prover_too(dropped):
    assert differences() == []
    reindex()
    assert differences() == []
    found = search_selectors.search("owner-b")
    assert dropped.amended_seq in [e["seq"] for e in found["about"]]


def test_migration_0005_backfills_an_upgraded_ledgers_index_once(dropped):
    """A ledger indexed before ref:/hash: rows and dropped provers existed: the migration adds exactly the missing
    rows (the index then equals its rebuild), and running it again adds nothing."""
    migration = importlib.import_module("desk.migrations.0005_entry_index_refs_hashes_dropped_provers")
    full = EntrySubject.objects.count()
    old = EntrySubject.objects.filter(Q(subject__startswith="hash:") | Q(subject__startswith="ref:"))
    old.delete()
    EntrySubject.objects.filter(subject="org:owner-b", kind="campaign.amended").delete()
    assert differences() != []
    migration.add_rows(apps, None)
    assert differences() == [] and EntrySubject.objects.count() == full
    migration.add_rows(apps, None)
    assert EntrySubject.objects.count() == full
