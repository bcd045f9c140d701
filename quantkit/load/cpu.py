"""Who used the machine's cores during a step: the client, the server, everything else.

A load test on the machine that serves measures the client too: its event loop takes CPU from the
server unless the two are pinned to different cores (taskset), and any other process on the
machine slows both. Per step: the client's CPU share (cores busy), the server's (its process and
every descendant), the machine's busy cores (/proc/stat via psutil), and what is left for the
others; a step where others held more than DISTURBED cores is flagged `disturbed` (a row to
re-measure, never to publish). The run names the client's and the server's cores and warns when
they overlap. The server is the `--server-pid` given, the process a lever study started, or, for a
loopback URL, the process listening on its port.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from urllib.parse import urlparse

import psutil

# Cores that processes other than the client and the server may use during a step before it is
# flagged disturbed: a quarter core, well above the kernel's and the shell's own background.
DISTURBED = 0.25
LOOPBACK = ("127.0.0.1", "localhost", "::1", "0.0.0.0")


@dataclass(frozen=True)
class CpuShares:
    """Cores busy during a step (CPU seconds per wall second), per party; `disturbed` when the
    others held more than DISTURBED. None where a party could not be measured."""

    client: float | None = None
    server: float | None = None
    machine: float | None = None
    others: float | None = None
    disturbed: bool | None = None

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "CpuShares":
        return cls(**data)


@dataclass(frozen=True)
class Placement:
    """The client's and the server's cores, which they share, and a warning about either."""

    client_cores: list[int] | None = None
    server_pid: int | None = None
    server_cores: list[int] | None = None
    shared_cores: list[int] | None = None
    warning: str | None = None

    def to_json(self) -> dict:
        data = asdict(self)
        if self.warning is None:
            del data["warning"]
        return data

    @classmethod
    def from_json(cls, data: dict) -> "Placement":
        return cls(**data)


def _busy_s() -> float:
    """CPU seconds all cores spent on anything but idle and I/O wait, since boot."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _tree_cpu_s(pid: int | None) -> float | None:
    if pid is None:
        return None
    total = 0.0
    for proc in _tree(pid):
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            continue
    return total


def listening_pid(url: str) -> int | None:
    """The process listening on a loopback URL's port (None: not loopback, or not visible to us)."""
    parsed = urlparse(url)
    if parsed.hostname not in LOOPBACK or not parsed.port:
        return None
    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == parsed.port and conn.pid:
                return conn.pid
    except (psutil.Error, OSError):
        return None
    return None


def cores_of(pid: int | None) -> list[int] | None:
    """The cores a process tree may run on (the union of its processes' affinities)."""
    if pid is None:
        return None
    cores: set[int] = set()
    for proc in _tree(pid):
        try:
            cores.update(proc.cpu_affinity())
        except (psutil.Error, AttributeError):
            continue
    return sorted(cores) or None


def placement(server_pid: int | None) -> Placement:
    """The client's and the server's cores, and a warning when they share any."""
    if server_pid == os.getpid():  # a server inside the client's own process (a test's stub)
        server_pid = None
    client = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    server = cores_of(server_pid)
    shared = sorted(set(client) & set(server)) if client and server else None
    warning = None
    if server is None:
        warning = (
            "the server's process is unknown (not on loopback, or not visible): client and server "
            "cores not checked, other processes' CPU not measured"
        )
    elif shared:
        warning = (
            f"client and server share cores {','.join(map(str, shared))}: the client's CPU is taken from the "
            "server's; pin them apart (taskset -c) for a clean measurement"
        )
    return Placement(client, server_pid, server, shared, warning)


@dataclass
class Watch:
    """CPU seconds at a step's start; `shares()` at its end gives cores busy per party."""

    server_pid: int | None
    wall: float = 0.0
    client: float = 0.0
    server: float | None = None
    busy: float = 0.0

    def start(self) -> "Watch":
        self.wall, self.client = time.perf_counter(), time.process_time()
        self.server, self.busy = _tree_cpu_s(self.server_pid), _busy_s()
        return self

    def shares(self) -> CpuShares:
        wall = time.perf_counter() - self.wall
        if wall <= 0:
            return CpuShares()
        client = (time.process_time() - self.client) / wall
        now = _tree_cpu_s(self.server_pid)
        server = (now - self.server) / wall if now is not None and self.server is not None else None
        machine = (_busy_s() - self.busy) / wall
        others = max(0.0, machine - client - server) if server is not None else None
        return CpuShares(client, server, machine, others, None if others is None else others > DISTURBED)
