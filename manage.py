#!/usr/bin/env python
from __future__ import annotations

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "activate.settings.dev")
    from django.core.management import execute_from_command_line

    from core.env import ConfigurationError

    try:
        execute_from_command_line(sys.argv)
    except ConfigurationError as exc:
        sys.stderr.write(f"Configuration error: {exc}\n")
        sys.exit(2)


if __name__ == "__main__":
    main()
