"""Settings shared by every deployment; each value comes from the environment."""

from __future__ import annotations

import hashlib
from pathlib import Path
from urllib.parse import urlsplit

from core.database_url import parse_database_url
from core.env import (
    KEY_FILE_NAME,
    ConfigurationError,
    EnvReader,
    private_directory,
    require_less_than,
    stored_secret,
)
from core.redis_connection import celery_broker
from core.transport.silence import PeerSilence, with_postgres_options
from identity.ldap import ldap_settings

BASE_DIR = Path(__file__).resolve().parent.parent.parent

env = EnvReader()

# What `make run` keeps: the SQLite database, the secret key, passwords, static files.
DATA_DIR = BASE_DIR / env.string("ACTIVATE_DATA_DIR", "data")
# Signs sessions and derives the key that encrypts stored SSH private keys. Unset, it is made
# once at random and kept in data/ (production refuses to start without it set).
SECRET_KEY_FILE = DATA_DIR / KEY_FILE_NAME
SECRET_KEY = env.optional_string("ACTIVATE_SECRET_KEY") or stored_secret(SECRET_KEY_FILE)
DEBUG = env.boolean("ACTIVATE_DEBUG", False)
ALLOWED_HOSTS = env.csv_list("ACTIVATE_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.csv_list("ACTIVATE_CSRF_TRUSTED_ORIGINS", [])

DATABASE_URL = env.optional_string("DATABASE_URL")
if DATABASE_URL is None:
    private_directory(DATA_DIR)
    DATABASE_URL = f"sqlite:///{DATA_DIR / 'activate.sqlite3'}"
try:
    DATABASES = {"default": parse_database_url(DATABASE_URL, conn_max_age=60)}
except ValueError as exc:
    raise ConfigurationError(f"DATABASE_URL is not a database URL: {exc}") from None
# Seconds a silent peer (a host cut off, not killed) keeps a connection of ours, and what hangs
# on it, such as a submission lock (core/transport/silence.py).
ACTIVATE_PEER_SILENCE = env.integer("ACTIVATE_PEER_SILENCE", 30, minimum=3)
PEER_SILENCE = PeerSilence(ACTIVATE_PEER_SILENCE)
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # SQLite serialises writers; a busy timeout keeps web, worker and beat from failing on locks.
    DATABASES["default"]["OPTIONS"] = {"timeout": 20}
    DATABASES["default"]["CONN_MAX_AGE"] = 0
elif DATABASES["default"]["ENGINE"].endswith("postgresql"):
    DATABASES["default"]["OPTIONS"] = with_postgres_options(
        DATABASES["default"].get("OPTIONS", {}),
        PEER_SILENCE,
        # A pooler that refuses startup options (PgBouncer) needs the server's own settings.
        server=env.boolean("ACTIVATE_DB_SERVER_KEEPALIVES", True),
    )

# One Redis server, or the sentinels watching one (sentinel://..., core/env.py's SENTINEL_FORM).
REDIS_URL = env.redis_url("REDIS_URL", "redis://127.0.0.1:6379/0")
ACTIVATE_PUBLIC_URL = env.url(
    "ACTIVATE_PUBLIC_URL", "http://127.0.0.1:8000", schemes=("http", "https")
).rstrip("/")
# Where job scripts tell agents to call back: the agents' own server (scripts/start.sh agents),
# so that users' requests never hold up a heartbeat.
ACTIVATE_AGENT_URL = env.url(
    "ACTIVATE_AGENT_URL", ACTIVATE_PUBLIC_URL, schemes=("http", "https")
).rstrip("/")
# Set by `scripts/start.sh agents`: this process serves the agents' endpoints and nothing else,
# so it cannot become a second door into the API or the admin.
ACTIVATE_AGENT_SERVER = env.boolean("ACTIVATE_AGENT_SERVER", False)

# Sessions on origins of their own (sessions_app/proxy/origins.py): each at <id>.<this domain>, with
# the platform's scheme and port, so that what a session serves can neither call the platform's
# API nor read its cookies. Browsers resolve *.localhost to loopback, so a platform on loopback
# needs no DNS; elsewhere it takes wildcard DNS and TLS. ACTIVATE_SESSION_PATHS=true serves
# sessions on the platform's own origin instead: only for sites whose users trust each other.
ACTIVATE_SESSION_PATHS = env.boolean("ACTIVATE_SESSION_PATHS", False)
_public_host = urlsplit(ACTIVATE_PUBLIC_URL).hostname or ""
_loopback = _public_host in ("localhost", "::1") or _public_host.startswith("127.")
ACTIVATE_SESSION_DOMAIN = env.matching(
    "ACTIVATE_SESSION_DOMAIN",
    "localhost" if _loopback and not ACTIVATE_SESSION_PATHS else "",
    pattern=r"|[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*",
    meaning="a lowercase DNS name (sessions are served at <id>.<name>)",
)
if ACTIVATE_SESSION_PATHS and env.optional_string("ACTIVATE_SESSION_DOMAIN"):
    raise ConfigurationError("set ACTIVATE_SESSION_DOMAIN or ACTIVATE_SESSION_PATHS, not both")
if not ACTIVATE_SESSION_PATHS and not ACTIVATE_SESSION_DOMAIN:
    raise ConfigurationError(
        f"ACTIVATE_SESSION_DOMAIN must be set for a platform at {ACTIVATE_PUBLIC_URL}: sessions"
        " are served at <id>.<that domain> (wildcard DNS and TLS); ACTIVATE_SESSION_PATHS=true"
        " serves them on the platform's own origin instead, for sites whose users trust each other"
    )
for _trusted in CSRF_TRUSTED_ORIGINS:
    # A session's origin trusted for CSRF could post to the platform as the session's owner.
    _host = (urlsplit(_trusted).hostname or "").removeprefix("*.")
    _suffix = "." + ACTIVATE_SESSION_DOMAIN
    _covers = _host.endswith(_suffix) or ("*." in _trusted and _suffix.endswith("." + _host))
    if ACTIVATE_SESSION_DOMAIN and _covers:
        raise ConfigurationError(
            f"ACTIVATE_CSRF_TRUSTED_ORIGINS may not include sessions' origins, got {_trusted!r}"
        )

# Names every scheduler job this installation submits (pw-worker-<id>-<worker>), so that
# installations sharing a cluster account never adopt or cancel each other's jobs. The default
# follows the secret key; set it explicitly to keep it across a key rotation.
ACTIVATE_INSTALLATION_ID = env.matching(
    "ACTIVATE_INSTALLATION_ID",
    hashlib.sha256(SECRET_KEY.encode()).hexdigest()[:8],
    pattern=r"[a-z0-9]{1,16}",
    meaning="1 to 16 lowercase letters or digits",
)

# Timing knobs, in seconds.
ACTIVATE_PENDING_TIMEOUT = env.number("ACTIVATE_PENDING_TIMEOUT", 7200, minimum=1)
ACTIVATE_QUEUED_TIMEOUT = env.number("ACTIVATE_QUEUED_TIMEOUT", 604800, minimum=1)
ACTIVATE_HEARTBEAT_INTERVAL = env.number("ACTIVATE_HEARTBEAT_INTERVAL", 30, minimum=0.1)
ACTIVATE_HEARTBEAT_TIMEOUT = env.number("ACTIVATE_HEARTBEAT_TIMEOUT", 120, minimum=1)
# Seconds an agent's signed request may be early or late (its timestamp against this server's
# clock); each request's nonce is remembered twice that long, so none is accepted twice.
ACTIVATE_AGENT_SIGNATURE_WINDOW = env.number("ACTIVATE_AGENT_SIGNATURE_WINDOW", 60, minimum=1)
# The agents' server's admission of beats (agents/admission.py), in each of its processes: a
# beat is shed, answered a signed "retry after N s" before any database or Redis work, while
# the event loop runs later than the budget (milliseconds: every beat waiting in it waits that
# long) or this many beats are between admission and answer. N grows with the share shed and
# is at most ACTIVATE_AGENT_RETRY_AFTER_MAX seconds. Beats' scripts share one pipelined Redis
# connection per process (agents/pipelined.py), so the bound in flight guards no pool now: it
# caps how many answers queue behind one another on it.
ACTIVATE_AGENT_BEAT_BUDGET_MS = env.number("ACTIVATE_AGENT_BEAT_BUDGET_MS", 50, minimum=1)
ACTIVATE_AGENT_BEATS_IN_FLIGHT = env.integer("ACTIVATE_AGENT_BEATS_IN_FLIGHT", 64, minimum=1)
ACTIVATE_AGENT_RETRY_AFTER_MAX = env.number(
    "ACTIVATE_AGENT_RETRY_AFTER_MAX", ACTIVATE_HEARTBEAT_INTERVAL, minimum=0.1
)
ACTIVATE_PURGE_AFTER = env.number("ACTIVATE_PURGE_AFTER", 3600, minimum=0)
ACTIVATE_POLL_INTERVAL = env.number("ACTIVATE_POLL_INTERVAL", 30, minimum=0.1)
ACTIVATE_SWEEP_INTERVAL = env.number("ACTIVATE_SWEEP_INTERVAL", 10, minimum=0.1)
# Before the heartbeat sweep stops anyone, it asks the agents' own endpoint whether the platform
# can hear them at all (off only in unit tests, which run no web server).
ACTIVATE_HEARING_PROBE = env.boolean("ACTIVATE_HEARING_PROBE", True)
# The circuit breaker: more than this share of a cluster's connected workers (when it has at
# least ACTIVATE_BREAKER_MIN_WORKERS) going silent in one sweep looks like the platform's own
# fault; they are kept until an operator confirms.
ACTIVATE_BREAKER_SHARE = env.number("ACTIVATE_BREAKER_SHARE", 0.5, minimum=0.0)
ACTIVATE_BREAKER_MIN_WORKERS = env.integer("ACTIVATE_BREAKER_MIN_WORKERS", 3, minimum=1)
# Commands run through the platform (pw ssh, the API's exec): per user at once, seconds, bytes.
ACTIVATE_EXEC_PER_USER = env.integer("ACTIVATE_EXEC_PER_USER", 4, minimum=1)
ACTIVATE_EXEC_TIMEOUT = env.number("ACTIVATE_EXEC_TIMEOUT", 300, minimum=1)
ACTIVATE_EXEC_MAX_OUTPUT = env.integer("ACTIVATE_EXEC_MAX_OUTPUT", 1_048_576, minimum=1024)
# Terminals (browser and `pw ssh`): closed after this long without a byte either way, or open.
ACTIVATE_TERMINAL_IDLE_TIMEOUT = env.number("ACTIVATE_TERMINAL_IDLE_TIMEOUT", 3600, minimum=1)
ACTIVATE_TERMINAL_MAX_DURATION = env.number("ACTIVATE_TERMINAL_MAX_DURATION", 86400, minimum=1)
ACTIVATE_TERMINALS_PER_USER = env.integer("ACTIVATE_TERMINALS_PER_USER", 10, minimum=1)
# A session whose start broke off on a dropped SSH connection or a scheduler that did not
# answer is started again this many times before it fails.
ACTIVATE_SESSION_START_RETRIES = env.integer("ACTIVATE_SESSION_START_RETRIES", 2, minimum=0)
# Owners are warned this many seconds before a connected worker's wall time runs out.
ACTIVATE_WALLTIME_WARNING = env.number("ACTIVATE_WALLTIME_WARNING", 600, minimum=0)
# Idle workers and sessions. The agent reports its job's CPU and I/O every
# ACTIVATE_ACTIVITY_INTERVAL seconds (along with a beat); a span under both thresholds (share of
# one core; bytes a second) with no terminal and no proxied traffic is quiet. Idle policies are
# at least ACTIVATE_IDLE_SHORTEST seconds; owners are warned ACTIVATE_IDLE_WARNING seconds ahead
# (at most half the policy), and the idle sweep runs every ACTIVATE_IDLE_SWEEP_INTERVAL seconds.
ACTIVATE_ACTIVITY_INTERVAL = env.number("ACTIVATE_ACTIVITY_INTERVAL", 300, minimum=0.1)
ACTIVATE_IDLE_CPU = env.number("ACTIVATE_IDLE_CPU", 0.05, minimum=0.0)
ACTIVATE_IDLE_IO = env.number("ACTIVATE_IDLE_IO", 65536, minimum=0.0)
ACTIVATE_IDLE_SHORTEST = env.number("ACTIVATE_IDLE_SHORTEST", 600, minimum=1)
ACTIVATE_IDLE_WARNING = env.number("ACTIVATE_IDLE_WARNING", 300, minimum=0)
ACTIVATE_IDLE_SWEEP_INTERVAL = env.number("ACTIVATE_IDLE_SWEEP_INTERVAL", 60, minimum=0.1)
# Notices by e-mail: Django's mail backend (the console unless a site sets SMTP).
EMAIL_BACKEND = env.string(
    "ACTIVATE_EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend"
)
EMAIL_HOST = env.string("ACTIVATE_EMAIL_HOST", "localhost")
EMAIL_PORT = env.integer("ACTIVATE_EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = env.string("ACTIVATE_EMAIL_USER", "")
EMAIL_HOST_PASSWORD = env.string("ACTIVATE_EMAIL_PASSWORD", "")
EMAIL_USE_TLS = env.boolean("ACTIVATE_EMAIL_TLS", False)
DEFAULT_FROM_EMAIL = env.string("ACTIVATE_EMAIL_FROM", "activate@localhost")
# Threads per web server process for pages and the API (WebSockets need none).
ACTIVATE_WEB_THREADS = env.integer("ACTIVATE_WEB_THREADS", 8, minimum=1)
# Threads per web process for commands run through the API (each holds one while it runs).
ACTIVATE_EXEC_THREADS = env.integer("ACTIVATE_EXEC_THREADS", 32, minimum=1)
# Where sessions' programs are on compute nodes (ACTIVATE_CODE_SERVER, ACTIVATE_NOVNC_DIR, ...)
# each session kind reads itself: see the `tools` of the modules in sessions_app/kinds/.
# Seconds between sweeps that start sessions whose worker connected and fail stuck starts.
ACTIVATE_SESSION_SWEEP_INTERVAL = env.number("ACTIVATE_SESSION_SWEEP_INTERVAL", 5, minimum=0.1)
# The session proxy, per web server process and user: requests and WebSockets open at once
# (over it, 429 or close 4429), and the largest request body (413) and WebSocket message (close
# 1009) it passes on, in bytes. uvicorn's --ws-max-size (16 MiB) caps browsers' messages too.
ACTIVATE_PROXY_MAX_CONNECTIONS_PER_USER = env.integer(
    "ACTIVATE_PROXY_MAX_CONNECTIONS_PER_USER", 64, minimum=1
)
ACTIVATE_PROXY_MAX_WEBSOCKETS_PER_USER = env.integer(
    "ACTIVATE_PROXY_MAX_WEBSOCKETS_PER_USER", 64, minimum=1
)
ACTIVATE_PROXY_MAX_BODY = env.integer("ACTIVATE_PROXY_MAX_BODY", 64 * 1024 * 1024, minimum=1024)
ACTIVATE_PROXY_MAX_MESSAGE = env.integer(
    "ACTIVATE_PROXY_MAX_MESSAGE", 16 * 1024 * 1024, minimum=1024
)
# The largest file an upload may write on a cluster, in bytes (413 beyond it: said at once when
# the request's Content-Length is over, else when the body reaches it).
ACTIVATE_FILES_MAX_UPLOAD = env.integer("ACTIVATE_FILES_MAX_UPLOAD", 10 * 1024**3, minimum=1)
# How many downloads and uploads one user may have under way at once, counted in Redis over all
# web processes (429 beyond it).
ACTIVATE_FILES_TRANSFERS_PER_USER = env.integer("ACTIVATE_FILES_TRANSFERS_PER_USER", 4, minimum=1)
ACTIVATE_PROBE_INTERVAL = env.number("ACTIVATE_PROBE_INTERVAL", 300, minimum=1)
ACTIVATE_RECONCILE_INTERVAL = env.number("ACTIVATE_RECONCILE_INTERVAL", 300, minimum=1)
# How long a dispatched submission owns a pending worker before the sweep sends it again.
ACTIVATE_SUBMIT_LEASE = env.number("ACTIVATE_SUBMIT_LEASE", 60, minimum=1)
ACTIVATE_SSH_CONNECT_TIMEOUT = env.number("ACTIVATE_SSH_CONNECT_TIMEOUT", 10, minimum=0.1)
ACTIVATE_SSH_COMMAND_TIMEOUT = env.number("ACTIVATE_SSH_COMMAND_TIMEOUT", 60, minimum=0.1)
ACTIVATE_SSH_MAX_CHANNELS = env.integer("ACTIVATE_SSH_MAX_CHANNELS", 8, minimum=1)
ACTIVATE_SSH_STREAMS_PER_CONNECTION = env.integer(
    "ACTIVATE_SSH_STREAMS_PER_CONNECTION", 8, minimum=1
)
ACTIVATE_SSH_IDLE_TIMEOUT = env.number("ACTIVATE_SSH_IDLE_TIMEOUT", 600, minimum=1)
# Seconds a user certificate the platform signs (clusters that trust its CA) stays valid: one is
# signed for each login, so minutes are plenty; a disabled user's last one dies with it.
ACTIVATE_SSH_CERT_LIFETIME = env.integer("ACTIVATE_SSH_CERT_LIFETIME", 300, minimum=30)
# Prometheus may read /metrics with this bearer token (staff sessions may anyway); empty: off.
# Long and random, as it is compared like a password.
ACTIVATE_METRICS_TOKEN = env.matching(
    "ACTIVATE_METRICS_TOKEN",
    "",
    pattern=r"|[A-Za-z0-9._~+/=-]{32,256}",
    meaning="empty or 32 to 256 letters, digits and ._~+/=- (e.g. `openssl rand -hex 32`)",
)
ACTIVATE_SSH_MAX_CONNECTIONS = env.integer("ACTIVATE_SSH_MAX_CONNECTIONS", 64, minimum=1)
# Relays on login hosts (clusters whose agents go via the login host; `run_relays` keeps them):
# how often each is checked, and the lease that keeps it to one per cluster and installation.
# A supervisor that dies is replaced within a lease, well before any agent's silence counts.
ACTIVATE_RELAY_LEASE = env.number(
    "ACTIVATE_RELAY_LEASE", min(30.0, ACTIVATE_HEARTBEAT_TIMEOUT / 4), minimum=0.5
)
ACTIVATE_RELAY_CHECK_INTERVAL = env.number(
    "ACTIVATE_RELAY_CHECK_INTERVAL", min(2.0, ACTIVATE_RELAY_LEASE / 4), minimum=0.1
)
_agent_url = urlsplit(ACTIVATE_AGENT_URL)
# Where relayed connections go on the platform's side: the agents' server itself, in plain
# HTTP (the SSH connection already encrypts the way from the login host).
ACTIVATE_RELAY_UPSTREAM = env.matching(
    "ACTIVATE_RELAY_UPSTREAM",
    f"{_agent_url.hostname}:{_agent_url.port or 80}"
    if _agent_url.scheme == "http"
    else "127.0.0.1:8001",
    pattern=r"[A-Za-z0-9.\-]+:[0-9]{1,5}|\[[0-9A-Fa-f:]+\]:[0-9]{1,5}",
    meaning="host:port of the agents' server",
)

# An agent must be able to miss one beat without being declared lost.
require_less_than(
    ("2 * ACTIVATE_HEARTBEAT_INTERVAL", 2 * ACTIVATE_HEARTBEAT_INTERVAL),
    ("ACTIVATE_HEARTBEAT_TIMEOUT", ACTIVATE_HEARTBEAT_TIMEOUT),
)
require_less_than(
    ("ACTIVATE_SWEEP_INTERVAL", ACTIVATE_SWEEP_INTERVAL),
    ("ACTIVATE_HEARTBEAT_TIMEOUT", ACTIVATE_HEARTBEAT_TIMEOUT),
)
# An agent told to retry after N s waits up to 1.5 N (its jitter): it beats again while the
# sweep still forgives the silence of the beat it was refused (a heartbeat timeout).
require_less_than(
    ("1.5 * ACTIVATE_AGENT_RETRY_AFTER_MAX", 1.5 * ACTIVATE_AGENT_RETRY_AFTER_MAX),
    ("ACTIVATE_HEARTBEAT_TIMEOUT", ACTIVATE_HEARTBEAT_TIMEOUT),
)
require_less_than(
    ("3 * ACTIVATE_RELAY_CHECK_INTERVAL", 3 * ACTIVATE_RELAY_CHECK_INTERVAL),
    ("ACTIVATE_RELAY_LEASE", ACTIVATE_RELAY_LEASE),
)
require_less_than(
    ("ACTIVATE_RELAY_LEASE", ACTIVATE_RELAY_LEASE),
    ("ACTIVATE_HEARTBEAT_TIMEOUT", ACTIVATE_HEARTBEAT_TIMEOUT),
)
# Celery beat runs on every host; the one holding this lease in Redis sends the schedule, and
# another takes over within a lease when it dies (core/beat.py). 0: no lease, every beat
# process sends (one beat only; or to show two at once are harmless, drills/two_beats.py).
ACTIVATE_BEAT_LEASE = env.number("ACTIVATE_BEAT_LEASE", 15, minimum=0)
if ACTIVATE_BEAT_LEASE:
    # The holder's last send and its successor's first are at least 0.7 of a lease apart
    # (core/beat.py): more than a sweep interval, so no sweep goes out twice.
    require_less_than(
        ("ACTIVATE_SWEEP_INTERVAL", ACTIVATE_SWEEP_INTERVAL),
        ("0.7 * ACTIVATE_BEAT_LEASE", 0.7 * ACTIVATE_BEAT_LEASE),
    )
require_less_than(
    ("ACTIVATE_POLL_INTERVAL", ACTIVATE_POLL_INTERVAL),
    ("ACTIVATE_PENDING_TIMEOUT", ACTIVATE_PENDING_TIMEOUT),
)
require_less_than(
    ("ACTIVATE_PENDING_TIMEOUT", ACTIVATE_PENDING_TIMEOUT),
    ("ACTIVATE_QUEUED_TIMEOUT", ACTIVATE_QUEUED_TIMEOUT),
)

# Single sign-on with OpenID Connect (identity/oidc.py): the provider's issuer URL (its
# endpoints come from its discovery document), our confidential client for the browser, and the
# public client `pw auth login` runs the device grant with. Empty issuer: no single sign-on.
ACTIVATE_OIDC_ISSUER = env.matching(
    "ACTIVATE_OIDC_ISSUER",
    "",
    pattern=r"|https://[^\s?#]+|http://(127\.[0-9.]+|localhost|\[::1\])(:[0-9]+)?(/[^\s?#]*)?",
    meaning="empty or the provider's https:// URL (http:// only on loopback)",
)
ACTIVATE_OIDC_CLIENT_ID = env.string("ACTIVATE_OIDC_CLIENT_ID", "")
ACTIVATE_OIDC_CLIENT_SECRET = env.string("ACTIVATE_OIDC_CLIENT_SECRET", "")
ACTIVATE_OIDC_CLI_CLIENT_ID = env.string("ACTIVATE_OIDC_CLI_CLIENT_ID", "")
ACTIVATE_OIDC_SCOPES = env.string("ACTIVATE_OIDC_SCOPES", "openid profile email groups")
_claim = {"pattern": r"[A-Za-z0-9_:./-]{1,128}", "meaning": "a claim name"}
ACTIVATE_OIDC_USERNAME_CLAIM = env.matching(
    "ACTIVATE_OIDC_USERNAME_CLAIM", "preferred_username", **_claim
)
ACTIVATE_OIDC_UNIX_CLAIM = env.matching("ACTIVATE_OIDC_UNIX_CLAIM", "preferred_username", **_claim)
ACTIVATE_OIDC_GROUPS_CLAIM = env.matching("ACTIVATE_OIDC_GROUPS_CLAIM", "groups", **_claim)
ACTIVATE_OIDC_LABEL = env.string("ACTIVATE_OIDC_LABEL", "single sign-on")
# How our client proves itself at the token endpoint (client_secret_basic is the one every
# provider must support).
ACTIVATE_OIDC_TOKEN_AUTH = env.matching(
    "ACTIVATE_OIDC_TOKEN_AUTH",
    "client_secret_basic",
    pattern="client_secret_basic|client_secret_post",
    meaning="client_secret_basic or client_secret_post",
)
if ACTIVATE_OIDC_ISSUER and not (ACTIVATE_OIDC_CLIENT_ID and ACTIVATE_OIDC_CLIENT_SECRET):
    raise ConfigurationError(
        "ACTIVATE_OIDC_CLIENT_ID and ACTIVATE_OIDC_CLIENT_SECRET must be set with"
        " ACTIVATE_OIDC_ISSUER"
    )
if "openid" not in ACTIVATE_OIDC_SCOPES.split():
    raise ConfigurationError(
        f"ACTIVATE_OIDC_SCOPES must include openid, got {ACTIVATE_OIDC_SCOPES!r}"
    )
# API keys `pw auth login` gets by signing in expire after this many hours.
ACTIVATE_CLI_KEY_HOURS = env.number("ACTIVATE_CLI_KEY_HOURS", 12, minimum=0.001)
# mozilla-django-oidc's own settings, from ours: PKCE (S256) and a nonce on every sign-in; the
# ID token kept in the session for the provider's logout (its id_token_hint).
OIDC_RP_CLIENT_ID = ACTIVATE_OIDC_CLIENT_ID
OIDC_RP_CLIENT_SECRET = ACTIVATE_OIDC_CLIENT_SECRET
OIDC_RP_SCOPES = ACTIVATE_OIDC_SCOPES
OIDC_USE_NONCE = True
OIDC_USE_PKCE = True
OIDC_PKCE_CODE_CHALLENGE_METHOD = "S256"
OIDC_STORE_ID_TOKEN = True
OIDC_TOKEN_USE_BASIC_AUTH = ACTIVATE_OIDC_TOKEN_AUTH == "client_secret_basic"  # noqa: S105 - a method's name
OIDC_TIMEOUT = 10

# The site's directory (identity/ldap.py): ACTIVATE_LDAP_URL empty, none. The bind password is
# named like a password so that Django's error pages hide it.
_directory = ldap_settings(env)
ACTIVATE_LDAP_URL: str = _directory.pop("ACTIVATE_LDAP_URL")
ACTIVATE_LDAP_UNIX_ATTRIBUTE: str = _directory.pop("ACTIVATE_LDAP_UNIX_ATTRIBUTE")
ACTIVATE_LDAP_GROUP_BASE: str = _directory.pop("ACTIVATE_LDAP_GROUP_BASE")
globals().update(_directory)  # django-auth-ldap's AUTH_LDAP_* (none without a directory)

# Local accounts first (operators keep their passwords), then the directory, then single
# sign-on (whose backend only answers its own callback).
AUTHENTICATION_BACKENDS = [
    "django.contrib.auth.backends.ModelBackend",
    *(["django_auth_ldap.backend.LDAPBackend"] if ACTIVATE_LDAP_URL else []),
    *(["identity.oidc.OidcBackend"] if ACTIVATE_OIDC_ISSUER else []),
]

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
    "identity",
    "workers_app",
    "agents",
    "files_app",
    "sessions_app",
    "notices_app",
]
# What the WebSockets' authentication (core/websocket_auth.py) asks for an API key's user.
ACTIVATE_API_KEY_USER = "workers_app.api.authentication.user_for_api_key"

MIDDLEWARE = [
    "agents.middleware.AgentHeartbeatFastPath",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "activate.agent_server_urls" if ACTIVATE_AGENT_SERVER else "activate.urls"
WSGI_APPLICATION = "activate.wsgi.application"
ASGI_APPLICATION = "activate.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "notices_app.context.notices",
            ],
        },
    },
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

