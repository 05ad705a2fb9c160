import gc
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
application = get_wsgi_application()
# What start-up loaded lives as long as the worker: out of the cyclic GC's reach, a stop is quick (config/celery.py).
gc.freeze()
