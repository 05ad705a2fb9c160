from django.urls import path

from . import views

app_name = "registry"
urlpatterns = [
    path("organisations", views.OrganisationListView.as_view(), name="organisations"),
    path("chip-models", views.ChipModelListView.as_view(), name="chip-models"),
    path("keys", views.KeyRegisterView.as_view(), name="key-register"),
    path("keys/revoke", views.KeyRevokeView.as_view(), name="key-revoke"),
    path("facilities", views.FacilityRegisterView.as_view(), name="facility-register"),
    path("chips", views.ChipListView.as_view(), name="chips"),
    path("chips/events/<slug:event>", views.ChipEventView.as_view(), name="chip-event"),
    path("chips/<str:serial>", views.ChipDetailView.as_view(), name="chip"),
]
