"""Which processes listen on a TCP port (Linux ``/proc``), for ``gateway doctor``'s port check.

:func:`listeners` reads ``/proc/net/tcp`` and ``/proc/net/tcp6`` for sockets in LISTEN state on a
port and maps their inodes to pids through ``/proc/<pid>/fd``. A socket whose owner cannot be seen
(another user's process, without root) is reported with pid None. Without ``/proc`` it returns
None (unknown).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_LISTEN = "0A"
PROC = Path("/proc")


@dataclass(frozen=True)
class Listener:
    port: int
    inode: int
    pid: int | None  # None: the owner is not visible to us
    cmdline: str = ""


def parse_proc_net_tcp(text: str, port: int) -> list[int]:
    """Inodes of LISTEN sockets on ``port`` in the text of /proc/net/tcp or tcp6."""
    inodes = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10:
            continue
        local, state, inode = fields[1], fields[3], fields[9]
        _, _, hex_port = local.rpartition(":")
        try:
            if state == _LISTEN and int(hex_port, 16) == port and inode.isdigit():
                inodes.append(int(inode))
        except ValueError:
            continue
    return inodes


def _cmdline(pid: int) -> str:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()


def _owners(inodes: set[int]) -> dict[int, int]:
    """inode -> pid for the sockets among ``inodes`` whose owner we can see."""
    found: dict[int, int] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = os.listdir(entry / "fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(entry / "fd" / fd)
            except OSError:
                continue
            if target.startswith("socket:[") and int(target[8:-1]) in inodes:
                found.setdefault(int(target[8:-1]), int(entry.name))
        if len(found) == len(inodes):
            break
    return found


def listeners(port: int) -> list[Listener] | None:
    """The sockets listening on ``port`` here (any address), with their pids where visible."""
    inodes: list[int] = []
    readable = False
    for name in ("tcp", "tcp6"):
        try:
            inodes += parse_proc_net_tcp((PROC / "net" / name).read_text(), port)
            readable = True
        except OSError:
            continue
    if not readable:
        return None
    owners = _owners(set(inodes)) if inodes else {}
    out = []
    for inode in dict.fromkeys(inodes):
        pid = owners.get(inode)
        out.append(Listener(port, inode, pid, _cmdline(pid) if pid is not None else ""))
    return out
