"""An EPCIS document holds the ledger from its first event on: the rows its later events lock (an export licence)
are locked before that first entry, so an export citing the same licence elsewhere waits instead of deadlocking."""

import threading

import pytest

from registry import services, signing
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


def test_a_write_signed_by_a_key_revoked_meanwhile_never_follows_the_revocation(monkeypatch):
    """The key's revocation holds the ledger (its entry appended, not yet committed) while a write signed by that
    key passes its signature check and waits for the ledger: the write must be refused, not land after the
    revocation (an outside verifier would find an entry signed by a key revoked before it)."""
    from nacl.signing import SigningKey

    from ledger import services as ledger
    from ledger.models import Entry
    from tests.registry.factories import SignedClient, organisation

    org, lost = organisation("owner-keys", ["owner"])
    services.organisation_key_register(organisation=org, public_key=bytes(SigningKey.generate().verify_key), actor="x")
    client = SignedClient(org, lost)
    lost_id = signing.key_id_for(bytes(lost.verify_key))
    appended, go, append = threading.Event(), threading.Event(), ledger.append_entry

    def revoked_then_wait(kind, *args, **kwargs):
        entry = append(kind, *args, **kwargs)
        if kind == "org.key_revoked":
            appended.set()
            go.wait(30)
        return entry

    monkeypatch.setattr(ledger, "append_entry", revoked_then_wait)
    revoke = lambda: services.organisation_key_revoke(organisation=org, key_id=lost_id, actor="regulator")
    one, revoked = in_thread(revoke)
    assert appended.wait(30)
    body = {"slug": "dc-late", "kind": "datacentre", "country": "US"}
    two, written = in_thread(lambda: client.post("/api/registry/facilities", body))
    two.join(timeout=1)
    go.set()
    one.join(timeout=60)
    two.join(timeout=60)
    both_landed(revoked, written)
    assert written["value"].status_code == 403, written["value"].content
    assert not Entry.objects.filter(kind="facility.registered", payload__slug="dc-late").exists()
