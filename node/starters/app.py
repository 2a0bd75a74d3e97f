"""An app an operator defined on the platform (data, no code of its own): one program started
from a command template (options: --spec-b64, URL-safe base64 of its JSON)::

    {"name": "tensorboard", "command": ["tensorboard", "--logdir", "{logdir}", ...],
     "env": {"NAME": "template"}, "reach": "unix" | "tcp", "values": {"logdir": "..."},
     "base_url": "/s/<id>/", "start_timeout": 60}

Each argument of the command and each environment value is a template, filled in by itself
(never by a shell): {socket} (reach unix: the Unix socket in the private folder it listens
on), {port} (reach tcp: the port it listens on in a network of its own), {base_url},
{base_path} (the same without its last "/"), {home}, {cwd} (the folder the session opens
in, where the program starts: the home unless the platform said --folder), {workdir} (the
private folder),
{secret_file} (a 0600 file there holding the session's password), the fields' names (their
values as given: a value is never read as a template itself; a leading "~" is the home
folder), and {secret}, in environment values only (a command line is readable by every user
of the node). {{ and }} are braces; any other placeholder fails the session, saying so.

Reach tcp: a program on 127.0.0.1 of the node would be open to every user there. It runs in
a user and network namespace of its own (owner's uid and gid mapped to themselves, so it runs
as its owner there too, and its files are the owner's), where this file, run as a script from
the private folder, brings the loopback up, starts it, and once it listens relays the route's
Unix socket (a path in the private folder, which works across network namespaces) to its
port. A node whose kernel refuses user namespaces fails the session, saying so.

If the program exits or does not listen within start_timeout seconds, the session fails with
its last lines. Whether it answers HTTP is for the platform to check, through the gate.
"""

import base64
import ctypes
import errno
import fcntl
import json
import os
import random
import re
import shutil
import signal
import socket
import string
import struct
import subprocess
import sys
import threading
import time
from typing import IO, TYPE_CHECKING, Any, Dict, List, NoReturn, Optional, Set, Tuple

if TYPE_CHECKING:
    from ..activate_session import Launcher  # the launcher these run in, on the node too

REACHES = ("unix", "tcp")
START_TIMEOUT = 60
PLACEHOLDERS = ("socket", "port", "base_url", "base_path", "home", "cwd", "workdir", "secret_file")
SECRET = "secret"  # noqa: S105 - the placeholder's name
FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# What of the program's output a failure shows: the platform keeps 512 characters of a reason.
TAIL_LINES = 20
TAIL_BYTES = 2048
MESSAGE_MAX = 480
TERMINAL_CODES = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]|[\x00-\x08\x0b-\x1f\x7f]")
# Any port is free in a network of one's own; these are below the kernel's ephemeral range
# (32768 on), so none of the ports the program asks the kernel for takes its own.
PORTS = (20000, 32768)
PROGRAM_LOG = "program.log"
SECRET_FILE = "secret"  # noqa: S105 - the file's name
CHUNK = 65536

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
PR_SET_PDEATHSIG = 1


class SpecError(ValueError):
    """The app's definition (or a value) cannot be run; the message says why."""


