"""The heartbeat's shortcuts: past the middleware stack, and out of the access log."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from gunicorn.config import Config

from activate.gunicorn_logging import QuietHeartbeatLogger
from workers_app.agents.middleware import AgentHeartbeatFastPath


def logged_paths(entries: list[tuple[str, int]]) -> list[str]:
    config = Config()
    config.set("accesslog", "-")
    logger = QuietHeartbeatLogger(config)
    seen: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    logger.access_log.addHandler(Capture())
    for path, status in entries:
        response = SimpleNamespace(status=f"{status} X", status_code=status, sent=0, headers=[])
        request = SimpleNamespace(method="POST", path=path, query="", version=(1, 1), headers=[])
        environ = {
            "PATH_INFO": path,
            "RAW_URI": path,
            "REQUEST_METHOD": "POST",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "REMOTE_ADDR": "127.0.0.1",
        }
        logger.access(response, request, environ, SimpleNamespace(seconds=0, microseconds=1))
    return seen


def test_successful_heartbeats_leave_no_access_log_line_and_failures_do() -> None:
    lines = logged_paths(
        [("/agent/v1/heartbeat", 200), ("/agent/v1/heartbeat", 403), ("/api/workers/", 200)]
    )
    assert len(lines) == 2
    assert "403" in lines[0] and "/api/workers/" in lines[1]


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
