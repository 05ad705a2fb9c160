"""API authentication by hashed token (``Authorization: Token <token>``): nothing in the database can be replayed."""

from rest_framework.authentication import TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed

from .services.tokens import api_token_user


class HashedTokenAuthentication(TokenAuthentication):
    def authenticate_credentials(self, key):
        user = api_token_user(key)
        if user is None:
            raise AuthenticationFailed("invalid or revoked token")
        return user, None
