"""chipledger settings, read from the environment (django-environ).

With no environment set, everything is embedded: SQLite and a filesystem
Celery broker under ``var/``. Set ``DATABASE_URL`` and ``REDIS_URL`` for
PostgreSQL and Redis. See README "Configuration".
"""

import os
import secrets
import sys
import urllib.parse
from datetime import timedelta
from pathlib import Path

import environ
from kombu import Exchange, Queue

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env")  # optional; real environment wins

VAR_DIR = Path(env("CHIPLEDGER_VAR_DIR", default=str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)
# Caches of the libraries the processes load live under var/ too, never in $HOME: matplotlib's font list
# (desk plots) and the replay verifier's compiled rounding kernel (a subprocess inherits the environment).
os.environ.setdefault("MPLCONFIGDIR", str(VAR_DIR / "matplotlib"))
os.environ.setdefault("REPLAY_NATIVE_CACHE", str(VAR_DIR / "replay-native"))


def _secret_key() -> str:
    """A per-installation key kept in var/, so the embedded default needs no setup."""
    path = VAR_DIR / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


def origin_from_public_url(url: str) -> str:
    """The tlog-tiles origin of a service reached at ``url``: its tiles prefix (``<url>/tlog``) without the scheme.

    https://example.org/chipledger -> example.org/chipledger/tlog; "" for "". Raises ValueError for a URL that
    is not a plain http(s) one (no user, query or fragment) or whose origin could not be a note key name.
    """
    if not url:
        return ""
    parts = urllib.parse.urlsplit(url)
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or "@" in parts.netloc
        or parts.query
        or parts.fragment
    ):
        raise ValueError(
            f"LEDGER_PUBLIC_URL must be a plain http(s) URL like https://example.org/chipledger, not {url!r}"
        )
    origin = f"{parts.netloc.lower()}{parts.path.rstrip('/')}/tlog"
    if "+" in origin or any(c.isspace() for c in origin):
        raise ValueError(f"LEDGER_PUBLIC_URL gives origin {origin!r}: a note's key name has no '+' and no space")
    return origin


SECRET_KEY = env("DJANGO_SECRET_KEY", default=None) or _secret_key()
DEBUG = env.bool("DJANGO_DEBUG", default=False)
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]", "testserver"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI assets served locally, no CDN
    "django_filters",
    "pgtrigger",
    "ledger",
    "registry",
    "inspections",
    "desk",
    "scenarios",  # the simulated outside world: seed_demo and run_scenario; nothing imports it
]

MIDDLEWARE = [
    "api.request_bodies.BodyLimitMiddleware",  # first: refuse an oversized body before anything reads it
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "config.middleware.LedgerFaultMiddleware",
    "desk.regulator_time_zone.RegulatorTimeZone",
]

# Per-endpoint body limits live in api/request_bodies.py (BODY_LIMITS); Django's own cap must not undercut the
# largest of them (the 5 MiB snapshot log, JSON-escaped). Uploaded files beyond 2.5 MiB go to a temp file.
DATA_UPLOAD_MAX_MEMORY_SIZE = 11 * 2**20

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database ---------------------------------------------------------------
DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'chipledger.sqlite3'}")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["OPTIONS"] = {
        # IMMEDIATE takes SQLite's write lock when a transaction starts, so two
        # ledger writers serialise instead of failing with "database is locked"
        # on lock upgrade; WAL lets readers go on while one writes.
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    # A file, not :memory:, so worker and writer subprocesses in tests share it.
    # Per-process name: concurrent test runs on one checkout must not share it.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / f"test-{os.getpid()}.sqlite3")}
else:
    DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("DATABASE_CONN_MAX_AGE", default=60))
    # Per-process test database: two test runs against one server must not drop each other's.
    DATABASES["default"]["TEST"] = {"NAME": f"test_{DATABASES['default']['NAME']}_{os.getpid()}"}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Cache / broker -----------------------------------------------------------
