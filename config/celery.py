"""Celery application. Broker and schedule come from Django settings (CELERY_* names)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("chipledger")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
