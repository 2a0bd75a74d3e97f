"""A session on an origin of its own, end to end: opened in Debian's Chromium from the platform's
page at <id>.localhost (browsers resolve *.localhost to loopback), where script in the session's
page gets none of the platform's cookies, no readable answer from its API and no terminal. Real
Slurm over real SSH, the platform as real processes, its defaults (no session setting given)."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import User

from harness.platform import Platform
from tests.sessions.test_sessions_e2e import (  # noqa: F401 - fixtures, found by pytest here
    PASSWORD,
    alice,
    chromium,
    created,
    environment,
    logged_in_page,
    pw,
    session_platform,
    session_tools,
    shot,
    showing,
)

pytestmark = [pytest.mark.slurm, pytest.mark.live]

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


def test_a_session_opens_on_its_own_origin_where_its_page_gets_nothing_of_the_platform(
    session_platform: Platform,  # noqa: F811
    pw: Any,  # noqa: F811
    chromium: Any,  # noqa: F811
    other_user: User,
) -> None:
    # Given: alice's desktop, running on a worker of its own.
    session, _ = created(pw, "--type", "desktop", "sessions", "--environment", "compute")
    sid, worker = session["id"], session["worker"]
    platform = session_platform.url

    # When: she opens it from its page on the platform.
    page = logged_in_page(chromium, session_platform, "alice")
    page.goto(f"{platform}/sessions/{sid}/")
    href = page.get_attribute("#open-session", "href", timeout=60_000)
    page.goto(platform + str(href))
    showing(page, session_platform, "origin-1-desktop")
    shot(page, "origin-1-desktop")

    # Then: it is on a host of its own, the handoff's token gone from the address.
    address = urlsplit(page.url)
    assert (address.hostname, address.port) == (f"{sid}.localhost", session_platform.port)
    assert address.path == f"/s/{sid}/" and "token=" not in page.url
    # Its cookie is for that host alone and out of scripts' reach; the platform's stay its own.
    jar = {c["name"]: c for c in page.context.cookies()}
    assert jar["activate_session"]["domain"] == f"{sid}.localhost"
    assert jar["activate_session"]["httpOnly"] is True
    assert jar["sessionid"]["domain"] == "127.0.0.1"

    # When: script in the session's page tries the platform.
    own_host = f"{sid}.localhost:{session_platform.port}"
    terminal = f"/ws/workers/{worker}/terminal/"
    seen = page.evaluate(
        PROBE,
        {
            "platform": platform,
            "terminals": [
                platform.replace("http://", "ws://") + terminal,
                f"ws://{own_host}{terminal}",
            ],
        },
    )
    print(f"what the session's page got: {seen}")
    # Then: no cookie of the platform's (nor the session's own) is readable,
    assert "sessionid" not in seen["cookie"] and "csrftoken" not in seen["cookie"]
    assert "activate_session" not in seen["cookie"]
    # no readable 2xx from the API, on the platform's host or the session's,
    api = seen["api"]
    assert "error" in api or not 200 <= api["status"] < 300, api
    assert seen["apiHere"].get("status") == 404, seen["apiHere"]
    # and no terminal: each socket is refused before a shell starts.
    for socket_seen in seen["terminals"]:
        started = [m for m in socket_seen["messages"] if "started" in m or m == "binary"]
        assert not started, socket_seen
        assert socket_seen["code"] in (1006, 4401, 4403), socket_seen

    # Someone else, logged in to the platform, gets nothing of it either way.
    other_user.set_password(PASSWORD)
    other_user.save()
    bob = logged_in_page(chromium, session_platform, other_user.username)
    assert bob.goto(platform + str(href)).status == 404
    assert bob.goto(f"http://{own_host}/s/{sid}/").status == 404

    # What the way through the platform costs: the first opening in a browser takes the handoff
    # (four redirects), later ones a redirect; against the session's own address.
    def median_load(url: str, *, forget: bool = False) -> float:
        took = []
        for _ in range(10):
            if forget:
                page.context.clear_cookies(domain=f"{sid}.localhost")
            started = time.monotonic()
            assert page.goto(url).status == 200
            took.append(time.monotonic() - started)
        return sorted(took)[5]

    first = median_load(f"{platform}/s/{sid}/vnc.html", forget=True)
    later = median_load(f"{platform}/s/{sid}/vnc.html")
    direct = median_load(f"http://{own_host}/s/{sid}/vnc.html")
    print(
        f"vnc.html (medians of 10): {first * 1000:.0f} ms opened first through the platform "
        f"(the handoff), {later * 1000:.0f} ms opened again, {direct * 1000:.0f} ms on its own "
        "origin"
    )
    pw("sessions", "stop", sid)
