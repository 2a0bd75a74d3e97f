"""A remote desktop: TigerVNC's X server on the loopback with a terminal in it, and websockify
serving noVNC and the VNC connection on the session's port (options: --novnc DIR)."""

import os
import subprocess
import time
from typing import TYPE_CHECKING, Dict, Tuple

if TYPE_CHECKING:
    from ..activate_session import Launcher  # the launcher these run in, on the node too


def start_x_server(launcher: "Launcher", xvnc: str, password_file: str) -> Tuple[int, int]:
    """Xvnc on the first free display; one taken meanwhile (another user's, or one still
    going away) makes it exit at once, and the next is tried."""
    display = 19
    for _ in range(20):
        display = next(
            n
            for n in range(display + 1, 1000)
            if not os.path.exists("/tmp/.X11-unix/X%d" % n)
            and not os.path.exists("/tmp/.X%d-lock" % n)
        )
        vnc_port = launcher.free_port("127.0.0.1")
        server = launcher.start(
            [
                xvnc,
                ":%d" % display,
                "-rfbport",
                str(vnc_port),
                "-interface",
                "127.0.0.1",
                "-SecurityTypes",
                "VncAuth",
                "-rfbauth",
                password_file,
                "-geometry",
                "1280x800",
                "-depth",
                "24",
                "-AlwaysShared",
            ]
        )
        deadline = time.time() + launcher.ready_within
        while server.poll() is None and not launcher.answers(vnc_port) and time.time() < deadline:
            time.sleep(0.1)
        if server.poll() is None and launcher.answers(vnc_port):
            return display, vnc_port
        launcher.forget(server)
        if server.poll() is None:
            server.kill()
    launcher.fail("Xvnc did not start on any display (see its log)")


def start(launcher: "Launcher", secret: str, port: int, options: Dict[str, str]) -> None:
    novnc = options.get("--novnc", "/usr/share/novnc")
    xvnc = launcher.find("Xtigervnc", "Xvnc")
    vncpasswd = launcher.find("tigervncpasswd", "vncpasswd")
    websockify = launcher.find("websockify")
    if not (xvnc and vncpasswd and websockify):
        launcher.fail("TigerVNC and websockify must be installed on the node")
    if not os.path.isfile(os.path.join(novnc, "vnc.html")):
        launcher.fail("noVNC is not installed on the node (no %s/vnc.html)" % novnc)
    password_file = os.path.join(launcher.workdir, "vncpasswd")
    with open(password_file, "wb") as out:
        out.write(
            subprocess.run(
                [vncpasswd, "-f"], input=secret.encode(), stdout=subprocess.PIPE, check=True
            ).stdout
        )
    display, vnc_port = start_x_server(launcher, xvnc, password_file)
    env = dict(os.environ, DISPLAY=":%d" % display)
    window_manager = launcher.find("xfwm4", "openbox", "fluxbox", "icewm", "twm")
    if window_manager:
        launcher.start([window_manager], vital=False, env=env)
    terminal = launcher.find("xterm", "x-terminal-emulator")
    if terminal:
        launcher.start(
            [terminal, "-geometry", "120x40+20+20"],
            vital=False,
            env=env,
            cwd=os.path.expanduser("~"),
        )
    launcher.start([websockify, "--web", novnc, "0.0.0.0:%d" % port, "127.0.0.1:%d" % vnc_port])
    launcher.wait_for(port, "websockify")
