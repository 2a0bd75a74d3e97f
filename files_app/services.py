"""Files on clusters, as the user's own Unix account over SFTP: what the API, the transfers and
the pages ask for. The platform checks only who may see the cluster; the cluster's OS decides
what each account may read or change.

A user acts as the account their workers run as (``acting_account``: their key or certificate
account, or the cluster's own on a shared cluster), over that login's kept connection.
"""

from __future__ import annotations

import logging
import re
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis
from django.conf import settings
from django.contrib.auth.models import User

from core.redis_connection import redis_client
from core.transport.sftp import (
    DIR,
    FILE,
    FileError,
    FileExists,
    FileStat,
    NoSuchFile,
    NotAFile,
    SFTPSession,
)
from files_app import paths
from files_app.models import FileRoot
from workers_app.actions.cluster_accounts import acting_account
from workers_app.cluster_access import connection_for
from workers_app.models import Cluster, ClusterAccount

log = logging.getLogger(__name__)

HOME_LABEL = "~"
UPLOAD_MARK = b".activate-upload-"
# An upload's hidden file (``.<name>.activate-upload-<16 hex digits>``) not written to for this
# long was left by a web process that died mid-upload: a live upload writes every few seconds,
# or the transfer ends (a cluster that does not answer fails it within the command timeout).
# Listing its folder removes it.
STALE_UPLOAD = 6 * 3600
_UPLOAD_NAME = re.compile(rb"\A\..+" + re.escape(UPLOAD_MARK) + rb"[0-9a-f]{16}\Z", re.DOTALL)


class ClusterNotFound(Exception):
    """No cluster of that name that this user may see."""


@dataclass(frozen=True)
class Place:
    """A cluster as one user acts on it."""

    cluster: Cluster
    account: ClusterAccount | None


def place_for(user: User, cluster_name: str) -> Place:
    """ClusterNotFound for a cluster the user may not see; a ParameterError (400, naming the
    cluster) when they have no account there and it is not shared."""
    cluster = Cluster.objects.visible_to(user).filter(name=cluster_name).first()
    if cluster is None:
        raise ClusterNotFound(cluster_name)
    return Place(cluster, acting_account(user, cluster))


def open_files(place: Place) -> SFTPSession:
    """An SFTP session as the place's account; the caller closes it. (A login by certificate
    asks the database whether the user is still active.)"""
    return connection_for(place.cluster, place.account).open_sftp()


def resolve(files: SFTPSession, path: bytes) -> bytes:
    """``~`` and ``~/...`` from the login's home, as scp and sftp read them; a relative path is
    the server's to resolve (from the home too)."""
    if path == b"~" or path.startswith(b"~/"):
        return paths.join(files.realpath(b"."), path[2:]) if path != b"~" else files.realpath(b".")
    return path


def entry(raw_path: bytes, found: FileStat) -> dict[str, Any]:
    name = paths.name_of(raw_path) or raw_path
    return {
        "name": paths.display(name),
        "name_b64": paths.b64(name),
        "path_b64": paths.b64(raw_path),
        "type": found.kind,
        "size": found.size,
        "mtime": (
            datetime.fromtimestamp(found.mtime, UTC).isoformat().replace("+00:00", "Z")
            if found.mtime is not None
            else None
        ),
        "mode": f"{found.mode:04o}",
    }


def roots(place: Place, files: SFTPSession) -> list[dict[str, str]]:
    """The home first, then the folders the operator lists for the cluster."""
    home = files.realpath(b".")
    found = [(HOME_LABEL, home)]
    for root in FileRoot.objects.filter(cluster=place.cluster).order_by("label"):
        found.append((root.label, root.path.encode("utf-8")))
    return [
        {"label": label, "path": paths.display(p), "path_b64": paths.b64(p)} for label, p in found
    ]


def listing(files: SFTPSession, path: bytes) -> dict[str, Any]:
    """A folder's entries, folders first, then by name. ``..`` and links are resolved by the
    server, which goes only where the account may."""
    where = files.realpath(resolve(files, path) or b".")
    if files.stat(where).kind != DIR:
        raise NotAFile("listing: that is not a folder")
    entries = sweep_abandoned_uploads(files, where, files.listdir(where), now=time.time())
    entries.sort(key=lambda e: (e.kind != DIR, paths.display(e.name).casefold(), e.name))
    parent = paths.parent_of(where)
    return {
        "path": paths.display(where),
        "path_b64": paths.b64(where),
        "parent_b64": paths.b64(parent) if parent is not None else None,
        "entries": [entry(paths.join(where, e.name), e) for e in entries],
    }


def make_folder(files: SFTPSession, path: bytes) -> dict[str, Any]:
    where = resolve(files, path)
    files.mkdir(where)
    return entry(where, files.lstat(where))


def rename(files: SFTPSession, source: bytes, target: bytes) -> dict[str, Any]:
    """Never over an existing name (FileExists)."""
    source, target = resolve(files, source), resolve(files, target)
    files.lstat(source)  # NoSuchFile before anything else is said of it
    files.rename(source, target)
    return entry(target, files.lstat(target))


def delete(files: SFTPSession, path: bytes, *, recursive: bool) -> None:
    """A file or a link (never what it points to); a folder if empty, or with all it holds."""
    where = resolve(files, path)
    found = files.lstat(where)
    if found.kind != DIR:
        files.remove(where)
    elif recursive:
        files.remove_tree(where)
    else:
        files.rmdir(where)


# -- uploads ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class UploadTarget:
    final: bytes
    temporary: bytes
    replaces: bool  # an existing file goes (overwrite), else the name was free


