"""What other apps may react to; workers_app sends these and imports none of the receivers."""

from __future__ import annotations

from django.dispatch import Signal

# A worker reached stopped or error. Arguments: worker (the Worker), failed (bool).
worker_finished = Signal()
# A worker's agent connected: its node is ready. Sent inside the changing transaction. Argument:
# worker.
worker_connected = Signal()
# A user deleted a worker; sent inside the deleting transaction. Argument: worker.
worker_deleted = Signal()
# A worker's agent saw programs of sessions on its node end (their launchers are gone).
# Arguments: worker (the Worker whose agent said so), session_ids (public ids, as the agent sent).
agent_sessions_ended = Signal()
# An idle worker or session will be ended at ends_at unless its owner keeps it. Sent inside the
# warning's transaction. Arguments: worker, session (a Session on it, or None), ends_at.
idle_warning = Signal()
# That warning no longer holds (busy again, kept, policy changed). Arguments: worker, session.
idle_warning_cleared = Signal()
