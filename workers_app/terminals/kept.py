"""Terminals kept on the node: tmux sessions that outlive the connection that opened them.

The job starts one tmux server of its own when the job starts (``SERVER_START``, in the job's
script), so its sessions' shells belong to the job, not to the step of the terminal that opened
them: a scheduler that ends a step with everything it started (cgroups) leaves them running.
A kept terminal's step only attaches a tmux client to a session of that server
(``KEPT_TERMINAL``); without tmux on the node it is an ordinary login shell, and says so.
"""

from __future__ import annotations

import re

KEEP_NAME = re.compile(r"[A-Za-z0-9_-]{1,32}")

# In the job's script, with ACTIVATE_WORKER_ID set, before the agent replaces the script's shell
# (so $$ is the agent's pid). The keeper session ends the server, and every kept terminal, once
# the agent is gone: a scheduler that tracks a job's processes by parentage would miss a
# daemonised tmux. The agent's key is not passed on to the kept terminals' shells.
SERVER_START = (
    "command -v tmux >/dev/null 2>&1 && env -u ACTIVATE_AGENT_KEY -u ACTIVATE_AGENT_KEY_ID "
    'tmux -L "activate-$ACTIVATE_WORKER_ID" new-session -d -s activate-keep '
    '"while kill -0 $$ 2>/dev/null; do sleep 5; done; '
    'tmux -L activate-$ACTIVATE_WORKER_ID kill-server" >/dev/null 2>&1 || true'
)

# sh -c KEPT_TERMINAL activate-terminal NAME WORKER_ID [here]: with "here", a kept terminal
# that already runs gets a window of its own in the folder the step runs in.
KEPT_TERMINAL = (
    "if command -v tmux >/dev/null 2>&1; then "
    'if [ -n "$3" ] && tmux -L "activate-$2" has-session -t "=$1" 2>/dev/null; then '
    'tmux -L "activate-$2" new-window -t "=$1:" -c "$PWD"; fi; '
    'exec tmux -L "activate-$2" new-session -A -s "$1"; '
    "fi; "
    'echo "activate: no tmux on this node: this terminal ends with its connection" >&2; '
    'exec "${SHELL:-/bin/sh}" -l'
)
