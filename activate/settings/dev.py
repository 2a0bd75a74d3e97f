from __future__ import annotations

from .base import *  # noqa: F403

DEBUG = env.boolean("ACTIVATE_DEBUG", True)  # noqa: F405
