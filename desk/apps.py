from django.apps import AppConfig


class DeskConfig(AppConfig):
    """The regulator's desk: dashboard, chip pages, search index, alert triage, long jobs."""

    name = "desk"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django.contrib import admin

        # The project's own name on every admin page (the stock admin, skinned: templates/admin/base_site.html).
        admin.site.site_header = "chipledger · regulator's desk"
        admin.site.site_title = "chipledger desk"
        admin.site.index_title = "Regulator's desk"

        from ledger import services as ledger

        from .services import index

        ledger.append_listener_add(index.entries_indexed)

        from celery.signals import task_postrun

        task_postrun.connect(_heartbeat, weak=False, dispatch_uid="desk-heartbeat")


def _heartbeat(sender=None, state=None, **_signal):
    from .services.heartbeats import heartbeat_record

    heartbeat_record(getattr(sender, "name", ""), state or "")
