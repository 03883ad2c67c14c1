"""One settings module for every environment, driven by environment variables.

The embedded default (no variables set) is a developer machine: SQLite in WAL mode and a
filesystem Celery broker under ./var, so nothing but Python is needed. Production sets
DATABASE_URL (PostgreSQL) and CELERY_BROKER_URL (Redis or RabbitMQ) and turns DEBUG off.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

from django.core.exceptions import ImproperlyConfigured
from django.utils.csp import CSP

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("LEDGER_VAR_DIR", BASE_DIR / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in {"1", "true", "yes", "on"}:
        return True
    if raw.lower() in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean, got {raw!r}")


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}") from exc


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be a number, got {raw!r}") from exc


def env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in env_str(name, default).split(",") if item.strip()]


# Test databases are per process, so two test runs on one machine never share one.
_TEST_SUFFIX = os.environ.get("LEDGER_TEST_DB_SUFFIX", str(os.getpid()))


def database_from_url(url: str) -> dict[str, object]:
    """Parse postgres://user:pass@host:port/name?opt=v (psycopg 3) or sqlite:///path."""
    parsed = urlparse(url)
    if parsed.scheme in {"postgres", "postgresql"}:
        options: dict[str, object] = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": unquote(parsed.path.lstrip("/")),
            "USER": unquote(parsed.username or ""),
            "PASSWORD": unquote(parsed.password or ""),
            "HOST": parsed.hostname or "",
            "PORT": str(parsed.port or ""),
            # Persistent connections without a `SELECT 1` before each request: a connection
            # that broke is discarded at the end of the request that found it broken.
            "CONN_MAX_AGE": env_int("DATABASE_CONN_MAX_AGE", 60),
            "CONN_HEALTH_CHECKS": env_bool("DATABASE_CONN_HEALTH_CHECKS", False),
            "OPTIONS": options,
            "TEST": {"NAME": env_str("DATABASE_TEST_NAME", f"test_agent_ledger_{_TEST_SUFFIX}")},
        }
    if parsed.scheme == "sqlite":
        return sqlite_database(Path(unquote(parsed.path)))
    raise ImproperlyConfigured(f"DATABASE_URL scheme {parsed.scheme!r} is not supported")


def sqlite_database(path: Path) -> dict[str, object]:
    # WAL lets readers run beside the one writer; IMMEDIATE takes the write lock at BEGIN so two
    # writers queue on the busy timeout instead of deadlocking on a read-to-write upgrade.
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": path,
        "OPTIONS": {
            "timeout": 20,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
        # A file, not memory: the Celery worker a test starts must see the same database.
        "TEST": {"NAME": str(VAR_DIR / f"test-ledger-{_TEST_SUFFIX}.sqlite3")},
    }


DEBUG = env_bool("DJANGO_DEBUG", False)
DEVELOPMENT_SECRET_KEY = "dev-only-insecure-secret-key-change-me-in-production-0123456789"
# Unset means the development key; with LEDGER_PRODUCTION on, an empty, short or development
# key is an error of `manage.py check --deploy` (config.checks) and stops the WSGI app.
SECRET_KEY_GIVEN = os.environ.get("DJANGO_SECRET_KEY")  # None when unset, "" when empty
SECRET_KEY = SECRET_KEY_GIVEN or DEVELOPMENT_SECRET_KEY
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver")
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", "")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "ledger",
    "reconciliation",
    "portal",
    "ops",
]

MIDDLEWARE = [
    "config.request_id.RequestIdMiddleware",
    "config.middleware.UnusablePathMiddleware",
    "config.middleware.LoadSheddingMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "config.middleware.ContentSecurityPolicyMiddleware",  # Django's, policy built once
    "config.middleware.BrowserOnlySessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "config.middleware.BrowserOnlyAuthenticationMiddleware",
    "config.middleware.BrowserOnlyMessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "config.middleware.BrowserOnlyHtmxMiddleware",
    # Last, so everything above runs for it as for any request: answers plain submits
    # (POST /api/v1/operations) without DRF's per-request work; see ledger/fast_path.py.
    "ledger.fast_path.SubmitFastPathMiddleware",
]

# Agents' bearer-token API calls skip the browser middleware above (the BrowserOnly wrappers
# in config/middleware.py): no session, user, messages or htmx work.

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
                "django.template.context_processors.csp",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASE_URL = os.environ.get("DATABASE_URL", "")