def read_spec(encoded: str) -> Dict[str, Any]:
    """The app's definition from --spec-b64, checked for what this starter needs."""
    try:
        raw = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
        spec = json.loads(raw.decode("utf-8"))
    except ValueError as exc:  # binascii.Error, UnicodeDecodeError and JSON's are ValueErrors
        raise SpecError(
            "the app's definition (--spec-b64) is not base64 of JSON: %s" % exc
        ) from None
    if not isinstance(spec, dict):
        raise SpecError("the app's definition (--spec-b64) is not a JSON object")
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise SpecError("the app's definition has no name")
    command = spec.get("command")
    if not isinstance(command, list) or not command or not all(_text(t) for t in command):
        raise SpecError("%s: its command must be a list of strings, the program first" % name)
    for what in ("env", "values"):
        items = spec.setdefault(what, {})
        if not isinstance(items, dict) or not all(
            _text(k) and k and _text(v) for k, v in items.items()
        ):
            raise SpecError("%s: its %s must map names to strings" % (name, what))
    for key in spec["env"]:
        if "=" in key or "\x00" in key:
            raise SpecError("%s: %r cannot be the name of an environment variable" % (name, key))
    for key in spec["values"]:
        if key in PLACEHOLDERS or key == SECRET:
            raise SpecError(
                "%s: a field may not be named %r (a placeholder of its own)" % (name, key)
            )
    if spec.setdefault("reach", "unix") not in REACHES:
        raise SpecError("%s: reach must be one of %s" % (name, ", ".join(REACHES)))
    if not isinstance(spec.setdefault("base_url", "/"), str):
        raise SpecError("%s: its base_url must be a string" % name)
    timeout = spec.setdefault("start_timeout", START_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise SpecError("%s: its start_timeout must be a number of seconds" % name)
    return spec


def _text(value: Any) -> bool:
    return isinstance(value, str)


def parsed(template: str, where: str) -> List[Tuple[str, Optional[str]]]:
    """A template as (text, placeholder or None) pairs; refuses what is not a plain {name}."""
    try:
        pieces = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise SpecError(
            "%s: %s in %r (write {{ and }} for braces)" % (where, exc, _quoted(template))
        ) from None
    found = []  # type: List[Tuple[str, Optional[str]]]
    for literal, name, format_spec, conversion in pieces:
        if name is not None and (format_spec or conversion or not FIELD_NAME.match(name)):
            raise SpecError(
                "%s: %r holds something that is not a placeholder (only {name}; {{ and }} are "
                "braces)" % (where, _quoted(template))
            )
        found.append((literal, name))
    return found


def _quoted(template: str) -> str:
    return template if len(template) <= 60 else template[:57] + "..."


def placeholders(template: str, where: str) -> List[str]:
    """The names a template refers to."""
    return [name for _, name in parsed(template, where) if name is not None]


def fill(template: str, known: Dict[str, str], where: str) -> str:
    """The template with each placeholder replaced by its value, as it is (one pass: what a
    value holds is never read as a template)."""
    parts = []
    for literal, name in parsed(template, where):
        parts.append(literal)
        if name is None:
            continue
        if name not in known:
            raise SpecError(
                "%s: unknown placeholder {%s} (%s)" % (where, name, _known_hint(name, known))
            )
        parts.append(known[name])
    return "".join(parts)


def _known_hint(name: str, known: Dict[str, str]) -> str:
    if name == "port":
        return "{port} is for apps reached over TCP"
    if name == "socket":
        return "{socket} is for apps reached on a Unix socket"
    if name == SECRET:
        return "{secret} may only be used in env"
    return "known: %s" % ", ".join("{%s}" % key for key in sorted(known))


def home_folder(value: str, home: str) -> str:
    """A value's leading "~" (alone or before "/") is the owner's home folder."""
    if value == "~" or value.startswith("~/"):
        return home + value[1:]
    return value


def templates(spec: Dict[str, Any]) -> List[Tuple[str, str]]:
    """Each template of the app with where it is, for messages."""
    name = spec["name"]
    found = [("%s: its command" % name, token) for token in spec["command"]]
    found += [("%s: env %s" % (name, key), value) for key, value in spec["env"].items()]
    return found


def used_placeholders(spec: Dict[str, Any]) -> Set[str]:
    return {name for where, text in templates(spec) for name in placeholders(text, where)}


def program_argv_and_env(
    spec: Dict[str, Any], known: Dict[str, str], secret: str
) -> Tuple[List[str], Dict[str, str]]:
    """The program's argv and the environment variables the app sets, filled in."""
    name = spec["name"]
    where = "%s: its command" % name
    if any(SECRET in placeholders(token, where) for token in spec["command"]):
        raise SpecError(
            "%s: its command may not hold {secret}, which every user of the node could read "
            "there; use {secret_file}, or {secret} in env" % name
        )
    argv = [fill(token, known, where) for token in spec["command"]]
    with_secret = dict(known, **{SECRET: secret})
    env = {
        key: fill(value, with_secret, "%s: env %s" % (name, key))
        for key, value in spec["env"].items()
    }
    if any("\x00" in text for text in argv + list(env.values())):
        raise SpecError("%s: a value holds a NUL character, which no program can be given" % name)
    return argv, env


def last_lines(path: str, secret: str = "") -> str:
    """The end of the program's output: its last lines, printable, the password hidden."""
    try:
        with open(path, "rb") as output:
            output.seek(0, os.SEEK_END)
            size = output.tell()
            output.seek(max(0, size - TAIL_BYTES))
            data = output.read()
    except OSError:
        return ""
    text = data.decode("utf-8", "replace")
    if secret:
        text = text.replace(secret, "********")
    lines = text.splitlines()
    if size > TAIL_BYTES and lines:
        lines = lines[1:]  # begun in the middle
    lines = [TERMINAL_CODES.sub("", line).rstrip() for line in lines]
    return "\n".join([line for line in lines if line.strip()][-TAIL_LINES:])


def with_last_lines(summary: str, path: str, secret: str) -> str:
    """A failure and as much of the program's last lines as the platform keeps."""
    tail = last_lines(path, secret)
    if not tail:
        return "%s (it printed nothing)" % summary
    head = "%s; its last lines:\n" % summary
    room = MESSAGE_MAX - len(head)
    if len(tail) > room:
        tail = "..." + tail[len(tail) - room + 3 :]
    return head + tail


def wait_until_listening(
    launcher: "Launcher",
    program: subprocess.Popen,
    route: str,
    spec: Dict[str, Any],
    log: str,
    secret: str,
) -> None:
    where = "its port" if spec["reach"] == "tcp" else "its socket"
    timeout = float(spec["start_timeout"])
    deadline = time.time() + timeout
    while True:
        if program.poll() is not None:
            status = program.returncode
            summary = "%s exited with status %s before it listened on %s" % (
                spec["name"],
                status,
                where,
            )
            launcher.fail(with_last_lines(summary, log, secret))
        if launcher.answers(route):
            return
        if time.time() > deadline:
            summary = "%s did not listen on %s within %g s" % (spec["name"], where, timeout)
            launcher.fail(with_last_lines(summary, log, secret))
        time.sleep(0.1)


def start(launcher: "Launcher", secret: str, options: Dict[str, str]) -> None:
    try:
        spec = read_spec(options.get("--spec-b64", ""))
    except SpecError as exc:
        launcher.fail(str(exc))
    name = spec["name"]
    home = os.path.expanduser("~")
    route = launcher.route("http")
    known = {
        "base_url": spec["base_url"],
        "base_path": spec["base_url"].rstrip("/"),
        "home": home,
        "cwd": launcher.folder,
        "workdir": launcher.workdir,
        "secret_file": os.path.join(launcher.workdir, SECRET_FILE),
    }
    port = random.randrange(*PORTS)  # noqa: S311 - any port will do: nobody else is there
    if spec["reach"] == "tcp":
        known["port"] = str(port)
    else:
        known["socket"] = route
    for field, value in spec["values"].items():
        known[field] = home_folder(value, home)
    try:
        used = used_placeholders(spec)
        where = "port" if spec["reach"] == "tcp" else "socket"
        if where not in used:
            raise SpecError(
                "%s: its command or env must tell it where to listen ({%s})" % (name, where)
            )
        argv, app_env = program_argv_and_env(spec, known, secret)
    except SpecError as exc:
        launcher.fail(str(exc))
    env = dict(os.environ, **app_env)
    if shutil.which(argv[0], path=env.get("PATH")) is None:
        launcher.fail("%s is not installed on the node (%s: not found)" % (name, argv[0]))
    if "secret_file" in used:
        descriptor = os.open(known["secret_file"], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(secret)
    log_path = os.path.join(launcher.workdir, PROGRAM_LOG)
    log = open(log_path, "ab")
    if spec["reach"] == "tcp":
        helper = os.path.join(launcher.workdir, "app.py")
        with open(helper, "w") as script:
            script.write(launcher.starter_source)
        refused = private_network_refused(helper)
        if refused:
            launcher.fail(
                "%s listens on TCP, and this node does not let its users have a network of their "
                "own (user namespaces: %s), without which its port would be open to every user "
                "of the node" % (name, refused)
            )
        argv = [sys.executable, helper, "--private-network", route, str(port), "--", *argv]
    program = launcher.start(argv, env=env, cwd=launcher.folder, stdout=log, stderr=log)
    wait_until_listening(launcher, program, route, spec, log_path, secret)


def private_network_refused(helper: str) -> str:
    """Why this node refuses the program a network of its own ("" if it does not)."""
    try:
        probe = subprocess.run(
            [sys.executable, helper, "--probe"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if probe.returncode == 0:
        return ""
    return probe.stdout.decode("utf-8", "replace").strip()[-200:] or "refused"


# What runs inside the app's own network namespace: this file, run as a script.


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int) -> None:
    if result != 0:
        number = ctypes.get_errno()
        raise OSError(number, os.strerror(number))


def enter_private_network() -> None:
    """This process in a user and network namespace of its own, its uid and gid mapped to
    themselves, the loopback up. It keeps the namespace's capabilities (the loopback needs
    them); the program it then starts as its uid loses them, as any program started by a user
    who is not root does."""
    uid, gid = os.geteuid(), os.getegid()
    libc = _libc()
    _check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNET))
    try:
        with open("/proc/self/setgroups", "w") as setgroups:
            setgroups.write("deny")
    except FileNotFoundError:  # kernels before 3.19 have none
        pass
    with open("/proc/self/uid_map", "w") as uid_map:
        uid_map.write("%d %d 1" % (uid, uid))
    with open("/proc/self/gid_map", "w") as gid_map:
        gid_map.write("%d %d 1" % (gid, gid))
    loopback_up()


def loopback_up() -> None:
    """``ip link set lo up``: a new network namespace's loopback is down."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as control:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(control.fileno(), SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(control.fileno(), SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))


def _die_with_parent() -> None:
    _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def listening(port: int) -> Optional[Tuple[int, str]]:
    """Where in this namespace the program accepts connections on ``port``, if it does."""
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        probe = socket.socket(family, socket.SOCK_STREAM)
        probe.settimeout(1)
        try:
            probe.connect((host, port))
            return family, host
        except OSError:
            continue
        finally:
            probe.close()
    return None


def pump(source: socket.socket, target: socket.socket) -> None:
    try:
        while True:
            data = source.recv(CHUNK)
            if not data:
                break
            target.sendall(data)
    except OSError:
        pass
    try:
        target.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def relay(connection: socket.socket, family: int, host: str, port: int) -> None:
    """One connection from the gate to the program's port, both ways, until both ends close."""
    program = socket.socket(family, socket.SOCK_STREAM)
    try:
        program.connect((host, port))
        program.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        program.close()
        connection.close()
        return
    back = threading.Thread(target=pump, args=(program, connection), daemon=True)
    back.start()
    pump(connection, program)
    back.join()
    program.close()
    connection.close()


def serve_route(route: str, family: int, host: str, port: int) -> None:
    os.umask(0o077)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(route)
    listener.listen(128)

    def accept() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    time.sleep(0.01)
                continue
            try:
                threading.Thread(
                    target=relay, args=(connection, family, host, port), daemon=True
                ).start()
            except RuntimeError:
                connection.close()

    threading.Thread(target=accept, name="route", daemon=True).start()


def exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def run_in_private_network(route: str, port: int, argv: List[str], out: IO[str]) -> NoReturn:
    """Start the program in a network of its own and relay ``route`` to its port; exit as it
    does. Its route appears only once it listens: that is what the starter waits for."""
    try:
        enter_private_network()
    except OSError as exc:
        out.write("activate: no network of its own for the program: %s\n" % exc)
        out.flush()
        sys.exit(126)
    try:
        program = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, close_fds=True, preexec_fn=_die_with_parent
        )
    except OSError as exc:
        out.write("activate: cannot start %s: %s\n" % (argv[0], exc))
        out.flush()
        sys.exit(127)

    def stop(number: int, _frame: Any) -> None:
        # Passed on (it may be in a process group of its own); its end ends this process.
        # (No wait here: the main thread may be waiting for it, holding the lock wait takes.)
        if program.returncode is None:
            program.send_signal(number)

    for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(number, stop)
    while program.poll() is None:
        found = listening(port)
        if found:
            serve_route(route, found[0], found[1], port)
            break
        time.sleep(0.1)
    sys.exit(exit_status(program.wait()))


def main(args: List[str]) -> None:
    if args[:1] == ["--probe"]:
        try:
            enter_private_network()
        except OSError as exc:
            sys.stdout.write("%s\n" % exc)
            sys.exit(1)
        sys.exit(0)
    if len(args) < 5 or args[0] != "--private-network" or args[3] != "--":
        sys.stderr.write("usage: app.py --private-network ROUTE PORT -- PROGRAM [ARG ...]\n")
        sys.exit(2)
    run_in_private_network(args[1], int(args[2]), args[4:], sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
