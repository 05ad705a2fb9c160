from django.contrib import admin

from .models import Job


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    """Long work started from the desk (draw audits, integrity sweeps); rows are written by the jobs service."""

    list_display = ("__str__", "kind", "state", "progress", "message", "started_by", "created_at", "finished_at")
    list_filter = ("kind", "state")

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
