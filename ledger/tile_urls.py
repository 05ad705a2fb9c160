from django.urls import path, re_path

from . import tile_views

app_name = "tlog"
urlpatterns = [
    path("checkpoint", tile_views.checkpoint, name="checkpoint"),
    re_path(r"^tile/(?P<path>.+)\Z", tile_views.tile, name="tile"),
]
