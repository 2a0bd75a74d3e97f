"""An app an operator defined (``sessions_app.catalog``) as a session kind: the generic starter
(``node/starters/app.py``) runs its command on the node, told the app's spec and the
session's values in one base64 argument; the platform checks its readiness path through the
gate and logs the owner in as the app says (nothing, a header, a cookie, or a form posted once
whose cookies the proxy then sends)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from contextlib import suppress
from functools import cached_property
from http.cookies import CookieError, SimpleCookie
from urllib.parse import urlencode

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser

from node import starter_source
from sessions_app.catalog import store
from sessions_app.catalog.spec import AppSpec, node_spec
from sessions_app.catalog.values import check_values
from sessions_app.kinds.base import Headers, NodeRequest, ProxyLogin, Session, SessionKind

STARTER = "app"


class OperatorApp(SessionKind):
    """A kind made of an ``AppSpec`` (one instance per app, built as the registry reads it)."""

    def __init__(self, spec: AppSpec) -> None:
        self.spec = spec
        # What the registry and pages read off every kind, here per instance.
        self.name = spec.name  # type: ignore[misc]
        self.label = spec.label  # type: ignore[misc]
        self.description = spec.description  # type: ignore[misc]
        self.keeps_prefix = spec.keeps_prefix  # type: ignore[misc]
        self.landing_path = spec.landing_path  # type: ignore[misc]
        self.ready_within = float(spec.start_timeout)  # type: ignore[misc]
        self.fields = spec.fields

    def seen_by(self, user: AbstractBaseUser | AnonymousUser) -> bool:
        return store.seen_by(self.spec, user)

    def offered_on(self, cluster: str, environment: str | None) -> bool:
        return store.offered_on(self.spec, cluster, environment)

    def checked_values(self, values: Mapping[str, object]) -> dict[str, str]:
        return check_values(self.spec, values)

    @cached_property
    def starter(self) -> str:
        return starter_source(STARTER)

    def starter_options(self, session: Session) -> dict[str, str]:
        values = {str(k): str(v) for k, v in (session.values or {}).items()}
        return {"--spec-b64": node_spec(self.spec, values=values, base_url=session.url_path)}

    def _root(self, session: Session) -> str:
        """The app's root as the program sees it through the gate."""
        return session.url_path if self.keeps_prefix else "/"

    def _filled(self, template: str, session: Session) -> str:
        return template.replace("{secret}", session.secret()).replace("{{", "{").replace("}}", "}")

    def log_in(self, request: NodeRequest, session: Session) -> str:
        login = self.spec.login
        kind = login.get("kind", "none")
        sent = ProxyLogin()
        if kind == "header":
            sent = ProxyLogin(
                headers=[(login["name"].encode(), self._filled(login["value"], session).encode())]
            )
        elif kind == "cookie":
            sent = ProxyLogin(cookies={login["name"]: self._filled(login["value"], session)})
        elif kind == "form":
            body = urlencode(
                {name: self._filled(value, session) for name, value in login["fields"].items()}
            ).encode()
            form = [("Content-Type", "application/x-www-form-urlencoded")]
            status, headers, _ = request("POST", self._root(session) + login["path"], body, form)
            cookies = _set_cookies(headers)
            if not cookies:
                raise OSError(f"its login form set no cookie (answered {status})")
            sent = ProxyLogin(cookies=cookies)
        extra = [(name.decode(), value.decode()) for name, value in sent.headers]
        if sent.cookies:
            extra.append(("Cookie", "; ".join(f"{k}={v}" for k, v in sent.cookies.items())))
        status, _, _ = request("GET", self._root(session) + self.spec.ready_path, b"", extra)
        if status not in self.spec.ready_statuses:
            wanted = ", ".join(str(s) for s in self.spec.ready_statuses)
            raise OSError(f"{self.spec.label} answered {status}, not {wanted}")
        return json.dumps(
            {
                "headers": [[n.decode(), v.decode()] for n, v in sent.headers],
                "cookies": sent.cookies,
            }
        )

    def proxy_login(self, login: str) -> ProxyLogin:
        if not login:
            return ProxyLogin()
        kept = json.loads(login)
        return ProxyLogin(
            cookies=dict(kept.get("cookies", {})),
            headers=[(n.encode(), v.encode()) for n, v in kept.get("headers", [])],
        )


def _set_cookies(headers: Headers) -> dict[str, str]:
    found: dict[str, str] = {}
    for name, value in headers:
        if name.lower() != b"set-cookie":
            continue
        jar: SimpleCookie = SimpleCookie()
        with suppress(CookieError):  # an odd cookie is skipped, as a browser would
            jar.load(value.decode("latin-1"))
        found.update({key: morsel.value for key, morsel in jar.items()})
    return found
