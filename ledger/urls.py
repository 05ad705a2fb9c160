from django.urls import path

from . import views

app_name = "ledger"
urlpatterns = [
    path("key", views.KeyView.as_view(), name="key"),
    path("checkpoint", views.CheckpointView.as_view(), name="checkpoint"),
    path("entries", views.EntriesView.as_view(), name="entries"),
    path("proof/inclusion", views.InclusionProofView.as_view(), name="inclusion"),
    path("proof/consistency", views.ConsistencyProofView.as_view(), name="consistency"),
    path("cosignatures", views.CosignatureView.as_view(), name="cosignatures"),
]
