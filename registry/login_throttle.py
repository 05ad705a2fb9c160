"""Password logins (admin and portal): delays after repeated failures, per (username, client address).

After ``LOGIN_MAX_FAILURES`` failures for one username from one address, each further attempt for that pair
must wait ``LOGIN_DELAY_SECONDS`` × 2^(failures − max) (at most ``LOGIN_DELAY_MAX_SECONDS``) after the last
failure; an attempt before then fails, right password or not. One address spraying many usernames is slowed
the same way after ``LOGIN_ADDRESS_MAX_FAILURES`` failures. Nothing is a hard block: the owner of a username
others are guessing still logs in from their own address, and after a short delay even from the attacker's.
A success clears the pair's count. The state lives in the cache (Redis when configured); counts expire after
``LOGIN_LOCKOUT_SECONDS`` without a failure.

The client address is ``REMOTE_ADDR``, or — only when ``LOGIN_CLIENT_ADDRESS_HEADER`` names the header the
trusted TLS proxy sets (e.g. ``HTTP_X_FORWARDED_FOR``) — the address that proxy appended (the right-most of
``LOGIN_TRUSTED_PROXIES`` entries): a client cannot pick its own address by sending the header itself.
"""

from __future__ import annotations

import hashlib
import time

from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.core.cache import cache
from django.core.exceptions import PermissionDenied


def _now() -> float:
    return time.time()


def client_address(request) -> str:
    if request is None:
        return ""
    remote = request.META.get("REMOTE_ADDR", "")
    header = settings.LOGIN_CLIENT_ADDRESS_HEADER
    if not header:
        return remote
    hops = [hop.strip() for hop in request.META.get(header, "").split(",") if hop.strip()]
    proxies = settings.LOGIN_TRUSTED_PROXIES
    return hops[-proxies] if len(hops) >= proxies else remote


def _keys(username, address: str) -> tuple[str, str]:
    pair = hashlib.sha256(f"{str(username).lower()[:150]}\x00{address}".encode()).hexdigest()
    return f"login-fail:pair:{pair}", f"login-fail:addr:{address}"


def _wait(key: str, allowed: int) -> float:
    """Seconds until ``key`` may try again (0: now)."""
    count, last = cache.get(key, (0, 0.0))
    if count < allowed:
        return 0.0
    delay = min(settings.LOGIN_DELAY_MAX_SECONDS, settings.LOGIN_DELAY_SECONDS * 2 ** (count - allowed))
    return max(0.0, last + delay - _now())


def _failed(key: str) -> None:
    count, _ = cache.get(key, (0, 0.0))
    cache.set(key, (count + 1, _now()), settings.LOGIN_LOCKOUT_SECONDS)


class ThrottledModelBackend(ModelBackend):
    def authenticate(self, request, username=None, password=None, **kwargs):
        pair, address = _keys(username, client_address(request))
        wait = max(_wait(pair, settings.LOGIN_MAX_FAILURES), _wait(address, settings.LOGIN_ADDRESS_MAX_FAILURES))
        if wait > 0:
            raise PermissionDenied(f"too many failed logins: try again in {wait:.0f} s")  # authenticate() stops
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is None:
            _failed(pair)
            _failed(address)
        else:
            cache.delete(pair)
        return user
