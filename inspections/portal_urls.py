from django.urls import path

from . import portal

app_name = "portal"
urlpatterns = [
    path("", portal.task_list, name="tasks"),
    path("tasks/<int:task_id>/", portal.task_detail, name="task"),
]
