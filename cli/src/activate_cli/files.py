"""pw files: your files on a cluster, as your own Unix account there (the cluster decides what
you may read). A remote path is CLUSTER:PATH, as scp writes it: a relative PATH is from your
home there, nothing after the colon is your home itself.

    pw files ls CLUSTER[:PATH]
    pw files cp SRC DST            (one side CLUSTER:PATH, the other a local path or -)
    pw files rm [-r] CLUSTER:PATH
    pw files mkdir CLUSTER:PATH

Paths travel as their bytes (base64), so any name the cluster holds can be named here.
"""

from __future__ import annotations

import argparse
import base64
import os
import re
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import httpx

from activate_cli.client import TIMEOUT_SECONDS, USER_AGENT, ApiClient
from activate_cli.errors import CliError, NotFound, Unreachable, UsageError
from activate_cli.output import EMPTY, emit, table, when

# What the API says an entry is (checked against its schema in tests/cli).
ENTRY_TYPES = ("file", "dir", "link", "other")
CHUNK = 1024 * 1024
PROGRESS_EVERY = 0.25
REMOTE = re.compile(r"^(?P<cluster>[A-Za-z0-9][A-Za-z0-9_-]*):(?P<path>.*)$", re.DOTALL)


@dataclass(frozen=True)
class Remote:
    cluster: str
    path: bytes  # empty: the home

    def __str__(self) -> str:
        return f"{self.cluster}:{os.fsdecode(self.path)}"


def remote(text: str) -> Remote | None:
    """CLUSTER:PATH, or None for a local path (./a:b is local, as for scp)."""
    match = REMOTE.match(text)
    if match is None:
        return None
    return Remote(match["cluster"], os.fsencode(match["path"]))


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode("ascii")


