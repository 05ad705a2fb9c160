"""A malformed query string on the desk is the caller's error, never a server error: str.isdigit() admits '²'
(which int() refuses), and a change list's filters may name no field or carry a value of the wrong type."""

import pytest

from inspections.webhooks import SignatureInvalid, webhook_verify
from scenarios.runner import _owner

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("page", ["%C2%B2", "%D9%A3", "abc", "-1", "99999999"])
def test_a_search_page_number_that_is_no_ascii_number_shows_the_first_page(regulator, page):
    response = regulator.get(f"/admin/desk/search/?q=x&page={page}")
    assert response.status_code == 200


@pytest.mark.parametrize(
    "path",
    [
        "/admin/desk/export/registry/chip.csv?bogus=1",
        "/admin/desk/export/ledger/entry.csv?seq__gte=abc",
        "/admin/desk/export/ledger/entry.csv?seq__gte=%C2%B2",
    ],
)
def test_an_export_with_a_filter_the_list_cannot_apply_is_a_400_naming_the_filters(regulator, path):
    response = regulator.get(path)
    assert response.status_code == 400 and response.content.decode().startswith("filters:")
    assert "Content-Disposition" not in response


def test_an_export_with_good_filters_still_exports(regulator):
    response = regulator.get("/admin/desk/export/ledger/entry.csv?seq__gte=1")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")


@pytest.mark.parametrize("model", ["campaign", "draw", "inspectiontask", "alert", "claim"])
def test_a_unicode_digit_object_id_on_an_inspections_admin_page_is_no_server_error(regulator, model):
    response = regulator.get(f"/admin/inspections/{model}/%C2%B2/change/")
    assert response.status_code < 500


def test_unicode_digits_are_not_numbers_to_the_webhook_check_or_the_scenario_runner():
    with pytest.raises(SignatureInvalid):
        webhook_verify("secret", "t=\u00b2,v1=00", b"{}", now=0)
    assert _owner("\u00b2") is None and _owner("12") == 12
