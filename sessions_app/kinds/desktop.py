"""A remote desktop: TigerVNC's X server with a terminal in it, shown in the browser by noVNC.

The platform serves a page of its own at the session's root: noVNC in a frame, its VNC password
(at most 8 characters, the protocol's limit) and WebSocket path filled in."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlencode

from django.template.loader import render_to_string

from sessions_app.kinds.base import NodeRequest, NodeTool, SessionKind

if TYPE_CHECKING:
    from sessions_app.models import Session


class Desktop(SessionKind):
    name = "desktop"
    label = "Remote desktop"
    description = "A Linux desktop (TigerVNC, with a terminal) on the node, shown by noVNC."
    secret_length = 8
    tools = (
        NodeTool(
            option="--novnc",
            setting="ACTIVATE_NOVNC_DIR",
            default="/usr/share/novnc",
            what="noVNC's files (vnc.html); TigerVNC and websockify on PATH",
        ),
    )

    def log_in(self, request: NodeRequest, session: Session) -> str:
        status, _, _ = request("GET", "/vnc.html", b"", [])
        if status != 200:
            raise OSError(f"noVNC answered {status}")
        return ""

    def page(self, session: Session) -> str:
        base = session.url_path
        query = urlencode(
            {
                "autoconnect": "1",
                "reconnect": "1",
                "reconnect_delay": "1000",
                "resize": "remote",
                "path": base.lstrip("/") + "websockify",
                "password": session.secret(),
            }
        )
        return render_to_string(
            "sessions_app/kinds/desktop.html",
            {"title": f"{session.name} (desktop)", "src": f"{base}vnc.html?{query}"},
        )


KIND = Desktop()
