"""The metric families processes record as things happen.

Each is one prometheus_client object, made at import. With PROMETHEUS_MULTIPROC_DIR set (as
scripts/start.sh sets it) every process writes its values to a file of its own there and the
web server's /metrics adds them up; without it they stay in the process (tests, a shell).
Recording is a counter increment or an observation: no database or Redis call, so it may sit on
the heartbeat path and in the session proxy's byte loops.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from prometheus_client import Counter, Gauge, Histogram

# A process must not fail on its first increment because the directory is not there yet.
if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    os.makedirs(os.environ["PROMETHEUS_MULTIPROC_DIR"], mode=0o700, exist_ok=True)

# Seconds from a request to its agent's call: a free node answers within a minute, a busy
# queue within hours.
CONNECT_BUCKETS = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)
POLL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 60)
COMMAND_BUCKETS = (0, 1, 2, 3, 5, 10, 20, 50, 100)
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60)

SUBMISSIONS = Counter(
    "activate_submissions",
    "Workers' submission attempts by outcome: submitted, adopted (an earlier attempt's job "
    "found), waiting (the cluster did not answer; retried), refused, account_refused, "
    "ended_meanwhile (the worker ended before its job was recorded)",
    ["cluster", "outcome"],
)
CANCELS = Counter(
    "activate_cancels",
    "Attempts to cancel a worker's job by outcome: cancelled, still_listed, not_confirmed "
    "(the cluster did not answer), refused, unreachable, no_job",
    ["cluster", "outcome"],
)
REQUEST_TO_CONNECTED = Histogram(
    "activate_request_to_connected_seconds",
    "From a worker's request to its agent's first call (connected)",
    ["cluster"],
    buckets=CONNECT_BUCKETS,
)
POLL_CYCLE = Histogram(
    "activate_poll_cycle_seconds",
    "One poll of a cluster: a status query per account with live jobs, and what follows",
    ["cluster"],
    buckets=POLL_BUCKETS,
)
POLL_COMMANDS = Histogram(
    "activate_poll_commands",
    "SSH commands one poll of a cluster ran",
    ["cluster"],
    buckets=COMMAND_BUCKETS,
)
HEARTBEATS_RECEIVED = Counter(
    "activate_heartbeats_received", "Agents' heartbeats answered, accepted or refused"
)
HEARTBEATS_REFUSED = Counter(
    "activate_heartbeats_refused",
    "Agents' heartbeats refused, by the status answered (401 unsigned or replayed, 403 not "
    "this worker's key, 410 the worker ended, 503 Redis did not answer, ...)",
    ["status"],
)
SSH_CONNECTIONS = Gauge(
    "activate_ssh_connections",
    "SSH connections held for commands (polls, submissions, cancels), by cluster",
    ["cluster"],
    multiprocess_mode="livesum",
)
SSH_CHANNEL_WAITS = Histogram(
    "activate_ssh_channel_wait_seconds",
    "Commands that found every channel of their SSH connection taken, and how long they waited",
    ["cluster"],
    buckets=WAIT_BUCKETS,
)
TERMINALS_OPEN = Gauge(
    "activate_terminals_open",
    "Terminals open on workers' nodes (browser and pw ssh)",
    multiprocess_mode="livesum",
)

_ssh_clusters: set[str] = set()


def heartbeat_answered(status: int) -> None:
    HEARTBEATS_RECEIVED.inc()
    if status != 200:
        HEARTBEATS_REFUSED.labels(str(status)).inc()


def ssh_connections_held(by_cluster: Mapping[str, int]) -> None:
    """This process's command connections now; a cluster it held some for before shows 0."""
    for cluster in _ssh_clusters - by_cluster.keys():
        SSH_CONNECTIONS.labels(cluster).set(0)
    for cluster, count in by_cluster.items():
        SSH_CONNECTIONS.labels(cluster).set(count)
    _ssh_clusters.update(by_cluster)
