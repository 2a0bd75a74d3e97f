"""`make demo`: a first run that works. A local single-node Slurm, the platform on the embedded
defaults (as `make run`), the local cluster registered and shared, and a demo user to log in as.

Brings up the test cluster (scripts/testcluster.sh up; needs root), migrates, registers
the cluster with add_cluster (its partition becomes an environment), marks it shared so the demo
user needs no cluster account of their own, creates the user, then serves through scripts/run.py
and prints where to log in. Running it again changes nothing that is already there.

`make demo` with ACTIVATE_DEMO_AGENTS=via-login-host (or `scripts/demo.py --via-login-host`)
registers the cluster with agents going via its login host: a relay there passes their calls
back over the platform's SSH connection, as for a platform behind a NAT or on a laptop.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

# scripts/run.py, beside this file (sys.path[0] when run as a script).
from run import set_password

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "data"
CLUSTER = REPO / ".cluster"
PASSWORD_FILE = DATA / "demo-password.txt"
CLUSTER_NAME = "local-slurm"
DEMO_USER = "demo"


def manage(*args: str) -> None:
    subprocess.run([sys.executable, "manage.py", *args], cwd=REPO, check=True)


def cluster_env() -> dict[str, str]:
    values = {}
    for line in (CLUSTER / "cluster.env").read_text().splitlines():
        name, sep, value = line.partition("=")
        if sep and not line.lstrip().startswith("#"):
            values[name.strip()] = value.strip()
    return values


def demo_password() -> str:
    DATA.mkdir(exist_ok=True)
    if not PASSWORD_FILE.exists():
        # 0600 from its first moment: data/ may be open to others before make run closes it.
        created = os.open(PASSWORD_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(created, "w") as out:
            out.write(secrets.token_urlsafe(12) + "\n")
    return PASSWORD_FILE.read_text().strip()


def register_cluster(*, via_login_host: bool) -> None:
    env = cluster_env()
    host_key = (CLUSTER / "known_host").read_text().strip() or env["ACTIVATE_TEST_SSH_HOST_KEY"]
    # known_host may name the host first ("[127.0.0.1]:2222 ssh-ed25519 AAAA..."): keep the key.
    host_key = " ".join(host_key.split()[-2:])
    manage(
        "add_cluster",
        CLUSTER_NAME,
        "--host",
        env["ACTIVATE_TEST_SSH_HOST"],
        "--port",
        env["ACTIVATE_TEST_SSH_PORT"],
        "--user",
        env["ACTIVATE_TEST_SSH_USER"],
        "--key-file",
        env.get("ACTIVATE_TEST_SSH_KEY", str(CLUSTER / "id_ed25519")),
        "--scheduler",
        "slurm",
        "--host-key",
        host_key,
        # Every user acts as the cluster's own account: the demo user needs none of their own.
        "--shared",
        *(
            # The login host is this machine, and so is the compute node: it reaches 127.0.0.1.
            ["--agent-route", "via_login_host", "--relay-host", "127.0.0.1"]
            if via_login_host
            else []
        ),
    )


def ensure_demo_user(password: str) -> None:
    """As make run's operator account: the password on manage.py's stdin, not its command line."""
    set_password(DEMO_USER, password, operator=False)


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health/", timeout=2) as response:  # noqa: S310 - our own URL
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def main() -> int:
    if os.geteuid() != 0:
        print("make demo needs root: it installs and starts a local Slurm", file=sys.stderr)
        return 1
    subprocess.run(["bash", "scripts/testcluster.sh", "up"], cwd=REPO, check=True)
    subprocess.run(["bash", "scripts/services.sh", "redis"], cwd=REPO, check=True)
    manage("migrate", "--noinput")
    via_login_host = "--via-login-host" in sys.argv[1:] or os.environ.get(
        "ACTIVATE_DEMO_AGENTS", "direct"
    ) in {"via-login-host", "via_login_host"}
    register_cluster(via_login_host=via_login_host)
    password = demo_password()
    ensure_demo_user(password)

    url = os.environ.get("ACTIVATE_PUBLIC_URL", "http://127.0.0.1:8000")
    server = subprocess.Popen([sys.executable, "scripts/run.py"], cwd=REPO)
    deadline = time.monotonic() + 120
    while server.poll() is None and not answers(url) and time.monotonic() < deadline:
        time.sleep(0.5)
    if server.poll() is None:
        print(
            f"\nThe demo is up: log in at {url}/login/  user: {DEMO_USER}  password: {password}\n"
            f"  Run -> Workers -> Create, pick {CLUSTER_NAME} / its partition, Request worker;\n"
            "  the worker goes pending, queued, connected within a minute.\n"
            + (
                "  Agents call back through the relay on the login host (admin: Clusters).\n"
                if via_login_host
                else ""
            )
            + "  Ctrl-C stops everything.\n",
            flush=True,
        )
    # Ctrl-C reaches run.py too (same process group); it stops its processes and returns.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return server.wait()


if __name__ == "__main__":
    sys.exit(main())
