"""Sessions on origins of their own: each session at ``<id>.<ACTIVATE_SESSION_DOMAIN>``.

What a session's program serves is not trusted (a neighbour on the node may be the one
answering), so it is never served on the platform's origin: there it could call the API, open
terminals and read the platform's cookies as its owner. Instead:

- A browser asking the platform for ``/s/<id>/...`` is sent to the same path on the session's
  host. Without that host's cookie, the host sets a state cookie of its own (random, for this
  browser alone) and sends the browser to the platform's ``HANDOFF_PATH`` with it.
- There the owner, logged in, gets a one-time token (random, in Redis for ``HANDOFF_SECONDS``,
  bound to the user, the session, the platform session, the state and the path asked for) and a
  redirect to ``HANDOFF_PATH`` on the session's host.
- Redis keeps no credential: the token and the host's cookie as hashes, the state as a hash,
  and the platform session's key sealed under the token or cookie it was handed to, so what is
  stored logs nobody in (tests/sessions/test_redis_read.py).
- The session's host takes the token once, if the browser holds its state (so no one can send
  someone else into their own session with a token of theirs), and sets a cookie for that host
  alone (no Domain, HttpOnly, SameSite=Lax) holding a credential of its own (in Redis, bound to
  the same user, session and platform session: logging out of the platform ends it too).
- On a session's host that cookie is the only credential, only ``/s/<id>/`` (its own id) and
  the handoff are served, requests that another site's page starts are refused, and neither
  that cookie nor the platform's reach the node. The platform refuses requests and WebSockets
  whose Origin is a session's.

API keys (``pw``, scripts) keep the platform's ``/s/<id>/``: no browser renders what they get.
``ACTIVATE_SESSION_PATHS=true`` serves browsers there too, for sites whose users trust each
other (the session's program can then act as its owner on the platform).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import re
import secrets
from importlib import import_module
from typing import Any
from urllib.parse import parse_qs, quote, urlencode, urlsplit

from channels.db import database_sync_to_async
from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings
from django.contrib.auth import SESSION_KEY, get_user_model
from django.shortcuts import resolve_url

from core.redis_connection import redis_client
from core.websocket_auth import Scope, WebSocketAuthMiddleware
from sessions_app.proxy.http_proxy import plain
from sessions_app.proxy.target import PATH, PREFIX
from sessions_app.services import find_session

log = logging.getLogger(__name__)

HANDOFF_PATH = "/_activate/handoff"
# Long enough for a redirect on a slow link; the token is taken at its first use anyway.
HANDOFF_SECONDS = 30
# Long enough to log in to the platform on the way.
STATE_SECONDS = 600
COOKIE = "activate_session"
STATE_COOKIE = "activate_state"
PUBLIC_ID = re.compile(r"[a-z0-9]{1,16}")
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
# Sec-Fetch-Site values of requests a page of the session's own origin (or the user) started.
OWN_SITES = ("same-origin", "none")


# -- where sessions are --------------------------------------------------------------------


def isolated() -> bool:
    """Whether browsers get sessions on origins of their own (else on the platform's)."""
    return bool(settings.ACTIVATE_SESSION_DOMAIN)


def cookie_name(name: str = COOKIE) -> str:
    # Over https the __Host- prefix makes browsers refuse the cookie from anywhere but this
    # host, with a Domain, or without Secure: a sibling session's page cannot plant one.
    return f"__Host-{name}" if _public().scheme == "https" else name


def _set_cookie(name: str, value: str, max_age: int | None = None) -> bytes:
    secure = "; Secure" if _public().scheme == "https" else ""
    age = f"; Max-Age={max_age}" if max_age is not None else ""
    return f"{cookie_name(name)}={value}; Path=/; HttpOnly; SameSite=Lax{age}{secure}".encode()


def _public() -> Any:
    return urlsplit(settings.ACTIVATE_PUBLIC_URL)


def session_origin(public_id: str) -> str:
    """``scheme://<id>.<domain>[:port]``: the platform's scheme and port."""
    public = _public()
    port = f":{public.port}" if public.port else ""
    return f"{public.scheme}://{public_id}.{settings.ACTIVATE_SESSION_DOMAIN}{port}"


def session_id_of_host(host: str) -> str | None:
    """The session whose host ``host`` (a Host header, or an Origin's host and port) is."""
    if not isolated():
        return None
    name = host.strip().lower()
    head, _, port = name.rpartition(":")
    if head and port.isdigit():
        name = head
    label, dot, domain = name.partition(".")
    if not dot or domain != settings.ACTIVATE_SESSION_DOMAIN or not PUBLIC_ID.fullmatch(label):
        return None
    return label


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if bytes(key).lower() == name:
            return bytes(value).decode("latin-1")
    return None


def serves(scope: Scope) -> bool:
    """Whether a request is the sessions' (else Django's): a session's path or host, or the
    platform's end of the handoff."""
    path = scope["path"]
    return path.startswith(PREFIX) or path == HANDOFF_PATH or on_session_host(scope) is not None


def on_session_host(scope: Scope) -> str | None:
    """The session whose host a request came to, if any."""
    return session_id_of_host(_header(scope, b"host") or "")


def from_session_origin(scope: Scope) -> bool:
    """Whether a request or WebSocket was started by a page on a session's origin."""
    origin = _header(scope, b"origin")
    if not origin or origin == "null":
        return False
    return session_id_of_host(urlsplit(origin).netloc) is not None


# -- the handoff and the session host's credential -------------------------------------------


def _key(kind: str, secret: str) -> str:
    # Only a hash is kept: what Redis holds opens nothing by itself.
    return f"activate:session-{kind}:{settings.ACTIVATE_INSTALLATION_ID}:{_hashed(secret)}"


def _hashed(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _sealer(secret: str) -> Fernet:
    # Another function of the secret than _hashed: the key a record is found by does not open it.
    return Fernet(base64.urlsafe_b64encode(hmac.digest(secret.encode(), b"seal", "sha256")))


def _seal(secret: str, platform_session: str) -> str:
    """The platform session's key, readable only with ``secret`` (a token or cookie the browser
    holds and Redis does not): a reader of Redis cannot log in as its owner."""
    return _sealer(secret).encrypt(platform_session.encode()).decode()


def _unseal(secret: str, sealed: str) -> str | None:
    try:
        return _sealer(secret).decrypt(sealed.encode()).decode()
    except InvalidToken:
        return None


def create_handoff(
    user: Any, public_id: str, platform_session: str, *, state: str, next_path: str
) -> str | None:
    """A one-time token that opens ``public_id`` on its own origin for ``user``, its owner
    (None for anyone else), in the browser that holds ``state``."""
    if find_session(user, public_id) is None or not state:
        return None
    token = secrets.token_urlsafe(32)
    record = {
        "user": user.pk,
        "session": public_id,
        "platform_session": _seal(token, platform_session),
        "state": _hashed(state),
        "next": next_path,
    }
    redis_client().set(_key("handoff", token), json.dumps(record), ex=HANDOFF_SECONDS)
    return token


def take_handoff(token: str, public_id: str, state: str) -> tuple[str, str] | None:
    """Takes the token (once: it is gone after this call, whoever calls); returns a new
    credential for this session's host, and where to go next, if the browser holds the state
    the token was made for."""
    raw = redis_client().getdel(_key("handoff", token)) if token else None
    if raw is None:
        return None
    record = json.loads(raw)
    if record["session"] != public_id or not secrets.compare_digest(
        record["state"], _hashed(state)
    ):
        return None
    platform_session = _unseal(token, record["platform_session"])
    if platform_session is None:
        return None
    credential = secrets.token_urlsafe(32)
    kept = {
        "user": record["user"],
        "session": public_id,
        "platform_session": _seal(credential, platform_session),
    }
    redis_client().set(
        _key("origin", credential), json.dumps(kept), ex=int(settings.SESSION_COOKIE_AGE)
    )
    return credential, str(record["next"])


def credential_user(credential: str, public_id: str) -> Any | None:
    """The user a session host's cookie stands for, while the platform session it was handed
    over from is still theirs; None otherwise."""
    raw = redis_client().get(_key("origin", credential)) if credential else None
    if raw is None:
        return None
    record = json.loads(raw)
    if record["session"] != public_id:
        return None
    platform_session = _unseal(credential, record["platform_session"])
    if platform_session is None:
        return None
    store = import_module(settings.SESSION_ENGINE).SessionStore(platform_session)
    if str(store.get(SESSION_KEY)) != str(record["user"]):
        return None
    user = get_user_model().objects.filter(pk=record["user"], is_active=True).first()
    return user


def _cookies(scope: Scope) -> list[tuple[str, str]]:
    pairs = []
    for value in (v for k, v in scope.get("headers", []) if bytes(k).lower() == b"cookie"):
        for item in bytes(value).decode("latin-1").split(";"):
            name, eq, rest = item.strip().partition("=")
            if eq:
                pairs.append((name, rest))
    return pairs


def without_credentials(scope: Scope) -> list[tuple[bytes, bytes]]:
    """The request's headers minus every credential of ours: the session host's cookie, any
    of the platform's (a sibling page may have planted one), and Authorization."""
    ours = {cookie_name(), cookie_name(STATE_COOKIE)}
    ours |= {settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME}
    kept = [(n, v) for n, v in _cookies(scope) if n not in ours]
    headers = [
        (bytes(k), bytes(v))
        for k, v in scope.get("headers", [])
        if bytes(k).lower() not in (b"cookie", b"authorization")
    ]
    if kept:
        headers.append((b"cookie", "; ".join(f"{n}={v}" for n, v in kept).encode("latin-1")))
    return headers


def _cookie(scope: Scope, name: str) -> str:
    return next((v for n, v in _cookies(scope) if n == name), "")


@database_sync_to_async
def _user_from_cookie(scope: Scope, public_id: str) -> Any | None:
    for name, value in _cookies(scope):
        if name == cookie_name():
            user = credential_user(value, public_id)
            if user is not None:
                return user
    return None


_create_handoff = database_sync_to_async(create_handoff)
_take_handoff = database_sync_to_async(take_handoff)


# -- ASGI ---------------------------------------------------------------------------------


def _full_path(scope: Scope) -> str:
    """The path and query as the browser sent them (still percent-encoded)."""
    raw = scope.get("raw_path")
    path = bytes(raw).decode("latin-1") if raw else quote(scope["path"])
    query = scope.get("query_string", b"").decode("latin-1")
    return path + (f"?{query}" if query else "")


def _started_elsewhere(scope: Scope, public_id: str) -> bool:
    """A request that a page of another origin started (a sibling session's page is on the
    same site, so SameSite alone would let its requests carry this host's cookie)."""
    method = scope["method"]
    origin = _header(scope, b"origin")
    if origin and method not in SAFE_METHODS and origin != session_origin(public_id):
        return True
    site = _header(scope, b"sec-fetch-site")
    if site is None or site in OWN_SITES:
        return False
    # Following a link or a redirect to the session is fine; framing or fetching it is not.
    navigation = _header(scope, b"sec-fetch-mode") == "navigate"
    document = _header(scope, b"sec-fetch-dest") in (None, "document")
    return not (navigation and document and method in ("GET", "HEAD"))


class SessionHttpGate:
    """Every HTTP request for a session: on a session's host, its proxy behind that host's
    cookie; on the platform's host, the way there (browsers) or the proxy (API keys, or when
    sessions are served by path)."""

    def __init__(self, proxy: Any) -> None:
        self.proxy = proxy
        self.on_platform = WebSocketAuthMiddleware(self._platform)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        public_id = on_session_host(scope)
        if public_id is None:
            await self.on_platform(scope, receive, send)
        else:
            await self._session_host(public_id, scope, receive, send)

    async def _platform(self, scope: Scope, receive: Any, send: Any) -> None:
        if not isolated() or scope.get("auth") == "api_key":
            if scope["path"].startswith(PREFIX):
                await self.proxy(scope, receive, send)
            else:
                await plain(send, 404, "Not found.")
            return
        if scope["method"] not in ("GET", "HEAD"):
            await plain(send, 404, "Sessions are served on origins of their own.")
        elif scope["path"] == HANDOFF_PATH:
            await self._hand_over(scope, send)
        elif (match := PATH.match(scope["path"])) is not None:
            there = session_origin(match["public_id"]) + _full_path(scope)
            await plain(send, 302, "", [(b"location", there.encode())])
        else:
            await plain(send, 404, "Not found.")

    async def _hand_over(self, scope: Scope, send: Any) -> None:
        user = scope.get("user")
        if user is None or not user.is_authenticated:
            login = f"{resolve_url(settings.LOGIN_URL)}?next={quote(_full_path(scope))}"
            await plain(send, 302, "Log in first.", [(b"location", login.encode())])
            return
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        public_id, state, next_path = (
            (query.get(name) or [""])[0] for name in ("session", "state", "next")
        )
        # A path on the session's host, as its raw request line had it.
        match = PATH.match(next_path) if next_path.isprintable() and " " not in next_path else None
        token = None
        if match is not None and match["public_id"] == public_id:
            platform_session = scope["session"].session_key or ""
            token = await _create_handoff(
                user, public_id, platform_session, state=state, next_path=next_path
            )
        if token is None:
            await plain(send, 404, "Not found.")
            return
        location = f"{session_origin(public_id)}{HANDOFF_PATH}?token={token}"
        await plain(send, 302, "", [(b"location", location.encode())])

    async def _session_host(self, public_id: str, scope: Scope, receive: Any, send: Any) -> None:
        if _started_elsewhere(scope, public_id):
            await plain(send, 403, "Another site's page may not use this session.")
            return
        if scope["path"] == HANDOFF_PATH:
            await self._take(public_id, scope, send)
            return
        match = PATH.match(scope["path"])
        if match is None or match["public_id"] != public_id:
            await plain(send, 404, "Not found.")
            return
        user = await _user_from_cookie(scope, public_id)
        if user is None:
            await self._ask_platform(public_id, scope, send)
            return
        headers = without_credentials(scope)
        inner = dict(scope, user=user, auth="session", origin_refused=False, headers=headers)
        await self.proxy(inner, receive, send)

    async def _ask_platform(self, public_id: str, scope: Scope, send: Any) -> None:
        """No credential here: a navigation goes to the platform for one, with a state that
        only this browser holds."""
        if scope["method"] not in ("GET", "HEAD"):
            await plain(send, 403, "Open this session from the platform first.")
            return
        state = secrets.token_urlsafe(24)
        query = urlencode({"session": public_id, "state": state, "next": _full_path(scope)})
        there = f"{settings.ACTIVATE_PUBLIC_URL}{HANDOFF_PATH}?{query}".encode()
        cookie = _set_cookie(STATE_COOKIE, state, STATE_SECONDS)
        await plain(send, 302, "", [(b"set-cookie", cookie), (b"location", there)])

    async def _take(self, public_id: str, scope: Scope, send: Any) -> None:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        token = (query.get("token") or [""])[0]
        state = _cookie(scope, cookie_name(STATE_COOKIE))
        taken = await _take_handoff(token, public_id, state)
        if taken is None:
            await plain(send, 403, "This link was used, has expired or is not yours.")
            return
        credential, next_path = taken
        log.info("session %s: handed over to its own origin", public_id)
        headers = [
            (b"set-cookie", _set_cookie(COOKIE, credential)),
            (b"set-cookie", _set_cookie(STATE_COOKIE, "", 0)),
            (b"location", next_path.encode()),
        ]
        await plain(send, 302, "", headers)


class SessionWebSocketGate:
    """Every WebSocket: on a session's host, only that session's own sockets, from its own
    origin, behind its cookie; on the platform's host, the platform's routes, where a browser
    gets no session's socket (it is served on the session's origin) when sessions are
    isolated."""

    def __init__(self, session_app: Any, platform_app: Any) -> None:
        self.session_app = session_app
        self.on_platform = WebSocketAuthMiddleware(_PlatformSockets(platform_app))

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        public_id = on_session_host(scope)
        if public_id is None:
            await self.on_platform(scope, receive, send)
            return
        match = PATH.match(scope["path"])
        user = None
        own_origin = _header(scope, b"origin") == session_origin(public_id)
        ours = match is not None and match["public_id"] == public_id and match["rest"]
        if ours and own_origin:
            user = await _user_from_cookie(scope, public_id)
        if user is None:
            await _refuse_socket(receive, send)
            return
        headers = without_credentials(scope)
        inner = dict(scope, user=user, auth="session", origin_refused=False, headers=headers)
        await self.session_app(inner, receive, send)


class _PlatformSockets:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        browser = scope.get("auth") == "session"
        session_path = isolated() and scope["path"].startswith(PREFIX)
        if (browser and session_path) or from_session_origin(scope):
            scope = dict(scope, origin_refused=True)
        await self.app(scope, receive, send)


async def _refuse_socket(receive: Any, send: Any) -> None:
    # Closed before it is accepted: the browser sees the handshake refused (HTTP 403).
    message = await receive()
    if message["type"] == "websocket.connect":
        await send({"type": "websocket.close", "code": 4404})


class RefuseSessionOrigins:
    """In front of Django: a request a session's page started is refused before any view (its
    browser may send the platform's cookies along when both are on one site)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and from_session_origin(scope):
            await plain(send, 403, "A session's page may not use the platform.")
            return
        await self.app(scope, receive, send)
