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
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlparse

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

    def csv_list(self, name: str, default: list[str]) -> list[str]:
        value = self._raw(name)
        if value is None:
            return default
        return [item.strip() for item in value.split(",") if item.strip()]


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
