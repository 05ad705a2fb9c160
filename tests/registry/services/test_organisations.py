"""A regulator replaces the key of an organisation that lost it: old keys revoked, the new one registered, with why."""

import pytest
from django.core.exceptions import ValidationError
from nacl.signing import SigningKey

from ledger.models import Entry
from registry import services
from registry.models import OrganisationKey
from tests.registry.factories import organisation

pytestmark = pytest.mark.django_db


def test_a_replacement_key_revokes_the_lost_one_and_records_the_reason():
    org, _ = organisation("owner-a", ["owner"])
    new = SigningKey.generate()
    key = services.organisation_key_replace(
        organisation=org, public_key=bytes(new.verify_key), reason="key file lost, ticket 4411"
    )
    old = OrganisationKey.objects.exclude(pk=key.pk).get(organisation=org)
    assert old.revoked_seq is not None and key.revoked_seq is None
    entry = Entry.objects.get(seq=key.registered_seq)
    assert entry.actor == "regulator" and entry.payload["reason"] == "key file lost, ticket 4411"
    assert entry.payload["replaces"] == [old.key_id]
    assert Entry.objects.get(seq=old.revoked_seq).payload["reason"] == "key file lost, ticket 4411"


@pytest.mark.parametrize("reason", ["", "   ", "a\x00b", "x" * 2001, None])
def test_no_replacement_without_a_reason(reason):
    org, _ = organisation("owner-a", ["owner"])
    before = Entry.objects.count()
    with pytest.raises(ValidationError) as error:
        services.organisation_key_replace(organisation=org, public_key=bytes(32), reason=reason)
    assert "reason" in error.value.message_dict
    assert Entry.objects.count() == before and OrganisationKey.objects.filter(revoked_seq=None).count() == 1
