"""Worker statuses as the platform's API names them; a test checks them against its schema."""

from __future__ import annotations

# Requested; not yet accepted by the scheduler.
PENDING = "pending"
# The scheduler accepted the job; it waits for a node.
QUEUED = "queued"
# The job runs on a node whose agent has not called back yet.
STARTING = "starting"
# The agent called back and keeps heartbeating: the node is usable.
CONNECTED = "connected"
# Deletion was asked for; the scheduler has yet to confirm the job gone.
STOPPING = "stopping"
# The job ended or was canceled.
STOPPED = "stopped"
# The job failed, timed out, or lost contact; the reason says which.
ERROR = "error"

STATUSES = (PENDING, QUEUED, STARTING, CONNECTED, STOPPING, STOPPED, ERROR)
FINISHED = frozenset({STOPPED, ERROR})
ON_A_NODE = frozenset({STARTING, CONNECTED})
