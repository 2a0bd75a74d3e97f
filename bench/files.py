"""Files: a 1 GiB upload and download through the platform (the web server's streaming
endpoints, SFTP on its kept SSH connection to the test cluster's sshd over loopback) against
OpenSSH's own `sftp` and `scp` to the same sshd as the same account, in the same run; and how
much the web process's peak resident memory grew while it streamed.

Each method moves the same random file up, then down again, and the copy that comes back is
compared with the original. The web server is `scripts/start.sh web` with one process, so one
event loop carries each transfer.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

from bench.report import Goal, Outcome, Table, times
from harness import HarnessError
from harness.cluster import KNOWN_HOSTS, SshTarget
from harness.objects import CLUSTER_NAME, run_id, run_user, start_afresh
from harness.platform import NO_RECONCILE, Platform

NAME = "files"
PIECE = 16 * 1024 * 1024
GOAL_RATIO = 0.8
MiB = 1024 * 1024


@dataclass
class Transfer:
    method: str
    up_seconds: float
    down_seconds: float
    growth: int | None = None  # bytes of the web process's peak over its resident memory before


def _random_file(path: Path, size: int) -> str:
    digest = hashlib.sha256()
    with path.open("wb") as out:
        for _ in range(size // PIECE):
            piece = os.urandom(PIECE)
            digest.update(piece)
            out.write(piece)
    return digest.hexdigest()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while piece := handle.read(PIECE):
            digest.update(piece)
    return digest.hexdigest()


def _options(target: SshTarget) -> list[str]:
    options = {
        "UserKnownHostsFile": str(KNOWN_HOSTS),
        "GlobalKnownHostsFile": "/dev/null",
        "StrictHostKeyChecking": "yes",
        "BatchMode": "yes",
        "IdentitiesOnly": "yes",
        "LogLevel": "ERROR",
    }
    argv = ["-i", target.key_path]
    for name, value in options.items():
        argv += ["-o", f"{name}={value}"]
    return argv


def _timed(argv: list[str], stdin: str | None = None) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=900)
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise HarnessError(f"{argv[0]} failed: {done.stderr.strip()}")
    return took


def _sftp(target: SshTarget, local: Path, remote: str, back: Path) -> Transfer:
    argv = ["sftp", "-q", "-b", "-", "-P", str(target.port), *_options(target)]
    argv.append(f"{target.user}@{target.host}")
    up = _timed(argv, f"put {local} {remote}\n")
    down = _timed(argv, f"get {remote} {back}\n")
    return Transfer("OpenSSH sftp", up, down)


def _scp(target: SshTarget, local: Path, remote: str, back: Path) -> Transfer:
    argv = ["scp", "-q", "-P", str(target.port), *_options(target)]
    there = f"{target.user}@{target.host}:{remote}"
    up = _timed([*argv, str(local), there])
    down = _timed([*argv, there, str(back)])
    return Transfer("OpenSSH scp", up, down)


def _memory(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name == field:
            return int(value.split()[0]) * 1024
    return 0


def _reset_peak(pid: int) -> int:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak (VmHWM) counts anew
    return _memory(pid, "VmRSS")


def _platform(platform: Platform, key: str, local: Path, remote: str, back: Path) -> Transfer:
    """curl, as a browser would be, a native client: not a Python one competing with the
    server for the machine's two cores. The key is read from a 0600 file, never a command line."""
    pids = [platform.processes["web"].pid, *platform.child_pids("web")]
    pid = max(pids, key=lambda p: _memory(p, "VmRSS"))
    headers = local.with_name("headers.txt")
    headers.touch(mode=0o600)
    headers.write_text(f"Authorization: Bearer {key}\n")
    query = urlencode({"path": remote})
    curl = ["curl", "-sS", "--fail-with-body", "-H", f"@{headers}"]
    before = _reset_peak(pid)
    up = _timed(
        [
            *curl,
            "-H",
            "Content-Type: application/octet-stream",
            "-T",
            str(local),
            "-o",
            "/dev/null",
            f"{platform.url}/files/{CLUSTER_NAME}/upload?{query}",
        ]
    )
    growth = _memory(pid, "VmHWM") - before
    before = _reset_peak(pid)
    down = _timed([*curl, "-o", str(back), f"{platform.url}/files/{CLUSTER_NAME}/download?{query}"])
    growth = max(growth, _memory(pid, "VmHWM") - before)
    headers.unlink()
    return Transfer("platform (HTTP + SFTP)", up, down, growth)


