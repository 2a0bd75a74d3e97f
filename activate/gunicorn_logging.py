"""Gunicorn's access log without a line per successful agent heartbeat.

At thousands of beats a second those lines would be most of the log and a measurable share of
the server's CPU; failed beats are still logged.
"""

from __future__ import annotations

from typing import Any

from gunicorn.glogging import Logger

HEARTBEAT_PATH = "/agent/v1/heartbeat"


class QuietHeartbeatLogger(Logger):
    def access(self, resp: Any, req: Any, environ: dict[str, Any], request_time: Any) -> None:
        if environ.get("PATH_INFO") == HEARTBEAT_PATH and resp.status_code == 200:
            return
        super().access(resp, req, environ, request_time)
