"""An EPCIS document holds the ledger from its first event on: the rows its later events lock (an export licence)
are locked before that first entry, so an export citing the same licence elsewhere waits instead of deadlocking."""

import threading

import pytest

from registry import services
from registry.models import ChipModel
from registry.services import chips as chip_services
from rules.epcis_format import parse_document
from tests.helpers import requires_postgres
from tests.inspections.test_lock_order import both_landed, in_thread
from tests.registry.epcis_helpers import commissioning, document, epcis_world, sgtin, shipping
from tests.registry.factories import fabricate

pytestmark = [pytest.mark.postgres, requires_postgres, pytest.mark.django_db(transaction=True)]


def test_a_document_that_exports_after_another_event_and_an_export_citing_its_licence_both_land(monkeypatch):
    fab = epcis_world()["fab"].org
    model = ChipModel.objects.get()
    mine, theirs = fabricate(fab, model, 1, "fab-tw-1"), fabricate(fab, model, 1, "fab-tw-1")
    events = parse_document(
        document(
            commissioning([sgtin("NEW-1")]),  # the document's first entry: from here on it holds the ledger
            shipping([sgtin(mine[0])], "vendor-a", **{"chipledger:exportLicence": "TW-EL-1"}),
        )
    )
    document_thread, reached, go = [], threading.Event(), threading.Event()
    use = chip_services.export_licence_use

    def use_when_told(*args):  # the document's export paused just before it takes the licence
        if threading.current_thread() in document_thread:
            reached.set()
            go.wait(30)
        return use(*args)

    monkeypatch.setattr(chip_services, "export_licence_use", use_when_told)
    one, captured = in_thread(lambda: services.epcis_capture(organisation=fab, events=events, submission=None))
    document_thread.append(one)
    assert reached.wait(30)
    export = {"chips": theirs, "consignee": "vendor-a", "export_licence": "TW-EL-1", "reference": "PO-43"}
    two, exported = in_thread(lambda: services.chips_record_event(organisation=fab, event="exported", payload=export))
    two.join(timeout=1)
    go.set()
    one.join(timeout=60)
    two.join(timeout=60)
    both_landed(captured, exported)
    assert captured["value"]["captured"] == 2


def test_two_revocations_at_once_leave_an_active_key(monkeypatch):
    """An organisation with two keys: each holder revokes the other's at the same moment (a stolen key racing its
    owner). Each revocation checks that another key stays active: one lands, the other is refused."""
    from nacl.signing import SigningKey

    from registry.models import OrganisationKey
    from tests.inspections.test_lock_order import against
    from tests.registry.factories import organisation

    org, _ = organisation("vendor-keys", ["vendor"])
    services.organisation_key_register(organisation=org, public_key=bytes(SigningKey.generate().verify_key), actor="x")
    first, second = OrganisationKey.objects.filter(organisation=org).order_by("pk").values_list("key_id", flat=True)
    revoke = lambda key_id: lambda: services.organisation_key_revoke(organisation=org, key_id=key_id, actor=org.slug)
    one, two, _ = against(monkeypatch, "org.key_revoked", revoke(first), revoke(second))
    outcomes = [one, two]
    refused = [o["error"] for o in outcomes if "error" in o]
    assert len(refused) == 1 and "key_id" in refused[0].message_dict, outcomes
    assert OrganisationKey.objects.filter(organisation=org, revoked_seq=None).count() == 1


def test_a_membership_added_twice_at_once_is_one_entry(monkeypatch):
    """A double Save on the admin's add-member page: one ``org.member_added`` entry, the other add sees it done."""
    from django.contrib.auth import get_user_model

    from ledger.models import Entry
    from tests.inspections.test_lock_order import against
    from tests.registry.factories import organisation

    org, _ = organisation("vendor-members", ["vendor"])
    user = get_user_model().objects.create_user("new-hire")
    add = lambda: services.member_add(user, org)
    one, two, _ = against(monkeypatch, "org.member_added", add, add)
    both_landed(one, two)
    assert Entry.objects.filter(kind="org.member_added", payload__user=user.pk).count() == 1
