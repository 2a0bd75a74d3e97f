from __future__ import annotations


class CliError(Exception):
    """A problem to report as one line on stderr, with a non-zero exit status."""

    exit_code = 1


class UsageError(CliError):
    """Arguments that do not go together, found after argparse: exit 2, as argparse's own."""

    exit_code = 2


class Unreachable(CliError):
    """The platform could not be reached, or failed on its side; trying again may help."""


class NotFound(CliError):
    pass


class Interrupted(CliError):
    exit_code = 130