REDIS_URL = env("REDIS_URL", default="")
if REDIS_URL:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}}
    CELERY_BROKER_URL = REDIS_URL
    CELERY_RESULT_BACKEND = REDIS_URL
    # A message a dead worker (the whole process, kill -9) held goes back to the queue this long after
    # delivery: longer than the longest task (a replay, REPLAY_MAX_SECONDS), or a running task is sent twice.
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "visibility_timeout": env.int(
            "CELERY_VISIBILITY_TIMEOUT", default=env.int("REPLAY_MAX_SECONDS", default=900) + 300
        ),
        "unacked_restore_interval": 10,  # look for such messages every 10 s
        "unacked_restore_throttle": 1,
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    # kombu's filesystem transport: a real broker that ships with kombu and
    # needs no server. Producer and consumer share one folder.
    _queue = VAR_DIR / "celery" / "queue"
    _processed = VAR_DIR / "celery" / "processed"
    _results = VAR_DIR / "celery" / "results"
    _control = VAR_DIR / "celery" / "control"
    for _folder in (_queue, _processed, _results, _control):
        _folder.mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_URL = "filesystem://"
    CELERY_BROKER_TRANSPORT = "config.broker:Transport"  # kombu's, with a prompt stop on Ctrl-C
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_queue),
        "data_folder_out": str(_queue),
        "processed_folder": str(_processed),
        "store_processed": False,
        "control_folder": str(_control),  # broadcast (pidbox) exchanges; default is the cwd
    }
    CELERY_RESULT_BACKEND = f"file://{_results}"
