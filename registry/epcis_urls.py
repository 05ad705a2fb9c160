"""GS1 EPCIS 2.0 endpoints, mounted at /api/epcis/."""

from django.urls import path

from . import epcis_views

app_name = "epcis"
urlpatterns = [
    path("capture", epcis_views.CaptureView.as_view(), name="capture"),
    path("events", epcis_views.EventQueryView.as_view(), name="events"),
]
