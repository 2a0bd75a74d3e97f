"""A remote desktop: TigerVNC's X server with a terminal in it, and noVNC's files, both on Unix
sockets in the session's private folder (options: --novnc DIR).

The X server needs its MIT-MAGIC-COOKIE (an authority file only the owner can read) from every
X client, so another user of the node cannot open the display, read the screen or type into
it. Its VNC side listens on the private socket only: the folder's mode is the VNC server's
access control, and the platform's proxy speaks VNC over WebSockets to it through the gate.
Python 3.7+ on the node (the file server's ``directory``).
"""

import http.server
import os
import socketserver
import subprocess
import threading
import time
from functools import partial
from typing import TYPE_CHECKING, Any, Dict, Tuple

if TYPE_CHECKING:
    from ..activate_session import Launcher  # the launcher these run in, on the node too


class NoVNCFiles(http.server.SimpleHTTPRequestHandler):
    """noVNC's static files, read-only, logged to the session's log."""

    def address_string(self) -> str:
        return "gate"  # a Unix socket's peer has no address

    def log_message(self, format: str, *args: Any) -> None:
        log = getattr(self.server, "log", None)
        if log is not None:
            log.write(("novnc: " + format % args + "\n").encode("utf-8", "replace"))
            log.flush()


class FileServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def serve_novnc(launcher: "Launcher", novnc: str) -> None:
    path = launcher.route("http")
    server = FileServer(path, partial(NoVNCFiles, directory=novnc))
    server.log = launcher.log  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, name="novnc", daemon=True).start()


def start_x_server(launcher: "Launcher", xvnc: str, xauth: str, vnc_socket: str) -> Tuple[int, str]:
    """Xvnc on the first free display, with a fresh cookie; one taken meanwhile (another
    user's, or one still going away) makes it exit at once, and the next is tried."""
    authority = os.path.join(launcher.workdir, "Xauthority")
    display = 19
    for _ in range(20):
        display = next(
            n
            for n in range(display + 1, 1000)
            if not os.path.exists("/tmp/.X11-unix/X%d" % n)
            and not os.path.exists("/tmp/.X%d-lock" % n)
        )
        if os.path.exists(authority):
            os.unlink(authority)
        # The cookie goes on xauth's stdin: any user of the node can read a command line.
        entry = "add :%d MIT-MAGIC-COOKIE-1 %s\n" % (display, os.urandom(16).hex())
        added = subprocess.run(
            [xauth, "-q", "-f", authority, "source", "-"],
            input=entry.encode(),
            stdout=launcher.log,
            stderr=launcher.log,
        )
        if added.returncode != 0:
            launcher.fail("xauth could not write the X server's authority file")
        server = launcher.start(
            [
                xvnc,
                ":%d" % display,
                "-auth",
                authority,
                "-nolisten",
                "tcp",
                "-rfbport",
                "-1",
                "-rfbunixpath",
                vnc_socket,
                "-rfbunixmode",
                "0600",
                "-SecurityTypes",
                "None",
                "-geometry",
                "1280x800",
                "-depth",
                "24",
                "-AlwaysShared",
            ]
        )
        deadline = time.time() + launcher.ready_within
        while server.poll() is None and not launcher.answers(vnc_socket) and time.time() < deadline:
            time.sleep(0.1)
        if server.poll() is None and launcher.answers(vnc_socket):
            return display, authority
        launcher.forget(server)
        if server.poll() is None:
            server.kill()
    launcher.fail("Xvnc did not start on any display (see its log)")


def start(launcher: "Launcher", secret: str, options: Dict[str, str]) -> None:
    novnc = options.get("--novnc", "/usr/share/novnc")
    xvnc = launcher.find("Xtigervnc", "Xvnc")
    xauth = launcher.find("xauth")
    if not (xvnc and xauth):
        launcher.fail("TigerVNC and xauth must be installed on the node")
    if not os.path.isfile(os.path.join(novnc, "vnc.html")):
        launcher.fail("noVNC is not installed on the node (no %s/vnc.html)" % novnc)
    display, authority = start_x_server(launcher, xvnc, xauth, launcher.route("vnc"))
    env = dict(os.environ, DISPLAY=":%d" % display, XAUTHORITY=authority)
    window_manager = launcher.find("xfwm4", "openbox", "fluxbox", "icewm", "twm")
    if window_manager:
        launcher.start([window_manager], vital=False, env=env)
    terminal = launcher.find("xterm", "x-terminal-emulator")
    if terminal:
        launcher.start(
            [terminal, "-geometry", "120x40+20+20"],
            vital=False,
            env=env,
            cwd=launcher.folder,
        )
    serve_novnc(launcher, novnc)
