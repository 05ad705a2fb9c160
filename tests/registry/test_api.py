"""The vendor/owner API: signatures, replay protection, idempotency, bulk all-or-nothing, permissions."""

import base64
import time

import pytest
from nacl.signing import SigningKey

from ledger import selectors as ledger_selectors
from ledger import services as ledger_services
from ledger.models import Entry
from registry import signing
from registry.models import ApiNonce, Chip, ChipEvent
from rules.identifiers import MAX_CHIPS
from tests.registry.factories import (
    SignedClient,
    chip_model,
    chip_public_key,
    event,
    fabricate,
    facility,
    new_serials,
    organisation,
)
from tlog import merkle

pytestmark = pytest.mark.django_db
EVENTS = "/api/registry/chips/events/"


@pytest.fixture
def world():
    fab, fab_key = organisation("fab-tw", ["fab"], "TW")
    vendor_a, key_a = organisation("vendor-a", ["vendor"], "US")
    vendor_b, key_b = organisation("vendor-b", ["vendor"], "US")
    owner_a, owner_key = organisation("owner-a", ["owner"], "US")
    regulator, regulator_key = organisation("regulator", ["regulator"], "US")
    facility(owner_a, "dc-owner-a")
    facility(vendor_a, "wh-vendor-a", kind="warehouse")
    facility(fab, "fab-tw-1", kind="fab")
    model = chip_model(vendor_a)
    return {
        "fab": SignedClient(fab, fab_key),
        "vendor_a": SignedClient(vendor_a, key_a),
        "vendor_b": SignedClient(vendor_b, key_b),
        "owner_a": SignedClient(owner_a, owner_key),
        "regulator": SignedClient(regulator, regulator_key),
        "model": model,
    }


def fab_body(model, count=3):
    return {
        "chips": [
            {"serial": s, "model": model.slug, "public_key": chip_public_key(), "facility": "fab-tw-1"}
            for s in new_serials(count)
        ]
    }


def vendor_stock(world, count=3) -> list[str]:
    """Chips fabricated, exported from TW to vendor A and received: vendor A holds them, the fab owns them."""
    fab = world["fab"].org
    serials = fabricate(fab, world["model"], count, "fab-tw-1")
    event(fab, "exported", serials, consignee="vendor-a", reference="PO-1", export_licence="TW-EL-1")
    event(world["vendor_a"].org, "received", serials, facility="wh-vendor-a")
    return serials


def test_fabricate_through_the_api_lands_on_the_ledger_with_the_signed_body(world):
    client = world["fab"]
    body = client.body(fab_body(world["model"]))
    response = client.post(EVENTS + "fabricate", raw=body)
    assert response.status_code == 201, response.content
    entry = Entry.objects.get(seq=response.json()["seq"])
    assert entry.kind == "chip.fabricated" and entry.actor == "fab-tw"
    leaf_submission = __import__("json").loads(bytes(entry.leaf))["submission"]
    assert base64.b64decode(leaf_submission["body"]) == body
    SigningKey(client.key.encode()).verify_key.verify(body, base64.b64decode(leaf_submission["sig"]))
    assert Chip.objects.filter(fab__slug="fab-tw", status="fabricated").count() == 3


def test_only_a_fab_fabricates(world):
    response = world["vendor_a"].post(EVENTS + "fabricate", fab_body(world["model"]))
    assert response.status_code == 400 and "organisation" in response.json()


@pytest.mark.parametrize("breakage", ["other_orgs_key", "tampered_body", "garbage_header", "no_header"])
def test_bad_signatures_are_refused_and_change_nothing(world, breakage):
    client = world["fab"]
    body = client.body(fab_body(world["model"]))
    size = ledger_selectors.ledger_size()
    if breakage == "other_orgs_key":
        response = client.post(EVENTS + "fabricate", raw=body, key=world["vendor_a"].key)
    elif breakage == "tampered_body":
        from registry import signing

        header = signing.sign(client.key, body)
        response = client.post(EVENTS + "fabricate", raw=body.replace(b'"chips"', b'"chips" '), signature=header)
    elif breakage == "garbage_header":
        response = client.post(EVENTS + "fabricate", raw=body, signature="nonsense")
    else:
        response = client.api.post(EVENTS + "fabricate", body, content_type="application/json")
    assert response.status_code == 403 and "signature" in response.json(), response.content
    assert ledger_selectors.ledger_size() == size and Chip.objects.count() == 0


