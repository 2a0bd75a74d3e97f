"""Where pw finds the platform and its API key.

The host comes from --platform-host, then PW_PLATFORM_HOST, then the credentials file; the key
from PW_API_KEY, then the credentials file. A stored key is only ever sent to the host it was
stored for.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from activate_cli.errors import CliError

HOST_ENV = "PW_PLATFORM_HOST"
KEY_ENV = "PW_API_KEY"


@dataclass(frozen=True)
class Config:
    platform_host: str
    api_key: str


def credentials_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "pw" / "credentials.json"


def normalize_host(host: str) -> str:
    """``example.org`` means https://example.org; a scheme, if given, must be http or https."""
    host = host.strip().rstrip("/")
    if "://" not in host:
        host = f"https://{host}"
    parts = urlsplit(host)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise CliError(f"not a platform URL: {host!r} (expected e.g. https://activate.example.org)")
    return host


def read_credentials() -> dict[str, str]:
    path = credentials_path()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot read {path}: {exc}; run `pw auth login` again") from None
    if not isinstance(data, dict):
        raise CliError(f"cannot read {path}: not a JSON object; run `pw auth login` again")
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)}


def write_credentials(config: Config) -> Path:
    """Write the file readable by its owner only, replacing any previous one atomically."""
    path = credentials_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".credentials-")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"platform_host": config.platform_host, "api_key": config.api_key}, f)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_config(platform_host: str | None = None) -> Config:
    stored = read_credentials()
    stored_host = normalize_host(stored["platform_host"]) if stored.get("platform_host") else ""
    host_arg = platform_host or os.environ.get(HOST_ENV) or stored_host
    if not host_arg:
        raise CliError(
            f"no platform host: set {HOST_ENV}, pass --platform-host, or run `pw auth login`"
        )
    host = normalize_host(host_arg)
    key = os.environ.get(KEY_ENV) or (stored.get("api_key", "") if host == stored_host else "")
    if not key:
        raise CliError(f"no API key for {host}: set {KEY_ENV} or run `pw auth login`")
    return Config(platform_host=host, api_key=key.strip())
