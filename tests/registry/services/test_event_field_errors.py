"""A lifecycle event with a wrongly named field says so: each unknown field, the field it probably meant, and the
organisation its value names when none is registered; never only "consignee: required for shipped"."""

import pytest
from django.core.exceptions import ValidationError

from ledger.models import Entry
from registry import services
from tests.registry.factories import chip_model, fabricate, organisation

pytestmark = pytest.mark.django_db


@pytest.fixture
def fab_chips():
    fab, _ = organisation("fab-tw", ["fab"], "TW")
    organisation("owner-a", ["owner"], "TW")
    return fab, fabricate(fab, chip_model(fab), 2)


def refusal(fab_chips, event, **fields) -> dict:
    fab, serials = fab_chips
    entries = Entry.objects.count()
    with pytest.raises(ValidationError) as caught:
        services.chips_record_event(organisation=fab, event=event, payload={"chips": serials, **fields})
    assert Entry.objects.count() == entries
    return caught.value.message_dict


def test_a_misnamed_consignee_names_the_field_meant_and_the_missing_organisation(fab_chips):
    errors = refusal(fab_chips, "shipped", consignee_org="owner-zz", reference="PO-1")
    assert errors["consignee"] == ["required for shipped"]
    assert errors["consignee_org"] == [
        "unknown field for shipped: did you mean 'consignee'? (and no organisation 'owner-zz' is registered)"
    ]
    errors = refusal(fab_chips, "shipped", consignee_org="owner-a", reference="PO-1")
    assert errors["consignee_org"] == ["unknown field for shipped: did you mean 'consignee'?"]


def test_a_consignee_that_is_not_registered_is_named(fab_chips):
    assert refusal(fab_chips, "shipped", consignee="owner-zz", reference="PO-1") == {
        "consignee": ["unknown organisation 'owner-zz'"]
    }


def test_an_unrelated_unknown_field_is_named_without_a_guess(fab_chips):
    assert refusal(fab_chips, "packaged", colour="red") == {"colour": ["unknown field for packaged"]}
