from __future__ import annotations


class CliError(Exception):
    """A problem to report as one line on stderr, with a non-zero exit status."""

    exit_code = 1


class Unreachable(CliError):
    """The platform could not be reached, or failed on its side; trying again may help."""


class NotFound(CliError):
    pass


class Interrupted(CliError):
    exit_code = 130
