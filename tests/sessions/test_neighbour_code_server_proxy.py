"""code-server's own port proxy is off: its /proxy/<port>/ and /absproxy/<port>/ routes would
serve whatever listens on the node's loopback, a neighbour's server included, on the owner's
session origin with her login (a neighbour's page there acts as her in VS Code). The neighbour
is the test cluster's second account (pwbob), an ordinary Unix user. Real Slurm over real SSH."""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User

from harness.cluster import SshTarget
from harness.platform import Platform
from tests.sessions.test_jupyter_neighbour import NODE_PYTHON
from tests.sessions.test_sessions_e2e import (  # noqa: F401 - fixtures, found by pytest here
    alice,
    created,
    environment,
    pw,
    session_platform,
    session_state,
    session_tools,
    shared_session_platform,
)
from workers_app.models import ApiKey

pytestmark = [pytest.mark.slurm, pytest.mark.live]
BOBS_PAGE = "<html><body>bob's page, served on your origin</body></html>"
# The neighbour's web server on a free port of the node's loopback, its page at every path (the
# absproxy route passes its own path on); it prints the port.
SERVE = f"""
import http.server

class Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = {BOBS_PAGE!r}.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

server = http.server.HTTPServer(("127.0.0.1", 0), Page)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def test_the_owners_vs_code_does_not_serve_a_neighbours_loopback_server_on_her_origin(
    session_platform: Platform,  # noqa: F811
    pw: Any,  # noqa: F811
    alice: User,  # noqa: F811
    ssh_target: SshTarget,
) -> None:
    _, neighbour = sorted(ssh_target.accounts)[:2]
    # Given: alice's VS Code on the node, and the neighbour's web server on the node's loopback.
    session, _ = created(pw, "--type", "vscode", "sessions", "--environment", "compute")
    server = subprocess.Popen(
        ["runuser", "-u", neighbour, "--", NODE_PYTHON, "-c", textwrap.dedent(SERVE)],
        stdout=subprocess.PIPE,
        text=True,
        cwd="/",
        start_new_session=True,  # runuser's child is killed with it, as a group
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        assert httpx.get(f"http://127.0.0.1:{port}/").text == BOBS_PAGE  # it serves
        _, key = ApiKey.issue(alice)
        with httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=30) as client:
            # When: her session is asked (through the platform, as her) for code-server's
            # proxy routes to that port.
            answers = {
                route: client.get(f"{session['url']}{route}/{port}/")
                for route in ("proxy", "absproxy")
            }
            shown = {route: (a.status_code, a.text[:120]) for route, a in answers.items()}
            print(f"her session's proxy routes to the neighbour's port {port}: {shown}")
            # Then: code-server refuses them: the neighbour's page is not on her origin.
            assert all(answer.status_code in (403, 404) for answer in answers.values()), shown
            assert all("bob's page" not in answer.text for answer in answers.values()), shown
            # And: her VS Code still opens.
            page = client.get(session["url"], follow_redirects=True)
            assert page.status_code == 200 and "code-server" in page.text.lower(), page.text[:300]
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    pw("sessions", "stop", session["id"])
