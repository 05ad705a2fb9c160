"""Hostile input through the API: every case a 4xx naming the field, nothing written — never a 500."""

import json

import pytest
from rest_framework.test import APIClient

from ledger.models import Entry
from registry.models import Facility
from tests.registry.factories import SignedClient, chip_model, chip_public_key, facility, organisation

pytestmark = pytest.mark.django_db
DEEP = "[" * 20_000 + "]" * 20_000  # under the 64 KiB limit: the parser, not the size, refuses it


@pytest.fixture
def fab():
    org, key = organisation("fab-tw", ["fab"], "TW")
    facility(org, "fab-tw-1", kind="fab")
    chip_model(org)
    return SignedClient(org, key)


def chip(serial="SN-1", **change):
    return {"serial": serial, "model": "h100-sxm", "public_key": chip_public_key(), "facility": "fab-tw-1", **change}


@pytest.mark.parametrize(
    "path, body, field",
    [
        ("/api/registry/facilities", {"slug": 7, "kind": "warehouse", "country": "TW"}, "slug"),
        ("/api/registry/facilities", {"slug": ["a"], "kind": "warehouse", "country": "TW"}, "slug"),
        ("/api/registry/facilities", {"slug": "wh-1", "kind": "warehouse", "country": 31}, "country"),
        ("/api/registry/facilities", {"slug": "wh-1", "kind": {}, "country": "TW"}, "kind"),
        (
            "/api/registry/facilities",
            {"slug": "wh-1", "kind": "warehouse", "country": "TW", "location": "x" * 256},
            "location",
        ),
        (
            "/api/registry/facilities",
            {"slug": "wh-1", "kind": "warehouse", "country": "TW", "location": ["x"]},
            "location",
        ),
        (
            "/api/registry/facilities",
            {"slug": "wh-1", "kind": "warehouse", "country": "TW", "location": "a\x00b"},
            "location",
        ),
        ("/api/registry/chips/events/fabricate", {"chips": [chip(serial=["SN-1"])]}, "chips[0].serial"),
        ("/api/registry/chips/events/fabricate", {"chips": [chip(serial="SN-\x00")]}, "chips[0].serial"),
        ("/api/registry/chips/events/fabricate", {"chips": [chip(model=2**64)]}, "chips[0].model"),
        ("/api/registry/chips/events/ship", {"chips": [["SN-1"]], "consignee": "x", "reference": "r"}, "chips"),
        ("/api/registry/chips/events/ship", {"chips": ["SN-1"], "consignee": 5, "reference": "r"}, None),
        ("/api/registry/keys/revoke", {"key_id": {"a": 1}}, None),
    ],
)
def test_a_hostile_signed_body_is_a_400_naming_the_field(fab, path, body, field):
    before = Entry.objects.count()
    response = fab.post(path, body)
    assert response.status_code == 400, response.content
    if field:
        assert field in response.json(), response.json()
    assert Entry.objects.count() == before


@pytest.mark.parametrize(
    "raw, field",
    [
        (b'{"timestamp": 1e400, "nonce": "abcdefabcdef", "slug": "wh-1"}', "timestamp"),
        (b'{"timestamp": NaN, "nonce": "abcdefabcdef"}', "timestamp"),
        (b'{"timestamp": 1, "nonce": "abcdefabcdef", "x": ' + DEEP.encode() + b"}", "body"),
        (b'{"timestamp": 123456789012345678901234567890, "nonce": "abcdefabcdef"}', "timestamp"),
        (b'{"timestamp": 1, "nonce": "ab\\u0000cdefabcdef"}', "nonce"),
        (b"\xff\xfe\x00\x01", "body"),
    ],
)
def test_a_hostile_raw_body_is_a_400_naming_the_field(fab, raw, field):
    response = fab.post("/api/registry/facilities", raw=raw)
    assert response.status_code == 400 and field in response.json(), response.content


@pytest.mark.parametrize(
    "body",
    [DEEP, '{"checkpoint": "x", "cosignature": "y", "z": ' + DEEP + "}", '{"checkpoint": "a\\u0000"}'],
)
def test_the_anonymous_cosignature_endpoint_refuses_hostile_json_with_a_400(body):
    response = APIClient().post("/api/ledger/cosignatures", body, content_type="application/json")
    assert response.status_code == 400, response.content


def test_nul_in_a_path_or_query_is_a_400(fab):
    assert fab.api.get("/api/registry/chips/SN-%00").status_code == 400
    response = fab.api.get("/api/registry/chips", {"owner": "a\x00"})
    assert response.status_code == 400 and "owner" in response.json()


def test_a_duplicate_slug_is_named_even_when_its_check_is_raced(fab, monkeypatch):
    """The service checks first; the database's unique constraint is the net for a concurrent twin."""
    facility(fab.org, "wh-1", kind="warehouse")
    monkeypatch.setattr(Facility.objects, "filter", lambda **kw: Facility.objects.none())
    response = fab.post("/api/registry/facilities", {"slug": "wh-1", "kind": "warehouse", "country": "TW"})
    assert response.status_code == 409 and "slug" in response.json(), response.content


def test_json_parser_errors_name_the_field_on_drf_views(fab):
    response = fab.api.post(
        "/api/ledger/cosignatures", json.dumps({"checkpoint": 1e400}), content_type="application/json"
    )
    assert response.status_code == 400 and "checkpoint" in response.json()


@pytest.mark.parametrize(
    "path, body, field",
    [
        ("/api/registry/chips/events/fabricate", {"chips": [chip(public_key="é" * 44)]}, "chips[0].public_key"),
        ("/api/registry/keys", {"public_key": "é" * 44}, "public_key"),
    ],
)
def test_non_ascii_base64_is_a_400_naming_the_field(fab, path, body, field):
    """base64 of a non-ASCII string raises ValueError, not binascii.Error (found by the EPCIS property tests)."""
    before = Entry.objects.count()
    response = fab.post(path, body)
    assert response.status_code == 400 and field in response.json(), response.content
    assert Entry.objects.count() == before


def test_a_non_ascii_signature_header_is_refused_naming_the_signature(fab):
    response = fab.post("/api/registry/facilities", {"slug": "wh-1", "kind": "warehouse"}, signature="0" * 16 + ":é")
    assert response.status_code in (400, 403) and "signature" in response.json(), response.content
