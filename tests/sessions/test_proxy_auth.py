"""Who the session proxy lets through when the browser's page adds its own credentials."""

from __future__ import annotations

from typing import Any

import pytest

from sessions_app.statuses import SessionStatus
from tests.sessions.test_session_origins import (
    credential_cookie,
    handed_over,
    host_of,
    origin_of,
    take,
)
from tests.sessions.test_session_rules import connected_worker, proxied, session_on

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_programs_own_authorization_header_leaves_the_owners_browser_session_in_force(
    user: Any,
) -> None:
    # JupyterLab sends its server's token as "Authorization: token ..." from the owner's page,
    # on the session's own host.
    session = session_on(connected_worker(user), status=SessionStatus.PENDING)
    _, _, set_cookies = take(handed_over(user, session.public_id))
    headers = [(b"cookie", credential_cookie(set_cookies)), (b"host", host_of(session.public_id))]
    page = proxied(
        f"/s/{session.public_id}/api/me", [*headers, (b"authorization", b"token x")], "http"
    )
    assert (page["status"], dict(page["headers"]).get(b"retry-after")) == (503, b"2")
    # Without it, a browser is sent on to the session's host (which sends it to log in).
    anonymous = proxied(f"/s/{session.public_id}/api/me", [(b"host", b"testserver")], "http")
    assert anonymous["status"] == 302
    there = dict(anonymous["headers"])[b"location"]
    assert there == f"{origin_of(session.public_id)}/s/{session.public_id}/api/me".encode()
