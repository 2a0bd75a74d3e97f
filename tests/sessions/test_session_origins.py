"""Sessions on origins of their own, through the real ASGI application without a cluster: the
one-time handoff, the session host's cookie, and what a session's origin can never reach."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from asgiref.sync import async_to_sync
from asgiref.testing import ApplicationCommunicator
from django.conf import settings
from django.test import Client

from activate.asgi import application
from sessions_app.proxy.origins import without_credentials
from sessions_app.statuses import SessionStatus
from tests.sessions.test_session_rules import connected_worker, session_on

pytestmark = pytest.mark.django_db(transaction=True)

Headers = list[tuple[bytes, bytes]]
REPO = Path(__file__).resolve().parents[2]


def call(
    path: str, headers: Headers, *, method: str = "GET", query: bytes = b""
) -> tuple[int, dict[bytes, bytes], list[bytes]]:
    """One HTTP request to the ASGI application: (status, headers, every Set-Cookie)."""

    async def run() -> tuple[int, dict[bytes, bytes], list[bytes]]:
        scope: dict[str, Any] = {"type": "http", "path": path, "headers": headers}
        scope.update(query_string=query, method=method, http_version="1.1", scheme="http")
        communicator = ApplicationCommunicator(application, scope)
        await communicator.send_input({"type": "http.request", "body": b""})
        start = await communicator.receive_output(10)
        # The whole body, so the application's threads are not left sending into a closed loop.
        body = start
        while body["type"] != "http.response.body" or body.get("more_body"):
            body = await communicator.receive_output(10)
        cookies = [v for k, v in start["headers"] if k.lower() == b"set-cookie"]
        return start["status"], {k.lower(): v for k, v in start["headers"]}, cookies

    return async_to_sync(run)()


def socket(path: str, headers: Headers) -> dict[str, Any]:
    """How a WebSocket to ``path`` closes: refused before it is accepted, or after (with what
    was sent before the close)."""

    async def run() -> dict[str, Any]:
        scope: dict[str, Any] = {"type": "websocket", "path": path, "headers": headers}
        scope.update(query_string=b"", subprotocols=[])
        communicator = ApplicationCommunicator(application, scope)
        await communicator.send_input({"type": "websocket.connect"})
        first: dict[str, Any] = await communicator.receive_output(10)
        if first["type"] != "websocket.accept":
            return first
        sent = []
        while (message := await communicator.receive_output(10))["type"] != "websocket.close":
            sent.append(message)
        return {**message, "accepted": True, "sent": sent}

    return async_to_sync(run)()


def platform_cookie(user: Any) -> bytes:
    client = Client()
    client.force_login(user)
    name = settings.SESSION_COOKIE_NAME
    return f"{name}={client.cookies[name].value}".encode()


def host_of(public_id: str) -> bytes:
    return urlsplit(origin_of(public_id)).netloc.encode()


def origin_of(public_id: str) -> str:
    public = urlsplit(settings.ACTIVATE_PUBLIC_URL)
    port = f":{public.port}" if public.port else ""
    return f"{public.scheme}://{public_id}.{settings.ACTIVATE_SESSION_DOMAIN}{port}"


PLATFORM_HOST = urlsplit(settings.ACTIVATE_PUBLIC_URL).netloc.encode()


@dataclass(frozen=True)
class Handoff:
    """Where the platform sent the browser with its token, and the state cookie the session's
    host gave that browser on the way."""

    location: str
    state: bytes


def handed_over(user: Any, public_id: str, path: str = "", platform: bytes = b"") -> Handoff:
    """A browser of ``user``'s asking the platform for the session: the way to its handoff."""
    asked = path or f"/s/{public_id}/"
    logged_in = [(b"host", PLATFORM_HOST), (b"cookie", platform or platform_cookie(user))]
    # The platform sends it to the session's host ...
    status, headers, _ = call(asked, logged_in)
    assert (status, headers[b"location"]) == (302, (origin_of(public_id) + asked).encode())
    # ... which, without its cookie, gives it a state and sends it back for a handoff ...
    status, headers, set_cookies = call(asked, [(b"host", host_of(public_id))])
    assert status == 302, status
    back = urlsplit(headers[b"location"].decode())
    assert f"{back.scheme}://{back.netloc}" == settings.ACTIVATE_PUBLIC_URL
    # ... where its owner gets a token for that state.
    status, headers, _ = call(back.path, logged_in, query=back.query.encode())
    assert status == 302, status
    return Handoff(headers[b"location"].decode(), credential_cookie(set_cookies))


