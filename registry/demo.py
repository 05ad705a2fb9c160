"""Demo data for `make run` (idempotent). Grows with the registry (issue 3)."""
from __future__ import annotations

import secrets
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import transaction

from ledger import keys, selectors, services

PASSWORD_FILE = "demo-password"


@dataclass(frozen=True)
class DemoLogin:
    username: str
    role: str


DEMO_LOGINS = (
    DemoLogin("regulator", "regulator: superuser of the admin"),
    DemoLogin("auditor", "auditor: read-only staff in the admin"),
)


def demo_password(requested: str | None) -> tuple[str, bool]:
    """The demo password: the one asked for, else one generated once and kept in var/."""
    path = settings.VAR_DIR / PASSWORD_FILE
    if requested:
        return requested, False
    if path.exists():
        return path.read_text().strip(), False
    password = secrets.token_urlsafe(12)
    path.write_text(password + "\n")
    path.chmod(0o600)
    return password, True


@transaction.atomic
def seed_demo(password: str) -> list[DemoLogin]:
    _user("regulator", password, superuser=True)
    auditor = _user("auditor", password, superuser=False)
    auditor.user_permissions.set(Permission.objects.filter(codename__startswith="view_"))
    if selectors.ledger_size() == 0:
        # Genesis: the log records its own origin and verifier key as entry 0.
        services.append_entry("ledger.opened", {"origin": settings.LEDGER_ORIGIN, "verifier_key": keys.verifier_key()}, "system")
    return list(DEMO_LOGINS)


def _user(username: str, password: str, superuser: bool):
    user, _ = get_user_model().objects.get_or_create(username=username)
    user.is_staff = True
    user.is_superuser = superuser
    user.set_password(password)
    user.save()
    return user
