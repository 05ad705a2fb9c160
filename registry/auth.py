"""API authentication by hashed token: nothing in the database can be replayed.

The header is ``Authorization: Token <token>`` or, as most HTTP clients send it, ``Authorization: Bearer <token>``.
"""

from rest_framework.authentication import TokenAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed

from .services.tokens import api_token_user

KEYWORDS = (b"token", b"bearer")


class HashedTokenAuthentication(TokenAuthentication):
    def authenticate(self, request):
        words = get_authorization_header(request).split()
        if not words or words[0].lower() not in KEYWORDS:
            return None
        if len(words) != 2:
            raise AuthenticationFailed(
                f"the Authorization header must be '{words[0].decode(errors='replace')} <token>'"
            )
        try:
            token = words[1].decode()
        except UnicodeError:
            raise AuthenticationFailed("the token must be ASCII") from None
        return self.authenticate_credentials(token)

    def authenticate_credentials(self, key):
        user = api_token_user(key)
        if user is None:
            raise AuthenticationFailed("invalid or revoked token")
        return user, None