# Request bodies (forms, JSON) larger than this answer 400 before anything reads them; the
# agents' endpoints cap theirs far lower (agent_views.MAX_BODY).
DATA_UPLOAD_MAX_MEMORY_SIZE = env.integer("ACTIVATE_MAX_REQUEST_BODY", 1_048_576, minimum=4096)

STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# The browser UI's own login page; after it, the Workers page.
LOGIN_URL = "pages:login"
LOGIN_REDIRECT_URL = "pages:workers"
LOGOUT_REDIRECT_URL = "pages:login"
# Django's database sessions, the table keeping a hash of each key, never the cookie's key.
SESSION_ENGINE = "core.login_sessions"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "workers_app.api.authentication.ApiKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 100,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "core.api.errors.api_exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "ACTIVATE API",
    "DESCRIPTION": "Request, track and delete workers: compute nodes reserved through a scheduler.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {"WorkerStatusEnum": "workers_app.statuses.WorkerStatus"},
}

CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Celery's consumer, but a broker lost with tasks unacknowledged does not end the worker.
CELERY_WORKER_CONSUMER = "core.celery_consumer:Consumer"
CELERY_TASK_TIME_LIMIT = env.integer("ACTIVATE_TASK_TIME_LIMIT", 300, minimum=1)
CELERY_TASK_SOFT_TIME_LIMIT = CELERY_TASK_TIME_LIMIT - 30 if CELERY_TASK_TIME_LIMIT > 60 else None
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Unacknowledged tasks (a worker killed mid-task) come back after this long; tasks are idempotent.
# Under Sentinel the URL becomes kombu's sentinel form and the options gain the master's name.
CELERY_BROKER_URL, CELERY_BROKER_TRANSPORT_OPTIONS = celery_broker(
    REDIS_URL,
    {"visibility_timeout": env.integer("ACTIVATE_TASK_VISIBILITY_TIMEOUT", 600, minimum=1)},
)
CELERY_TASK_ALWAYS_EAGER = env.boolean("ACTIVATE_TASKS_EAGER", False)


