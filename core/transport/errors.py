"""What can go wrong over SSH, as callers tell the cases apart."""

from __future__ import annotations


class SSHError(Exception):
    """The cluster could not be reached or the connection broke: nothing is known."""


class HostKeyMismatch(SSHError):
    """The server did not present the pinned host key. Never connect anyway."""


class AuthenticationFailed(SSHError):
    """The server is there and refused this login (wrong user or key)."""


class CommandTimeout(SSHError):
    """A command did not finish in time; whether it had an effect is unknown."""
