"""A host that can be cut off rather than killed: a network namespace of this machine joined to
it by a veth pair, from which this machine's loopback services (PostgreSQL, Redis, the test
cluster's sshd) are reached at the pair's far address, or at 127.0.0.1 itself: inside, those
ports of 127.0.0.1 are sent over the link, so a process started there needs no other settings
than on this machine (a platform host, harness/platform.py's ``wrap``). Dropping the link
(``cut``) leaves every connection of the namespace's processes open on the other side, silent,
as a cable pulled or a partition would; the processes themselves run on.

The services listen on loopback only: packets from the namespace are sent on to 127.0.0.1 and
their source made 127.0.0.1 (nftables, a table of the namespace's own), so the services see a
local client, as they would see the real host's. Needs root, ``ip`` and ``nft``
(scripts/testcluster.sh installs nftables).
"""

from __future__ import annotations

import itertools
import os
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from harness import HarnessError

_numbers = itertools.count()


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise HarnessError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return done


@dataclass(frozen=True)
class CutOffHost:
    name: str
    outside: str  # the host's end of the link (this machine's side)
    address: str  # where the namespace reaches this machine's services
    inner: str  # where this machine reaches the namespace's servers

    def argv(self, argv: Sequence[str]) -> list[str]:
        """argv run inside the namespace (as root; ``runuser`` after it for another user)."""
        return ["ip", "netns", "exec", self.name, *argv]

    def cut(self) -> None:
        """The link down: nothing more passes either way, and no side is told."""
        _run("ip", "link", "set", self.outside, "down")

    def restore(self) -> None:
        _run("ip", "link", "set", self.outside, "up")


@contextmanager
def cut_off_host(ports: Sequence[int]) -> Iterator[CutOffHost]:
    """A namespace whose processes reach this machine's ``ports`` at ``address``; removed after."""
    number = (os.getpid() * 7 + next(_numbers)) % 16000
    name = f"activate-cut-{number}"
    outside, inside = f"actc{number}h", f"actc{number}n"
    # A /30 of its own in 10.232.0.0/16 (4 addresses per namespace).
    base = 4 * number
    host_ip = f"10.{232 + base // 65536}.{base // 256 % 256}.{base % 256 + 1}"
    inner_ip = f"10.{232 + base // 65536}.{base // 256 % 256}.{base % 256 + 2}"
    table = f"activate_cut_{number}"
    try:
        _run("ip", "netns", "add", name)
        _run("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
        _run("ip", "link", "set", inside, "netns", name)
        _run("ip", "addr", "add", f"{host_ip}/30", "dev", outside)
        _run("ip", "link", "set", outside, "up")
        inner = ["ip", "netns", "exec", name]
        _run(*inner, "ip", "addr", "add", f"{inner_ip}/30", "dev", inside)
        _run(*inner, "ip", "link", "set", inside, "up")
        _run(*inner, "ip", "link", "set", "lo", "up")
        _run("sysctl", "-q", "-w", f"net.ipv4.conf.{outside}.route_localnet=1")
        listed = ", ".join(str(port) for port in ports)
        rules = (
            f"table ip {table} {{\n"
            "  chain pre {\n    type nat hook prerouting priority -100;\n"
            f'    iifname "{outside}" tcp dport {{ {listed} }} dnat to 127.0.0.1\n  }}\n'
            "  chain input {\n    type nat hook input priority 100;\n"
            f'    iifname "{outside}" snat to 127.0.0.1\n  }}\n'
            "}\n"
        )
        done = subprocess.run(["nft", "-f", "-"], input=rules, capture_output=True, text=True)
        if done.returncode != 0:
            raise HarnessError(f"nft refused the namespace's rules: {done.stderr.strip()}")
        # Inside, the listed ports of 127.0.0.1 go over the link (and leave with the namespace's
        # own address: a loopback source would be dropped on the way).
        _run(*inner, "sysctl", "-q", "-w", f"net.ipv4.conf.{inside}.route_localnet=1")
        _run(*inner, "sysctl", "-q", "-w", "net.ipv4.conf.all.route_localnet=1")
        rules_inside = (
            f"table ip {table}_in {{\n"
            "  chain out {\n    type nat hook output priority -100;\n"
            f"    ip daddr 127.0.0.1 tcp dport {{ {listed} }} dnat to {host_ip}\n  }}\n"
            "  chain post {\n    type nat hook postrouting priority 100;\n"
            f'    oifname "{inside}" snat to {inner_ip}\n  }}\n'
            "}\n"
        )
        done = subprocess.run(
            [*inner, "nft", "-f", "-"], input=rules_inside, capture_output=True, text=True
        )
        if done.returncode != 0:
            raise HarnessError(f"nft refused the rules inside: {done.stderr.strip()}")
        yield CutOffHost(name, outside, host_ip, inner_ip)
    finally:
        _run("nft", "delete", "table", "ip", table, check=False)
        _run("ip", "link", "delete", outside, check=False)
        _run("ip", "netns", "delete", name, check=False)
