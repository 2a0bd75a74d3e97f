"""A session's program on a compute node: started inside the worker's job, as its owner.

Standard-library Python 3.6+, sent by the platform on stdin: the password's line, this
launcher's source, a NUL, then the source of the session kind's starter
(``sessions_app/node/starters/<kind>.py``):
    python3 -c BOOTSTRAP KIND [--OPTION VALUE ...]
(the password is never in argv, which other users may read). It picks a free port, has the
starter start the kind's program there (the options say where the program is on the node),
and once the port answers prints one line of JSON: {"ready": true, "host", "port", "pid"}; on
failure {"error": "..."}. It stays in the foreground, and when any of the session's essential
programs ends, or it gets SIGTERM or SIGHUP, it ends them all.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import IO, Any, Dict, List, NoReturn, Optional

READY_WITHIN = 120


def say(**message: Any) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def find(*names: str) -> Optional[str]:
    """The first of these commands on PATH (or given as an executable path)."""
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return None


class Launcher:
    """What a starter gets: a private work folder and log, and the session's processes."""

    ready_within = READY_WITHIN

    def __init__(self, workdir: str, log: IO[bytes]) -> None:
        self.workdir = workdir
        self.log = log
        self.children = []  # type: List[subprocess.Popen]
        # The programs the session is: when one of them ends, the session's program has ended.
        # (A terminal or window manager closed in the desktop is not: the desktop stays.)
        self.essential = []  # type: List[subprocess.Popen]

    free_port = staticmethod(free_port)
    answers = staticmethod(answers)
    find = staticmethod(find)

    def fail(self, message: str) -> NoReturn:
        say(error=message)
        self.stop_all()
        sys.exit(1)

    def start(
        self,
        argv: List[str],
        vital: bool = True,
        env: Optional[Dict[str, str]] = None,
        **kwargs: Any,
    ) -> subprocess.Popen:
        """A process in a session of its own (so it ends with its children), its output in the
        log, unless the starter says otherwise."""
        kwargs.setdefault("stdout", self.log)
        kwargs.setdefault("stderr", self.log)
        try:
            child = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
                env=env,
                **kwargs,
            )
        except OSError as exc:
            self.fail("cannot start %s: %s" % (argv[0], exc))
        self.children.append(child)
        if vital:
            self.essential.append(child)
        return child

    def forget(self, child: subprocess.Popen) -> None:
        """A process the starter gave up on (and ends itself): no longer the session's."""
        for group in (self.children, self.essential):
            if child in group:
                group.remove(child)

    def wait_for(self, port: int, what: str) -> None:
        deadline = time.time() + READY_WITHIN
        while time.time() < deadline:
            for child in self.essential:
                if child.poll() is not None:
                    self.fail(
                        "%s exited with status %s before it answered" % (what, child.returncode)
                    )
            if answers(port):
                return
            time.sleep(0.2)
        self.fail("%s did not answer on port %d within %d s" % (what, port, READY_WITHIN))

    def running(self) -> bool:
        return all(child.poll() is None for child in self.essential)

    def stop_all(self, *_args: Any) -> None:
        for child in self.children:
            try:
                os.killpg(child.pid, signal.SIGTERM)
            except OSError:
                pass
        deadline = time.time() + 5
        for child in self.children:
            try:
                child.wait(max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(child.pid, signal.SIGKILL)
                except OSError:
                    pass


def load_starter(kind: str, source: str) -> Any:
    """The kind's starter, run as a module of its own; its ``start`` starts the program."""
    namespace = {"__name__": "activate_starter_%s" % kind}  # type: Dict[str, Any]
    exec(compile(source, "starters/%s.py" % kind, "exec"), namespace)
    return namespace["start"]


def main() -> None:
    args = sys.argv[1:]
    kind = args[0] if args else ""
    options = dict(zip(args[1::2], args[2::2]))
    # Run by the platform's bootstrap, which read the password's line and split the starter off.
    secret = str(globals().get("SECRET") or "")
    source = str(globals().get("STARTER") or "")
    workdir = tempfile.mkdtemp(prefix="activate-session-")
    launcher = Launcher(workdir, open(os.path.join(workdir, "log"), "ab"))

    def stop_and_exit(*_args: Any) -> None:
        launcher.stop_all()
        sys.exit(0)

    for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(number, stop_and_exit)
    try:
        if not secret:
            launcher.fail("no password came on stdin")
        if not source:
            launcher.fail("no starter came for session type %r" % kind)
        port = free_port("0.0.0.0")
        load_starter(kind, source)(launcher, secret, port, options)
        launcher.wait_for(port, kind)
        say(ready=True, host=socket.gethostname(), port=port, pid=os.getpid())
        while launcher.running():
            time.sleep(1)
    finally:
        launcher.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