def test_revoked_key_signs_nothing_after_revocation(world):
    client = world["fab"]
    spare = SigningKey.generate()
    assert (
        client.post(
            "/api/registry/keys", {"public_key": base64.b64encode(bytes(spare.verify_key)).decode()}
        ).status_code
        == 201
    )
    assert client.post(EVENTS + "fabricate", fab_body(world["model"], 1), key=spare).status_code == 201
    from registry.signing import key_id_for

    assert client.post("/api/registry/keys/revoke", {"key_id": key_id_for(bytes(spare.verify_key))}).status_code == 201
    response = client.post(EVENTS + "fabricate", fab_body(world["model"], 1), key=spare)
    assert response.status_code == 403 and "revoked" in response.json()["signature"][0]


def test_replayed_request_is_refused(world):
    client = world["fab"]
    body = client.body(fab_body(world["model"]))
    assert client.post(EVENTS + "fabricate", raw=body).status_code == 201
    size = ledger_selectors.ledger_size()
    replay = client.post(EVENTS + "fabricate", raw=body)
    assert replay.status_code == 403 and "nonce" in replay.json()
    assert ledger_selectors.ledger_size() == size


def test_stale_timestamp_is_refused(world):
    response = world["fab"].post(EVENTS + "fabricate", fab_body(world["model"]), timestamp=1_000_000_000)
    assert response.status_code == 403 and "timestamp" in response.json()
    reason = response.json()["timestamp"][0]
    assert "behind the server's clock" in reason and "Unix seconds" in reason and "milliseconds" not in reason


def test_a_millisecond_timestamp_is_named_as_such_with_the_servers_time(world):
    now = int(time.time())
    response = world["fab"].post(EVENTS + "fabricate", fab_body(world["model"]), timestamp=now * 1000)
    assert response.status_code == 403
    reason = response.json()["timestamp"][0]
    assert "ahead of the server's clock" in reason and "looks like milliseconds" in reason
    server_time = int(reason.split("(")[1].split()[0])
    assert abs(server_time - now) <= 5


def test_idempotency_key_returns_the_first_answer_without_a_second_entry(world):
    client = world["fab"]
    body = client.body(fab_body(world["model"]))
    first = client.post(EVENTS + "fabricate", raw=body, idempotency_key="batch-42")
    size = ledger_selectors.ledger_size()
    again = client.post(EVENTS + "fabricate", raw=body, idempotency_key="batch-42")
    assert (again.status_code, again.json()) == (first.status_code, first.json())
    assert ledger_selectors.ledger_size() == size
    other = client.post(EVENTS + "fabricate", fab_body(world["model"]), idempotency_key="batch-42")
    assert other.status_code == 409 and ledger_selectors.ledger_size() == size


def test_a_refused_request_spends_its_nonce_so_it_cannot_be_replayed_once_it_would_pass(world):
    client = world["fab"]
    bad = fab_body(world["model"])
    missing_model = bad["chips"][1]["model"] = "later-model"
    body = client.body(bad, nonce="n" * 20)
    assert client.post(EVENTS + "fabricate", raw=body).status_code == 400
    assert ApiNonce.objects.filter(nonce="n" * 20).exists()
    chip_model(world["fab"].org, missing_model)  # now the captured request would be accepted
    replay = client.post(EVENTS + "fabricate", raw=body)
    assert replay.status_code == 403 and "nonce" in replay.json()
    assert Chip.objects.count() == 0


