"""A real shell on the worker's node: `pw ssh` through the platform's WebSocket, a PTY inside
the job (Slurm's `srun --pty`, a task of the job on Grid Engine), on each real scheduler over
real SSH, as the owner's own Unix user."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import select
import subprocess
import time
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from harness.cells import Cell
from harness.cluster import SshTarget
from harness.platform import Platform
from harness.waiting import wait_for
from tests.e2e.conftest import PW, compute_environment, on_every_scheduler, pw_runner
from tests.e2e.test_accounts import connected
from tests.platforms import module_platform
from workers_app.models import ApiKey, TerminalRecord, Worker

pytestmark = [pytest.mark.slurm, pytest.mark.live]

# Idle seconds: long enough for a step to start on a busy node (srun says nothing meanwhile).
IDLE = 10
# How late past the idle limit a terminal may close: the consumer looks every second
# (terminals.consumer.WATCH_EVERY), and a loaded 2-core machine delays it a little.
CLOSE_LATE = 2.5
TERMINAL_KNOBS = {"ACTIVATE_TERMINALS_PER_USER": "3", "ACTIVATE_TERMINAL_IDLE_TIMEOUT": str(IDLE)}


shared_terminal_platform = module_platform(knobs=TERMINAL_KNOBS)


@pytest.fixture
def terminal_platform(transactional_db: None, shared_terminal_platform: Platform) -> Platform:
    return shared_terminal_platform


@pytest.fixture
def alice_worker(
    terminal_platform: Platform,
    make_cluster,
    ssh_target: SshTarget,
    cell: Cell,
    user: User,
    tmp_path: Path,
) -> Worker:
    cluster = make_cluster(name="terminals", shared=False, scheduler=cell.kind)
    compute_environment(cluster, cell)
    remote = sorted(ssh_target.accounts)[0]
    pw = pw_runner(terminal_platform, user, tmp_path / "alice")
    key_file = ssh_target.accounts[remote]
    connected_account = pw(
        "cluster", "connect", cluster.name, "--user", remote, "--key-file", key_file
    )
    assert connected_account.returncode == 0, connected_account.stderr
    created = pw("workers", "create", cluster.name, "--environment", "compute")
    assert created.returncode == 0, created.stderr
    return connected(Worker.objects.get(owner=user), terminal_platform)


def pw_env(platform: Platform, user: User, home: Path) -> dict[str, str]:
    _, key = ApiKey.issue(user)
    home.mkdir(parents=True, exist_ok=True)
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "TERM": "xterm",
        "PW_PLATFORM_HOST": platform.url,
        "PW_API_KEY": key,
    }


def read_until(fd: int, needle: bytes, timeout: float) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while needle not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"{needle!r} never came; got {seen[-2000:]!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    assert needle in seen, f"{needle!r} never came; pw ended after {seen[-2000:]!r}"
    return seen


@on_every_scheduler
def test_pw_ssh_opens_a_login_shell_in_a_pty_on_the_node_as_the_owner(
    terminal_platform: Platform,
    alice_worker: Worker,
    user: User,
    ssh_target: SshTarget,
    tmp_path: Path,
) -> None:
    env = pw_env(terminal_platform, user, tmp_path / "pty")
    pid, fd = pty.fork()
    if pid == 0:  # the child: pw, in a pseudo-terminal of its own as a user's would be
        os.execve(str(PW), [str(PW), "ssh", alice_worker.public_id], env)  # noqa: S606
    try:
        os.write(fd, b"echo ready-$((6*7))\n")
        read_until(fd, b"ready-42", timeout=60)
        os.write(fd, b"tty; id -un; hostname; echo done-$((6*7))\n")
        output = read_until(fd, b"done-42", timeout=30)
        # Left apart: a pty's last output may be lost to the reader once its child has gone.
        os.write(fd, b"exit 3\n")
    except AssertionError as exc:
        output = str(exc).encode()
    finally:
        _, wait_status = os.waitpid(pid, 0)
    text = output.decode(errors="replace")
    remote = sorted(ssh_target.accounts)[0]
    assert "/dev/pts/" in text, text
    assert remote in text.split(), text
    assert alice_worker.node_hostname in text, text
    assert os.waitstatus_to_exitcode(wait_status) == 3, text
    record = TerminalRecord.objects.get(worker_public_id=alice_worker.public_id)
    assert (record.user_id, record.pty, record.exit_status) == (user.pk, True, 3)
    assert record.closed_at is not None and record.command == []


@on_every_scheduler
def test_pw_ssh_streams_a_command_as_it_runs_and_exits_with_its_status(
    terminal_platform: Platform, alice_worker: Worker, user: User, tmp_path: Path
) -> None:
    env = pw_env(terminal_platform, user, tmp_path / "stream")
    script = "echo a; echo oops >&2; sleep 2; echo b; exit 7"
    started = time.monotonic()
    process = subprocess.Popen(
        [str(PW), "ssh", alice_worker.public_id, "--", "sh", "-c", script],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    first = process.stdout.readline()
    a_at = time.monotonic()
    rest = process.stdout.read()
    b_at = time.monotonic()
    assert process.wait(timeout=30) == 7
    assert (first, rest) == (b"a\n", b"b\n")
    # stderr is kept apart from stdout (srun adds its own line about the exit there).
    assert process.stderr.read().startswith(b"oops\n")
    # a came while the command still ran: b only ~2 s later.
    assert b_at - a_at > 1.5, (a_at - started, b_at - started)


def test_another_users_terminal_is_not_found_and_never_reaches_the_cluster(
    terminal_platform: Platform,
    alice_worker: Worker,
    other_user: User,
    tmp_path: Path,
) -> None:
    bob = pw_runner(terminal_platform, other_user, tmp_path / "bob")
    answer = bob("ssh", alice_worker.public_id, "--", "id", "-un")
    assert answer.returncode != 0 and "not found" in answer.stderr.lower(), answer.stderr
    env = pw_env(terminal_platform, other_user, tmp_path / "bob-ws")
    url = terminal_platform.url.replace("http", "ws") + (
        f"/ws/workers/{alice_worker.public_id}/terminal/"
    )
    with connect(url, additional_headers={"Authorization": f"Bearer {env['PW_API_KEY']}"}) as ws:
        refusal = json.loads(ws.recv(timeout=10))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
    assert refusal["code"] == 4404 and closed.value.rcvd is not None
    assert closed.value.rcvd.code == 4404
    # Nothing was opened or recorded for bob: the refusal came before any SSH.
    assert not TerminalRecord.objects.filter(user=other_user).exists()


def test_terminals_are_capped_per_user_and_closed_when_idle(
    terminal_platform: Platform, alice_worker: Worker, user: User, tmp_path: Path
) -> None:
    env = pw_env(terminal_platform, user, tmp_path / "cap")
    url = terminal_platform.url.replace("http", "ws") + (
        f"/ws/workers/{alice_worker.public_id}/terminal/"
    )
    headers = {"Authorization": f"Bearer {env['PW_API_KEY']}"}
    start = json.dumps({"type": "start", "command": [], "pty": True, "cols": 80, "rows": 24})
    with contextlib.ExitStack() as opened:
        sockets = [opened.enter_context(connect(url, additional_headers=headers)) for _ in range(4)]
        answers = []
        for ws in sockets:
            ws.send(start)
            answers.append(json.loads(ws.recv(timeout=30)))
        assert [a["type"] for a in answers[:3]] == ["started"] * 3
        assert answers[3]["code"] == 4429 and "at most 3" in answers[3]["message"]
        # Left without a byte after its last output, a terminal is closed at the idle limit
        # (README: ACTIVATE_TERMINAL_IDLE_TIMEOUT without a byte either way), and recorded.
        idle = sockets[2]
        idle.send(b"echo idle-$((6*7))\n")
        seen, last_byte = b"", time.monotonic()
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                message = idle.recv(timeout=30)
                if isinstance(message, bytes):
                    seen, last_byte = seen + message[1:], time.monotonic()
        quiet = time.monotonic() - last_byte
        assert b"idle-42" in seen, seen[-2000:]
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4408
        # Less than IDLE only by the last byte's way to us (it left the platform earlier).
        assert IDLE - 0.5 < quiet <= IDLE + CLOSE_LATE, quiet
        print(f"\nidle terminal closed {quiet:.2f} s after its last byte (limit {IDLE} s)")
        last = answers[2]["terminal"]
        wait_for(
            lambda: "without input or output" in TerminalRecord.objects.get(pk=last).close_reason,
            timeout=10,
        )
    assert TerminalRecord.objects.filter(user=user).count() == 3


def pw_ssh_keep(
    env: dict[str, str], worker: Worker, *lines: bytes, until: bytes, cwd: str = ""
) -> str:
    """`pw ssh --keep work` in a pty of its own: type ``lines``, read until ``until``, then drop
    the connection (pw killed, as a lost network or a closed laptop would)."""
    argv = [str(PW), "ssh", "--keep", "work", *(["--cwd", cwd] if cwd else []), worker.public_id]
    pid, fd = pty.fork()
    if pid == 0:
        os.execve(str(PW), argv, env)  # noqa: S606
    try:
        for line in lines:
            os.write(fd, line)
        return read_until(fd, until, timeout=60).decode(errors="replace")
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(fd)


def test_a_kept_terminal_is_reattached_after_its_connection_drops(
    terminal_platform: Platform, alice_worker: Worker, user: User, tmp_path: Path
) -> None:
    env = pw_env(terminal_platform, user, tmp_path / "kept")
    # Given: a kept terminal with a variable set in its shell, and its connection dropped.
    setting = b"export KEPT=value-$((6*7)); echo set-$((6*7))\n"
    pw_ssh_keep(env, alice_worker, setting, until=b"set-42")
    wait_for(
        lambda: not TerminalRecord.objects.filter(keep="work", closed_at__isnull=True).exists(),
        timeout=30,
    )

    # When: it is opened again by name. Then: the same shell, the variable still set.
    seen = pw_ssh_keep(env, alice_worker, b"echo got-$KEPT-end\n", until=b"got-value-42-end")
    assert "got-value-42-end" in seen
    records = TerminalRecord.objects.filter(worker_public_id=alice_worker.public_id)
    assert list(records.values_list("keep", flat=True)) == ["work", "work"]

    # Opened again in a folder (Files' "Terminal here"): a window of its own there, beside the
    # shell that was kept, which is still there.
    folder = owners_folder("kept in here")
    wait_for(lambda: not TerminalRecord.objects.filter(closed_at__isnull=True).exists(), timeout=30)
    try:
        typed = b"echo at-$(pwd)-$KEPT-end\n"
        seen = pw_ssh_keep(
            env, alice_worker, typed, until=f"at-{folder}--end".encode(), cwd=str(folder)
        )
        assert f"at-{folder}--end" in seen  # a new shell (KEPT unset), in the folder
        wait_for(
            lambda: not TerminalRecord.objects.filter(closed_at__isnull=True).exists(),
            timeout=30,
        )
        typed = b"echo windows-$(tmux list-windows | wc -l)-w\n"
        pw_ssh_keep(env, alice_worker, typed, until=b"windows-2-w")
    finally:
        subprocess.run(["rm", "-rf", "--", str(folder)], check=True)

    # When the job ends, so does the tmux server that kept it, with its shells.
    pw = pw_runner(terminal_platform, user, tmp_path / "kept")
    ended = pw("workers", "delete", "--wait", alice_worker.public_id)
    assert ended.returncode == 0, ended.stderr
    wait_for(lambda: not processes_naming(f"activate-{alice_worker.public_id}"), timeout=30)


def owners_folder(name: str) -> Path:
    """A folder in pwalice's home on the node (this machine), made and owned by her."""
    folder = Path("/home/pwalice") / f"{name} {time.monotonic_ns()}"
    subprocess.run(["runuser", "-u", "pwalice", "--", "mkdir", "--", str(folder)], check=True)
    return folder


