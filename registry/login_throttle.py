"""Password logins (admin and portal) throttled per username and per client address, in the cache.

After ``LOGIN_MAX_FAILURES`` failures within ``LOGIN_LOCKOUT_SECONDS`` every further attempt for that username,
or from that address, fails, right password or not, until the window passes. A success clears the username's count.
"""

from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.core.cache import cache
from django.core.exceptions import PermissionDenied


def _keys(request, username) -> list[str]:
    address = request.META.get("REMOTE_ADDR", "") if request is not None else ""
    return [f"login-fail:user:{str(username).lower()[:150]}", f"login-fail:addr:{address}"]


class ThrottledModelBackend(ModelBackend):
    def authenticate(self, request, username=None, password=None, **kwargs):
        keys = _keys(request, username)
        if any(cache.get(key, 0) >= settings.LOGIN_MAX_FAILURES for key in keys):
            raise PermissionDenied("too many failed logins: wait and try again")  # authenticate() stops here
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is None:
            for key in keys:
                cache.add(key, 0, settings.LOGIN_LOCKOUT_SECONDS)
                cache.incr(key)
        else:
            cache.delete(keys[0])
        return user
