"""A session on an origin of its own, end to end, with the platform and its sessions on one site
(activate.example.test and <id>.sessions.example.test, both loopback for Chromium): the browser
then sends the platform's cookies with whatever a session's page asks of the platform, so what
that page gets is what the platform refuses, not what the browser withholds. Opened in Debian's
Chromium from the platform's page, script in the session's page gets none of the platform's
cookies, no answer from its API and no terminal. Real Slurm over real SSH, the platform as real
processes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import User

from harness.platform import Platform, free_port
from tests.browser import launched_chromium
from tests.browser import logged_in_page as browser_page
from tests.sessions.test_sessions_e2e import (  # noqa: F401 - fixtures, found by pytest here
    PASSWORD,
    alice,
    created,
    environment,
    pw,
    session_tools,
    shot,
    showing,
)

pytestmark = [pytest.mark.slurm, pytest.mark.live]

# One registrable domain (example.test): one site, the platform's origin and each session's.
PLATFORM_HOST = "activate.example.test"
SESSION_DOMAIN = "sessions.example.test"
HOST_RULES = (
    f"--host-resolver-rules=MAP {PLATFORM_HOST} 127.0.0.1, MAP *.{SESSION_DOMAIN} 127.0.0.1"
)

# What a session's page could try against the platform it was opened from.
PROBE = """async ({platform, terminals}) => {
    const read = async (url) => {
        try {
            const answer = await fetch(url, {credentials: "include"});
            return {status: answer.status, body: (await answer.text()).slice(0, 200)};
        } catch (e) {
            return {error: String(e)};
        }
    };
    const socket = (url) => new Promise((resolve) => {
        const seen = {url, opened: false, messages: [], code: null};
        const ws = new WebSocket(url);
        ws.onopen = () => {
            seen.opened = true;
            ws.send(JSON.stringify(
                {type: "start", command: ["id", "-un"], pty: false, cols: 80, rows: 24}));
        };
        ws.onmessage = (m) => seen.messages.push(typeof m.data === "string" ? m.data : "binary");
        ws.onclose = (e) => { seen.code = e.code; resolve(seen); };
        setTimeout(() => { seen.timeout = true; resolve(seen); }, 15000);
    });
    const terminalsSeen = [];
    for (const url of terminals) terminalsSeen.push(await socket(url));
    return {
        cookie: document.cookie,
        api: await read(platform + "/api/workers/"),
        apiHere: await read("/api/workers/"),
        terminals: terminalsSeen,
    };
}"""


class Wire:
    """What went over the wire for a page, below what its scripts may see (the cookies a request
    carried, the status of an answer CORS hides): Chromium's DevTools protocol."""

    def __init__(self, page: Any) -> None:
        self.urls: dict[str, str] = {}
        self.cookies: dict[str, str] = {}
        self.statuses: dict[str, int] = {}
        cdp = page.context.new_cdp_session(page)
        cdp.on("Network.requestWillBeSent", self._request)
        cdp.on("Network.requestWillBeSentExtraInfo", self._sent)
        cdp.on("Network.responseReceivedExtraInfo", self._answered)
        cdp.send("Network.enable")

    def _request(self, event: dict[str, Any]) -> None:
        self.urls[event["requestId"]] = event["request"]["url"]

    def _sent(self, event: dict[str, Any]) -> None:
        headers = {k.lower(): v for k, v in event["headers"].items()}
        self.cookies[event["requestId"]] = headers.get("cookie", "")

    def _answered(self, event: dict[str, Any]) -> None:
        self.statuses[event["requestId"]] = event["statusCode"]

    def of(self, url: str) -> list[tuple[str, int | None]]:
        """(cookies sent, status answered) of each request for ``url``."""
        return [
            (self.cookies.get(rid, ""), self.statuses.get(rid))
            for rid, seen in self.urls.items()
            if seen == url
        ]


@pytest.fixture
def session_platform(transactional_db: None, tmp_path: Path) -> Iterator[Platform]:
    port = free_port()
    site = Platform(
        workdir=tmp_path,
        port=port,
        public_url=f"http://{PLATFORM_HOST}:{port}",
        knobs={
            "ACTIVATE_SESSION_DOMAIN": SESSION_DOMAIN,
            # 127.0.0.1 for the harness's and pw's own requests.
            "ACTIVATE_ALLOWED_HOSTS": f"127.0.0.1,{PLATFORM_HOST}",
        },
    )
    with site.running() as running:
        yield running


@pytest.fixture
def chromium() -> Iterator[Any]:
    with launched_chromium(HOST_RULES) as browser:
        yield browser