def test_pw_ssh_in_a_folder_runs_there_whatever_its_name_holds_and_a_missing_one_is_said(
    terminal_platform: Platform, alice_worker: Worker, user: User, tmp_path: Path
) -> None:
    env = pw_env(terminal_platform, user, tmp_path / "cwd")
    folder = owners_folder('it\'s $(touch ran); a "folder"')
    try:
        done = subprocess.run(
            [str(PW), "ssh", "--cwd", str(folder), alice_worker.public_id, "--", "pwd"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert (done.returncode, done.stdout) == (0, f"{folder}\n"), done.stderr
        home = subprocess.run(
            [str(PW), "ssh", "--cwd", "~", alice_worker.public_id, "--", "pwd"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert home.stdout == "/home/pwalice\n", home.stderr
        assert not list(Path("/home/pwalice").glob("ran"))
        gone = subprocess.run(
            [str(PW), "ssh", "--cwd", "/no/such/place", alice_worker.public_id, "--", "pwd"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert gone.returncode == 1 and gone.stdout == ""
        assert "activate: cannot open the folder /no/such/place" in gone.stderr
        bad = subprocess.run(
            [str(PW), "ssh", "--cwd", "relative", alice_worker.public_id, "--", "pwd"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert bad.returncode != 0 and "cwd must be absolute" in bad.stderr, bad.stderr
    finally:
        subprocess.run(["rm", "-rf", "--", str(folder)], check=True)


def processes_naming(text: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and text.encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_without_tmux_a_kept_terminal_is_an_ordinary_shell_and_says_so() -> None:
    from workers_app.terminals.kept import KEPT_TERMINAL

    ran = subprocess.run(
        ["/bin/sh", "-c", KEPT_TERMINAL, "activate-terminal", "work", "w1"],
        env={"PATH": "/nonexistent", "SHELL": "/bin/echo"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert ran.stdout.strip() == "-l"  # the login shell ($SHELL -l), here echo
    assert "no tmux on this node: this terminal ends with its connection" in ran.stderr