def test_a_badly_signed_request_spends_no_nonce(world):
    client = world["fab"]
    body = client.body(fab_body(world["model"]), nonce="m" * 20)
    assert client.post(EVENTS + "fabricate", raw=body, key=SigningKey.generate()).status_code == 403
    assert not ApiNonce.objects.filter(nonce="m" * 20).exists()
    assert client.post(EVENTS + "fabricate", raw=body).status_code == 201


def test_the_signature_is_checked_before_the_idempotency_answer(world):
    client = world["fab"]
    body = client.body(fab_body(world["model"]))
    assert client.post(EVENTS + "fabricate", raw=body, idempotency_key="k-1").status_code == 201
    unsigned = client.post(EVENTS + "fabricate", raw=body, idempotency_key="k-1", signature="junk")
    assert unsigned.status_code == 403 and "seq" not in unsigned.json()
    forged = client.post(EVENTS + "fabricate", raw=body, idempotency_key="k-1", key=SigningKey.generate())
    assert forged.status_code == 403 and "seq" not in forged.json()


def test_a_retried_refusal_gets_the_same_answer(world):
    client = world["fab"]
    bad = fab_body(world["model"])
    bad["chips"][0]["model"] = "no-such-model"
    body = client.body(bad)
    first = client.post(EVENTS + "fabricate", raw=body, idempotency_key="k-2")
    again = client.post(EVENTS + "fabricate", raw=body, idempotency_key="k-2")
    assert first.status_code == again.status_code == 400
    assert first.json() == again.json() and "chips[0]" in again.json()


def test_a_retry_racing_its_first_request_gets_409_then_the_first_answer(world):
    """The race: the first request has spent the nonce but not yet answered; the retry must never get 403."""
    from registry import services

    client = world["fab"]
    body = client.body(fab_body(world["model"]))
    import json

    signed = services.signed_body_check(
        client.org, signing.sign(client.key, body), body, json.loads(body)
    )  # what the first request did so far
    services.signed_nonce_consume(client.org, signed)
    racing = client.post(EVENTS + "fabricate", raw=body, idempotency_key="k-3")
    assert racing.status_code == 409 and "in progress" in racing.json()["detail"]
    services.idempotent_answer_record(client.org, "k-3", body, 201, {"seq": 99, "kind": "chip.fabricated"})
    late = client.post(EVENTS + "fabricate", raw=body, idempotency_key="k-3")
    assert (late.status_code, late.json()) == (201, {"seq": 99, "kind": "chip.fabricated"})


def test_bulk_is_all_or_nothing_with_per_item_errors(world):
    client = world["fab"]
    body = fab_body(world["model"], 5)
    taken = fabricate(world["fab"].org, world["model"], 1)[0]
    body["chips"][1]["serial"] = taken
    body["chips"][3]["public_key"] = "short"
    response = client.post(EVENTS + "fabricate", body)
    assert response.status_code == 400
    assert "chips[3].public_key" in response.json()
    key = chip_public_key()  # the same 32 bytes in a second spelling (a spare bit set): the ledger keeps the text
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    body["chips"][3]["public_key"] = key[:-2] + alphabet[alphabet.index(key[-2]) | 1] + key[-1]
    response = client.post(EVENTS + "fabricate", body)
    assert response.status_code == 400 and "canonical" in str(response.json()["chips[3].public_key"])
    body["chips"][3]["public_key"] = key
    response = client.post(EVENTS + "fabricate", body)
    assert response.status_code == 400 and list(response.json()) == ["chips[1]"]
    assert Chip.objects.count() == 1


def test_max_chips_in_one_request_and_not_one_more(world):
    client = world["fab"]
    too_many = client.post(EVENTS + "fabricate", fab_body(world["model"], MAX_CHIPS + 1))
    assert too_many.status_code == 400 and f"1 to {MAX_CHIPS} chips" in str(too_many.json()["chips"])
    response = client.post(EVENTS + "fabricate", fab_body(world["model"], MAX_CHIPS))
    assert response.status_code == 201 and response.json()["count"] == MAX_CHIPS
    assert Chip.objects.count() == MAX_CHIPS and ChipEvent.objects.count() == MAX_CHIPS