# The queue tasks are sent to and workers consume; a scenario run uses one of its own (scenarios.runner).
CELERY_TASK_DEFAULT_QUEUE = env("CELERY_DEFAULT_QUEUE", default="celery")
# Replay verification goes to a queue of its own, so GPU hosts can run workers that take only it
# (`celery -A config worker -Q replay`, REPLAY_DEVICE=cuda: docs/operations.md). A worker started without
# -Q (the Procfile's, `make run`) consumes every queue listed here, so it takes replay work too. A run
# that isolates its default queue (scenarios, tests) keeps replay work on that same queue.
REPLAY_QUEUE = env(
    "CELERY_REPLAY_QUEUE", default="replay" if CELERY_TASK_DEFAULT_QUEUE == "celery" else CELERY_TASK_DEFAULT_QUEUE
)
CELERY_TASK_QUEUES = tuple(
    Queue(name, Exchange(name), routing_key=name) for name in dict.fromkeys([CELERY_TASK_DEFAULT_QUEUE, REPLAY_QUEUE])
)
CELERY_TASK_ROUTES = {
    "inspections.tasks.verify_claim": {"queue": REPLAY_QUEUE},
    "inspections.tasks.reverify_coverage_claim": {"queue": REPLAY_QUEUE},  # a replay too: where the GPU workers are
}
# A claim whose step is beyond the budgets of the worker that took it is retried on this queue, where set: only
# workers started with larger budgets consume it (`-Q replay,replay-large` on a GPU host: docs/operations.md).
# Not among CELERY_TASK_QUEUES, so a worker started without -Q never takes it. Unset: the retry goes to REPLAY_QUEUE.
REPLAY_LARGE_QUEUE = env("CELERY_REPLAY_LARGE_QUEUE", default="")
CELERY_RESULT_EXPIRES = timedelta(days=1)  # task outcomes that matter land on the ledger
# A task is acknowledged when it finishes, and a pool child that dies running it (kill -9, out of memory)
# hands the message back at once instead of acknowledging it: the work is redelivered, never lost.
# Tasks are idempotent (one result per claim, per draw, per log), so a redelivery records nothing twice.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1  # a worker holds no more than it runs: a killed worker strands one task
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TIMEZONE = "UTC"
# /healthz: a periodic task that has not run for two intervals plus this many seconds is stale (503).
HEALTH_HEARTBEAT_GRACE = env.int("HEALTH_HEARTBEAT_GRACE", default=60)
# A desk job that no worker finished this long after it was started is failed by the jobs sweep (its worker
# was killed, or the broker lost its message): the regulator sees why and starts it again.
DESK_JOB_DEADLINE = env.int("DESK_JOB_DEADLINE", default=env.int("REPLAY_MAX_SECONDS", default=900) + 600)
CELERY_BEAT_SCHEDULE = {
    "ledger-checkpoint": {
        "task": "ledger.tasks.checkpoint_if_grown",
        "schedule": timedelta(seconds=env.int("LEDGER_CHECKPOINT_INTERVAL", default=60)),
    },
    "ledger-witnesses": {
        "task": "ledger.tasks.witnesses_cosign_latest",
        "schedule": timedelta(seconds=env.int("LEDGER_WITNESS_INTERVAL", default=20)),
    },
    "inspections-sweep": {
        "task": "inspections.tasks.sweep",
        "schedule": timedelta(seconds=env.int("INSPECTIONS_SWEEP_INTERVAL", default=3600)),
    },
    "inspections-coverage": {
        "task": "inspections.tasks.reverify_coverage",
        "schedule": timedelta(seconds=env.int("REPLAY_COVERAGE_INTERVAL", default=3600)),
    },
    "inspections-pending": {
        "task": "inspections.tasks.sweep_pending",
        "schedule": timedelta(seconds=env.int("INSPECTIONS_PENDING_SWEEP_INTERVAL", default=300)),
    },
    "desk-figures": {
        "task": "desk.tasks.refresh_figures",
        "schedule": timedelta(seconds=env.int("DESK_FIGURES_INTERVAL", default=300)),
    },
    "desk-jobs": {
        "task": "desk.tasks.sweep_jobs",
        "schedule": timedelta(seconds=env.int("DESK_JOB_SWEEP_INTERVAL", default=300)),
    },
    # The header's ledger badge says "intact" only from a sweep that covered the ledger as it is: sweep hourly.
    "desk-integrity-sweep": {
        "task": "desk.tasks.sweep_integrity",
        "schedule": timedelta(seconds=env.int("DESK_INTEGRITY_SWEEP_INTERVAL", default=3600)),
    },
    # A notice whose message was lost (a broker restart, a killed worker) is re-sent; see ALERT_NOTIFY_SWEEP_GRACE.
    "inspections-notices": {
        "task": "inspections.tasks.resend_alert_notices",
        "schedule": timedelta(seconds=env.int("ALERT_NOTIFY_SWEEP_INTERVAL", default=300)),
    },
    "inspections-draw": {
        "task": "inspections.tasks.draw_due_campaigns",
        "schedule": timedelta(seconds=env.int("INSPECTIONS_DRAW_INTERVAL", default=3600)),
    },
}

# --- Ledger -------------------------------------------------------------------
# The log's origin, the first line of every checkpoint and the name in its verifier key (C2SP). tlog-tiles
# says it SHOULD be the tiles URL prefix without its scheme. LEDGER_ORIGIN if set; else derived from
# LEDGER_PUBLIC_URL (where the public reaches this service, e.g. https://example.org/chipledger ->
# example.org/chipledger/tlog); else the demo's localhost/chipledger. It names a log when the log is opened:
# an opened log keeps the origin its genesis entry recorded (ledger.keys.origin; docs/ledger.md, Origin).
LEDGER_PUBLIC_URL = env("LEDGER_PUBLIC_URL", default="")
LEDGER_ORIGIN = env("LEDGER_ORIGIN", default="") or origin_from_public_url(LEDGER_PUBLIC_URL) or "localhost/chipledger"
# Base64 of a 32-byte Ed25519 seed. If unset, a key file is created on first use.
LEDGER_SIGNING_KEY = env("LEDGER_SIGNING_KEY", default="")
LEDGER_KEY_FILE = Path(env("LEDGER_KEY_FILE", default=str(VAR_DIR / "ledger-signing.key")))
LEDGER_MAX_PAGE = env.int("LEDGER_MAX_PAGE", default=1000)
# Cosignatures timestamped further than this in the future are refused.
LEDGER_COSIGNATURE_MAX_SKEW = env.int("LEDGER_COSIGNATURE_MAX_SKEW", default=600)
# C2SP tlog-witness: where each registered witness (by name) takes add-checkpoint, as
# "name=URL prefix,name2=URL2"; and the M of the M-of-N policy: the served checkpoint is the newest one
# with at least M cosignatures from registered witnesses (docs/ledger.md, Witnesses).
LEDGER_WITNESS_URLS = dict(
    pair.split("=", 1) for pair in env("LEDGER_WITNESS_URLS", default="").split(",") if "=" in pair
)
LEDGER_WITNESS_QUORUM = env.int("LEDGER_WITNESS_QUORUM", default=0)
LEDGER_WITNESS_TIMEOUT = env.float("LEDGER_WITNESS_TIMEOUT", default=10.0)

