"""Interactive commands (a terminal's shell, a program the user runs): input in, output out as
it comes, on a channel of their own, with a pty of a given size or separate stdout and stderr."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import paramiko

from core.transport.errors import SSHError

READ_CHUNK = 65536


@dataclass(frozen=True)
class PtySize:
    cols: int
    rows: int
    term: str = "xterm-256color"


STDOUT = 1
STDERR = 2
# Input waiting to be sent past this is refused: a paste into a program that stopped reading.
MAX_PENDING_INPUT = 4 * 1024 * 1024


class Stream:
    """One interactive command: input in, output out as it comes, then its exit status.

    A reader thread hands each chunk to ``on_output(stream_id, data)`` (which may block: that
    is the back-pressure into the SSH window) and then calls ``on_end(exit_status)``. Input is
    queued and sent by a writer thread, so a caller on an event loop never blocks.
    """

    def __init__(self, channel: paramiko.Channel, *, merged: bool, on_close: Callable[[], None]):
        self._channel = channel
        self._merged = merged
        self._on_close = on_close
        self._closed = False
        self._close_lock = threading.Lock()
        self._input: list[bytes | None] = []
        self._input_bytes = 0
        self._input_ready = threading.Condition()

    def start(
        self, on_output: Callable[[int, bytes], None], on_end: Callable[[int | None], None]
    ) -> None:
        threading.Thread(
            target=self._read, args=(on_output, on_end), name="stream-reader", daemon=True
        ).start()
        threading.Thread(target=self._write, name="stream-writer", daemon=True).start()

    def write(self, data: bytes) -> None:
        with self._input_ready:
            if self._input_bytes + len(data) > MAX_PENDING_INPUT:
                raise SSHError("the command is not reading its input")
            self._input.append(data)
            self._input_bytes += len(data)
            self._input_ready.notify()

    def end_input(self) -> None:
        with self._input_ready:
            self._input.append(None)
            self._input_ready.notify()

    def resize(self, cols: int, rows: int) -> None:
        try:
            self._channel.resize_pty(width=cols, height=rows)
        except (OSError, EOFError, paramiko.SSHException):
            pass  # the command is ending; its exit tells the client

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        with self._input_ready:
            self._input.append(None)
            self._input_ready.notify()
        self._channel.close()
        self._on_close()

    def _write(self) -> None:
        while True:
            with self._input_ready:
                while not self._input:
                    self._input_ready.wait()
                data = self._input.pop(0)
                if data is not None:
                    self._input_bytes -= len(data)
            try:
                if data is None:
                    if not self._closed:
                        self._channel.shutdown_write()
                    return
                self._channel.sendall(data)
            except (OSError, EOFError, paramiko.SSHException):
                return

    def _read(
        self, on_output: Callable[[int, bytes], None], on_end: Callable[[int | None], None]
    ) -> None:
        # Blocking reads, a thread per stream: an open terminal costs no wake-ups while idle.
        channel = self._channel
        channel.settimeout(None)
        stderr = None
        if not self._merged:
            stderr = threading.Thread(
                target=self._pump,
                args=(channel.recv_stderr, STDERR, on_output),
                name="stream-stderr",
                daemon=True,
            )
            stderr.start()
        self._pump(channel.recv, STDOUT, on_output)
        if stderr is not None:
            stderr.join()
        # A channel closed from our side never gets a status: don't wait for one forever.
        status = channel.exit_status if channel.status_event.wait(10) else None
        on_end(None if status == -1 else status)

    @staticmethod
    def _pump(
        recv: Callable[[int], bytes], stream_id: int, on_output: Callable[[int, bytes], None]
    ) -> None:
        try:
            while data := recv(READ_CHUNK):
                on_output(stream_id, data)
        except (OSError, EOFError, paramiko.SSHException):
            return


def start_stream(
    channel: paramiko.Channel, command: str, *, pty: PtySize | None, host: str
) -> None:
    """Start ``command`` on ``channel``, with a terminal of ``pty``'s size if one is given; the
    channel is closed again if the server refuses."""
    try:
        if pty is not None:
            channel.get_pty(term=pty.term, width=pty.cols, height=pty.rows)
        channel.exec_command(command)
    except (OSError, EOFError, paramiko.SSHException) as exc:
        channel.close()
        raise SSHError(f"cannot start {command[:80]!r} on {host}: {exc}") from exc