def take(
    handoff: Handoff, state: bytes | None = None
) -> tuple[int, dict[bytes, bytes], list[bytes]]:
    """The session's host taking the token, in the browser that holds ``state``."""
    parts = urlsplit(handoff.location)
    held = handoff.state if state is None else state
    headers = [(b"host", parts.netloc.encode()), *([(b"cookie", held)] if held else [])]
    return call(parts.path, headers, query=parts.query.encode())


def credential_cookie(set_cookies: list[bytes]) -> bytes:
    return set_cookies[0].split(b";")[0]


def test_the_default_puts_each_session_on_a_host_of_its_own_under_localhost() -> None:
    assert settings.ACTIVATE_SESSION_DOMAIN == "localhost"
    assert settings.ACTIVATE_SESSION_PATHS is False


def test_the_handoff_opens_the_session_on_its_own_host_once_with_a_cookie_for_that_host_only(
    user: Any,
) -> None:
    # Given: alice's session, and alice logged in on the platform.
    session = session_on(connected_worker(user), status=SessionStatus.PENDING)
    sid = session.public_id

    # When: her browser asks the platform for the session's page.
    handoff = handed_over(user, sid, f"/s/{sid}/vnc.html")

    # Then: it reaches the session's own origin with a one-time token.
    parts = urlsplit(handoff.location)
    assert f"{parts.scheme}://{parts.netloc}" == origin_of(sid)
    assert parts.path == "/_activate/handoff" and parts.query.startswith("token=")

    # When: the session's host takes the token.
    status, headers, set_cookies = take(handoff)
    # Then: a cookie for this host alone, out of scripts' reach, and on to the page asked for.
    assert (status, headers[b"location"]) == (302, f"/s/{sid}/vnc.html".encode())
    attributes = [a.strip().lower() for a in set_cookies[0].split(b";")]
    assert b"httponly" in attributes and b"samesite=lax" in attributes and b"path=/" in attributes
    assert not any(a.startswith(b"domain") for a in attributes)

    # With it, the proxy serves her (the program is not running yet: 503, not a login).
    cookie = credential_cookie(set_cookies)
    on_host = [(b"host", host_of(sid)), (b"cookie", cookie)]
    assert call(f"/s/{sid}/vnc.html", on_host)[0] == 503

    # The same token a second time opens nothing.
    assert take(handoff)[0] == 403


