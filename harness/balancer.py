"""HAProxy (Debian's package) in front of several hosts' web and agents' servers on loopback,
configured as docker/haproxy.cfg is: health-checked backends, a request that cannot reach its
server sent to another (redispatch), WebSockets tunnelled. A client may pin its connection to
one host with the X-Activate-Host header (drills: a terminal on the host about to be lost);
HAProxy ignores the pin while that host is down."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from harness import HarnessError
from harness.platform import free_port
from harness.waiting import wait_until

PIN_HEADER = "X-Activate-Host"
# Health checks every CHECK_MS, a server down after FALL failed ones: a dead host leaves the
# rotation within about a second; until then retries redispatch its requests.
CHECK_MS = 300
FALL = 2


@dataclass
class Backend:
    name: str
    web_port: int
    agents_port: int


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
        def servers(port_of: str, check_path: str) -> list[str]:
            lines = [
                f"  option httpchk\n  http-check send meth GET uri {check_path} ver HTTP/1.1 "
                "hdr Host 127.0.0.1\n  http-check expect status 200"
            ]
            for backend in self.backends:
                port = getattr(backend, port_of)
                lines.append(
                    f"  server {backend.name} 127.0.0.1:{port} check inter {CHECK_MS} "
                    f"fall {FALL} rise 2"
                )
            return lines

        pins = [
            f"  use-server {b.name} if {{ req.hdr({PIN_HEADER}) -m str {b.name} }}"
            for b in self.backends
        ]
        return "\n".join(
            [
                "global",
                "  maxconn 4096",
                "defaults",
                "  mode http",
                "  timeout connect 1s",
                "  timeout client 60s",
                "  timeout server 60s",
                "  timeout tunnel 1h",
                "  retries 3",
                "  option redispatch 1",
                "  option forwardfor",
                "frontend web",
                f"  bind 127.0.0.1:{self.web_port}",
                "  default_backend web",
                "frontend agents",
                f"  bind 127.0.0.1:{self.agents_port}",
                "  default_backend agents",
                "backend web",
                "  balance leastconn",
                *pins,
                *servers("web_port", "/health/"),
                "backend agents",
                "  balance roundrobin",
                *servers("agents_port", "/agent/v1/ping"),
                "",
            ]
        )

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
