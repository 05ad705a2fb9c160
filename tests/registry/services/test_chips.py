"""Chip events: the request's shape is checked before the lifecycle, every missing field named at once."""

import pytest
from django.core.exceptions import ValidationError

from registry import services
from tests.registry.factories import chip_model, fabricate, facility, organisation

pytestmark = pytest.mark.django_db


def test_every_missing_field_is_named_at_once():
    fab, _ = organisation("fab-mf", ["fab"], "US")
    facility(fab, "fab-mf-1", kind="fab")
    serials = fabricate(fab, chip_model(fab), 1, "fab-mf-1")
    with pytest.raises(ValidationError) as error:
        services.chips_record_event(organisation=fab, event="exported", payload={"chips": serials})
    assert set(error.value.message_dict) == {"consignee", "reference", "export_licence"}
