"""Who listens where: /proc/net/tcp{,6} and /proc/PID/fd, no extra tools."""
from __future__ import annotations

import os
import socket
from pathlib import Path


def _addr(hex_addr: str) -> str:
    ip, _ = hex_addr.split(":")
    raw = bytes.fromhex(ip)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])            # little-endian u32
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))      # four little-endian u32
    return socket.inet_ntop(socket.AF_INET6, words)


def listeners(port: int) -> list[tuple[str, int]]:
    """(local address, socket inode) of every TCP socket LISTENing on ``port``."""
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            f = line.split()
            local, state, inode = f[1], f[3], int(f[9])
            if state == "0A" and int(local.split(":")[1], 16) == port:   # 0A = LISTEN
                out.append((_addr(local), inode))
    return out


def pid_of_socket(inode: int) -> int | None:
    target = f"socket:[{inode}]"
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            for fd in (d / "fd").iterdir():
                if os.readlink(fd) == target:
                    return int(d.name)
        except (PermissionError, FileNotFoundError, ProcessLookupError):
            continue
    return None


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def outside_addresses() -> list[str]:
    """This machine's IPv4 addresses other than loopback (from the routing view)."""
    found = set()
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))                            # no packet is sent
            found.add(s.getsockname()[0])
    except OSError:
        pass
    try:
        found.update(i[4][0] for i in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET))
    except OSError:
        pass
    return sorted(a for a in found if not a.startswith("127."))
