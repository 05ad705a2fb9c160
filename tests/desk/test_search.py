"""The desk's search across everything: an entry by seq or hash, a key, chips by serial, owner, facility or
country (paged: an owner of 2,000 chips lists them all, page by page), organisations and facilities by name, city
or country, campaigns, references, alert kinds. Over the demo world (tests/desk/conftest.py)."""

import re

import pytest
from django.urls import reverse

from desk.rebuild_index import differences
from inspections.demo_campaign import DEMO_CAMPAIGN
from ledger import selectors as ledger
from registry.models import Chip, ChipModel, Organisation, OrganisationKey
from tests.registry.factories import fabricate

pytestmark = pytest.mark.django_db


def found(regulator, query: str, **params) -> str:
    response = regulator.get(reverse("desk:search"), {"q": query, **params})
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def section(html: str, element_id: str) -> str:
    match = re.search(rf'id="{element_id}">(.*?)</(ul|table|p)>', html, re.S)
    return match.group(1) if match else ""


def test_an_entry_by_seq_and_by_its_leaf_hash(regulator):
    seq = ledger.ledger_size() - 1
    leaf_hash = ledger.entry_leaf_hash(seq).hex()
    for query in (str(seq), f"#{seq}", leaf_hash, leaf_hash[:16].upper(), leaf_hash[:40]):
        assert f"#{seq}</a>" in section(found(regulator, query), "entry-results"), query
    wrong = leaf_hash[:16] + ("0" if leaf_hash[16] != "0" else "1")  # the index's 64 bits match, the rest do not
    assert section(found(regulator, wrong), "entry-results") == ""
    assert section(found(regulator, leaf_hash[:15]), "entry-results") == ""  # too short to be a hash


def test_a_key_by_its_id(regulator):
    key = OrganisationKey.objects.select_related("organisation").first()
    assert key.organisation.slug in section(found(regulator, key.key_id[:8]), "key-results")


def test_an_owner_of_two_thousand_chips_lists_them_page_by_page(regulator):
    owner = Organisation.objects.get(slug="fab-tw")
    fabricate(owner, ChipModel.objects.get(slug="h100-sxm"), 2000)
    total = Chip.objects.filter(owner=owner).count()
    assert total >= 2000
    first = found(regulator, "fab-tw")
    assert "Chips owned by fab-tw" in first and f"1–50 of {total}" in first
    assert len(re.findall(r'href="/admin/desk/chip/', section(first, "chip-results"))) == 50
    assert "?owner=fab-tw" in first  # the whole list, filtered, one click away
    last_page = (total + 49) // 50
    last = found(regulator, "fab-tw", page=last_page)
    shown = len(re.findall(r'href="/admin/desk/chip/', section(last, "chip-results")))
    assert shown == total - 50 * (last_page - 1) and 'id="chip-next"' not in last
    serials = set(Chip.objects.filter(owner=owner).order_by("serial").values_list("serial", flat=True)[50:100])
    assert serials == set(
        re.findall(r"/admin/desk/chip/([^/]+)/", section(found(regulator, "fab-tw", page=2), "chip-results"))
    )


def test_a_city_a_country_and_a_facility(regulator):
    city = found(regulator, "amsterdam")
    assert "dc-owner-b-ams" in section(city, "facility-results")
    country = found(regulator, "nl")
    assert "owner-b" in section(country, "organisation-results") and "vendor-b" in section(
        country, "organisation-results"
    )
    assert "wh-vendor-b-ams" in section(country, "facility-results") and "Chips in NL" in country
    in_nl = set(re.findall(r"/admin/desk/chip/([^/]+)/", section(country, "chip-results")))
    assert in_nl and in_nl <= set(Chip.objects.filter(country="NL").values_list("serial", flat=True))
    facility = found(regulator, "dc-owner-a-or")
    assert "Chips at dc-owner-a-or" in facility


def test_a_campaign_a_reference_and_an_alert_kind(regulator, world):
    assert DEMO_CAMPAIGN in section(found(regulator, DEMO_CAMPAIGN[:6]), "campaign-results")
    shipped = section(found(regulator, "SO-owner-b"), "reference-results")
    assert "shipped" in shipped or "exported" in shipped
    licence = section(found(regulator, "TW-MOEA-2026-vendor-a"), "reference-results")
    assert "exported" in licence
    for query in ("overdue", "Overdue"):
        html = found(regulator, query)
        assert f"overdue #{world['alert'].pk}" in section(html, "alert-results") and "?kind=overdue" in html


def test_a_serial_still_opens_its_chip_and_bad_input_is_no_error(regulator):
    chip = Chip.objects.order_by("serial").first()
    assert regulator.get(reverse("desk:search"), {"q": chip.serial}).url == reverse("desk:chip", args=[chip.serial])
    for query, page in (("", "1"), ("%", "x"), ("'; drop", "-1"), ("9" * 40, "99999999")):
        assert regulator.get(reverse("desk:search"), {"q": query, "page": page}).status_code == 200


def test_the_index_behind_it_is_rebuilt_from_the_ledger_alone(world):
    assert differences() == []
