"""Holds terminals open in a process of its own, so their reading costs the measuring client
nothing: `python -m bench.terminal_holder WS_URL API_KEY COUNT`. Prints "ready" once every
terminal has started, reads them until stdin closes, then prints how many lines it read."""

from __future__ import annotations

import json
import sys
import threading

from websockets.sync.client import ClientConnection, connect

TICKER = ["sh", "-c", "while true; do date; sleep 1; done"]


def main(url: str, key: str, count: int) -> int:
    lines = [0]
    sockets: list[ClientConnection] = []
    start = {"type": "start", "command": TICKER, "pty": True, "cols": 100, "rows": 30}

    def drain(socket: ClientConnection) -> None:
        try:
            for message in socket:
                if isinstance(message, bytes):
                    lines[0] += message.count(b"\n")
        except Exception:  # closed at the end, however it ends
            return

    for _ in range(count):
        socket = connect(url, additional_headers={"Authorization": f"Bearer {key}"})
        socket.send(json.dumps(start))
        answer = json.loads(socket.recv(timeout=60))
        if answer.get("type") != "started":
            print(f"not started: {answer}", flush=True)
            return 1
        sockets.append(socket)
        threading.Thread(target=drain, args=(socket,), daemon=True).start()
    print("ready", flush=True)
    sys.stdin.read()
    for socket in sockets:
        socket.close()
    print(lines[0], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
