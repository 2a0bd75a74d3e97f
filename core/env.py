"""Strict reading of configuration from the environment.

A malformed value stops start-up with a message naming the variable, instead of
surfacing later as a confusing runtime failure.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

# The key test settings use. It is in this repository, so it is published like the old
# development default: anyone who knows a key can sign sessions and derive the key that
# encrypts every stored SSH private key. Both are refused everywhere but in tests.
TEST_SECRET_KEY = "test-only-secret-key-published-in-the-repository-never-use-it"  # noqa: S105 - public
PUBLISHED_SECRET_KEYS = frozenset(
    {"insecure-development-key-change-me-0123456789abcdef", TEST_SECRET_KEY}
)
PUBLISHED_SECRET_KEY_PREFIXES = ("insecure-", "django-insecure-")
# Where an unset ACTIVATE_SECRET_KEY is kept, in the data directory.
KEY_FILE_NAME = "secret-key.txt"


class ConfigurationError(Exception):
    """A setting read from the environment is malformed."""


class EnvReader:
    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self.environ = os.environ if environ is None else environ

    def _raw(self, name: str) -> str | None:
        value = self.environ.get(name)
        if value is None or value.strip() == "":
            return None
        return value.strip()

    def string(self, name: str, default: str) -> str:
        value = self._raw(name)
        return default if value is None else value

    def optional_string(self, name: str) -> str | None:
        return self._raw(name)

    def matching(self, name: str, default: str, *, pattern: str, meaning: str) -> str:
        value = self.string(name, default)
        if not re.fullmatch(pattern, value):
            raise ConfigurationError(f"{name} must be {meaning}, got {value!r}")
        return value

    def integer(self, name: str, default: int, *, minimum: int = 0) -> int:
        value = self._raw(name)
        if value is None:
            return default
        try:
            number = int(value)
        except ValueError:
            raise ConfigurationError(f"{name} must be an integer, got {value!r}") from None
        if number < minimum:
            raise ConfigurationError(f"{name} must be at least {minimum}, got {number}")
        return number

    def number(self, name: str, default: float, *, minimum: float = 0.0) -> float:
        value = self._raw(name)
        if value is None:
            return default
        try:
            number = float(value)
        except ValueError:
            raise ConfigurationError(f"{name} must be a number, got {value!r}") from None
        if number != number or number < minimum:
            raise ConfigurationError(f"{name} must be a number >= {minimum}, got {value!r}")
        return number

    def boolean(self, name: str, default: bool) -> bool:
        value = self._raw(name)
        if value is None:
            return default
        lowered = value.lower()
        if lowered in {"1", "true", "yes", "on"}:
            return True
        if lowered in {"0", "false", "no", "off"}:
            return False
        raise ConfigurationError(f"{name} must be true or false, got {value!r}")

    def url(self, name: str, default: str, *, schemes: tuple[str, ...]) -> str:
        value = self.string(name, default)
        parsed = urlparse(value)
        if parsed.scheme not in schemes or not (parsed.netloc or parsed.path):
            allowed = ", ".join(f"{s}://" for s in schemes)
            raise ConfigurationError(f"{name} must be a URL starting with {allowed}, got {value!r}")
        return value

    def redis_url(self, name: str, default: str) -> str:
        """A Redis server's URL (redis://, rediss://, unix://) or its sentinels' (sentinel://)."""
        value = self.string(name, default)
        if urlparse(value).scheme == "sentinel":
            sentinel_address(value, name=name)
            return value
        return self.url(name, default, schemes=("redis", "rediss", "unix", "sentinel"))

    def csv_list(self, name: str, default: list[str]) -> list[str]:
        value = self._raw(name)
        if value is None:
            return default
        return [item.strip() for item in value.split(",") if item.strip()]


SENTINEL_FORM = (
    "sentinel://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]...]/SERVICE[/DB]"
    "[?sentinel_password=...&sentinel_username=...]"
)
DEFAULT_SENTINEL_PORT = 26379
SENTINEL_QUERY = ("sentinel_password", "sentinel_username")


@dataclass(frozen=True)
class SentinelAddress:
    """What a sentinel:// URL names. The user and password are the master's (and its replicas'),
    as in a redis:// URL and in kombu's sentinel URLs; the sentinels' own, when they have
    `requirepass`, come in the query."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = None


def _redacted(value: str) -> str:
    """``value`` for an error message: what may be a password (the part before @, the values
    after ?, anything after #) starred."""
    rest, hash_mark, _fragment = value.partition("#")
    head, question_mark, query = rest.partition("?")
    head = re.sub(r"^sentinel://[^/]*@", "sentinel://***@", head)
    query = re.sub(r"=[^&]*", "=***", query)
    return head + question_mark + query + ("#***" if hash_mark else "")


def _sentinel_host(item: str, fail: Callable[[str], ConfigurationError]) -> tuple[str, int]:
    if item.startswith("["):  # [IPv6]:port
        host, bracket, rest = item[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise fail(f"{item!r} is not HOST[:PORT]")
        port_text = rest[1:]
    else:
        host, _, port_text = item.partition(":")
    if not host:
        raise fail(f"{item!r} has no host")
    if not port_text:
        return host, DEFAULT_SENTINEL_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise fail(f"the port of {item!r} is not a number from 1 to 65535")
    return host, int(port_text)


def sentinel_address(value: str, *, name: str = "REDIS_URL") -> SentinelAddress:
    """The sentinel:// URL ``value`` read strictly; ``name`` is the setting it came from."""

    def fail(reason: str) -> ConfigurationError:
        return ConfigurationError(
            f"{name} is not a Sentinel URL ({reason}): expected {SENTINEL_FORM}, "
            f"got {_redacted(value)!r}"
        )

    parsed = urlparse(value)
    if parsed.scheme != "sentinel":
        raise fail("it does not start with sentinel://")
    if parsed.fragment or parsed.params:
        raise fail("it has a part after # or ;")
    userinfo, at, hosts = parsed.netloc.rpartition("@")
    username = password = None
    if at:
        user_text, colon, password_text = userinfo.partition(":")
        if not colon:
            raise fail("the part before @ must be USER:PASSWORD or :PASSWORD")
        username = unquote(user_text) or None
        password = unquote(password_text) or None
    if not hosts:
        raise fail("no sentinel HOST:PORT")
    sentinels = tuple(_sentinel_host(item, fail) for item in hosts.split(","))
    path = parsed.path.strip("/").split("/") if parsed.path.strip("/") else []
    if not path:
        raise fail("no SERVICE: the name the sentinels monitor the master by")
    if len(path) > 2:
        raise fail("more than /SERVICE/DB in the path")
    service = unquote(path[0])
    if not re.fullmatch(r"[A-Za-z0-9._-]+", service):
        raise fail(f"the SERVICE {service!r} is not letters, digits, '.', '_' and '-'")
    db = path[1] if len(path) == 2 else "0"
    if not db.isdigit():
        raise fail(f"the DB {db!r} is not a number")
    try:
        query = parse_qs(parsed.query, keep_blank_values=True, strict_parsing=bool(parsed.query))
    except ValueError:
        raise fail("the part after ? is not NAME=VALUE&...") from None
    unknown = sorted(set(query) - set(SENTINEL_QUERY))
    if unknown:
        raise fail(f"unknown {', '.join(unknown)} after ?; known: {', '.join(SENTINEL_QUERY)}")
    if any(len(values) > 1 for values in query.values()):
        raise fail("a name given twice after ?")
    return SentinelAddress(
        sentinels=sentinels,
        service=service,
        db=int(db),
        username=username,
        password=password,
        sentinel_username=query.get("sentinel_username", [""])[0] or None,
        sentinel_password=query.get("sentinel_password", [""])[0] or None,
    )


def require_less_than(smaller: tuple[str, float], larger: tuple[str, float]) -> None:
    """Timing knobs must keep their order: an interval longer than its timeout is an error."""
    (small_name, small), (large_name, large) = smaller, larger
    if not small < large:
        raise ConfigurationError(
            f"{small_name} ({small:g}) must be smaller than {large_name} ({large:g})"
        )


def is_published_secret(value: str) -> bool:
    return value in PUBLISHED_SECRET_KEYS or value.startswith(PUBLISHED_SECRET_KEY_PREFIXES)


def private_directory(path: Path) -> Path:
    """``path`` made if missing, readable by this user only (tightened if it is ours)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.stat()
    if info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) & 0o077:
        path.chmod(0o700)
    return path


def stored_secret(path: Path) -> str:
    """The secret kept in ``path``: made once at random (mode 0600), the same on every later
    start. Processes starting together all read the one file that was linked first."""
    private_directory(path.parent)
    if not path.exists():
        descriptor, draft = tempfile.mkstemp(dir=path.parent, prefix=".secret-")  # mode 0600
        try:
            with os.fdopen(descriptor, "w") as handle:
                handle.write(secrets.token_urlsafe(48) + "\n")
            try:
                os.link(draft, path)
            except FileExistsError:
                pass
        finally:
            os.unlink(draft)
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
        value = path.read_text().strip()
    except OSError as exc:
        raise ConfigurationError(f"cannot read the secret key file {path}: {exc}") from None
    if mode & 0o077:
        raise ConfigurationError(
            f"the secret key file {path} can be read by other users (mode {mode:04o}): "
            "anyone who read it can decrypt the stored SSH keys; delete it to have a new one "
            "made, or chmod 600 it if nobody else could reach it"
        )
    if not value:
        raise ConfigurationError(f"the secret key file {path} is empty; delete it")
    return value
