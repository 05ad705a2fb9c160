"""Regulators in the admin: browse the registry; register an organisation onto the ledger."""

import base64

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from nacl.signing import SigningKey

from ledger.models import Entry
from registry.demo_registry import seed_demo
from registry.models import Organisation
from tests.shared_world import seeded_once_per_module

pytestmark = pytest.mark.django_db


def admin_demo_world() -> None:
    seed_demo("demo-pass-123", chips=50)


admin_demo_world_fixture = seeded_once_per_module(admin_demo_world)


@pytest.fixture
def regulator(client, admin_demo_world):
    client.force_login(get_user_model().objects.get(username="regulator"))
    return client


PAGES = [
    "/admin/",
    "/admin/registry/chip/",
    "/admin/registry/chip/?status=lost",
    "/admin/registry/organisation/",
    "/admin/registry/facility/",
    "/admin/ledger/entry/",
    "/admin/ledger/checkpoint/",
]


def test_regulator_pages_render(regulator):
    assert {page: regulator.get(page).status_code for page in PAGES} == {page: 200 for page in PAGES}


def test_chip_page_shows_its_history(regulator):
    from registry.models import Chip

    chip = Chip.objects.get(serial="A000001")
    # The stock change page sends the regulator to the desk's chip page (timeline and proof check).
    html = regulator.get(f"/admin/registry/chip/{chip.pk}/change/", follow=True).content.decode()
    assert "chip.fabricated" in html and "chip.installed" in html


def test_registering_an_organisation_writes_the_ledger(regulator):
    key = base64.b64encode(bytes(SigningKey.generate().verify_key)).decode()
    response = regulator.post(
        "/admin/registry/organisation/add/",
        {"slug": "owner-d", "legal_name": "Delta Labs", "country": "de", "roles": ["owner"], "public_key": key},
    )
    assert response.status_code == 302
    organisation = Organisation.objects.get(slug="owner-d")
    assert organisation.country == "DE" and organisation.keys.count() == 1
    assert Entry.objects.filter(kind="org.registered", payload__slug="owner-d").exists()


def test_bad_registration_shows_the_error_and_writes_nothing(regulator):
    size = Entry.objects.count()
    response = regulator.post(
        "/admin/registry/organisation/add/", {"slug": "fab-tw", "legal_name": "Dup", "country": "TW", "roles": ["fab"]}
    )
    assert response.status_code == 200 and "is taken" in response.content.decode()
    assert 'value="Register"' in response.content.decode()
    assert Entry.objects.count() == size


def test_auditor_cannot_register(client):
    seed_demo("demo-pass-123", chips=50)
    client.force_login(get_user_model().objects.get(username="auditor"))
    assert client.get("/admin/registry/chip/").status_code == 200
    assert client.get("/admin/registry/organisation/add/").status_code == 403


# --- memberships: who may act, each change on the ledger --------------------------------------------


def test_staff_cannot_move_itself_into_an_inspection_body_through_the_admin(client):
    from registry.models import Member

    seed_demo("demo-pass-123", chips=50)
    staff = get_user_model().objects.get(username="regulator-staff")
    client.force_login(staff)
    member = Member.objects.get(user=staff)
    size = Entry.objects.count()
    body = Organisation.objects.get(slug="inspect-eu")
    response = client.post(f"/admin/registry/member/{member.pk}/change/", {"organisation": body.pk})
    assert response.status_code == 200 and "staff users act for the regulator only" in response.content.decode()
    assert Member.objects.get(user=staff).organisation.slug == "regulator" and Entry.objects.count() == size
    new = get_user_model().objects.create_user("new-staff", is_staff=True)
    client.post("/admin/registry/member/add/", {"user": new.pk, "organisation": body.pk})
    assert not Member.objects.filter(user=new).exists() and Entry.objects.count() == size


def test_a_membership_change_is_a_ledger_entry_and_a_token_holder_is_not_moved(client):
    from registry import services
    from registry.models import Member

    seed_demo("demo-pass-123", chips=50)
    client.force_login(get_user_model().objects.get(username="regulator"))
    person = get_user_model().objects.create_user("lab-tech")
    eu = Organisation.objects.get(slug="inspect-eu")
    assert client.post("/admin/registry/member/add/", {"user": person.pk, "organisation": eu.pk}).status_code == 302
    entry = Entry.objects.filter(kind="org.member_added").latest("seq")
    assert entry.payload == {"org": "inspect-eu", "user": person.pk, "from": None}
    vendor = get_user_model().objects.get(username="vendor-a")  # holds an API token (the demo's)
    with pytest.raises(ValidationError, match="revoke them before moving"):
        services.member_add(vendor, Organisation.objects.get(slug="regulator"))
    member = Member.objects.get(user=person)
    client.post(f"/admin/registry/member/{member.pk}/delete/", {"post": "yes"})
    assert not Member.objects.filter(user=person).exists()
    assert Entry.objects.filter(kind="org.member_removed", payload__user=person.pk).count() == 1
    services.member_remove(member)  # a second admin's removal of the same row, from its stale page: nothing to do
    assert Entry.objects.filter(kind="org.member_removed", payload__user=person.pk).count() == 1


@pytest.mark.parametrize(
    "vkey",
    ["garbage", "w+zz+!!", "w+00000000+AQ==", "wï+12345678+" + "A" * 44, "a+b+c\x00", "x" * 400],
)
def test_a_malformed_witness_key_is_a_form_error_not_a_500(regulator, vkey):
    size = Entry.objects.count()
    response = regulator.post("/admin/ledger/witness/add/", {"verifier_key": vkey})
    assert response.status_code == 200 and "errorlist" in response.content.decode()
    assert Entry.objects.count() == size


def test_replace_key_with_a_non_ascii_key_is_a_clear_error():
    from django.core.management import CommandError, call_command

    seed_demo("demo-pass-123", chips=50)
    for args in (["vendor-a", "\u00fc"], ["vend\u00f6r", "AAAA"]):
        with pytest.raises(CommandError) as error:
            call_command("replace_key", *args, reason="lost")
        assert "public_key: not base64" in str(error.value) or "no organisation" in str(error.value)


def test_a_role_grant_is_a_ledger_entry_and_only_for_staff():
    from registry.services.roles import REGULATOR_STAFF, role_grant

    seed_demo("demo-pass-123", chips=50)
    staff = get_user_model().objects.get(username="regulator-staff")
    assert Entry.objects.filter(kind="regulator.role_granted", payload__user=staff.pk).exists()
    vendor = get_user_model().objects.get(username="vendor-a")
    size = Entry.objects.count()
    with pytest.raises(ValidationError, match="staff"):
        role_grant(vendor, REGULATOR_STAFF)
    assert Entry.objects.count() == size and not vendor.groups.exists()
