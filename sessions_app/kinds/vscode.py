"""VS Code in the browser: code-server, logged in by the platform (its session cookie is what
the proxy sends; the owner never sees the password)."""

from __future__ import annotations

from urllib.parse import urlencode

from sessions_app.kinds.base import NodeRequest, NodeTool, ProxyLogin, Session, SessionKind

COOKIE_NAME = "code-server-session"


class VSCode(SessionKind):
    name = "vscode"
    label = "VS Code"
    description = "VS Code in the browser (code-server), opened on your home folder on the node."
    tools = (
        NodeTool(
            option="--code-server",
            setting="ACTIVATE_CODE_SERVER",
            default="code-server",
            what="code-server",
        ),
    )

    def log_in(self, request: NodeRequest, session: Session) -> str:
        """Log in as the user would; code-server's session cookie is what the proxy sends."""
        body = urlencode({"password": session.secret()}).encode()
        form = [("Content-Type", "application/x-www-form-urlencoded")]
        status, headers, _ = request("POST", "/login", body, form)
        for name, value in headers:
            if name.lower() == b"set-cookie" and value.startswith(COOKIE_NAME.encode() + b"="):
                return value.decode("latin-1").split(";", 1)[0].split("=", 1)[1]
        raise OSError(f"code-server did not take its password (answered {status})")

    def proxy_login(self, login: str) -> ProxyLogin:
        return ProxyLogin(cookies={COOKIE_NAME: login} if login else {})


KIND = VSCode()