DATABASES = {
    "default": database_from_url(DATABASE_URL)
    if DATABASE_URL
    else sqlite_database(VAR_DIR / "ledger.sqlite3")
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

_cache_url = env_str("CACHE_URL", "")
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": _cache_url}
    if _cache_url
    else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "admin:login"

LANGUAGE_CODE = "en"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATIC_ROOT.mkdir(exist_ok=True)
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True

# Bodies are small JSON documents; anything bigger is refused before parsing.
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("LEDGER_MAX_BODY_BYTES", 64 * 1024)

# Security headers. The CSP is strict: scripts only from our own static files with a nonce.
SECURE_CSP = {
    "default-src": [CSP.SELF],
    "script-src": [CSP.SELF, CSP.NONCE],
    "style-src": [CSP.SELF, CSP.NONCE],
    "img-src": [CSP.SELF, "data:"],
    "connect-src": [CSP.SELF],
    "font-src": [CSP.SELF],
    "object-src": [CSP.NONE],
    "base-uri": [CSP.NONE],
    "frame-ancestors": [CSP.NONE],
    "form-action": [CSP.SELF],
}
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
SESSION_COOKIE_HTTPONLY = True
# LEDGER_PRODUCTION=true switches every transport-security default on (behind TLS).
PRODUCTION = env_bool("LEDGER_PRODUCTION", False)
SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", PRODUCTION)
SESSION_COOKIE_SECURE = env_bool("DJANGO_SECURE_COOKIES", PRODUCTION)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_HSTS_SECONDS = env_int("DJANGO_HSTS_SECONDS", 31_536_000 if PRODUCTION else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = SECURE_HSTS_SECONDS > 0
SECURE_HSTS_PRELOAD = SECURE_HSTS_SECONDS > 0
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["ledger.auth.AgentTokenAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["ledger.auth.IsAgent"],
    "DEFAULT_PARSER_CLASSES": ["ledger.api_support.StrictJSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "ledger.negotiation.JsonNegotiation",
    "DEFAULT_THROTTLE_CLASSES": ["ledger.auth.AgentRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {"agent": env_str("LEDGER_AGENT_RATE", "600/min")},
    # Proxies in front of the service that append to X-Forwarded-For: 0 trusts only the
    # connection's address, so a client cannot pick its own address for the throttles.
    "NUM_PROXIES": env_int("LEDGER_NUM_PROXIES", 0),
    "EXCEPTION_HANDLER": "ledger.api_support.problem_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Agent Ledger API",
    "DESCRIPTION": (
        "Submit side-effecting tool calls under a stable operation ID. Completed actions are "
        "reused, concurrent senders are excluded, uncertain actions are never blindly repeated."
    ),
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "ledger.openapi.postprocess",
    ],
}

# --- The ledger ---------------------------------------------------------------------------
SANDBOX_URL = env_str("SANDBOX_URL", "http://127.0.0.1:8765")
# The sandbox's SMTP listener, which the `smtp-sandbox` e-mail adapter sends to.
SANDBOX_SMTP_HOST = env_str("SANDBOX_SMTP_HOST", "127.0.0.1")
SANDBOX_SMTP_PORT = env_int("SANDBOX_SMTP_PORT", 8025)
# The tool catalogue (README, "Guard your own tool"): every tool, its params schema, thresholds
# and provider connector. Read and validated once at start-up. The demo's is config/tools.toml;
# config/tools-stripe-smtp.toml adds refund v2 on the Stripe SDK and send_email v2 over SMTP.
LEDGER_TOOLS_FILE = env_str("LEDGER_TOOLS_FILE", str(BASE_DIR / "config" / "tools.toml"))
LEDGER_EMAIL_FROM = env_str("LEDGER_EMAIL_FROM", "ledger@example.invalid")
# Overrides every tool's own request timeout when set (tests shorten it).
LEDGER_PROVIDER_TIMEOUT_SECONDS = env_float("LEDGER_PROVIDER_TIMEOUT_SECONDS", 0) or None
LEDGER_RETRY_AFTER_SECONDS = env_int("LEDGER_RETRY_AFTER_SECONDS", 5)
# How long a web process trusts a credential it verified (no query per request). Revocations
# made elsewhere take effect within this many seconds; in the same process at once.
LEDGER_CREDENTIAL_CACHE_SECONDS = env_float("LEDGER_CREDENTIAL_CACHE_SECONDS", 2.0)
# Plain submits answered by ledger.fast_path instead of going through DRF (same answers).
LEDGER_API_FAST_PATH = env_bool("LEDGER_API_FAST_PATH", True)
LEDGER_PUBLIC_BASE_URL = env_str("LEDGER_PUBLIC_BASE_URL", "")
# How long the executor keeps retrying (fresh connection, short backoff) to persist an outcome
# the provider has given when the database is unreachable, before answering 503.
LEDGER_PERSIST_RETRY_SECONDS = env_float("LEDGER_PERSIST_RETRY_SECONDS", 10.0)
# Load shedding (config.middleware.LoadSheddingMiddleware): requests running at once per
# process (0 turns it off), and the longest a request may wait — for a slot, or in a proxy's
# queue per its X-Request-Start stamp — before it is answered 503 overloaded.
LEDGER_MAX_CONCURRENT_REQUESTS = env_int("LEDGER_MAX_CONCURRENT_REQUESTS", 16)
LEDGER_MAX_QUEUE_WAIT_SECONDS = env_float("LEDGER_MAX_QUEUE_WAIT_SECONDS", 1.0)
LEDGER_OVERLOAD_RETRY_AFTER_SECONDS = env_int("LEDGER_OVERLOAD_RETRY_AFTER_SECONDS", 2)
# Operations: /metrics and /readyz.
# prometheus_client's multiprocess mode: every gunicorn worker and Celery process writes its
# metrics there and /metrics sums them. Must be set (and emptied) before the processes start.
PROMETHEUS_MULTIPROC_DIR = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")
# When set, /metrics answers only `Authorization: Bearer <token>`.
LEDGER_METRICS_TOKEN = env_str("LEDGER_METRICS_TOKEN", "")
LEDGER_READYZ_TIMEOUT_SECONDS = env_int("LEDGER_READYZ_TIMEOUT_SECONDS", 2)
# Personal data: free-text and secret params of terminal operations are blanked this many days
# after they were resolved (ledger.retention, run by beat every LEDGER_RETENTION_SWEEP_SECONDS).
LEDGER_PARAMS_RETENTION_DAYS = env_int("LEDGER_PARAMS_RETENTION_DAYS", 30)
LEDGER_RETENTION_SWEEP_SECONDS = env_float("LEDGER_RETENTION_SWEEP_SECONDS", 3600.0)
# Failed authentications one client address may make before it gets 429 (see ledger.auth).
LEDGER_AUTH_FAILURE_RATE = env_str("LEDGER_AUTH_FAILURE_RATE", "30/min")
# Long-poll (GET …?wait=N): first re-check after this long, then doubling up to the ceiling.
LEDGER_LONG_POLL_FIRST_INTERVAL_SECONDS = env_float("LEDGER_LONG_POLL_FIRST_INTERVAL_SECONDS",
                                                    0.1)
LEDGER_LONG_POLL_INTERVAL_SECONDS = env_float("LEDGER_LONG_POLL_INTERVAL_SECONDS", 0.5)
# The longest a long poll is held, whatever wait (0-30) the client asked for: the answer is the
# current state when this runs out, and a client polls again (the SDKs do).
LEDGER_LONG_POLL_MAX_SECONDS = env_float("LEDGER_LONG_POLL_MAX_SECONDS", 30.0)
# Webhooks: per-attempt timeout, backoff between attempts (exponential with jitter), how long
# a delivery is retried before it is given up (at least a day), and how long a worker's claim
# on a delivery hides it from the sweep (longer than the timeout; a killed worker's delivery is
# due again after it).
LEDGER_WEBHOOK_TIMEOUT_SECONDS = env_float("LEDGER_WEBHOOK_TIMEOUT_SECONDS", 10.0)
LEDGER_WEBHOOK_BACKOFF_BASE_SECONDS = env_float("LEDGER_WEBHOOK_BACKOFF_BASE_SECONDS", 10.0)
LEDGER_WEBHOOK_BACKOFF_MAX_SECONDS = env_float("LEDGER_WEBHOOK_BACKOFF_MAX_SECONDS", 3600.0)
LEDGER_WEBHOOK_RETRY_WINDOW_SECONDS = max(
    env_int("LEDGER_WEBHOOK_RETRY_WINDOW_SECONDS", 3 * 24 * 3600), 24 * 3600)
LEDGER_WEBHOOK_VISIBILITY_SECONDS = env_int("LEDGER_WEBHOOK_VISIBILITY_SECONDS", 60)
LEDGER_WEBHOOK_SWEEP_BATCH_SIZE = env_int("LEDGER_WEBHOOK_SWEEP_BATCH_SIZE", 200)

# --- The operators' dashboard (/ops/) ---------------------------------------------------------
# How long an operation may stay unknown before it is overdue, for tools that set no
# unknown_sla_seconds of their own.
LEDGER_UNKNOWN_SLA_SECONDS = env_int("LEDGER_UNKNOWN_SLA_SECONDS", 900)
# Replays and params conflicts are counted in memory and written once per this many seconds
# (per process); 0 writes them only when something calls ledger.tally.flush().
LEDGER_TALLY_FLUSH_SECONDS = env_float("LEDGER_TALLY_FLUSH_SECONDS", 10.0)
# The provider error-rate banner: share of sends answered not_sent or unknown in the last
# 10 minutes, once at least this many calls were made.
OPS_PROVIDER_ERROR_RATE = env_float("OPS_PROVIDER_ERROR_RATE", 0.2)
OPS_PROVIDER_ERROR_MIN_CALLS = env_int("OPS_PROVIDER_ERROR_MIN_CALLS", 20)

# Who the customers' status pages speak for, and how to reach them (shown on every page).
LEDGER_ORG_NAME = env_str("LEDGER_ORG_NAME", "Example Shop")
LEDGER_ORG_CONTACT = env_str(
    "LEDGER_ORG_CONTACT", "Questions? Write to support@example.invalid and quote your reference.")

# --- Celery (the Celery app reads every CELERY_* name) -------------------------------------
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "filesystem://")
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = (
    {
        "data_folder_in": str(VAR_DIR / "broker" / "out"),
        "data_folder_out": str(VAR_DIR / "broker" / "out"),
        "processed_folder": str(VAR_DIR / "broker" / "processed"),
        "control_folder": str(VAR_DIR / "broker" / "control"),
        "store_processed": False,
    }
    if CELERY_BROKER_URL.startswith("filesystem")
    else {}
)
for _folder in ("out", "processed", "control"):
    if CELERY_BROKER_URL.startswith("filesystem"):
        (VAR_DIR / "broker" / _folder).mkdir(parents=True, exist_ok=True)
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SOFT_TIME_LIMIT = env_int("CELERY_TASK_SOFT_TIME_LIMIT", 60)
CELERY_TASK_TIME_LIMIT = env_int("CELERY_TASK_TIME_LIMIT", 90)
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
LEDGER_SWEEP_INTERVAL_SECONDS = env_float("LEDGER_SWEEP_INTERVAL_SECONDS", 5.0)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "json": {"()": "config.logging.JsonFormatter"},
        "text": {
            "()": "config.logging.TextFormatter",
            "format": "%(asctime)s %(levelname)s %(name)s %(message)s",
        },
    },
    "filters": {"request_id": {"()": "config.logging.RequestIdFilter"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": env_str("LOG_FORMAT", "json" if PRODUCTION else "text"),
            "filters": ["request_id"],
        }
    },
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    # The Stripe SDK logs Stripe's error messages (which can echo request values) at INFO, and
    # httpx logs every request's full URL (a lookup's query string included) at INFO; the
    # connectors log their own redacted line for every call instead.
    "loggers": {name: {"level": "WARNING"} for name in ("stripe", "httpx", "httpcore")},
}

