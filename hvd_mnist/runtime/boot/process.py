"""Who a process is, from Linux's /proc: when it started, on which boot of which machine, and a kill that can
only ever reach that process (a pid reused by a stranger has another start time)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from dataclasses import dataclass


def boot_id() -> str:
    """This boot of this machine (a container shares its host's)."""
    with open("/proc/sys/kernel/random/boot_id") as handle:
        return handle.read().strip()


def start_ticks(pid: int | str = "self") -> int:
    """The process's start time in clock ticks since boot (0 when there is no such process)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[19])  # after the command name, which may hold ")"
    except (OSError, IndexError, ValueError):
        return 0


def seconds_since_start() -> float:
    """Wall seconds since this process started, so that start-up counts: the user waited for it."""
    with open("/proc/uptime") as uptime:
        up_seconds = float(uptime.read().split()[0])
    return up_seconds - start_ticks() / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Process:
    """Who a rank is on its machine, so that a peer on the same machine can find it (and only it)."""

    rank: int
    host: str
    boot_id: str
    pid: int
    start_ticks: int

    @classmethod
    def this(cls, rank: int) -> Process:
        return cls(rank, socket.gethostname(), boot_id(), os.getpid(), start_ticks(os.getpid()))

    def same_machine(self) -> bool:
        return self.boot_id == boot_id() and self.host == socket.gethostname()

    def kill(self) -> bool:
        """SIGKILL this process if it runs on this machine and is still the same process; True if done."""
        if not self.same_machine() or start_ticks(self.pid) != self.start_ticks:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        return True