def run(target: SshTarget, *, size_mib: int = 1024) -> Outcome:
    from workers_app.models import ApiKey

    start_afresh(target)  # the cluster, shared: every method acts as its one account
    owner = run_user()
    _, key = ApiKey.issue(owner, name="bench-files")
    workdir = Path(tempfile.mkdtemp(prefix="bench-files-"))
    folder = f"bench-files-{run_id()}"
    size = size_mib * MiB
    platform = Platform(workdir=workdir / "platform", knobs=dict(NO_RECONCILE), web_as_shipped=True)
    (workdir / "platform").mkdir()
    results: list[Transfer] = []
    try:
        local = workdir / "payload.bin"
        original = _random_file(local, size)
        subprocess.run(target.ssh_argv("mkdir", "-p", folder), check=True, timeout=60)
        platform.start_web(workers=1)
        runs = [
            lambda back: _platform(platform, key, local, f"~/{folder}/platform.bin", back),
            lambda back: _sftp(target, local, f"{folder}/sftp.bin", back),
            lambda back: _scp(target, local, f"{folder}/scp.bin", back),
        ]
        for method in runs:
            back = workdir / "back.bin"
            result = method(back)
            if _sha256(back) != original:
                raise HarnessError(f"{result.method}: the file came back different")
            back.unlink()
            results.append(result)
            print(
                f"  files: {result.method}: up {size / result.up_seconds / 1e6:.0f} MB/s, "
                f"down {size / result.down_seconds / 1e6:.0f} MB/s",
                flush=True,
            )
    finally:
        platform.stop_all()
        subprocess.run(target.ssh_argv("rm", "-rf", folder), check=False, timeout=120)
        shutil.rmtree(workdir, ignore_errors=True)
        ApiKey.objects.filter(user=owner).delete()
    return _outcome(results, size)


def _outcome(results: list[Transfer], size: int) -> Outcome:
    table = Table(
        f"Files: {size // MiB} MiB up and down over loopback SSH",
        ["method", "upload", "download", "platform / this (up / down)", "web memory growth"],
        align="lrrrr",
    )
    ours = results[0]
    for result in results:
        table.add(
            result.method,
            f"{size / result.up_seconds / 1e6:.0f} MB/s",
            f"{size / result.down_seconds / 1e6:.0f} MB/s",
            f"{times(result.up_seconds / ours.up_seconds)} / "
            f"{times(result.down_seconds / ours.down_seconds)}",
            f"+{result.growth / MiB:.1f} MiB" if result.growth is not None else "-",
        )
    table.notes += [
        "platform: curl's PUT /files/<cluster>/upload and GET /files/<cluster>/download with "
        "an API key, through scripts/start.sh web (one process), SFTP over the platform's kept "
        "SSH connection (paramiko); sftp and scp: OpenSSH 9's, a new connection each (scp "
        "speaks SFTP too).",
        "platform / this: the platform's rate over the method's (the goal: 0.8x or more).",
        "web memory growth: the web process's peak resident memory (VmHWM, reset before each "
        "transfer) over its resident memory before it, the larger of up and down.",
        "machine: 2 cores of a shared VM, sshd and the client on the same cores.",
    ]
    goals = []
    for other in results[1:]:
        up = other.up_seconds / ours.up_seconds
        down = other.down_seconds / ours.down_seconds
        goals.append(
            Goal(
                NAME,
                f"upload and download at least {GOAL_RATIO}x {other.method}'s throughput",
                f"{up:.2f}x up, {down:.2f}x down",
                up >= GOAL_RATIO and down >= GOAL_RATIO,
            )
        )
    if ours.growth is not None:
        goals.append(
            Goal(
                NAME,
                "web memory growth under 64 MiB while streaming",
                f"+{ours.growth / MiB:.1f} MiB",
                ours.growth < 64 * MiB,
            )
        )
    return Outcome(tables=[table], goals=goals)
