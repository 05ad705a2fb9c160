"""API tokens: issued once in the clear, stored as a hash, revocable."""

from __future__ import annotations

import hashlib
import secrets

from django.utils import timezone

from ..models import ApiToken

TOKEN_PREFIX = "clt_"  # 32 random bytes follow: a hash lookup needs no salt or slow KDF


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def api_token_issue(user, label: str = "") -> tuple[ApiToken, str]:
    """A new token for ``user``: the row, and the token itself (shown to the user once, kept nowhere)."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken.objects.create(user=user, digest=token_digest(token), prefix=token[:12], label=label[:100])
    return row, token


def api_token_revoke(token: ApiToken) -> ApiToken:
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
    return token


def api_token_user(token: str):
    """The active user a presented token belongs to, or None."""
    row = (
        ApiToken.objects.select_related("user")
        .filter(digest=token_digest(token), revoked_at__isnull=True, user__is_active=True)
        .first()
    )
    return row.user if row else None
