"""A TCP relay between the platform and the test cluster's sshd that a test can make slow and
cut: sshd's bytes held back a while (the platform has sent a command and not yet read its
answer), then every connection dropped with what was held."""

from __future__ import annotations

import queue
import socket
import threading
import time
from contextlib import suppress

CHUNK = 65536


class _Pair:
    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.cut = False
        # sshd's bytes for the client, each with when it may go.
        self.answers: queue.Queue[tuple[float, bytes]] = queue.Queue()

    def close(self) -> None:
        self.cut = True
        for sock in (self.client, self.server):
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self.answers.put((0.0, b""))


class SshRelay:
    """Listens on 127.0.0.1:``port`` and relays each connection to ``target_port``."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._held = 0.0
        self._pairs: list[_Pair] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, name="ssh-relay", daemon=True).start()

    def hold(self, seconds: float) -> None:
        """sshd's bytes from now on reach the platform ``seconds`` late (0: at once)."""
        self._held = seconds

    def cut(self) -> int:
        """Drop every connection, and what sshd said on them that the platform has not had yet;
        returns how many were dropped."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            pair.close()
        return len(pairs)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self.cut()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port), timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            pair = _Pair(client, server)
            with self._lock:
                self._pairs.append(pair)
            for target in (self._requests, self._answers, self._deliver):
                threading.Thread(target=target, args=(pair,), daemon=True).start()

    def _requests(self, pair: _Pair) -> None:
        """The platform's bytes, to sshd at once."""
        with suppress(OSError):
            while data := pair.client.recv(CHUNK):
                pair.server.sendall(data)
        pair.close()

    def _answers(self, pair: _Pair) -> None:
        with suppress(OSError):
            while data := pair.server.recv(CHUNK):
                pair.answers.put((time.monotonic() + self._held, data))
        pair.answers.put((0.0, b""))

    def _deliver(self, pair: _Pair) -> None:
        """sshd's bytes, to the platform once due (in order), unless cut meanwhile."""
        while True:
            due, data = pair.answers.get()
            time.sleep(max(0.0, due - time.monotonic()))
            if pair.cut or not data:
                break
            try:
                pair.client.sendall(data)
            except OSError:
                break
        pair.close()
