"""VS Code in the browser: code-server with password login, on a Unix socket in the session's
private folder, its own port proxy off (options: --code-server PATH)."""

import hashlib
import os
from typing import TYPE_CHECKING, Dict

if TYPE_CHECKING:
    from ..activate_session import Launcher  # the launcher these run in, on the node too


def start(launcher: "Launcher", secret: str, options: Dict[str, str]) -> None:
    code_server = options.get("--code-server", "code-server")
    program = launcher.find(code_server)
    if not program:
        launcher.fail("code-server is not installed on the node (%s)" % code_server)
    data = os.path.join(os.path.expanduser("~"), ".activate", "code-server")
    # Given as a (legacy, SHA-256) hash, code-server checks its login cookie with a string
    # compare; given in plain text, it runs argon2 on every request (about 50 ms each).
    env = dict(os.environ, HASHED_PASSWORD=hashlib.sha256(secret.encode()).hexdigest())
    env.pop("PASSWORD", None)
    socket = launcher.route("http")
    launcher.start(
        [
            program,
            "--socket",
            socket,
            "--socket-mode",
            "600",
            "--auth",
            "password",
            "--disable-telemetry",
            "--disable-update-check",
            "--disable-workspace-trust",
            # Its /proxy/<port>/ and /absproxy/<port>/ would serve anything on the node's
            # loopback, another user's server too, on the session's origin with its login.
            "--disable-proxy",
            "--user-data-dir",
            os.path.join(data, "data"),
            "--extensions-dir",
            os.path.join(data, "extensions"),
            launcher.folder,
        ],
        env=env,
    )
