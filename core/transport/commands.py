"""One-shot commands: run one on an open channel, its input sent and closed, its output read
to the end or to a limit, and its exit status as a ``CommandResult``."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import paramiko

from core.transport.errors import CommandTimeout, SSHError

READ_CHUNK = 65536
# How often a blocked stdout read wakes up to drain stderr (so neither stream stalls the other).
POLL_INTERVAL = 0.2


@dataclass(frozen=True)
class CommandResult:
    exit_status: int  # -1 when the output was cut short before the command ended
    stdout: str
    stderr: str
    # The output passed the caller's limit: what came so far, and the command was left.
    truncated: bool = False


def execute(
    channel: paramiko.Channel,
    command: str,
    *,
    host: str,
    stdin: str | None,
    deadline: float,
    output_limit: int | None,
    started: Callable[[], None],
) -> CommandResult:
    """Run ``command`` (a line for the remote shell) on ``channel``; ``started`` is called once
    the server accepted it. CommandTimeout past ``deadline`` (a monotonic time), SSHError when
    the connection to ``host`` breaks."""
    try:
        channel.settimeout(max(0.001, deadline - time.monotonic()))
        channel.exec_command(command)
        started()
        if stdin:
            _send_stdin(channel, stdin)
        channel.shutdown_write()
        stdout, stderr = _read_all(channel, deadline, output_limit)
    except TimeoutError:
        raise CommandTimeout(f"{command[:80]!r} did not finish in time") from None
    except (OSError, EOFError, paramiko.SSHException) as exc:
        raise SSHError(f"connection to {host} broke during a command: {exc}") from exc
    if output_limit is not None and len(stdout) + len(stderr) > output_limit:
        return CommandResult(
            exit_status=-1,
            stdout=stdout[:output_limit].decode(errors="replace"),
            stderr=stderr[: max(0, output_limit - len(stdout))].decode(errors="replace"),
            truncated=True,
        )
    transport = channel.get_transport()
    if not channel.status_event.wait(max(0.0, deadline - time.monotonic())):
        raise CommandTimeout(f"{command[:80]!r} sent no exit status in time")
    status = channel.exit_status
    if status == -1 and not transport.is_active():
        raise SSHError(f"connection to {host} broke before {command[:80]!r} finished")
    return CommandResult(
        exit_status=status,
        stdout=stdout.decode(errors="replace"),
        stderr=stderr.decode(errors="replace"),
    )


def _send_stdin(channel: paramiko.Channel, stdin: str) -> None:
    try:
        channel.sendall(stdin.encode())
    except TimeoutError:
        raise
    except OSError:
        # The command closed its end without reading everything (e.g. it failed early);
        # its exit status and stderr say why, so read them instead of failing here.
        transport = channel.get_transport()
        if not transport.is_active():
            raise


def _read_all(
    channel: paramiko.Channel, deadline: float, output_limit: int | None = None
) -> tuple[bytes, bytes]:
    # Both streams share one flow-control window: reading only stdout while the command
    # fills stderr would stall it forever, so stderr is drained on every wake-up.
    stdout = bytearray()
    stderr = bytearray()
    limit = float("inf") if output_limit is None else output_limit
    while True:
        if len(stdout) + len(stderr) > limit:
            return bytes(stdout), bytes(stderr)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        channel.settimeout(min(remaining, POLL_INTERVAL))
        try:
            data = channel.recv(READ_CHUNK)
        except TimeoutError:
            data = None
        while channel.recv_stderr_ready():
            stderr += channel.recv_stderr(READ_CHUNK)
        if data is None:
            continue
        if not data:
            break
        stdout += data
    while len(stdout) + len(stderr) <= limit:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        channel.settimeout(remaining)
        data = channel.recv_stderr(READ_CHUNK)
        if not data:
            break
        stderr += data
    return bytes(stdout), bytes(stderr)
