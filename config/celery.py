"""Celery application. Broker and schedule come from Django settings (CELERY_* names)."""

import gc
import os

from celery import Celery, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("chipledger")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@signals.worker_ready.connect(weak=False, dispatch_uid="chipledger-gc-freeze-worker")
@signals.beat_init.connect(weak=False, dispatch_uid="chipledger-gc-freeze-beat")
def startup_objects_frozen(**_) -> None:
    """Everything loaded at start-up (Django, the apps, Celery) lives as long as the process: moved out of
    the cyclic GC's reach, a stop (Ctrl-C) no longer spends ~0.5 s of CPU traversing it (1.5 s -> 0.1 s)."""
    gc.freeze()
