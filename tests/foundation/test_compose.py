"""docker/: the production image, and the compose file's two hosts behind Debian's HAProxy.

No Docker engine runs here, so the files are checked for what they say, and the proxy's own
config runs under the haproxy binary (`scripts/services.sh` installs it) in front of two small
local servers, its addresses only rewritten.
"""

from __future__ import annotations

import http.client
import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.urls import resolve

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
ROLES = ("web", "agents", "worker", "sweeper", "beat", "relays")
HOSTS = ("a", "b")
# Each frontend: the port it publishes and the role of the servers behind it.
FRONTENDS = {"web": 8000, "agents": 8001}
CHECK_PATHS = {"web": ("/health/", "activate.urls"), "agents": ("/agent/v1/ping", None)}

# One host's web and agents' server stand-in: answers every GET with its name and the proxy
# headers it got, and a WebSocket upgrade with 101, then echoes bytes prefixed with its name.
BACKEND = """
import base64, hashlib, json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NAME = sys.argv[1]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.headers.get("Upgrade", "").lower() == "websocket":
            self.send_response(101)
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            key = self.headers["Sec-WebSocket-Key"] + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
            accept = base64.b64encode(hashlib.sha1(key.encode()).digest()).decode()
            self.send_header("Sec-WebSocket-Accept", accept)
            self.end_headers()
            while True:
                data = self.connection.recv(4096)
                if not data:
                    break
                self.connection.sendall(NAME.encode() + b":" + data)
            self.close_connection = True
            return
        body = json.dumps({
            "server": NAME,
            "path": self.path,
            "forwarded_for": self.headers.get_all("X-Forwarded-For") or [],
            "forwarded_proto": self.headers.get("X-Forwarded-Proto"),
        }).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    return loaded


def services_of_role(role: str) -> list[str]:
    return sorted(
        name for name, svc in compose()["services"].items() if svc.get("command") == [role]
    )


def haproxy_sections(text: str) -> dict[str, list[str]]:
    """'backend web' -> its lines, comments and blank lines left out."""
    sections: dict[str, list[str]] = {}
    current: list[str] = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        if not line[0].isspace():
            current = sections.setdefault(line.strip(), [])
        else:
            current.append(line.strip())
    return sections


def haproxy_binary() -> str:
    found = shutil.which("haproxy", path="/usr/sbin:/usr/bin:/sbin:/bin")
    if found is None:
        pytest.fail("haproxy is not installed (scripts/services.sh installs Debian's package)")
    return found


def haproxy_check(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [haproxy_binary(), "-c", "-f", str(config)], capture_output=True, text=True, timeout=30
    )


def config_on_loopback(text: str, *, frontends: dict[int, int], servers: dict[str, int]) -> str:
    """The proxy's config with only its addresses changed: each frontend on a loopback port,
    each server at a local port."""
    for published, port in frontends.items():
        text, found = re.subn(
            rf"^(\s*bind ):{published}$", rf"\g<1>127.0.0.1:{port}", text, flags=re.M
        )
        assert found == 1, f"no frontend binds :{published}"
    for name, port in servers.items():
        text, found = re.subn(
            rf"^(\s*server {re.escape(name)}) \S+:\d+", rf"\1 127.0.0.1:{port}", text, flags=re.M
        )
        assert found == 1, f"no server {name}"
    return text


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_docker_files_reference_what_exists() -> None:
    start = (REPO / "scripts" / "start.sh").read_text()
    for role in ROLES:
        assert f"  {role})" in start
    dockerfiles = {
        svc["build"]["dockerfile"] for svc in compose()["services"].values() if "build" in svc
    }
    assert dockerfiles == {"docker/Dockerfile", "docker/proxy.Dockerfile"}
    for dockerfile in dockerfiles:
        for line in (REPO / dockerfile).read_text().splitlines():
            if line.startswith("COPY "):
                for source in line.split()[1:-1]:
                    assert (REPO / source).exists(), (dockerfile, source)


def test_the_compose_file_ships_secure_cookies_and_no_plain_http_agent_traffic() -> None:
    environment = compose()["x-activate"]["environment"]
    # ${NAME:-default} gives the default; ${NAME:?message} makes the operator set it.
    assert environment["ACTIVATE_SECURE_COOKIES"] == "${ACTIVATE_SECURE_COOKIES:-true}"
    assert environment["ACTIVATE_AGENT_URL"].startswith("${ACTIVATE_AGENT_URL:?")
    assert environment["ACTIVATE_AGENT_PLAIN_HTTP"] == "${ACTIVATE_AGENT_PLAIN_HTTP:-false}"
    assert "DJANGO_SETTINGS_MODULE=activate.settings.prod" in (DOCKER / "Dockerfile").read_text()


@pytest.mark.parametrize("host", HOSTS)
def test_each_host_runs_every_role_with_its_own_metrics_and_pid_namespace(host: str) -> None:
    services = {
        name: svc for name, svc in compose()["services"].items() if name.endswith(f"-{host}")
    }
    assert sorted(svc["command"] for svc in services.values()) == sorted([r] for r in ROLES)
    web = f"web-{host}"
    for name, svc in services.items():
        # /metrics of this host's web server adds up these files and tells ended pids apart.
        assert svc["volumes"] == [f"metrics-{host}:/metrics"], name
        assert svc.get("pid") == (None if name == web else f"service:{web}"), name
        assert svc["environment"]["PROMETHEUS_MULTIPROC_DIR"] == "/metrics"
    # Migrated once before either web server starts: two at once would race.
    assert services[web]["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}
    migrate = compose()["services"]["migrate"]
    assert migrate["entrypoint"] == ["python", "manage.py", "migrate", "--noinput"]


def test_only_the_proxy_publishes_ports_and_relayed_calls_go_through_it() -> None:
    services = compose()["services"]
    published = {name: svc["ports"] for name, svc in services.items() if "ports" in svc}
    assert published == {"proxy": [f"{port}:{port}" for port in FRONTENDS.values()]}
    assert services["proxy"]["build"]["dockerfile"] == "docker/proxy.Dockerfile"
    environment = compose()["x-activate"]["environment"]
    assert environment["ACTIVATE_RELAY_UPSTREAM"] == "${ACTIVATE_RELAY_UPSTREAM:-proxy:8001}"
    assert len(services_of_role("web")) == len(services_of_role("agents")) == len(HOSTS)


def test_the_proxy_is_debians_haproxy_with_the_config_of_this_folder() -> None:
    dockerfile = (DOCKER / "proxy.Dockerfile").read_text()
    assert re.search(r"^FROM debian:bookworm-slim$", dockerfile, flags=re.M)
    assert "apt-get install -y --no-install-recommends haproxy" in dockerfile
    assert "COPY docker/haproxy.cfg /etc/haproxy/haproxy.cfg" in dockerfile


@pytest.mark.parametrize("role", FRONTENDS)
def test_the_proxy_balances_every_server_of_the_compose_file_with_health_checks(
    role: str,
) -> None:
    sections = haproxy_sections((DOCKER / "haproxy.cfg").read_text())
    port = FRONTENDS[role]
    assert f"bind :{port}" in sections[f"frontend {role}"]
    assert f"default_backend {role}" in sections[f"frontend {role}"]
    backend = sections[f"backend {role}"]
    servers = [line.split() for line in backend if line.startswith("server ")]
    assert {name: address for _, name, address in servers} == {
        name: f"{name}:{port}" for name in services_of_role(role)
    }
    path, urlconf = CHECK_PATHS[role]
    assert "option httpchk" in backend
    check = next(line for line in backend if line.startswith("http-check send "))
    assert f" uri {path} " in check
    # The path is one the server serves, and the Host it names is one the servers accept.
    resolve(path, urlconf=urlconf or "activate.agent_server_urls")
    host = re.search(r"hdr Host (\S+)", check)
    assert host is not None
    allowed = compose()["x-activate"]["environment"]["ACTIVATE_ALLOWED_HOSTS"]
    assert host[1] in allowed.removesuffix("}").split(":-", 1)[1].split(",")
    defaults = sections["defaults"]
    assert any(line.startswith("default-server ") and " check " in line for line in defaults)
    assert "option redispatch 1" in defaults
    assert "option forwardfor" in defaults


def test_haproxy_accepts_the_config_before_its_servers_resolve() -> None:
    checked = haproxy_check(DOCKER / "haproxy.cfg")
    assert checked.returncode == 0, checked.stderr


@pytest.mark.parametrize(
    "breakage",
    [
        ("resolvers docker\n", "resolvers elsewhere\n"),
        ("balance leastconn", "balance fewestconn"),
        ("timeout tunnel 1h", "timeout tunnel forever"),
    ],
)
def test_haproxy_refuses_a_broken_copy_of_the_config(
    tmp_path: Path, breakage: tuple[str, str]
) -> None:
    text = (DOCKER / "haproxy.cfg").read_text()
    assert breakage[0] in text
    broken = tmp_path / "haproxy.cfg"
    broken.write_text(text.replace(*breakage))
    assert haproxy_check(broken).returncode != 0


def start_backend(script: Path, name: str) -> tuple[subprocess.Popen[str], int]:
    process = subprocess.Popen(
        [sys.executable, str(script), name],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    return process, int(process.stdout.readline())


def wait_until_listening(port: int, deadline: float) -> None:
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def get(port: int, path: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path, headers=headers or {})
        response = connection.getresponse()
        body = response.read()
        assert response.status == 200, (response.status, body)
        loaded: dict[str, Any] = json.loads(body)
        return loaded
    finally:
        connection.close()


@pytest.fixture
def proxy_on_loopback(tmp_path: Path) -> Iterator[tuple[dict[str, int], dict[str, Any]]]:
    """haproxy as the image runs it, with the config of docker/ rewritten only for addresses,
    in front of hosts a and b: (frontend ports by role, backend processes by host)."""
    script = tmp_path / "backend.py"
    script.write_text(BACKEND)
    processes: list[subprocess.Popen[Any]] = []
    try:
        backends = {}
        for host in HOSTS:
            process, port = start_backend(script, host)
            processes.append(process)
            backends[host] = (process, port)
        frontends = {role: free_port() for role in FRONTENDS}
        config = tmp_path / "haproxy.cfg"
        config.write_text(
            config_on_loopback(
                (DOCKER / "haproxy.cfg").read_text(),
                frontends={FRONTENDS[role]: port for role, port in frontends.items()},
                servers={
                    name: backends[name.rsplit("-", 1)[1]][1]
                    for role in FRONTENDS
                    for name in services_of_role(role)
                },
            )
        )
        entrypoint = re.search(
            r"^ENTRYPOINT (.+)$", (DOCKER / "proxy.Dockerfile").read_text(), flags=re.M
        )
        assert entrypoint is not None
        argv = [
            str(config) if arg == "/etc/haproxy/haproxy.cfg" else arg
            for arg in json.loads(entrypoint[1])
        ]
        argv[0] = haproxy_binary()
        log = (tmp_path / "haproxy.log").open("w")
        processes.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 5
        for port in frontends.values():
            wait_until_listening(port, deadline)
        yield frontends, {host: process for host, (process, _) in backends.items()}
    finally:
        for process in reversed(processes):
            process.kill()
            process.wait()


@pytest.mark.timeout(30)
def test_haproxy_balances_both_hosts_and_keeps_serving_when_one_dies(
    proxy_on_loopback: tuple[dict[str, int], dict[str, Any]],
) -> None:
    frontends, backends = proxy_on_loopback
    # Given both hosts up: each frontend shares requests between them.
    for role, port in frontends.items():
        served = Counter(get(port, f"/{role}/{n}")["server"] for n in range(8))
        assert sorted(served) == ["a", "b"] and min(served.values()) >= 3, (role, served)
    # When host b dies, and before any health check could notice:
    backends["b"].send_signal(signal.SIGKILL)
    backends["b"].wait()
    started = time.monotonic()
    # Then every request still succeeds, redispatched to host a.
    for role, port in frontends.items():
        served = Counter(get(port, f"/{role}/{n}")["server"] for n in range(8))
        assert served == {"a": 8}, (role, served)
    assert time.monotonic() - started < 5


def test_haproxy_says_who_called_and_passes_the_scheme_on(
    proxy_on_loopback: tuple[dict[str, int], dict[str, Any]],
) -> None:
    frontends, _ = proxy_on_loopback
    for port in frontends.values():
        plain = get(port, "/")
        assert plain["forwarded_for"] == ["127.0.0.1"]
        assert plain["forwarded_proto"] == "http"
        # From the TLS proxy in front: its scheme stays, and the chain grows by one.
        behind_tls = get(
            port, "/", headers={"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.7"}
        )
        assert behind_tls["forwarded_for"] == ["203.0.113.7", "127.0.0.1"]
        assert behind_tls["forwarded_proto"] == "https"


def test_websockets_pass_through_the_web_frontend(
    proxy_on_loopback: tuple[dict[str, int], dict[str, Any]],
) -> None:
    frontends, _ = proxy_on_loopback
    with socket.create_connection(("127.0.0.1", frontends["web"]), timeout=5) as sock:
        sock.sendall(
            b"GET /ws/terminals/1/ HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\n"
            b"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(4096)
            assert chunk, head
            head += chunk
        assert head.startswith(b"HTTP/1.1 101 "), head
        for message in (b"first", b"second"):
            sock.sendall(message)
            echoed = sock.recv(4096)
            assert echoed in (b"a:" + message, b"b:" + message)
