from django.urls import path

from . import views

app_name = "inspections"
urlpatterns = [
    path("tasks", views.TaskListView.as_view(), name="tasks"),
    path("tasks/<int:task_id>/accept", views.TaskAcceptView.as_view(), name="accept"),
    path("tasks/<int:task_id>/challenge", views.ChallengeView.as_view(), name="challenge"),
    path("tasks/<int:task_id>/identity", views.IdentityView.as_view(), name="identity"),
    path("tasks/<int:task_id>/snapshot-log", views.SnapshotLogView.as_view(), name="snapshot-log"),
    path("tasks/<int:task_id>/finding", views.FindingView.as_view(), name="finding"),
    path("claims", views.ClaimsView.as_view(), name="claims"),
    path("claims/<int:claim_id>", views.ClaimStatusView.as_view(), name="claim"),
    path("snapshot-logs/<int:log_id>", views.SnapshotLogStatusView.as_view(), name="snapshot-log-status"),
]
