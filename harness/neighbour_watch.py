"""What a neighbour sees of every new process on this machine (node, login host and platform
host alike here): started as root only to subscribe to the kernel's process events (the proc
connector), it becomes the ordinary Unix user named on its command line before it reads
anything, so each command line and environment it records is one that user was allowed to read.

    python3 neighbour_watch.py USER OUTFILE

One JSON line per exec: {"pid", "uid", "argv": [...] or null, "environ": [...] or "refused" or
"gone"}; a process that ended before it could be read is recorded with argv null. A line
{"marker": TEXT} is written for a process whose argv holds ``activate-watch-marker`` then TEXT:
the reader uses it to know that every event before it has been written.
"""

import json
import os
import pwd
import socket
import struct
import sys

NETLINK_CONNECTOR = 11
CN_IDX_PROC = 1
CN_VAL_PROC = 1
PROC_CN_MCAST_LISTEN = 1
PROC_EVENT_EXEC = 0x00000002
NLMSG_HEADER = struct.Struct("=IHHII")
CN_MSG = struct.Struct("=IIIIHH")
MARKER = "activate-watch-marker"


def subscribe() -> socket.socket:
    events = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
    events.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    events.bind((0, CN_IDX_PROC))
    op = struct.pack("=I", PROC_CN_MCAST_LISTEN)
    message = CN_MSG.pack(CN_IDX_PROC, CN_VAL_PROC, 0, 0, len(op), 0) + op
    events.send(NLMSG_HEADER.pack(NLMSG_HEADER.size + len(message), 3, 0, 0, 0) + message)
    return events


def become(user: str) -> None:
    entry = pwd.getpwnam(user)
    os.setgroups([])
    os.setgid(entry.pw_gid)
    os.setuid(entry.pw_uid)
    if os.getuid() == 0 or os.geteuid() == 0:
        raise SystemExit(f"neighbour_watch: still root after becoming {user}")


def read(pid: int, name: str) -> object:
    try:
        with open(f"/proc/{pid}/{name}", "rb") as handle:
            data = handle.read()
    except PermissionError:
        return "refused"
    except OSError:
        return "gone"
    return [part.decode("utf-8", "replace") for part in data.split(b"\0") if part]


def owner(pid: int) -> object:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def main() -> None:
    user, out = sys.argv[1], sys.argv[2]
    events = subscribe()
    sink = open(out, "a", buffering=1)
    become(user)
    sink.write(json.dumps({"started": os.getpid(), "uid": os.getuid()}) + "\n")
    header = NLMSG_HEADER.size + CN_MSG.size
    while True:
        data = events.recv(65536)
        if len(data) < header + 24:
            continue
        what = struct.unpack_from("=I", data, header)[0]
        if what != PROC_EVENT_EXEC:
            continue
        pid = struct.unpack_from("=I", data, header + 16)[0]
        argv = read(pid, "cmdline")
        if isinstance(argv, list) and MARKER in argv[:-1]:
            sink.write(json.dumps({"marker": argv[argv.index(MARKER) + 1]}) + "\n")
            continue
        record = {
            "pid": pid,
            "uid": owner(pid),
            "argv": argv if isinstance(argv, list) else None,
            "environ": read(pid, "environ"),
        }
        sink.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
