"""What a signed write may carry: its body is published on the ledger as it is, so a member the write does not
take is refused by name (no free text reaches the public ledger), a repeated member is refused (the stored body
would say two things), and a key must be one that can sign."""

import base64

import pytest
from nacl.signing import SigningKey

from ledger.models import Entry
from registry import signing
from registry.models import Chip, OrganisationKey
from tests.registry.factories import SignedClient, chip_model, fabricate, facility, organisation

pytestmark = pytest.mark.django_db


@pytest.fixture
def vendor():
    org, key = organisation("vendor-a", ["vendor", "fab"], "US")
    facility(org, "fab-us-1", kind="fab")
    return SignedClient(org, key)


def new_key() -> str:
    return base64.b64encode(bytes(SigningKey.generate().verify_key)).decode()


@pytest.mark.parametrize(
    "path, body, field",
    [
        ("/api/registry/facilities", {"slug": "wh-1", "kind": "warehouse", "country": "US", "note": "secret"}, "note"),
        ("/api/registry/keys", {"public_key": None, "label": "laptop of J. Doe"}, "label"),
        ("/api/registry/keys/revoke", {"key_id": "0" * 16, "why": "x"}, "why"),
        ("/api/inspections/claims", {"claims": [], "note": "secret"}, "note"),
    ],
)
def test_a_member_the_write_does_not_take_is_refused_by_name_and_written_nowhere(vendor, path, body, field):
    if body.get("public_key", "") is None:
        body = {**body, "public_key": new_key()}
    before = Entry.objects.count()
    answer = vendor.post(path, body)
    assert answer.status_code == 400, answer.json()
    assert list(answer.json()) == [field] and "unknown field" in answer.json()[field][0]
    assert Entry.objects.count() == before


def test_a_misspelt_member_is_named_with_the_one_it_probably_meant(vendor):
    answer = vendor.post("/api/inspections/claims", {"claim": [{"serial": "x"}]})
    assert answer.status_code == 400
    assert list(answer.json()) == ["claim"] and "did you mean 'claims'?" in answer.json()["claim"][0]


def test_a_facility_location_takes_no_control_characters(vendor):
    body = {"slug": "wh-l", "kind": "warehouse", "country": "US", "location": "12 Foo St\nfloor 3"}
    answer = vendor.post("/api/registry/facilities", body)
    assert answer.status_code == 400 and list(answer.json()) == ["location"]
    assert vendor.post("/api/registry/facilities", {**body, "location": "12 Foo St, floor 3"}).status_code == 201


def test_a_repeated_member_is_refused_by_name_and_changes_nothing(vendor):
    model = chip_model(vendor.org)
    first, second = fabricate(vendor.org, model, 2, "fab-us-1")
    raw = vendor.body({})[:-1] + f', "chips": ["{first}"], "chips": ["{second}"]}}'.encode()
    before = Entry.objects.count()
    answer = vendor.post("/api/registry/chips/events/package", raw=raw)
    assert answer.status_code == 400
    assert answer.json() == {"chips": ["the member appears twice in one object: give it once"]}
    assert Entry.objects.count() == before
    assert set(Chip.objects.values_list("status", flat=True)) == {"fabricated"}


def test_an_organisation_cannot_revoke_its_only_active_key(vendor):
    only = signing.key_id_for(bytes(vendor.key.verify_key))
    answer = vendor.post("/api/registry/keys/revoke", {"key_id": only})
    assert answer.status_code == 400 and "only active key" in answer.json()["key_id"][0]
    assert OrganisationKey.objects.get(key_id=only).revoked_seq is None
    assert vendor.post("/api/registry/keys", {"public_key": new_key()}).status_code == 201
    assert vendor.post("/api/registry/keys/revoke", {"key_id": only}).status_code == 201  # another key remains


@pytest.mark.parametrize(
    "public_key",
    [
        bytes(32),  # all zeros: a point of small order
        bytes([1]) + bytes(31),  # the neutral element
        bytes.fromhex("ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f"),  # order 2
        b"\xff" * 32,  # not on the curve
    ],
)
def test_a_key_that_cannot_sign_is_refused(vendor, public_key):
    answer = vendor.post("/api/registry/keys", {"public_key": base64.b64encode(public_key).decode()})
    assert answer.status_code == 400 and "not a usable Ed25519 public key" in answer.json()["public_key"][0]
    assert OrganisationKey.objects.filter(organisation=vendor.org).count() == 1
