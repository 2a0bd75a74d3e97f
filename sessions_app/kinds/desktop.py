"""A remote desktop: TigerVNC's X server with a terminal in it, shown in the browser by noVNC.

The platform serves a page of its own at the session's root: noVNC in a frame, its WebSocket
path filled in. The VNC server has no password of its own: it listens only on a socket in the
owner's private folder on the node, reached through the session launcher's gate, and the proxy
carries noVNC's WebSocket to it as a byte stream. Nothing secret is in the frame's URL."""

from __future__ import annotations

from urllib.parse import urlencode

from django.template.loader import render_to_string

from sessions_app.kinds.base import NodeRequest, NodeTool, Session, SessionKind


class Desktop(SessionKind):
    name = "desktop"
    label = "Remote desktop"
    description = "A Linux desktop (TigerVNC, with a terminal) on the node, shown by noVNC."
    raw_routes = {"websockify": "vnc"}
    tools = (
        NodeTool(
            option="--novnc",
            setting="ACTIVATE_NOVNC_DIR",
            default="/usr/share/novnc",
            what="noVNC's files (vnc.html); TigerVNC and xauth on PATH",
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
            }
        )
        return render_to_string(
            "sessions_app/kinds/desktop.html",
            {"title": f"{session.name} (desktop)", "src": f"{base}vnc.html?{query}"},
        )


KIND = Desktop()
