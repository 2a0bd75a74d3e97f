"""JupyterLab: notebooks whose kernels run on the node as the owner.

Jupyter Server is given the session's password as its token (in its environment, never on a
command line) and the session's path as its base URL, so it serves its pages under /s/<id>/ as
the browser sees them; the proxy sends ``Authorization: token ...`` with every request and
WebSocket (token-authenticated requests need no XSRF cookie), and the owner never sees a login.
"""

from __future__ import annotations

from sessions_app.kinds.base import NodeRequest, NodeTool, ProxyLogin, Session, SessionKind


class Jupyter(SessionKind):
    name = "jupyter"
    label = "JupyterLab"
    description = "JupyterLab notebooks whose kernels run on the node, as you."
    tools = (
        NodeTool(
            option="--jupyter-lab",
            setting="ACTIVATE_JUPYTER_LAB",
            default="jupyter-lab",
            what="JupyterLab's jupyter-lab command",
        ),
    )
    keeps_prefix = True
    landing_path = "lab"

    def starter_options(self, session: Session) -> dict[str, str]:
        return {**super().starter_options(session), "--base-url": session.url_path}

    def log_in(self, request: NodeRequest, session: Session) -> str:
        token = session.secret()
        answer, _, _ = request(
            "GET", f"{session.url_path}api/status", b"", [("Authorization", f"token {token}")]
        )
        if answer != 200:
            raise OSError(f"Jupyter Server answered {answer} with its token")
        return token

    def proxy_login(self, login: str) -> ProxyLogin:
        return ProxyLogin(headers=[(b"authorization", f"token {login}".encode())] if login else [])


KIND = Jupyter()
