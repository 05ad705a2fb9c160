from rest_framework.throttling import SimpleRateThrottle

from registry.selectors import organisation_of


class OrganisationRateThrottle(SimpleRateThrottle):
    """One budget per organisation, shared by all its users (cache: Redis when configured)."""

    scope = "organisation"

    def get_cache_key(self, request, view):
        if not request.user or not request.user.is_authenticated:
            return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}
        organisation = organisation_of(request.user)
        ident = organisation.slug if organisation else f"user-{request.user.pk}"
        return self.cache_format % {"scope": self.scope, "ident": ident}
