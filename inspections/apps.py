from django.apps import AppConfig


class InspectionsConfig(AppConfig):
    name = "inspections"
    verbose_name = "Inspections"

    def ready(self):
        from registry.signals import chip_notice

        from .services.alerts import alert_from_chip_notice

        chip_notice.connect(alert_from_chip_notice, dispatch_uid="inspections.alert_from_chip_notice")
