"""Dates in the admin in the regulator's time zone (setting ``REGULATOR_TIME_ZONE``)."""

import zoneinfo

from django.conf import settings
from django.utils import timezone


class RegulatorTimeZone:
    def __init__(self, get_response):
        self.get_response = get_response
        self.zone = zoneinfo.ZoneInfo(settings.REGULATOR_TIME_ZONE)

    def __call__(self, request):
        if request.path.startswith("/admin/"):
            timezone.activate(self.zone)
            try:
                return self.get_response(request)
            finally:
                timezone.deactivate()
        return self.get_response(request)
