"""The heartbeat's shortcut on the web server: past the middleware stack."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from agents.middleware import AgentHeartbeatFastPath


@pytest.mark.django_db
def test_only_the_heartbeat_skips_the_middleware_stack(rf: pytest.FixtureRequest) -> None:
    passed_on: list[str] = []

    def rest_of_stack(request: object) -> object:
        passed_on.append(request.path_info)  # type: ignore[attr-defined]
        return SimpleNamespace(status_code=299)

    middleware = AgentHeartbeatFastPath(rest_of_stack)  # type: ignore[arg-type]
    beat = middleware(rf.post("/agent/v1/heartbeat", data="{}", content_type="application/json"))
    assert beat.status_code == 401  # answered by the heartbeat view itself: not signed
    assert beat["Content-Length"] == str(len(beat.content))
    other = middleware(rf.get("/api/workers/"))
    assert other.status_code == 299
    assert passed_on == ["/api/workers/"]