def logged_in_page(chromium: Any, site: str, username: str) -> Any:
    return browser_page(chromium, site, username, PASSWORD)


def test_a_session_opens_on_its_own_origin_where_its_page_gets_nothing_of_the_platform(
    session_platform: Platform,
    pw: Any,  # noqa: F811
    chromium: Any,
    other_user: User,
) -> None:
    # Given: alice's desktop, running on a worker of its own.
    session, _ = created(pw, "--type", "desktop", "sessions", "--environment", "compute")
    sid, worker = session["id"], session["worker"]
    port = session_platform.port
    platform = f"http://{PLATFORM_HOST}:{port}"

    # When: she opens it from its page on the platform.
    page = logged_in_page(chromium, platform, "alice")
    page.goto(f"{platform}/sessions/{sid}/")
    href = page.get_attribute("#open-session", "href", timeout=60_000)
    page.goto(platform + str(href))
    showing(page, session_platform, "origin-1-desktop")
    shot(page, "origin-1-desktop")

    # Then: it is on a host of its own, the handoff's token gone from the address.
    own_host = f"{sid}.{SESSION_DOMAIN}"
    address = urlsplit(page.url)
    assert (address.hostname, address.port) == (own_host, port)
    assert address.path == f"/s/{sid}/" and "token=" not in page.url
    # Its cookie is for that host alone and out of scripts' reach; the platform's stay its own.
    jar = {c["name"]: c for c in page.context.cookies()}
    assert jar["activate_session"]["domain"] == own_host
    assert jar["activate_session"]["httpOnly"] is True
    assert jar["sessionid"]["domain"] == PLATFORM_HOST

    # When: script in the session's page tries the platform (its browser sending the platform's
    # cookies along: one site).
    wire = Wire(page)
    own_origin = f"http://{own_host}:{port}"
    terminal = f"/ws/workers/{worker}/terminal/"
    platform_terminal = platform.replace("http://", "ws://") + terminal
    seen = page.evaluate(
        PROBE,
        {
            "platform": platform,
            "terminals": [platform_terminal, f"ws://{own_host}:{port}{terminal}"],
        },
    )
    print(f"what the session's page got: {seen}")
    print(f"what went over the wire: { {url: wire.of(url) for url in wire.urls.values()} }")
    # Then: no cookie of the platform's (nor the session's own) is readable,
    assert "sessionid" not in seen["cookie"] and "csrftoken" not in seen["cookie"]
    assert "activate_session" not in seen["cookie"]
    # the platform, handed alice's login, refuses its API to her session's page (and the
    # session's host has no API),
    [(cookies, status)] = wire.of(platform + "/api/workers/")
    assert "sessionid=" in cookies and status == 403, (cookies, status)
    api = seen["api"]
    assert "error" in api or not 200 <= api["status"] < 300, api
    assert seen["apiHere"].get("status") == 404, seen["apiHere"]
    assert wire.of(own_origin + "/api/workers/")[0][1] == 404
    # and no terminal: the platform's knows her by her cookie and refuses her page's origin
    # (4403, not 4401) before a shell starts; the session's host has none (handshake refused).
    for socket_seen, code in zip(seen["terminals"], (4403, 1006), strict=True):
        started = [m for m in socket_seen["messages"] if "started" in m or m == "binary"]
        assert not started, socket_seen
        assert socket_seen["code"] == code, socket_seen

    # Someone else, logged in to the platform, gets nothing of it either way.
    other_user.set_password(PASSWORD)
    other_user.save()
    bob = logged_in_page(chromium, platform, other_user.username)
    assert bob.goto(platform + str(href)).status == 404
    assert bob.goto(f"{own_origin}/s/{sid}/").status == 404

    # What the way through the platform costs: the first opening in a browser takes the handoff
    # (four redirects), later ones a redirect; against the session's own address.
    def median_load(url: str, *, forget: bool = False) -> float:
        took = []
        for _ in range(10):
            if forget:
                page.context.clear_cookies(domain=own_host)
            started = time.monotonic()
            assert page.goto(url).status == 200
            took.append(time.monotonic() - started)
        return sorted(took)[5]

    first = median_load(f"{platform}/s/{sid}/vnc.html", forget=True)
    later = median_load(f"{platform}/s/{sid}/vnc.html")
    direct = median_load(f"{own_origin}/s/{sid}/vnc.html")
    print(
        f"vnc.html (medians of 10): {first * 1000:.0f} ms opened first through the platform "
        f"(the handoff), {later * 1000:.0f} ms opened again, {direct * 1000:.0f} ms on its own "
        "origin"
    )
    pw("sessions", "stop", sid)
