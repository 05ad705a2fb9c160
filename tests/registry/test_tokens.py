"""API tokens are stored only as hashes, shown once, revocable; admin roles are explicit and hold no secrets."""

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from rest_framework.test import APIClient

from registry.demo_registry import seed_demo
from registry.models import ApiToken
from registry.services.roles import AUDITOR, REGULATOR_STAFF
from registry.services.tokens import api_token_issue, api_token_revoke, token_digest
from tests.registry.factories import organisation

pytestmark = pytest.mark.django_db


def user_of(slug: str):
    from registry import services

    org, _ = organisation(slug, ["owner"], "US")
    user = get_user_model().objects.create_user(username=f"u-{slug}")
    services.member_add(user, org)
    return user


def test_a_token_is_stored_only_as_its_hash_and_works_until_revoked():
    row, token = api_token_issue(user_of("owner-a"))
    stored = ApiToken.objects.filter(pk=row.pk).values().get()
    assert token not in str(stored) and stored["digest"] == token_digest(token)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert client.get("/api/registry/chips").status_code == 200
    api_token_revoke(row)
    assert client.get("/api/registry/chips").status_code == 401
    client.credentials(HTTP_AUTHORIZATION=f"Token {row.digest}")  # the stored hash is no credential
    assert client.get("/api/registry/chips").status_code == 401


@pytest.mark.parametrize("keyword", ["Token", "Bearer", "bearer"])
def test_a_token_is_accepted_as_token_or_bearer(keyword):
    _, token = api_token_issue(user_of("owner-a"))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"{keyword} {token}")
    assert client.get("/api/registry/chips").status_code == 200
    client.credentials(HTTP_AUTHORIZATION=f"{keyword} not-a-token")
    response = client.get("/api/registry/chips")
    assert response.status_code == 401 and "invalid or revoked token" in response.json()["detail"]
    client.credentials(HTTP_AUTHORIZATION=f"{keyword} {token} extra")
    assert client.get("/api/registry/chips").status_code == 401


def test_the_command_prints_a_token_once_and_revokes_by_prefix(capsys):
    user_of("owner-a")
    call_command("api_token", "issue", "u-owner-a")
    token = capsys.readouterr().out.strip()
    row = ApiToken.objects.get()
    assert token.startswith(row.prefix) and row.digest == token_digest(token)
    call_command("api_token", "revoke", row.prefix)
    assert ApiToken.objects.get().revoked_at is not None


def test_no_admin_page_shows_a_token_and_the_auditor_sees_no_secrets(client):
    logins = seed_demo("demo-pass-123", chips=50)
    tokens = [login.token for login in logins]
    auditor = get_user_model().objects.get(username="auditor")
    assert [g.name for g in auditor.groups.all()] == [AUDITOR] and not auditor.user_permissions.exists()
    client.force_login(auditor)
    assert client.get("/admin/registry/chip/").status_code == 200
    for secret_page in (
        "/admin/registry/apitoken/",
        "/admin/registry/member/",
        "/admin/auth/user/",
        "/admin/auth/group/",
    ):
        assert client.get(secret_page).status_code == 403, secret_page
    assert not any(
        p.codename.endswith(
            ("apitoken", "apinonce", "idempotencyrecord", "identitychallenge", "campaignseed", "user", "session")
        )
        for p in auditor.groups.get().permissions.all()
    )
    client.force_login(get_user_model().objects.get(username="regulator"))
    page = client.get("/admin/registry/apitoken/").content.decode()
    assert "demo" in page and not any(token in page for token in tokens)
    staff = get_user_model().objects.get(username="regulator-staff")
    assert [g.name for g in staff.groups.all()] == [REGULATOR_STAFF]
    client.force_login(staff)
    assert client.get("/admin/registry/organisation/add/").status_code == 200
    assert client.get("/admin/auth/user/").status_code == 403


def test_regulator_staff_revokes_a_token_in_the_admin(client):
    seed_demo("demo-pass-123", chips=50)
    client.force_login(get_user_model().objects.get(username="regulator-staff"))
    row = ApiToken.objects.get(user__username="vendor-a", revoked_at__isnull=True)
    response = client.post("/admin/registry/apitoken/", {"action": "revoke", "_selected_action": [row.pk]}, follow=True)
    assert response.status_code == 200
    row.refresh_from_db()
    assert row.revoked_at is not None
