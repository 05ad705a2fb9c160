from django.contrib import admin
from django.urls import include, path
from django.views.generic import TemplateView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from config.health import healthz
from desk import views as desk_views

urlpatterns = [
    path("", TemplateView.as_view(template_name="home.html"), name="home"),
    # The desk's pages and its login/home take precedence over the stock admin's.
    path("admin/", admin.site.admin_view(desk_views.dashboard), name="desk-home"),
    path("admin/login/", desk_views.login, name="desk-login"),
    path("admin/", include("desk.urls")),
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("portal/", include("inspections.portal_urls")),
    path("healthz", healthz, name="healthz"),
    path("api/ledger/", include("ledger.urls")),
    path("tlog/", include("ledger.tile_urls")),  # C2SP tlog-tiles (docs/ledger.md, Tiles)
    path("api/registry/", include("registry.urls")),
    path("api/inspections/", include("inspections.urls")),
    path("api/epcis/", include("registry.epcis_urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
]
