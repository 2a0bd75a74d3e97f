"""The platform's side of a session launcher's gate (``node/activate_session.py``).

Before any byte of a request flows, the node's end must prove it holds the session's key, and
the platform proves it too; each proof covers both sides' fresh nonces and the route, so
nothing either side sends is of use for another connection. Whoever else answers on the
session's port (a neighbour who bound it once the launcher was gone) gets the route's name and
a proof bound to its own nonce, and is sent nothing more.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import re

from core.transport.channels import Channel
from core.transport.errors import SSHError

GREETING = re.compile(rb"^ACTIVATE-GATE 1 (?P<nonce>[0-9a-f]{32})\n$")
ANSWER = re.compile(rb"^OK (?P<proof>[0-9a-f]{64})\n$")
LINE_MAX = 512
WITHIN = 10.0


class GateRefused(SSHError):
    """What answered on the session's port is not its launcher (or did not prove it)."""


def key(secret: str) -> bytes:
    return hmac.new(secret.encode(), b"activate-gate", hashlib.sha256).digest()


def _proof(gate_key: bytes, side: str, gate_nonce: str, client_nonce: str, route: str) -> str:
    message = "\n".join((side, gate_nonce, client_nonce, route)).encode()
    return hmac.new(gate_key, message, hashlib.sha256).hexdigest()


class Handshake:
    """One connection's exchange, fed the lines the far end sends."""

    def __init__(self, secret: str, route: str) -> None:
        self.key = key(secret)
        self.route = route
        self.nonce = os.urandom(16).hex()
        self.gate_nonce = ""

    def reply(self, greeting: bytes) -> bytes:
        match = GREETING.match(greeting)
        if match is None:
            raise GateRefused("the session's port did not answer as its launcher")
        self.gate_nonce = match["nonce"].decode()
        proof = _proof(self.key, "client", self.gate_nonce, self.nonce, self.route)
        return f"{self.route} {self.nonce} {proof}\n".encode()

    def check(self, answer: bytes) -> None:
        match = ANSWER.match(answer)
        expected = _proof(self.key, "gate", self.gate_nonce, self.nonce, self.route)
        if match is None or not hmac.compare_digest(match["proof"].decode(), expected):
            raise GateRefused("the session's port is not its launcher's (its proof was wrong)")


async def open_async(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, secret: str, route: str
) -> None:
    handshake = Handshake(secret, route)
    try:
        async with asyncio.timeout(WITHIN):
            writer.write(handshake.reply(await reader.readuntil(b"\n")))
            await writer.drain()
            handshake.check(await reader.readuntil(b"\n"))
    except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
        message = f"the session's port did not complete the gate's handshake: {exc!r}"
        raise GateRefused(message) from exc


def open_blocking(channel: Channel, secret: str, route: str) -> None:
    handshake = Handshake(secret, route)
    channel.settimeout(WITHIN)
    channel.sendall(handshake.reply(_read_line(channel)))
    handshake.check(_read_line(channel))


def _read_line(channel: Channel) -> bytes:
    # One byte at a time: nothing after the line is the handshake's to take.
    line = b""
    while not line.endswith(b"\n"):
        byte = channel.recv(1)
        if not byte or len(line) >= LINE_MAX:
            raise GateRefused("the session's port closed during the gate's handshake")
        line += byte
    return line
