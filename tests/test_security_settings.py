"""Login throttling on the portal and the admin; secure production settings."""

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.cache import cache

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_cache():
    cache.clear()
    yield
    cache.clear()


@pytest.mark.parametrize("login_url", ["/accounts/login/", "/admin/login/"])
def test_logins_are_throttled_after_repeated_failures(client, login_url):
    get_user_model().objects.create_user("inspector-x", password="right-password-1", is_staff=True)
    for _ in range(settings.LOGIN_MAX_FAILURES):
        assert client.post(login_url, {"username": "inspector-x", "password": "wrong"}).status_code == 200
    locked = client.post(login_url, {"username": "inspector-x", "password": "right-password-1"})
    assert locked.status_code == 200 and "_auth_user_id" not in client.session  # even the right password fails
    cache.clear()  # the window passed
    assert client.post(login_url, {"username": "inspector-x", "password": "right-password-1"}).status_code == 302


def test_one_address_cannot_spray_many_usernames(client):
    get_user_model().objects.create_user("victim", password="right-password-1")
    for n in range(settings.LOGIN_MAX_FAILURES):
        client.post("/accounts/login/", {"username": f"guess-{n}", "password": "x"})
    client.post("/accounts/login/", {"username": "victim", "password": "right-password-1"})
    assert "_auth_user_id" not in client.session


def test_production_settings_are_secure_when_debug_is_off():
    assert not settings.DEBUG
    assert settings.SESSION_COOKIE_SECURE and settings.CSRF_COOKIE_SECURE
    assert settings.SECURE_HSTS_SECONDS >= 31_536_000 and settings.SECURE_HSTS_INCLUDE_SUBDOMAINS
    assert settings.SESSION_COOKIE_AGE <= 8 * 3600 and settings.SESSION_EXPIRE_AT_BROWSER_CLOSE