# --- Keys kept outside the database -----------------------------------------------
# Demo organisations' signing keys, and the simulated chips' keys and firmware logs (replay.prover.chipsim).
# Tests point both at a temporary folder (tests/conftest.py), never at a running demo's.
DEMO_KEY_DIR = Path(env("DEMO_KEY_DIR", default=str(VAR_DIR / "demo-keys")))
CHIP_KEY_DIR = Path(env("CHIP_KEY_DIR", default=str(VAR_DIR / "chip-keys")))
DEMO_TOKEN_DIR = Path(env("DEMO_TOKEN_DIR", default=str(VAR_DIR / "demo-tokens")))  # the demo's API tokens

# --- Regulator's desk (admin) --------------------------------------------------
REGULATOR_TIME_ZONE = env("REGULATOR_TIME_ZONE", default="UTC")  # dates in the admin are shown in this zone
DESK_JOB_QUEUE = env("DESK_JOB_QUEUE", default="celery")  # the Celery queue of long admin jobs

# --- Replay verification -------------------------------------------------------
# Directories under which provers' transcripts may be read by path (e.g. a share they export).
TRANSCRIPT_ROOTS = env.list("TRANSCRIPT_ROOTS", default=[str(VAR_DIR / "transcripts")])
REPLAY_MAX_SECONDS = env.int("REPLAY_MAX_SECONDS", default=900)
# The device the verifier subprocess replays on (it inherits the worker's environment): cpu, or cuda on
# a GPU worker. Its budgets follow the device (replay/protocol/limits.py: REPLAY_MEMORY_BUDGET_BYTES,
# REPLAY_FLOP_BUDGET, read from the environment by the replay package).
REPLAY_DEVICE = env("REPLAY_DEVICE", default="cpu")
REPLAY_MAX_MEMORY_BYTES = env.int("REPLAY_MAX_MEMORY_BYTES", default=8 * 2**30)
# The verifier executable (argv prefix; SOURCE and the contract's options follow). A JSON list in the environment.
REPLAY_VERIFIER_COMMAND = env.json("REPLAY_VERIFIER_COMMAND", default=[sys.executable, "-m", "replay", "verify"])
# The default command runs forked from a fork server that imported torch and the verifier once (about 2 s a claim
# less; the same limits, environment and output). Off: every claim spawns `python -m replay verify` afresh.
REPLAY_VERIFIER_FORKSERVER = env.bool("REPLAY_VERIFIER_FORKSERVER", default=True)
# CPU threads a verifier replays on (OMP_NUM_THREADS and torch's, forked or spawned): by default this host's cores over
# the embedded worker's two verifications at once. Two verifiers of two threads each on two cores ran 9x slower than
# of one each (OpenMP's threads spin for cores the other holds); a worker of --concurrency N wants cores / N.
# (the cores this process may run on; off Linux, the machine's)
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
REPLAY_VERIFIER_THREADS = env.int("REPLAY_VERIFIER_THREADS", default=max(1, CORES // 2))
# Fetching a transcript URL (inside the verifier's limited subprocess): caps on bytes, files and time.
REPLAY_FETCH_MAX_BYTES = env.int("REPLAY_FETCH_MAX_BYTES", default=8 * 2**30)
REPLAY_FETCH_MAX_FILES = env.int("REPLAY_FETCH_MAX_FILES", default=1000)
REPLAY_FETCH_SECONDS = env.int("REPLAY_FETCH_SECONDS", default=600)
# Hosts whose loopback/private addresses may be fetched (on-premises transcript stores; tests). Empty: none.
REPLAY_FETCH_ALLOWED_HOSTS = env.list("REPLAY_FETCH_ALLOWED_HOSTS", default=[])
# Per run: the probability with which one fabricated segment must be caught; more segments are replayed until then.
REPLAY_COVERAGE_TARGET = env.float("REPLAY_COVERAGE_TARGET", default=0.9)
# Runs below their coverage target re-verified per beat (REPLAY_COVERAGE_INTERVAL), one claim each: bounded work
REPLAY_COVERAGE_RUNS = env.int("REPLAY_COVERAGE_RUNS", default=20)
# A run whose re-verification drew nothing new (its claims' own replays fill REPLAY_MAX_SECONDS) is tried again
# after this long, not every beat; the desk shows it as stalled.
REPLAY_STALLED_RETRY_SECONDS = env.int("REPLAY_STALLED_RETRY_SECONDS", default=86400)
# A verifier failure (crash, kill, timeout) is retried after REPLAY_RETRY_SECONDS * 2^(attempt-1), at most
# REPLAY_MAX_ATTEMPTS attempts in all; then an alert asks the regulator to look.
REPLAY_MAX_ATTEMPTS = env.int("REPLAY_MAX_ATTEMPTS", default=5)
REPLAY_RETRY_SECONDS = env.int("REPLAY_RETRY_SECONDS", default=600)
# A claim or log with no result this long after it was sent to the worker is re-sent by the pending sweep;
# one a worker started this many times without a result is failed with an alert.
INSPECTIONS_PENDING_DEADLINE = env.int("INSPECTIONS_PENDING_DEADLINE", default=2 * REPLAY_MAX_SECONDS + 300)
INSPECTIONS_PENDING_MAX_ATTEMPTS = env.int("INSPECTIONS_PENDING_MAX_ATTEMPTS", default=3)

# --- Auth, i18n, static -------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
FORMAT_MODULE_PATH = ["desk.formats"]  # one date format on every admin page: 2026-11-25 16:40 UTC
STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "static"
STATIC_ROOT.mkdir(exist_ok=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
LOGIN_URL = "login"
AUTHENTICATION_BACKENDS = ["registry.login_throttle.ThrottledModelBackend"]
LOGIN_MAX_FAILURES = env.int("LOGIN_MAX_FAILURES", default=5)
LOGIN_LOCKOUT_SECONDS = env.int("LOGIN_LOCKOUT_SECONDS", default=900)
LOGIN_ADDRESS_MAX_FAILURES = env.int("LOGIN_ADDRESS_MAX_FAILURES", default=20)
LOGIN_DELAY_SECONDS = env.int("LOGIN_DELAY_SECONDS", default=2)  # doubled per further failure
LOGIN_DELAY_MAX_SECONDS = env.int("LOGIN_DELAY_MAX_SECONDS", default=120)
# The header the trusted TLS proxy sets with the client's address (e.g. HTTP_X_FORWARDED_FOR); empty: REMOTE_ADDR.
LOGIN_CLIENT_ADDRESS_HEADER = env("LOGIN_CLIENT_ADDRESS_HEADER", default="")
LOGIN_TRUSTED_PROXIES = env.int("LOGIN_TRUSTED_PROXIES", default=1)
# A regulator's session: one working day at most, ended when the browser closes.
SESSION_COOKIE_AGE = env.int("SESSION_COOKIE_AGE", default=8 * 3600)
SESSION_EXPIRE_AT_BROWSER_CLOSE = True
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
# Served over HTTPS (default whenever DEBUG is off; `make run` on loopback HTTP sets DJANGO_HTTPS=0).
HTTPS = env.bool("DJANGO_HTTPS", default=not DEBUG)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = HTTPS
SECURE_HSTS_SECONDS = env.int("DJANGO_HSTS_SECONDS", default=31_536_000) if HTTPS else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = HTTPS
SECURE_SSL_REDIRECT = env.bool("DJANGO_SSL_REDIRECT", default=False)  # usually the TLS proxy's job
if env.bool("DJANGO_BEHIND_TLS_PROXY", default=False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
LOGIN_REDIRECT_URL = "/portal/"
LOGOUT_REDIRECT_URL = "login"

REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "registry.auth.HashedTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_PARSER_CLASSES": [
        "api.request_bodies.StrictJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_THROTTLE_RATES": {"organisation": env("API_RATE_PER_ORGANISATION", default="1200/min")},
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "EXCEPTION_HANDLER": "api.errors.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "chipledger API",
    "DESCRIPTION": "Chip registry, inspections and the verifiable ledger of a compute regulator.",
    "VERSION": "0.1.0",
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "api.openapi.document_error_responses",
    ],
    "ENUM_NAME_OVERRIDES": {
        "ChipStatusEnum": "registry.models.CHIP_STATUS_CHOICES",
        "InspectionTaskStatusEnum": "inspections.models.InspectionTask.Status",
    },
}

EMAIL_BACKEND = env("DJANGO_EMAIL_BACKEND", default="django.core.mail.backends.console.EmailBackend")
DEFAULT_FROM_EMAIL = env("DJANGO_DEFAULT_FROM_EMAIL", default="chipledger@localhost")

# --- Alert cases (docs/regulator.md, Case handling) ---------------------------------
# Hours the regulator gives itself to close (resolve or dismiss) an alert of each severity; older open alerts
# are shown overdue on the desk.
ALERT_SLA_HOURS = {
    "high": env.float("ALERT_SLA_HOURS_HIGH", default=24),
    "medium": env.float("ALERT_SLA_HOURS_MEDIUM", default=72),
    "low": env.float("ALERT_SLA_HOURS_LOW", default=168),
}
# A high-severity alert is announced by email to these addresses (comma-separated) and to a webhook signed with
# HMAC-SHA256 under the shared secret; either is off while unset. The worker tries each notice up to
# ALERT_NOTIFY_TRIES times, waiting ALERT_NOTIFY_BACKOFF seconds, then twice as long each time (at most an hour).
ALERT_EMAILS = env.list("ALERT_EMAILS", default=[])
ALERT_WEBHOOK_URL = env("ALERT_WEBHOOK_URL", default="")
ALERT_WEBHOOK_SECRET = env("ALERT_WEBHOOK_SECRET", default="")
ALERT_WEBHOOK_TIMEOUT = env.float("ALERT_WEBHOOK_TIMEOUT", default=10.0)
ALERT_NOTIFY_TRIES = env.int("ALERT_NOTIFY_TRIES", default=8)
ALERT_NOTIFY_BACKOFF = env.float("ALERT_NOTIFY_BACKOFF", default=30.0)
# The sweep re-sends a notice whose try is this many seconds overdue (its message was lost).
ALERT_NOTIFY_SWEEP_GRACE = env.float("ALERT_NOTIFY_SWEEP_GRACE", default=300.0)
# The desk's address in notices (links to the alert's page), e.g. https://desk.example.org; empty: paths only.
DESK_BASE_URL = env("DESK_BASE_URL", default="")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env("LOG_LEVEL", default="INFO")},
}
