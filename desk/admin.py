from django.contrib import admin
from rest_framework.authtoken.models import TokenProxy

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


# API tokens are secrets: nobody reads them in the admin (an auditor has view_* permissions on every
# model), and a superuser sees whose they are, never the key.
if admin.site.is_registered(TokenProxy):
    admin.site.unregister(TokenProxy)


@admin.register(TokenProxy)
class SecretlessTokenAdmin(admin.ModelAdmin):
    list_display = ("user", "created")
    fields = ("user", "created")
    readonly_fields = ("created",)

    def has_view_permission(self, request, obj=None):
        return request.user.is_active and request.user.is_superuser

    def has_module_permission(self, request):
        return self.has_view_permission(request)

    def has_add_permission(self, request):
        return False  # tokens are issued by the API's own flow, never shown here

    def has_change_permission(self, request, obj=None):
        return False
