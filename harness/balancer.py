"""HAProxy (Debian's package) in front of several hosts' web and agents' servers on loopback,
run on docker/haproxy.cfg itself: its timeouts, health checks (every 5 s, down after two
failures), retries and redispatch, with only the addresses changed (loopback ports for its
binds and servers, no Compose DNS) and a stats socket added, from which a drill learns when a
host started again is back in rotation (two passed checks, up to ten seconds). A client may pin
its connection to one host with the X-Activate-Host header (drills: a terminal on the host
about to be lost); HAProxy ignores the pin while that host is down."""

from __future__ import annotations

import csv
import shutil
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from harness import REPO, HarnessError
from harness.platform import free_port
from harness.waiting import wait_until

PIN_HEADER = "X-Activate-Host"
SHIPPED = REPO / "docker" / "haproxy.cfg"
# What only Compose has: its DNS for the servers' names.
COMPOSE_ONLY = ("resolvers docker", "init-addr libc,none")


@dataclass
class Backend:
    name: str
    web_port: int
    agents_port: int
    host: str = "127.0.0.1"


@dataclass
class Balancer:
    workdir: Path
    backends: list[Backend]
    web_port: int = field(default_factory=free_port)
    agents_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    @property
    def agents_url(self) -> str:
        return f"http://127.0.0.1:{self.agents_port}"

    def config(self) -> str:
        """docker/haproxy.cfg with this balancer's ports and backends, and the pins."""
        ports = {"web": self.web_port, "agents": self.agents_port}
        lines: list[str] = []
        section: list[str] = []

        def end_section() -> None:
            if section and section[0] == "backend":
                port_of = "web_port" if section[1] == "web" else "agents_port"
                lines.extend(
                    f"    server {b.name} {b.host}:{getattr(b, port_of)}" for b in self.backends
                )

        for raw in SHIPPED.read_text().splitlines():
            line = raw.split("#", 1)[0].rstrip()
            if not line:
                continue
            if not line[0].isspace():
                end_section()
                section = line.split()
                if section[0] != "resolvers":
                    lines.append(line)
                if section == ["global"]:
                    lines.append(f"    stats socket {self.stats_socket} mode 600 level user")
                if section == ["backend", "web"]:
                    lines.extend(
                        f"    use-server {b.name} if {{ req.hdr({PIN_HEADER}) -m str {b.name} }}"
                        for b in self.backends
                    )
                continue
            words = line.split()
            if section[0] == "resolvers" or words[0] == "server":
                continue
            if words[0] == "bind":
                line = f"    bind 127.0.0.1:{ports[section[1]]}"
            for part in COMPOSE_ONLY:
                line = line.replace(" " + part, "")
            lines.append(line)
        end_section()
        return "\n".join([*lines, ""])

    @property
    def stats_socket(self) -> Path:
        return self.workdir / "haproxy.sock"

    def servers(self) -> dict[tuple[str, str], str]:
        """Each (backend, server)'s status as HAProxy's checks see it: UP, DOWN, "UP 1/2"..."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stats:
            stats.settimeout(5)
            stats.connect(str(self.stats_socket))
            stats.sendall(b"show stat\n")
            chunks = []
            while chunk := stats.recv(65536):
                chunks.append(chunk)
        rows = csv.DictReader(b"".join(chunks).decode().lstrip("# ").splitlines())
        return {
            (row["pxname"], row["svname"]): row["status"]
            for row in rows
            if row["svname"] not in ("FRONTEND", "BACKEND")
        }

    def wait_all_up(self, timeout: float = 30) -> None:
        """Until every server of every backend passed its checks (a pin to a host HAProxy still
        holds down goes to another host)."""
        if not wait_until(lambda: set(self.servers().values()) == {"UP"}, timeout=timeout):
            raise HarnessError(f"HAProxy holds servers down: {self.servers()}")

    def start(self) -> None:
        haproxy = shutil.which("haproxy")
        if haproxy is None:
            raise HarnessError("haproxy is missing: scripts/services.sh installs it")
        path = self.workdir / "haproxy.cfg"
        path.write_text(self.config())
        checked = subprocess.run(
            [haproxy, "-c", "-q", "-f", str(path)], capture_output=True, text=True, check=False
        )
        if checked.returncode != 0:
            raise HarnessError(f"haproxy refused its config: {checked.stderr or checked.stdout}")
        with (self.workdir / "haproxy.log").open("ab") as log:
            self.process = subprocess.Popen(
                [haproxy, "-db", "-f", str(path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        if not wait_until(self._answers, timeout=20):
            raise HarnessError("haproxy did not answer")

    def _answers(self) -> bool:
        try:
            httpx.get(f"{self.url}/health/", timeout=2)
            return True
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
        self.process = None
