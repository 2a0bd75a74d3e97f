#!/usr/bin/env python3
"""ACTIVATE node agent: tells the platform this node is up, then heartbeats until told to stop.

Standard library only, Python 3.6+, so it runs on whatever Python 3 a compute node has.
Configuration comes from the environment the job script sets:
ACTIVATE_URL, ACTIVATE_WORKER_ID, ACTIVATE_WORKER_SECRET, ACTIVATE_HEARTBEAT_INTERVAL, and
ACTIVATE_JOB_ID (the job's id, copied by the script from wherever its scheduler puts it).
Exit codes: 0 the platform ended the worker (or SIGTERM), 3 the secret was refused.
"""

import http.client
import json
import os
import signal
import socket
import sys
import time
import urllib.error
import urllib.request

GONE, FORBIDDEN, NOT_YET = 410, 403, 409


class Refused(Exception):
    def __init__(self, status: int) -> None:
        super().__init__("HTTP %d" % status)
        self.status = status


def log(message: str) -> None:
    sys.stderr.write("[activate-agent %s] %s\n" % (time.strftime("%H:%M:%S"), message))
    sys.stderr.flush()


def post(url: str, secret: str, payload: dict, timeout: float) -> dict:
    body = json.dumps(payload).encode()
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": "Bearer " + secret},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read().decode() or "{}")
    except urllib.error.HTTPError as exc:
        raise Refused(exc.code) from None


def main() -> int:
    base = os.environ["ACTIVATE_URL"].rstrip("/")
    worker = os.environ["ACTIVATE_WORKER_ID"]
    secret = os.environ["ACTIVATE_WORKER_SECRET"]
    interval = float(os.environ.get("ACTIVATE_HEARTBEAT_INTERVAL", "30"))
    timeout = max(2.0, min(10.0, interval))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    hostname = socket.gethostname()
    identity = {
        "worker": worker,
        "hostname": hostname,
        "job_id": os.environ.get("ACTIVATE_JOB_ID", ""),
    }
    connected = False
    # Short blips are retried quickly; a long outage is retried at the heartbeat interval.
    retry_delay = min(2.0, interval)
    while True:
        try:
            if not connected:
                answer = post(base + "/agent/v1/connect", secret, identity, timeout)
                interval = float(answer.get("heartbeat_interval", interval))
                connected = True
                log("connected as %s on %s" % (worker, hostname))
            else:
                post(base + "/agent/v1/heartbeat", secret, {"worker": worker}, timeout)
            retry_delay = min(2.0, interval)
            time.sleep(interval)
        except Refused as exc:
            if exc.status == GONE:
                log("the platform ended this worker; exiting")
                return 0
            if exc.status == FORBIDDEN:
                log("the platform refused this worker's secret; exiting")
                return 3
            if exc.status == NOT_YET:
                connected = False
            else:
                log("server answered %s; retrying" % exc)
            time.sleep(retry_delay)
        except (OSError, ValueError, http.client.HTTPException) as exc:
            # HTTPException: an answer cut off on the way (a proxy or relay that lost its link).
            log("cannot reach %s (%s); retrying" % (base, exc))
            time.sleep(retry_delay)
            retry_delay = min(retry_delay * 2, interval)


if __name__ == "__main__":
    sys.exit(main())
