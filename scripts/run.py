"""`make run`: the whole platform on the embedded defaults, in one terminal.

Migrates, makes sure an operator account exists, then runs the web server, the agents' server,
a Celery worker, the sweeper (a Celery worker for the sweeps alone), Celery beat and the relays'
keeper (run_relays) through scripts/start.sh.
Ctrl-C (or any one process dying) stops all of it. Safe by default: DEBUG stays off unless
ACTIVATE_DEBUG says otherwise, and an unset ACTIVATE_SECRET_KEY is made once at random and kept
in data/secret-key.txt (mode 0600; the settings make it, so manage.py commands share it).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

from core.env import KEY_FILE_NAME, ConfigurationError, EnvReader, private_directory

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / EnvReader().string("ACTIVATE_DATA_DIR", "data")
PASSWORD_FILE = DATA / "admin-password.txt"
# What `make run` starts, each through scripts/start.sh.
ROLES = ("web", "agents", "worker", "sweeper", "beat", "relays")


# Reads what to set from stdin: a command line is every local user's to read
# (/proc/<pid>/cmdline), a process's stdin is its owner's alone.
ACCOUNT_SCRIPT = """
import json, sys
from django.contrib.auth import get_user_model
asked = json.loads(sys.stdin.read())
User = get_user_model()
user = User.objects.filter(username=asked["username"]).first() or User(username=asked["username"])
if asked["operator"]:
    user.is_staff = user.is_superuser = True
user.set_password(asked["password"])
user.save()
"""


def set_password(username: str, password: str, *, operator: bool) -> None:
    """Creates or updates the account ``username`` (an operator if ``operator``) with
    ``password``, which goes to manage.py on stdin, never on its command line."""
    asked = {"username": username, "password": password, "operator": operator}
    subprocess.run(
        [sys.executable, "manage.py", "shell", "--verbosity", "0", "-c", ACCOUNT_SCRIPT],
        cwd=REPO,
        input=json.dumps(asked),
        text=True,
        check=True,
    )


def ensure_operator() -> str:
    private_directory(DATA)
    if not PASSWORD_FILE.exists():
        PASSWORD_FILE.write_text(secrets.token_urlsafe(12) + "\n")
        PASSWORD_FILE.chmod(0o600)
    password = PASSWORD_FILE.read_text().strip()
    set_password("admin", password, operator=True)
    return password


def agents_environment(env: dict[str, str]) -> dict[str, str]:
    """Point job scripts at the agents' own server: the public URL's host, the agents' port."""
    bind = env.setdefault("ACTIVATE_AGENT_BIND", "127.0.0.1:8001")
    public = urlsplit(env.get("ACTIVATE_PUBLIC_URL", "http://127.0.0.1:8000"))
    host, port = public.hostname or "127.0.0.1", bind.rpartition(":")[2]
    host = f"[{host}]" if ":" in host else host
    env.setdefault("ACTIVATE_AGENT_URL", f"{public.scheme}://{host}:{port}")
    return env


def fresh_metrics_directory(env: dict[str, str]) -> dict[str, str]:
    """Where this run's processes keep their metrics (start.sh's default unless set), emptied:
    counters start again from zero, and no gauge of an earlier run's process is added in."""
    metrics = Path(env.setdefault("PROMETHEUS_MULTIPROC_DIR", str(DATA / "metrics")))
    private_directory(metrics)
    for stale in metrics.glob("*.db"):
        stale.unlink()
    return env


def safety_summary(env: EnvReader) -> str:
    """What a look at the start-up lines should tell: debug pages, and whose key."""
    debug = "on (ACTIVATE_DEBUG)" if env.boolean("ACTIVATE_DEBUG", False) else "off"
    key = (
        "ACTIVATE_SECRET_KEY from the environment"
        if env.optional_string("ACTIVATE_SECRET_KEY")
        else f"{DATA / KEY_FILE_NAME} (made once for this installation, mode 0600)"
    )
    return f"  DEBUG: {debug}   secret key: {key}\n"


def main() -> int:
    try:
        summary = safety_summary(EnvReader())
    except ConfigurationError as exc:
        print(f"Configuration error: {exc}", file=sys.stderr)
        return 2
    subprocess.run(["bash", "scripts/services.sh", "redis"], cwd=REPO, check=True)
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=REPO, check=True)
    password = ensure_operator()
    env = fresh_metrics_directory(agents_environment(dict(os.environ)))
    processes = [
        subprocess.Popen(["bash", "scripts/start.sh", role], cwd=REPO, env=env) for role in ROLES
    ]
    url = env.get("ACTIVATE_PUBLIC_URL", "http://127.0.0.1:8000")
    print(
        f"\nACTIVATE is starting at {url}/\n"
        f"  operator login: {url}/admin/  user: admin  password: {password}\n"
        f"  health: {url}/health/   API docs: {url}/api/docs/\n"
        f"  agents call back on {env['ACTIVATE_AGENT_URL']}/agent/v1/\n"
        f"{summary}"
        "  Ctrl-C stops everything.\n",
        flush=True,
    )
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    while not stopping and all(p.poll() is None for p in processes):
        time.sleep(0.5)
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 15
    for process in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
    return 0 if stopping else 1


if __name__ == "__main__":
    sys.exit(main())