def test_a_token_or_cookie_opens_only_its_own_session_and_only_for_its_owner(
    user: Any, other_user: Any
) -> None:
    alices = session_on(connected_worker(user), status=SessionStatus.PENDING)
    bobs = session_on(connected_worker(other_user), status=SessionStatus.PENDING)
    alice, bob = platform_cookie(user), platform_cookie(other_user)

    # Bob asking the platform for a handoff to alice's session gets 404, and no token.
    _, headers, _ = call(f"/s/{alices.public_id}/", [(b"host", host_of(alices.public_id))])
    back = urlsplit(headers[b"location"].decode())
    as_bob = [(b"host", PLATFORM_HOST), (b"cookie", bob)]
    assert call(back.path, as_bob, query=back.query.encode())[0] == 404

    # Bob's own token, taken on alice's session's host, opens nothing.
    bobs_handoff = handed_over(other_user, bobs.public_id, platform=bob)
    moved = bobs_handoff.location.replace(bobs.public_id, alices.public_id, 1)
    assert take(Handoff(moved, bobs_handoff.state))[0] == 403

    # Bob's token sent to alice (a link in a message) does not put her in his session: her
    # browser holds no state of his.
    bobs_handoff = handed_over(other_user, bobs.public_id, platform=bob)
    assert take(bobs_handoff, state=b"")[0] == 403
    # Nor if she holds a state for his session's host (she was sent there before).
    bobs_handoff = handed_over(other_user, bobs.public_id, platform=bob)
    _, _, set_cookies = call(f"/s/{bobs.public_id}/", [(b"host", host_of(bobs.public_id))])
    status, _, given = take(bobs_handoff, state=credential_cookie(set_cookies))
    assert (status, given) == (403, [])

    # Bob's cookie for his own session's host does not open alice's.
    _, _, set_cookies = take(handed_over(other_user, bobs.public_id, platform=bob))
    bobs_cookie = credential_cookie(set_cookies)
    on_alices = [(b"host", host_of(alices.public_id)), (b"cookie", bobs_cookie)]
    status, headers, _ = call(f"/s/{alices.public_id}/vnc.html", on_alices)
    # (sent to the platform for a handoff, which answers bob 404)
    assert status == 302 and headers[b"location"].startswith(settings.ACTIVATE_PUBLIC_URL.encode())
    # ... and a platform cookie is no credential on a session's host either.
    with_platform_cookie = [(b"host", host_of(alices.public_id)), (b"cookie", alice)]
    assert call(f"/s/{alices.public_id}/vnc.html", with_platform_cookie)[0] == 302


def test_a_sessions_host_serves_nothing_of_the_platform(user: Any) -> None:
    session = session_on(connected_worker(user), status=SessionStatus.RUNNING)
    sid = session.public_id
    _, _, set_cookies = take(handed_over(user, sid))
    on_host = [(b"host", host_of(sid)), (b"cookie", credential_cookie(set_cookies))]
    for path in ("/api/workers/", "/admin/", "/workers/", "/sessions/", "/", "/s/other1/"):
        assert call(path, on_host)[0] == 404, path
    # A terminal's socket on a session's host is refused, with the host's own cookie and origin.
    origin = (b"origin", origin_of(sid).encode())
    worker = session.worker.public_id
    refused = socket(f"/ws/workers/{worker}/terminal/", [*on_host, origin])
    assert refused["type"] == "websocket.close" and "accepted" not in refused


def test_the_platform_refuses_what_a_sessions_page_starts(user: Any) -> None:
    session = session_on(connected_worker(user), status=SessionStatus.RUNNING)
    origin = (b"origin", origin_of(session.public_id).encode())
    platform = [(b"host", PLATFORM_HOST), (b"cookie", platform_cookie(user))]
    # The API, even if the browser sent the platform's cookie along (one site in production).
    assert call("/api/workers/", platform)[0] == 200
    assert call("/api/workers/", [*platform, origin])[0] == 403
    # A terminal's socket, even with the platform's cookie.
    worker = session.worker.public_id
    refused = socket(f"/ws/workers/{worker}/terminal/", [*platform, origin])
    assert refused["type"] == "websocket.close" and refused["code"] == 4403
    # And the session's own socket on the platform's host: browsers get it on its origin only.
    platform_origin = (b"origin", settings.ACTIVATE_PUBLIC_URL.encode())
    on_platform = socket(f"/s/{session.public_id}/websockify", [*platform, platform_origin])
    assert on_platform["type"] == "websocket.close" and on_platform.get("code") == 4404