# --- Reconciliation -------------------------------------------------------------------------
# Everything the reconciler, its sweeps and their Celery schedule read. Durations in seconds.
# How many due cases one sweeper leases per short transaction, and how long a lease hides them
# from other sweepers: longer than one case can take (a re-send plus a lookup, each bounded by
# the provider timeout), so a case is never processed twice at once.
RECONCILIATION_SWEEP_BATCH_SIZE = env_int("RECONCILIATION_SWEEP_BATCH_SIZE", 25)
RECONCILIATION_CASE_VISIBILITY_SECONDS = env_int("RECONCILIATION_CASE_VISIBILITY_SECONDS", 120)
# One sweep task stops leasing new batches after this long (well under its soft time limit).
RECONCILIATION_SWEEP_BUDGET_SECONDS = env_float("RECONCILIATION_SWEEP_BUDGET_SECONDS", 30.0)
RECONCILIATION_LEASE_SWEEP_BATCH_SIZE = env_int("RECONCILIATION_LEASE_SWEEP_BATCH_SIZE", 200)
# Exponential backoff with jitter between checks of one case: base * 2**(n-1), capped.
RECONCILIATION_BACKOFF_BASE_SECONDS = env_float("RECONCILIATION_BACKOFF_BASE_SECONDS", 2.0)
RECONCILIATION_BACKOFF_MAX_SECONDS = env_float("RECONCILIATION_BACKOFF_MAX_SECONDS", 300.0)
# A same-key re-send is allowed only until key_first_sent_at + the provider's retention minus
# this margin: clocks drift and a request takes time to arrive, and one that lands after the
# provider forgot the key would execute a second time.
RECONCILIATION_KEY_RETENTION_MARGIN_SECONDS = env_int(
    "RECONCILIATION_KEY_RETENTION_MARGIN_SECONDS", 3600
)
# A case still unresolved this long after it opened goes to a person.
RECONCILIATION_CASE_DEADLINE_SECONDS = env_int("RECONCILIATION_CASE_DEADLINE_SECONDS", 4 * 3600)
# How long a case may wait in the review queue before it is overdue (its SLA).
RECONCILIATION_REVIEW_SLA_SECONDS = env_int("RECONCILIATION_REVIEW_SLA_SECONDS", 4 * 3600)
# Task limits: a sweep is cut off softly (it finishes the case in hand), then hard.
RECONCILIATION_SWEEP_SOFT_TIME_LIMIT = env_int("RECONCILIATION_SWEEP_SOFT_TIME_LIMIT", 90)
RECONCILIATION_SWEEP_TIME_LIMIT = env_int("RECONCILIATION_SWEEP_TIME_LIMIT", 120)
RECONCILIATION_TASK_MAX_RETRIES = env_int("RECONCILIATION_TASK_MAX_RETRIES", 5)