def test_only_the_possessor_ships_and_only_the_consignee_receives(world):
    serials = vendor_stock(world)
    ship = {"chips": serials, "consignee": "owner-a", "reference": "INV-7"}
    assert world["vendor_b"].post(EVENTS + "ship", ship).status_code == 400
    assert world["vendor_a"].post(EVENTS + "ship", ship).status_code == 201
    assert world["vendor_b"].post(EVENTS + "receive", {"chips": serials}).status_code == 400
    response = world["owner_a"].post(EVENTS + "receive", {"chips": serials, "facility": "dc-owner-a"})
    assert response.status_code == 201
    chip = Chip.objects.get(serial=serials[0])
    assert (chip.possessor.slug, chip.owner.slug, chip.facility.slug, chip.status) == (
        "owner-a",
        "fab-tw",
        "dc-owner-a",
        "in_stock",
    )


def test_a_receipt_must_name_the_facility_the_chips_arrive_at(world):
    """A chip received "nowhere" would be in stock at no facility and in no country the desk can show."""
    serials = vendor_stock(world)
    ship = {"chips": serials, "consignee": "owner-a", "reference": "INV-8"}
    assert world["vendor_a"].post(EVENTS + "ship", ship).status_code == 201
    size = ledger_selectors.ledger_size()
    response = world["owner_a"].post(EVENTS + "receive", {"chips": serials})
    assert response.status_code == 400
    assert response.json() == {"facility": ["required for received"]}
    assert ledger_selectors.ledger_size() == size
    assert set(Chip.objects.filter(serial__in=serials).values_list("status", flat=True)) == {"in_transit"}


def test_transfer_is_pending_until_accepted(world):
    serials = vendor_stock(world, 2)
    fab = world["fab"]
    assert fab.post(EVENTS + "transfer-offer", {"chips": serials, "to_owner": "vendor-a"}).status_code == 201
    assert Chip.objects.get(serial=serials[0]).owner.slug == "fab-tw"
    assert world["vendor_b"].post(EVENTS + "transfer-accept", {"chips": serials}).status_code == 400
    assert world["vendor_a"].post(EVENTS + "transfer-accept", {"chips": serials}).status_code == 201
    assert set(Chip.objects.filter(serial__in=serials).values_list("owner__slug", flat=True)) == {"vendor-a"}


@pytest.mark.parametrize("roles", [["regulator"], ["inspection_body"]])
def test_chips_are_not_transferred_to_an_organisation_that_may_not_own_them(world, roles):
    """The regulator and inspection bodies check chips; owning one would make them a party to what they check."""
    organisation("checker", roles, "US")
    serials = vendor_stock(world, 1)
    before = Entry.objects.count()
    answer = world["fab"].post(EVENTS + "transfer-offer", {"chips": serials, "to_owner": "checker"})
    assert answer.status_code == 400 and "may not own chips" in answer.json()["to_owner"][0]
    assert Entry.objects.count() == before and Chip.objects.get(serial=serials[0]).pending_owner is None


def test_unknown_event_and_malformed_bodies(world):
    client = world["vendor_a"]
    assert client.post(EVENTS + "teleport", {"chips": ["SN-1"]}).status_code == 404
    assert client.post(EVENTS + "ship", raw=b"not json").status_code == 400
    response = client.post(EVENTS + "ship", {"chips": ["SN-1"], "consignee": "owner-a"})
    assert response.status_code == 400 and "reference" in response.json()
    response = client.post(
        EVENTS + "ship", {"chips": ["SN-1"], "consignee": "owner-a", "reference": "x", "colour": "red"}
    )
    assert response.status_code == 400 and response.json() == {"colour": ["unknown field for shipped"]}