def test_another_sites_page_cannot_use_a_sessions_cookie(user: Any) -> None:
    session = session_on(connected_worker(user), status=SessionStatus.PENDING)
    sid = session.public_id
    _, _, set_cookies = take(handed_over(user, sid))
    on_host = [(b"host", host_of(sid)), (b"cookie", credential_cookie(set_cookies))]
    sibling = origin_of("s" + "2" * 10).encode()
    # A sibling session's page (the same site) fetching or posting: refused.
    fetched = [(b"sec-fetch-site", b"same-site"), (b"sec-fetch-mode", b"cors")]
    assert call(f"/s/{sid}/vnc.html", [*on_host, *fetched])[0] == 403
    posted = [(b"origin", sibling)]
    assert call(f"/s/{sid}/api", [*on_host, *posted], method="POST")[0] == 403
    framed = [(b"sec-fetch-site", b"same-site"), (b"sec-fetch-mode", b"navigate")]
    assert call(f"/s/{sid}/", [*on_host, *framed, (b"sec-fetch-dest", b"iframe")])[0] == 403
    # Its socket, from another origin: refused.
    assert "accepted" not in socket(f"/s/{sid}/websockify", [*on_host, (b"origin", sibling)])
    # Following a link to it is fine; so is its own page's socket.
    navigated = [*framed, (b"sec-fetch-dest", b"document")]
    assert call(f"/s/{sid}/vnc.html", [*on_host, *navigated])[0] == 503
    own = socket(f"/s/{sid}/websockify", [*on_host, (b"origin", origin_of(sid).encode())])
    assert own.get("accepted") and own["code"] == 4503


def test_logging_out_of_the_platform_ends_the_sessions_cookie(user: Any) -> None:
    session = session_on(connected_worker(user), status=SessionStatus.PENDING)
    sid = session.public_id
    client = Client()
    client.force_login(user)
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    _, _, set_cookies = take(handed_over(user, sid, platform=cookie.encode()))
    on_host = [(b"host", host_of(sid)), (b"cookie", credential_cookie(set_cookies))]
    assert call(f"/s/{sid}/vnc.html", on_host)[0] == 503
    client.post("/logout/")
    assert call(f"/s/{sid}/vnc.html", on_host)[0] == 302


def test_nothing_of_ours_reaches_the_node_from_a_sessions_host() -> None:
    platform = settings.SESSION_COOKIE_NAME
    scope = {
        "headers": [
            (b"host", b"s2345678923.localhost:8000"),
            (b"authorization", b"Bearer pwk_x"),
            (b"cookie", f"activate_session=c; theme=dark; {platform}=p".encode()),
            (b"cookie", f"{settings.CSRF_COOKIE_NAME}=t; _xsrf=j".encode()),
        ]
    }
    sent = dict(without_credentials(scope))
    assert b"authorization" not in sent
    assert sent[b"cookie"] == b"theme=dark; _xsrf=j"


def check(**env: str) -> subprocess.CompletedProcess[str]:
    """`manage.py check` in a process with ``env`` (and no other ACTIVATE_ variable)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ACTIVATE_")}
    environ.update(env, DJANGO_SETTINGS_MODULE="activate.settings.dev")
    return subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"ACTIVATE_PUBLIC_URL": "https://activate.example.org"}, "ACTIVATE_SESSION_DOMAIN"),
        (
            {"ACTIVATE_SESSION_DOMAIN": "sessions.example.org", "ACTIVATE_SESSION_PATHS": "true"},
            "not both",
        ),
        ({"ACTIVATE_SESSION_DOMAIN": "Sessions.Example.org"}, "ACTIVATE_SESSION_DOMAIN"),
        (
            {
                "ACTIVATE_SESSION_DOMAIN": "sessions.example.org",
                "ACTIVATE_CSRF_TRUSTED_ORIGINS": "https://*.example.org",
            },
            "ACTIVATE_CSRF_TRUSTED_ORIGINS",
        ),
    ],
)
def test_a_platform_whose_sessions_have_no_origin_of_their_own_does_not_start_unless_told(
    env: dict[str, str], says: str
) -> None:
    result = check(**env)
    assert result.returncode != 0 and says in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_a_site_without_wildcard_dns_opts_in_to_paths_and_one_with_it_names_its_domain() -> None:
    public = {"ACTIVATE_PUBLIC_URL": "https://activate.example.org"}
    paths = check(**public, ACTIVATE_SESSION_PATHS="true")
    assert paths.returncode == 0, paths.stderr
    domain = check(**public, ACTIVATE_SESSION_DOMAIN="sessions.example.org")
    assert domain.returncode == 0, domain.stderr