def shown(name: str) -> str:
    """A name on one line: control characters (a newline in a name) escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in name)


def _path_params(where: Remote) -> dict[str, str]:
    return {"path_b64": b64(where.path)} if where.path else {}


def _cluster_url(cluster: str) -> str:
    return f"/clusters/{cluster}/files"


# -- ls, rm, mkdir ----------------------------------------------------------------------------


def render_listing(body: dict[str, Any]) -> str:
    rows = [
        [
            entry["type"],
            entry["mode"],
            str(entry["size"]) if entry["type"] != "dir" else EMPTY,
            when(entry["mtime"]),
            shown(entry["name"]) + ("/" if entry["type"] == "dir" else ""),
        ]
        for entry in body["entries"]
    ]
    head = f"{shown(body['path'])}:"
    if not rows:
        return f"{head}\n(empty)"
    return head + "\n" + table(["TYPE", "MODE", "SIZE", "MODIFIED", "NAME"], rows)


def list_files(client: ApiClient, args: argparse.Namespace) -> int:
    where = _remote_arg(args.target, allow_bare=True)
    body = client.get(
        f"{_cluster_url(where.cluster)}/",
        params=_path_params(where),
        not_found=f"{where}: no such folder (or no cluster {where.cluster})",
    )
    emit(sys.stdout, body, args.output, render_listing)
    return 0


def remove(client: ApiClient, args: argparse.Namespace) -> int:
    where = _remote_arg(args.target)
    client.post(
        f"{_cluster_url(where.cluster)}/delete/",
        {"path_b64": b64(where.path), "recursive": args.recursive},
        not_found=f"{where}: no such file or folder",
    )
    return 0


def make_folder(client: ApiClient, args: argparse.Namespace) -> int:
    where = _remote_arg(args.target)
    client.post(
        f"{_cluster_url(where.cluster)}/mkdir/",
        {"path_b64": b64(where.path)},
        not_found=f"{where}: its folder does not exist",
    )
    return 0


def _remote_arg(text: str, *, allow_bare: bool = False) -> Remote:
    where = remote(text)
    if where is None and allow_bare and REMOTE.match(text + ":"):
        return Remote(text, b"")
    if where is None:
        raise UsageError(f"{text!r} is not CLUSTER:PATH")
    if not where.path and not allow_bare:
        raise UsageError(f"{text!r} names no path after the cluster")
    return where


# -- cp ---------------------------------------------------------------------------------------


class Progress:
    """Bytes moved so far, on one line of stderr, when stderr is a terminal."""

    def __init__(self, label: str, total: int | None) -> None:
        self.label, self.total = label, total
        self.done = 0
        self.started = time.monotonic()
        self.shown_at = 0.0
        self.on = sys.stderr.isatty()

    def add(self, count: int) -> None:
        self.done += count
        now = time.monotonic()
        if self.on and now - self.shown_at >= PROGRESS_EVERY:
            self.shown_at = now
            self._show(now)

    def _show(self, now: float) -> None:
        rate = self.done / max(now - self.started, 1e-6) / 1e6
        of = f" of {self.total / 1e6:.1f}" if self.total else ""
        percent = f" {100 * self.done / self.total:3.0f}%" if self.total else ""
        line = f"{self.label}:{percent} {self.done / 1e6:.1f}{of} MB, {rate:.1f} MB/s"
        sys.stderr.write("\r" + line + "\x1b[K")
        sys.stderr.flush()

    def finish(self) -> None:
        if self.on:
            self._show(time.monotonic())
            sys.stderr.write("\n")


def _stream_client(client: ApiClient) -> httpx.Client:
    return httpx.Client(
        base_url=client.host,
        headers={"User-Agent": USER_AGENT, "Authorization": f"Bearer {client.api_key}"},
        # Waiting for bytes may take long on a busy cluster; connecting may not.
        timeout=httpx.Timeout(TIMEOUT_SECONDS * 10, connect=TIMEOUT_SECONDS),
    )


def _refused(response: httpx.Response, what: str) -> CliError:
    try:
        body = response.json()
        detail = str(body.get("detail") or "") if isinstance(body, dict) else ""
    except ValueError:
        detail = ""
    code = response.status_code
    if code == 401:
        return CliError(f"the platform refused the API key ({detail or 'HTTP 401'})")
    if code == 404:
        return NotFound(f"{what}: {detail or 'not found'}")
    if code >= 500:
        return Unreachable(f"{what}: {detail or f'the platform failed with HTTP {code}'}")
    return CliError(f"{what}: {detail or f'HTTP {code}'}")


def copy(client: ApiClient, args: argparse.Namespace) -> int:
    source, target = remote(args.source), remote(args.target)
    if source is not None and target is not None:
        raise UsageError("copy between clusters in two steps: to a local file, then on")
    if source is None and target is None:
        raise UsageError("one side must be CLUSTER:PATH (use cp for local copies)")
    try:
        if source is not None:
            _download(client, source, args.target)
        else:
            assert target is not None
            _upload(client, args.source, target, overwrite=not args.no_clobber)
    except httpx.TimeoutException:
        raise Unreachable(f"{client.host} stopped answering") from None
    except httpx.HTTPError as exc:
        raise Unreachable(f"the transfer failed ({exc})") from None
    return 0


def _download(client: ApiClient, source: Remote, local: str) -> None:
    if not source.path:
        raise UsageError(f"{source}: name a file")
    name = os.fsdecode(source.path.rstrip(b"/").rsplit(b"/", 1)[-1])
    if local != "-" and os.path.isdir(local):
        local = os.path.join(local, name)
    params = {"path_b64": b64(source.path)}
    with (
        _stream_client(client) as http,
        http.stream("GET", f"/files/{source.cluster}/download", params=params) as response,
    ):
        if response.status_code != 200:
            response.read()
            raise _refused(response, str(source))
        total = int(response.headers.get("content-length", "0")) or None
        progress = Progress(name, total)
        if local == "-":
            _drain(response.iter_raw(CHUNK), sys.stdout.buffer, progress)
        else:
            _into_file(response.iter_raw(CHUNK), local, progress)
        progress.finish()
        if total is not None and progress.done != total:
            raise Unreachable(f"{source}: the download stopped after {progress.done} bytes")


def _drain(pieces: Iterator[bytes], out: BinaryIO, progress: Progress) -> None:
    for piece in pieces:
        out.write(piece)
        progress.add(len(piece))
    out.flush()


def _into_file(pieces: Iterator[bytes], local: str, progress: Progress) -> None:
    """Written beside its final name and renamed there once whole."""
    folder = os.path.dirname(os.path.abspath(local))
    handle, partial = tempfile.mkstemp(prefix=".pw-download-", dir=folder)
    try:
        with os.fdopen(handle, "wb") as out:
            _drain(pieces, out, progress)
        os.replace(partial, local)
    except BaseException:
        os.unlink(partial)
        raise


def _upload(client: ApiClient, local: str, target: Remote, *, overwrite: bool) -> None:
    if local == "-":
        size, source = None, sys.stdin.buffer
    else:
        try:
            info = os.stat(local)
        except OSError as exc:
            raise CliError(f"{local}: {exc.strerror}") from None
        if not stat.S_ISREG(info.st_mode):
            raise CliError(f"{local}: not a file")
        size, source = info.st_size, open(local, "rb")  # closed below
    name = "stdin" if local == "-" else os.path.basename(local)
    try:
        path = _upload_path(client, target, os.fsencode(name))
        progress = Progress(name, size)

        def body() -> Iterator[bytes]:
            while piece := source.read(CHUNK):
                progress.add(len(piece))
                yield piece

        headers = {"Content-Type": "application/octet-stream"}
        if size is not None:
            headers["Content-Length"] = str(size)
        params = {"path_b64": b64(path), "overwrite": "1" if overwrite else "0"}
        with _stream_client(client) as http:
            response = http.put(
                f"/files/{target.cluster}/upload", params=params, content=body(), headers=headers
            )
        progress.finish()
        if response.status_code not in (200, 201):
            raise _refused(response, f"{target.cluster}:{os.fsdecode(path)}")
    finally:
        if source is not sys.stdin.buffer:
            source.close()


def _upload_path(client: ApiClient, target: Remote, name: bytes) -> bytes:
    """The file's path: into the home, into a folder named (ending with / or that is one), or
    the path itself."""
    if not target.path:
        return b"~/" + name
    if target.path.endswith(b"/"):
        return target.path + name
    try:
        client.get(f"{_cluster_url(target.cluster)}/", params=_path_params(target))
    except NotFound:
        return target.path  # no folder of that name: the file's own
    except CliError:
        return target.path  # a file, or not ours to list: the upload says what is wrong
    return target.path.rstrip(b"/") + b"/" + name


# -- the parser -------------------------------------------------------------------------------


def add_parser(
    commands: Any, common: argparse.ArgumentParser, output: argparse.ArgumentParser
) -> None:
    files = commands.add_parser(
        "files", help="your files on a cluster: list, copy, delete, make folders", parents=[common]
    )
    sub = files.add_subparsers(dest="action", required=True, metavar="ACTION")

    p = sub.add_parser("ls", help="list a folder (default: your home)", parents=[common, output])
    p.add_argument("target", metavar="CLUSTER[:PATH]")
    p.set_defaults(run=list_files)

    p = sub.add_parser(
        "cp",
        help="copy a file to or from a cluster",
        description="SRC or DST is CLUSTER:PATH, the other a local path (- for stdin/stdout).",
        parents=[common],
    )
    p.add_argument("source", metavar="SRC")
    p.add_argument("target", metavar="DST")
    p.add_argument(
        "-n", "--no-clobber", action="store_true", help="never replace a file on the cluster"
    )
    p.set_defaults(run=copy)

    p = sub.add_parser("rm", help="delete a file, a link or an empty folder", parents=[common])
    p.add_argument("-r", "--recursive", action="store_true", help="a folder with all it holds")
    p.add_argument("target", metavar="CLUSTER:PATH")
    p.set_defaults(run=remove)

    p = sub.add_parser("mkdir", help="make a folder", parents=[common])
    p.add_argument("target", metavar="CLUSTER:PATH")
    p.set_defaults(run=make_folder)
