from django.apps import AppConfig


class ScenariosConfig(AppConfig):
    """The simulated outside world (chips, provers, inspectors) and its commands: ``seed_demo``, ``run_scenario``.

    An app only so that Django finds its commands; it has no models, and nothing on the server imports it.
    """

    name = "scenarios"