# Tests and parallel deployments that share one broker keep their messages apart by queue.
CELERY_TASK_DEFAULT_QUEUE = env_str("CELERY_TASK_DEFAULT_QUEUE", "celery")
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Celery's own beat_schedule (no database scheduler). `expires` drops a sweep that waited too
# long in the queue (the next one is on its way), but never under 10 s: with short intervals a
# busy single worker (or the filesystem broker's 1 s polling) would otherwise let every sweep
# expire before it runs, and nothing would be reconciled.
CELERY_BEAT_SCHEDULE = {
    "reconciliation-sweep-leases": {
        "task": "reconciliation.tasks.sweep_leases",
        "schedule": LEDGER_SWEEP_INTERVAL_SECONDS,
        "options": {"expires": max(LEDGER_SWEEP_INTERVAL_SECONDS, 10.0)},
    },
    "reconciliation-sweep-cases": {
        "task": "reconciliation.tasks.sweep_cases",
        "schedule": LEDGER_SWEEP_INTERVAL_SECONDS,
        "options": {"expires": max(LEDGER_SWEEP_INTERVAL_SECONDS, 10.0)},
    },
    # Retention of personal data (ledger.retention).
    "ledger-redact-expired-params": {
        "task": "ledger.tasks.redact_expired_params",
        "schedule": LEDGER_RETENTION_SWEEP_SECONDS,
        "options": {"expires": LEDGER_RETENTION_SWEEP_SECONDS},
    },
    # Webhook deliveries that are due: retries after their backoff, and any whose worker died
    # or whose enqueue-on-commit message was lost.
    "ledger-sweep-webhooks": {
        "task": "ledger.tasks.sweep_webhooks",
        "schedule": LEDGER_SWEEP_INTERVAL_SECONDS,
        "options": {"expires": max(LEDGER_SWEEP_INTERVAL_SECONDS, 10.0)},
    },
    # The ledger's own sweep: prepared rows nobody is sending (executor.retry_unsent).
    "ledger-retry-unsent": {
        "task": "ledger.tasks.retry_unsent_operations",
        "schedule": LEDGER_SWEEP_INTERVAL_SECONDS,
        "options": {"expires": max(LEDGER_SWEEP_INTERVAL_SECONDS, 10.0)},
    },
    # The dashboard's counters: closed minutes of the event tables, rolled up (ops.rollup).
    "ops-rollup-stats": {
        "task": "ops.tasks.rollup_stats",
        "schedule": env_float("OPS_ROLLUP_INTERVAL_SECONDS", 30.0),
        "options": {"expires": 30.0},
    },
}
if CELERY_BROKER_URL.startswith("filesystem"):
    # The filesystem transport neither creates its folders nor keeps its exchange tables
    # anywhere but ./control (relative to whatever directory the worker started in).
    CELERY_BROKER_TRANSPORT_OPTIONS["control_folder"] = str(VAR_DIR / "broker" / "control")
    for _folder in ("data_folder_in", "data_folder_out", "processed_folder", "control_folder"):
        Path(str(CELERY_BROKER_TRANSPORT_OPTIONS[_folder])).mkdir(parents=True, exist_ok=True)