def upload_target(files: SFTPSession, path: bytes, *, overwrite: bool) -> UploadTarget:
    """Where an upload is written first (a hidden name of its own beside the final one, made
    only by this upload) and renamed to once the body arrived whole. FileExists when the name
    is taken and not to be overwritten (a folder never is); NoSuchFile when its folder is not
    there."""
    final = resolve(files, path)
    name = paths.name_of(final)
    if not name or name in (b".", b".."):
        raise NoSuchFile("uploading: name a file")
    try:
        existing: FileStat | None = files.lstat(final)
    except NoSuchFile:
        existing = None
    if existing is not None and (existing.kind == DIR or not overwrite):
        raise FileExists("uploading: that name is taken")
    folder = paths.parent_of(final) or b"/"
    files.stat(folder)
    temporary = paths.join(folder, b"." + name + UPLOAD_MARK + secrets.token_hex(8).encode())
    return UploadTarget(final=final, temporary=temporary, replaces=existing is not None)


def is_abandoned_upload(found: FileStat, *, now: float) -> bool:
    """An upload's hidden file that nobody has written to for STALE_UPLOAD seconds."""
    return (
        found.kind == FILE
        and _UPLOAD_NAME.match(found.name) is not None
        and found.mtime is not None
        and found.mtime < now - STALE_UPLOAD
    )


def sweep_abandoned_uploads(
    files: SFTPSession, folder: bytes, entries: list[FileStat], *, now: float
) -> list[FileStat]:
    """Remove the folder's abandoned upload files; the entries less those removed. What the
    account may not remove stays, listed as before."""
    kept: list[FileStat] = []
    for found in entries:
        if is_abandoned_upload(found, now=now):
            try:
                files.remove(paths.join(folder, found.name))
            except FileError as exc:
                log.info("an abandoned upload's file stays: %s", exc)
            else:
                continue
        kept.append(found)
    return kept


def finish_upload(files: SFTPSession, target: UploadTarget, *, overwrite: bool) -> dict[str, Any]:
    files.rename(target.temporary, target.final, replace=overwrite)
    return entry(target.final, files.lstat(target.final))


def forget_upload(files: SFTPSession, target: UploadTarget) -> None:
    """Remove what an upload that did not finish wrote (whatever is still there)."""
    try:
        files.remove(target.temporary)
    except NoSuchFile:
        pass


# -- how many transfers a user has under way -------------------------------------------------

TRANSFERS_KEY = "activate:files-transfers:"
# A transfer's slot lapses SLOT_LEASE seconds after it was last renewed, so a web process that
# died mid-transfer frees its users' slots within that; a transfer renews its slot every
# SLOT_RENEW while it runs and gives it back when it ends, however it ends.
SLOT_LEASE = 60.0
SLOT_RENEW = 15.0
assert 3 * SLOT_RENEW < SLOT_LEASE

# Redis's clock, not the web hosts': KEYS[1] the user's sorted set (token -> lapses at),
# ARGV: limit, lease seconds, token.
_TAKE_SLOT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then
  return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2]) * 1000))
return 1
"""
# ARGV: lease seconds, token. 0 when the slot had lapsed (it is not taken again).
_RENEW_SLOT = """
if not redis.call('ZSCORE', KEYS[1], ARGV[2]) then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[2])
redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[1]) * 1000))
return 1
"""


class TooManyTransfers(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(
            f"You have {limit} file transfers under way, the most one user may have at once: "
            "start this one when one of them has ended."
        )


@dataclass(frozen=True)
class TransferSlot:
    key: str
    token: str


def _slots_key(user: User) -> str:
    return f"{TRANSFERS_KEY}{settings.ACTIVATE_INSTALLATION_ID}:{user.pk}"


def take_transfer_slot(user: User, *, limit: int) -> TransferSlot | None:
    """One of the user's ``limit`` slots, or TooManyTransfers. None when Redis does not answer:
    the transfer then goes uncounted rather than refused."""
    slot = TransferSlot(_slots_key(user), secrets.token_hex(8))
    try:
        taken = redis_client().eval(_TAKE_SLOT, 1, slot.key, limit, SLOT_LEASE, slot.token)
    except redis.RedisError as exc:
        log.warning("file transfers are not counted: Redis did not answer: %s", exc)
        return None
    if not taken:
        raise TooManyTransfers(limit)
    return slot


def renew_transfer_slot(slot: TransferSlot) -> bool:
    """Whether the slot is still held (False: it lapsed, or Redis did not answer)."""
    try:
        return bool(redis_client().eval(_RENEW_SLOT, 1, slot.key, SLOT_LEASE, slot.token))
    except redis.RedisError as exc:
        log.warning("a file transfer's slot was not renewed: %s", exc)
        return False


def release_transfer_slot(slot: TransferSlot) -> None:
    try:
        redis_client().zrem(slot.key, slot.token)
    except redis.RedisError as exc:
        log.warning("a file transfer's slot lapses on its own: %s", exc)


def transfers_under_way(user: User) -> int:
    """The user's slots held now (lapsed ones not counted)."""
    client = redis_client()
    seconds, micros = client.time()
    return int(client.zcount(_slots_key(user), f"({seconds + micros / 1e6}", "+inf"))


__all__ = [
    "ClusterNotFound",
    "FileExists",
    "Place",
    "TooManyTransfers",
    "TransferSlot",
    "UploadTarget",
    "delete",
    "entry",
    "finish_upload",
    "forget_upload",
    "listing",
    "make_folder",
    "open_files",
    "place_for",
    "release_transfer_slot",
    "rename",
    "renew_transfer_slot",
    "roots",
    "sweep_abandoned_uploads",
    "take_transfer_slot",
    "transfers_under_way",
    "upload_target",
]
