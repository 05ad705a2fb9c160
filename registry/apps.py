from django.apps import AppConfig
from django.db.models.signals import post_migrate


class RegistryConfig(AppConfig):
    name = "registry"
    verbose_name = "Chip registry"

    def ready(self):
        from .services.roles import roles_sync

        post_migrate.connect(roles_sync, dispatch_uid="registry.roles_sync")
