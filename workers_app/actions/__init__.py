"""The worker domain's changes, one module per concern; views, the API, the admin, the CLI and
tasks call these, and none of them writes a status itself."""

from __future__ import annotations


class NotOwner(Exception):
    """Only a worker's (or session's) owner acts as its cluster account: runs commands, requests
    it again, keeps it."""
