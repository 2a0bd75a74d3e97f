"""`make run`, `manage.py` and the processes of scripts/start.sh unless told otherwise."""

from __future__ import annotations

from core.env import is_published_secret

from .base import *  # noqa: F403
from .base import SECRET_KEY, SECRET_KEY_FILE, ConfigurationError, env

if is_published_secret(SECRET_KEY):
    if env.optional_string("ACTIVATE_SECRET_KEY"):
        raise ConfigurationError(
            "ACTIVATE_SECRET_KEY is a published key: anyone can sign sessions with it and "
            f"decrypt the stored SSH keys. Unset it (a random one is then kept in "
            f"{SECRET_KEY_FILE}) or set a secret of your own"
        )
    raise ConfigurationError(
        f"{SECRET_KEY_FILE} holds a published key: anyone can sign sessions with it and decrypt "
        "the stored SSH keys. Delete the file to have a random one made"
    )
