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


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr("registry.login_throttle._now", clock)
    return clock


def _post(client, url, username, password, address="10.0.0.1", **headers):
    client.logout()
    return client.post(url, {"username": username, "password": password}, REMOTE_ADDR=address, **headers)


@pytest.mark.parametrize("login_url", ["/accounts/login/", "/admin/login/"])
def test_repeated_failures_delay_that_username_from_that_address_not_block_it(client, clock, login_url):
    get_user_model().objects.create_user("inspector-x", password="right-password-1", is_staff=True)
    for _ in range(settings.LOGIN_MAX_FAILURES):
        assert _post(client, login_url, "inspector-x", "wrong").status_code == 200
    delayed = _post(client, login_url, "inspector-x", "right-password-1")
    assert delayed.status_code == 200 and "_auth_user_id" not in client.session  # even the right password waits
    clock.now += settings.LOGIN_DELAY_SECONDS  # the delay passed: no 15-minute lockout
    assert _post(client, login_url, "inspector-x", "right-password-1").status_code == 302


def test_the_delay_doubles_and_is_capped(client, clock):
    get_user_model().objects.create_user("victim", password="right-password-1")
    for n in range(settings.LOGIN_MAX_FAILURES + 10):
        clock.now += settings.LOGIN_DELAY_MAX_SECONDS  # each guess waits out the delay
        _post(client, "/accounts/login/", "victim", f"guess-{n}")
    clock.now += settings.LOGIN_DELAY_MAX_SECONDS - 1
    _post(client, "/accounts/login/", "victim", "right-password-1")
    assert "_auth_user_id" not in client.session
    clock.now += 1
    assert _post(client, "/accounts/login/", "victim", "right-password-1").status_code == 302


def test_the_owner_logs_in_from_another_address_while_someone_guesses_its_username(client, clock):
    get_user_model().objects.create_user("regulator-x", password="right-password-1", is_staff=True)
    for n in range(settings.LOGIN_MAX_FAILURES * 3):
        _post(client, "/admin/login/", "regulator-x", f"guess-{n}", address="203.0.113.9")
    assert _post(client, "/admin/login/", "regulator-x", "right-password-1", address="10.0.0.7").status_code == 302


def test_one_address_spraying_many_usernames_is_slowed(client, clock):
    get_user_model().objects.create_user("victim", password="right-password-1")
    for n in range(settings.LOGIN_ADDRESS_MAX_FAILURES):
        _post(client, "/accounts/login/", f"guess-{n}", "x")
    _post(client, "/accounts/login/", "victim", "right-password-1")
    assert "_auth_user_id" not in client.session
    assert _post(client, "/accounts/login/", "victim", "right-password-1", address="10.0.0.2").status_code == 302


def test_behind_the_proxy_the_address_comes_from_its_header_only(client, clock, settings):
    """Everyone shares the proxy's REMOTE_ADDR: an attacker must not lock out the others, nor pick its own
    address by sending the header itself (the proxy appends the real one last)."""
    settings.LOGIN_CLIENT_ADDRESS_HEADER = "HTTP_X_FORWARDED_FOR"
    get_user_model().objects.create_user("victim", password="right-password-1")
    for n in range(settings.LOGIN_ADDRESS_MAX_FAILURES):  # forged left-most hops change nothing
        _post(
            client, "/accounts/login/", f"guess-{n}", "x", "127.0.0.1", HTTP_X_FORWARDED_FOR=f"1.1.1.{n}, 198.51.100.6"
        )
    spoofed = _post(
        client, "/accounts/login/", "victim", "right-password-1", "127.0.0.1", HTTP_X_FORWARDED_FOR="198.51.100.6"
    )
    assert spoofed.status_code == 200 and "_auth_user_id" not in client.session
    honest = _post(
        client, "/accounts/login/", "victim", "right-password-1", "127.0.0.1", HTTP_X_FORWARDED_FOR="192.0.2.44"
    )
    assert honest.status_code == 302


def test_production_settings_are_secure_when_debug_is_off():
    assert not settings.DEBUG
    assert settings.SESSION_COOKIE_SECURE and settings.CSRF_COOKIE_SECURE
    assert settings.SECURE_HSTS_SECONDS >= 31_536_000 and settings.SECURE_HSTS_INCLUDE_SUBDOMAINS
    assert settings.SESSION_COOKIE_AGE <= 8 * 3600 and settings.SESSION_EXPIRE_AT_BROWSER_CLOSE
