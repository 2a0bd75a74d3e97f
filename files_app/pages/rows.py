"""What the Files page shows of a folder: its path as links, the places, a row per entry.

Paths stay bytes; the page links to them by their urlsafe base64 and shows them as
``paths.display`` gives them (U+FFFD for bytes that are no UTF-8).
"""

from __future__ import annotations

import stat
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from files_app import paths

HOME_LABEL = "~"
UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")
KINDS = {"dir": "Folder", "file": "File", "link": "Link", "other": "Other"}
TYPE_LETTER = {"dir": "d", "link": "l", "file": "-"}
# Control characters in a name shown as signs a person sees (the link's title has the name as
# it is): a line break ↵, a tab ⇥, any other �. (The Unicode control pictures, ␊, are in few
# fonts.)
CONTROL_SIGNS = {code: 0xFFFD for code in [*range(32), 127]} | {10: 0x21B5, 13: 0x21B5, 9: 0x21E5}


def human_size(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    value = float(size)
    for unit in UNITS:
        value /= 1024
        if value < 1024 or unit == UNITS[-1]:
            return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
    raise AssertionError("unreachable")


def permissions(mode: str, kind: str) -> str:
    """``0750`` of a folder as ``drwxr-x---``."""
    try:
        bits = int(mode, 8)
    except ValueError:
        return mode
    return TYPE_LETTER.get(kind, "?") + stat.filemode(bits)[1:]


def page_link(page_url: str, path_b64: str) -> str:
    return f"{page_url}?{urlencode({'path_b64': path_b64})}"


def _decoded(path_b64: str) -> bytes:
    return paths.path_from({"path_b64": path_b64})


@dataclass(frozen=True)
class Crumb:
    label: str
    url: str


def crumbs(page_url: str, path: bytes) -> list[Crumb]:
    """``/a/b`` as ``/``, ``a``, ``b``, each a link to itself; a path the cluster did not
    resolve (``~``) as it was asked."""
    if not path.startswith(b"/"):
        return [Crumb(paths.display(path), page_link(page_url, paths.b64(path)))]
    found = [Crumb("/", page_link(page_url, paths.b64(b"/")))]
    upto = b""
    for part in path.split(b"/"):
        if part:
            upto += b"/" + part
            found.append(Crumb(paths.display(part), page_link(page_url, paths.b64(upto))))
    return found


@dataclass(frozen=True)
class Place:
    label: str
    path: str
    url: str
    current: bool


def _within(path: bytes, top: bytes) -> bool:
    top = top.rstrip(b"/")
    return path == top or path.startswith(top + b"/") or not top


def places(page_url: str, roots: list[dict[str, str]], here: bytes | None) -> list[Place]:
    """The roots as links; the deepest one holding ``here`` is current."""
    raw = [_decoded(root["path_b64"]) for root in roots]
    holding = [p for p in raw if here is not None and _within(here, p)]
    deepest = max(holding, key=len) if holding else None
    return [
        Place(
            label="Home" if root["label"] == HOME_LABEL else root["label"],
            path=root["path"],
            url=page_link(page_url, root["path_b64"]),
            current=path == deepest,
        )
        for root, path in zip(roots, raw, strict=True)
    ]


@dataclass(frozen=True)
class Row:
    name: str  # as paths.display gives it
    path_b64: str
    kind: str
    kind_label: str
    size: int
    size_shown: str
    modified: datetime | None
    permissions: str
    open_url: str  # a folder's (or a link's) page, a file's download; "" for the rest
    download_url: str  # files and links: "" for the rest
    hidden: bool

    @property
    def shown_name(self) -> str:
        return self.name.translate(CONTROL_SIGNS)


def rows(page_url: str, stream_url: str, entries: list[dict[str, Any]]) -> list[Row]:
    found = []
    for entry in entries:
        kind = entry["type"]
        path_b64 = entry["path_b64"]
        download = download_link(stream_url, path_b64) if kind in ("file", "link") else ""
        mtime = entry.get("mtime")
        found.append(
            Row(
                name=entry["name"],
                path_b64=path_b64,
                kind=kind,
                kind_label=KINDS.get(kind, "Other"),
                size=entry["size"],
                size_shown="—" if kind == "dir" else human_size(entry["size"]),
                modified=datetime.fromisoformat(mtime) if mtime else None,
                permissions=permissions(entry["mode"], kind),
                open_url=page_link(page_url, path_b64) if kind in ("dir", "link") else download,
                download_url=download,
                hidden=entry["name"].startswith("."),
            )
        )
    return found


def download_link(stream_url: str, path_b64: str) -> str:
    return f"{stream_url}download?{urlencode({'path_b64': path_b64})}"
