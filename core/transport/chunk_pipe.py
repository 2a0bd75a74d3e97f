"""A channel's incoming buffer that keeps what arrives as the chunks it came in.

paramiko's ``BufferedPipe`` appends every packet to one ``array`` and takes each read off its
front with ``del buf[:n]``, which moves everything still held: with a few hundred KiB of SFTP
answers in flight, reading a 4-byte packet length moved them all. This one holds the packets'
bytes in a deque and hands out whole chunks or slices of them; what a read leaves of a chunk
stays where it is (a memoryview). Same interface and locking as ``BufferedPipe``: the transport's
thread feeds, one reader reads.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from paramiko.buffered_pipe import PipeTimeout


class ChunkPipe:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._event: threading.Event | None = None
        self._chunks: deque[bytes | memoryview] = deque()
        self._size = 0
        self._closed = False

    def set_event(self, event: threading.Event) -> None:
        with self._lock:
            self._event = event
            if self._closed or self._size:
                event.set()
            else:
                event.clear()

    def feed(self, data: bytes | str) -> None:
        chunk = data.encode() if isinstance(data, str) else bytes(data)
        with self._lock:
            if self._event is not None:
                self._event.set()
            if chunk:
                self._chunks.append(chunk)
                self._size += len(chunk)
            self._cv.notify_all()

    def read_ready(self) -> bool:
        with self._lock:
            return self._size > 0

    def read(self, nbytes: int, timeout: float | None = None) -> bytes:
        """Up to ``nbytes`` of what is held, waiting for something first; b"" once closed and
        empty; PipeTimeout if nothing came within ``timeout`` seconds."""
        with self._lock:
            if not self._size:
                if self._closed:
                    return b""
                if timeout == 0.0:
                    raise PipeTimeout()
                deadline = None if timeout is None else time.monotonic() + timeout
                while not self._size and not self._closed:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise PipeTimeout()
                    self._cv.wait(left)
                if not self._size:
                    return b""
            out = self._take(nbytes)
            if not self._size and self._event is not None and not self._closed:
                self._event.clear()
            return out

    def _take(self, nbytes: int) -> bytes:
        chunks = self._chunks
        first = chunks[0]
        if len(first) >= nbytes:
            if len(first) == nbytes:
                chunks.popleft()
                out = first if type(first) is bytes else bytes(first)
            else:
                view = first if isinstance(first, memoryview) else memoryview(first)
                chunks[0] = view[nbytes:]
                out = bytes(view[:nbytes])
            self._size -= nbytes
            return out
        parts: list[bytes | memoryview] = []
        taken = 0
        while chunks and taken + len(chunks[0]) <= nbytes:
            chunk = chunks.popleft()
            parts.append(chunk)
            taken += len(chunk)
        if chunks and taken < nbytes:
            view = chunks[0] if isinstance(chunks[0], memoryview) else memoryview(chunks[0])
            parts.append(view[: nbytes - taken])
            chunks[0] = view[nbytes - taken :]
            taken = nbytes
        self._size -= taken
        return b"".join(parts)

    def empty(self) -> bytes:
        with self._lock:
            out = b"".join(self._chunks)
            self._chunks.clear()
            self._size = 0
            if self._event is not None and not self._closed:
                self._event.clear()
            return out

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._cv.notify_all()
            if self._event is not None:
                self._event.set()

    def __len__(self) -> int:
        with self._lock:
            return self._size


__all__ = ["ChunkPipe"]
