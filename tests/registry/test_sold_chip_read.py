"""A vendor reads a chip it sold: its history up to the sale, nothing after; a stranger still gets 404."""

import pytest

from tests.registry.factories import SignedClient, chip_model, event, fabricate, facility, organisation

pytestmark = pytest.mark.django_db


def test_a_seller_reads_the_chips_history_up_to_the_sale_and_no_further():
    fab, _ = organisation("fab-tw", ["fab"], "TW")
    vendor, vendor_key = organisation("vendor-a", ["vendor"], "TW")
    owner, _ = organisation("owner-a", ["owner"], "TW")
    stranger, stranger_key = organisation("vendor-z", ["vendor"], "TW")
    facility(owner, "dc-a")
    facility(vendor, "wh-a", kind="warehouse")
    (serial,) = fabricate(fab, chip_model(fab), 1)
    event(fab, "shipped", [serial], consignee="vendor-a", reference="PO-1")
    event(vendor, "received", [serial], facility="wh-a")
    event(fab, "transfer_offered", [serial], to_owner="vendor-a")
    event(vendor, "transfer_accepted", [serial])
    seller = SignedClient(vendor, vendor_key)
    assert seller.get(f"/api/registry/chips/{serial}").json()["owner"] == "vendor-a"
    event(vendor, "shipped", [serial], consignee="owner-a", reference="SO-1")
    event(vendor, "transfer_offered", [serial], to_owner="owner-a")
    event(owner, "transfer_accepted", [serial])
    event(owner, "received", [serial], facility="dc-a")
    event(owner, "installed", [serial], facility="dc-a")

    answer = seller.get(f"/api/registry/chips/{serial}")
    assert answer.status_code == 200, answer.content
    sold = answer.json()
    assert sold["sold_to"] == "owner-a" and "facility" not in sold and "owner" not in sold
    kinds = [e["kind"] for e in sold["history"]]
    assert kinds[-1] == "chip.transfer_accepted" and "chip.installed" not in kinds and "chip.received" in kinds
    assert all(e["seq"] <= sold["sold_seq"] for e in sold["history"])
    assert SignedClient(stranger, stranger_key).get(f"/api/registry/chips/{serial}").status_code == 404


def test_an_offer_cancelled_or_never_accepted_is_no_sale():
    fab, fab_key = organisation("fab-tw", ["fab"], "TW")
    organisation("owner-a", ["owner"], "TW")
    (serial,) = fabricate(fab, chip_model(fab), 1)
    event(fab, "transfer_offered", [serial], to_owner="owner-a")
    event(fab, "transfer_cancelled", [serial])
    assert SignedClient(fab, fab_key).get(f"/api/registry/chips/{serial}").json()["owner"] == "fab-tw"


def test_the_readme_and_the_openapi_description_list_each_events_fields():
    from pathlib import Path

    from django.conf import settings
    from drf_spectacular.generators import SchemaGenerator

    from registry import services

    table = services.event_fields_table()
    assert "| `decommission` | `reason`, `evidence` | — |" in table
    assert table in (Path(settings.BASE_DIR) / "README.md").read_text()
    schema = SchemaGenerator().get_schema(request=None, public=True)
    (operation,) = [ops["post"] for path, ops in schema["paths"].items() if path.endswith("/events/{event}")]
    assert table in operation["description"]