def _beat(task: str, interval: float) -> dict[str, object]:
    return {"task": task, "schedule": interval, "options": {"expires": interval}}


CELERY_BEAT_SCHEDULE = {
    "poll-schedulers": _beat("workers_app.tasks.poll_clusters", ACTIVATE_POLL_INTERVAL),
    "sweep-timeouts": _beat("workers_app.tasks.sweep_timeouts", ACTIVATE_SWEEP_INTERVAL),
    "sweep-heartbeats": _beat("workers_app.tasks.sweep_heartbeats", ACTIVATE_SWEEP_INTERVAL),
    "sweep-terminals": _beat("workers_app.tasks.sweep_terminals", ACTIVATE_SWEEP_INTERVAL),
    "dispatch-pending": _beat("workers_app.tasks.dispatch_pending", ACTIVATE_SWEEP_INTERVAL),
    "probe-clusters": _beat("workers_app.tasks.probe_clusters", ACTIVATE_PROBE_INTERVAL),
    "reconcile-jobs": _beat("workers_app.tasks.reconcile_clusters", ACTIVATE_RECONCILE_INTERVAL),
    "sweep-sessions": _beat("sessions_app.tasks.sweep_sessions", ACTIVATE_SESSION_SWEEP_INTERVAL),
    "warn-walltimes": _beat("notices_app.tasks.warn_walltimes", ACTIVATE_SWEEP_INTERVAL),
    "sweep-idle": _beat("workers_app.tasks.sweep_idle", ACTIVATE_IDLE_SWEEP_INTERVAL),
    "sweep-idle-sessions": _beat(
        "sessions_app.tasks.sweep_idle_sessions", ACTIVATE_IDLE_SWEEP_INTERVAL
    ),
}

# The sweeps run on a Celery worker of their own (`scripts/start.sh sweeper`, consuming only
# this queue): slow polls and submissions filling the ordinary worker never delay them. They
# touch only the database and Redis (what they start over SSH goes on as tasks of its own).
SWEEP_QUEUE = "sweeps"
SWEEP_TASKS = (
    "workers_app.tasks.sweep_timeouts",
    "workers_app.tasks.sweep_heartbeats",
    "workers_app.tasks.sweep_terminals",
    "workers_app.tasks.sweep_idle",
    "sessions_app.tasks.sweep_sessions",
    "sessions_app.tasks.sweep_idle_sessions",
)
CELERY_TASK_DEFAULT_QUEUE = "celery"
CELERY_TASK_ROUTES = {task: {"queue": SWEEP_QUEUE} for task in SWEEP_TASKS}
CELERY_BEAT_SCHEDULER = "core.beat:LeasedScheduler"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.string("ACTIVATE_LOG_LEVEL", "INFO")},
    "loggers": {"paramiko": {"level": "WARNING"}},
}
