"""The desk's pages, mounted under /admin/ before the stock admin (see config/urls.py)."""

from django.contrib import admin
from django.urls import path

from . import views

app_name = "desk"
staff = admin.site.admin_view
urlpatterns = [
    path("desk/search/", staff(views.search), name="search"),
    path("desk/chip/<str:serial>/", staff(views.chip_page), name="chip"),
    path("desk/organisation/<slug:slug>/", staff(views.organisation_page), name="organisation"),
    path(
        "desk/organisation/<slug:slug>/report.<str:extension>",
        staff(views.organisation_report),
        name="organisation_report",
    ),
    path("desk/organisation/<slug:slug>/extract.json", staff(views.organisation_extract), name="organisation_extract"),
    path("desk/alert/<int:pk>/", staff(views.alert_page), name="alert"),
    path("desk/draw/<int:pk>/", staff(views.draw_page), name="draw"),
    path("desk/campaign/<slug:slug>/", staff(views.campaign_page), name="campaign"),
    path("desk/campaign/<slug:slug>/report.<str:extension>", staff(views.campaign_report), name="campaign_report"),
    path("desk/campaign/<slug:slug>/extract.json", staff(views.campaign_extract), name="campaign_extract"),
    path("desk/task/<int:pk>/", staff(views.task_page), name="task"),
    path("desk/claim/<int:pk>/", staff(views.claim_page), name="claim"),
    path("desk/job/<int:pk>/", staff(views.job_page), name="job"),
    path("desk/sweep/", staff(views.sweep_start), name="sweep"),
    path("desk/export/<str:app_label>/<str:model_name>.csv", staff(views.changelist_csv), name="export"),
    path("desk/prover-by-country.csv", staff(views.crosstab_csv), name="crosstab"),
]