def test_others_chips_are_404_and_the_regulator_sees_all(world):
    serials = vendor_stock(world, 2)
    assert world["vendor_a"].get(f"/api/registry/chips/{serials[0]}").status_code == 200
    assert world["vendor_b"].get(f"/api/registry/chips/{serials[0]}").status_code == 404
    assert world["regulator"].get(f"/api/registry/chips/{serials[0]}").status_code == 200
    assert world["vendor_b"].get("/api/registry/chips").json()["results"] == []
    assert len(world["regulator"].get("/api/registry/chips").json()["results"]) == 2


def test_chip_history_carries_inclusion_proofs_that_verify(world):
    serials = vendor_stock(world, 1)
    checkpoint = ledger_services.checkpoint_sign()
    body = world["vendor_a"].get(f"/api/registry/chips/{serials[0]}").json()
    assert [e["kind"] for e in body["history"]] == ["chip.fabricated", "chip.exported", "chip.received"]
    for item in body["history"]:
        leaf_hash = bytes(Entry.objects.get(seq=item["seq"]).hash)
        proof = [base64.b64decode(h) for h in item["proof"]]
        assert merkle.verify_inclusion(leaf_hash, item["seq"], checkpoint.size, proof, bytes(checkpoint.root))


def test_list_filters_and_cursor_pagination(world):
    serials = vendor_stock(world, 5)
    event(world["vendor_a"].org, "reported_lost", serials[:2])
    client = world["regulator"]
    assert {c["serial"] for c in client.get("/api/registry/chips", status="lost").json()["results"]} == set(serials[:2])
    assert len(client.get("/api/registry/chips", possessor="vendor-a", status="in_stock").json()["results"]) == 3
    assert client.get("/api/registry/chips", country="US").json()["results"][0]["country"] == "US"
    first = client.get("/api/registry/chips", page_size=2).json()
    assert len(first["results"]) == 2 and first["next"]
    second = client.api.get(first["next"]).json()
    assert {c["serial"] for c in second["results"]}.isdisjoint({c["serial"] for c in first["results"]})


@pytest.mark.parametrize(
    "cursor",
    ["garbage", base64.b64encode(b"p=abc").decode(), base64.b64encode(b"o=x").decode(), "%%%", ""],
)
def test_a_cursor_that_is_not_one_of_the_list_is_a_400_naming_cursor(world, cursor):
    vendor_stock(world, 1)
    answer = world["regulator"].get("/api/registry/chips", cursor=cursor)
    if cursor == "":  # no cursor: the first page
        assert answer.status_code == 200
        return
    assert answer.status_code == 400 and list(answer.json()) == ["cursor"], answer.content


def test_user_without_organisation_is_refused(world):
    from django.contrib.auth import get_user_model
    from rest_framework.test import APIClient

    api = APIClient()
    api.force_authenticate(get_user_model().objects.create_user("loner"))
    assert api.get("/api/registry/chips").status_code == 403


def test_owner_is_not_possessor_and_consignee_is_not_owner(world):
    serials = vendor_stock(world, 2)  # fab-tw owns them, vendor-a holds them
    fab, vendor = world["fab"], world["vendor_a"]
    ship = {"chips": serials, "consignee": "owner-a", "reference": "INV-9"}
    refused = fab.post(EVENTS + "ship", ship)  # the owner does not hold them
    assert refused.status_code == 400 and "only the chip's possessor" in refused.json()["chips[0]"][0]
    refused = vendor.post(
        EVENTS + "transfer-offer", {"chips": serials, "to_owner": "owner-a"}
    )  # the holder does not own them
    assert refused.status_code == 400 and "only the chip's owner" in refused.json()["chips[0]"][0]
    assert vendor.post(EVENTS + "ship", ship).status_code == 201
    refused = world["owner_a"].post(EVENTS + "decommission", {"chips": serials})  # consignee, not owner
    assert refused.status_code == 400
    assert world["owner_a"].get(f"/api/registry/chips/{serials[0]}").status_code == 200  # consigned to it: visible
