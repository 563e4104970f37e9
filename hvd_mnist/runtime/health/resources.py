"""What a rank may use and what it ran out of: its memory limits, read where the kernel enforces them, and the
resource an exception says is exhausted.

/proc/meminfo describes the machine, not the container, pod or Slurm job a rank runs in: its cgroup's limit
(v1 or v2, its own and every ancestor's) and its rlimits are what end it, by the OOM killer's SIGKILL or by an
allocation that fails. A limit that several ranks of a node share (one cgroup) is divided among them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import resource
from dataclasses import dataclass
from pathlib import Path

from hvd_mnist.errors import RanOut, first_line
from hvd_mnist.runtime.boot.process import boot_id

CGROUP_ROOT = Path("/sys/fs/cgroup")
UNLIMITED = 1 << 62  # a cgroup v1 "no limit" is 2^63 rounded down to a page: anything above this is none
NEAR_LIMIT = 0.9  # a rank at this fraction of its limit is near it (a death then is most likely the OOM killer)
# ...or, for address space, this close: a new thread reserves its stack (8 MiB) and often a malloc arena (64 MiB)
# at once, and a native library that cannot start one aborts the process (LLVM, TensorFlow's thread pools).
NEAR_ADDRESS_SPACE = 256 * 2**20
ADDRESS_SPACE = ("RLIMIT_AS", "RLIMIT_DATA")
MAP_FAILED = r"failed to map segment|[Cc]annot allocate memory"  # the loader's words for a library it had no room for
MIB = 2**20
LAUNCHER_RANKS = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")  # a rank before Horovod's


@dataclass(frozen=True)
class Limit:
    """One limit on this rank's memory: its name, this rank's share of it, and what the rank uses of it now."""

    name: str
    limit: int
    used: int

    @property
    def headroom(self) -> int:
        return max(self.limit - self.used, 0)

    def describe(self) -> str:
        """'410 of 420 MiB (cgroup v1 limit)'."""
        return f"{self.used / MIB:.0f} of {self.limit / MIB:.0f} MiB ({self.name})"

    def shared(self, share: int) -> Limit:
        """This limit as one of `share` ranks of a node under it sees it: a cgroup's split evenly (limit and use),
        the machine's free memory split, a process's own rlimit whole."""
        if self.name == "MemAvailable":
            return Limit(self.name, self.used + (self.limit - self.used) // share, self.used)
        if self.name.startswith("cgroup"):
            return Limit(self.name, self.limit // share, self.used // share)
        return self


def _status() -> dict[str, int]:
    """This process's /proc/self/status sizes in bytes (VmRSS, VmHWM, VmSize, VmData)."""
    sizes = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if value.strip().endswith("kB"):
                sizes[key] = int(value.split()[0]) * 1024
    return sizes


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _cgroup_dirs() -> list[tuple[str, Path]]:
    """('v1'|'v2', directory) of this process's memory cgroup and each ancestor's, innermost first."""
    found = []
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            version, base = "v1", CGROUP_ROOT / "memory"
        elif controllers == "" and (CGROUP_ROOT / "cgroup.controllers").exists():
            version, base = "v2", CGROUP_ROOT
        else:
            continue
        here = base / path.lstrip("/")
        while here != base.parent and base in (here, *here.parents):
            found.append((version, here))
            here = here.parent
    return found


def _working_set(version: str, directory: Path) -> int:
    """A cgroup's usage less its inactive page cache, which the kernel reclaims before it kills (the working set
    that Kubernetes compares with the limit)."""
    usage = _read_int(directory / ("memory.usage_in_bytes" if version == "v1" else "memory.current")) or 0
    inactive = 0
    try:
        for line in (directory / "memory.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == ("total_inactive_file" if version == "v1" else "inactive_file"):
                inactive = int(value)
    except OSError:
        pass
    return max(usage - inactive, 0)


def _cgroup_limit(version: str, directory: Path) -> int | None:
    """A cgroup's memory limit in bytes; None where it sets none."""
    limit = _read_int(directory / ("memory.limit_in_bytes" if version == "v1" else "memory.max"))
    return limit if limit is not None and limit < UNLIMITED else None


def cgroup_key() -> str:
    """This machine's boot and the innermost memory cgroup that limits this process (its inode, the same seen
    from any container; 'machine' if none): ranks with the same key share that limit."""
    limiting = next((directory for version, directory in _cgroup_dirs()
                     if _cgroup_limit(version, directory) is not None), None)
    try:
        return f"{boot_id()}:{limiting.stat().st_ino if limiting else 'machine'}"
    except OSError:
        return f"{boot_id()}:{limiting}"


def _available() -> int:
    """MemAvailable: free memory plus what the kernel can reclaim."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def limits(share: int = 1, sizes: dict[str, int] | None = None) -> list[Limit]:
    """Every limit that applies to this rank, `share` ranks of this node sharing the cgroup's and the machine's
    (`sizes`: this process's /proc/self/status sizes, where the caller has read them already)."""
    sizes = _status() if sizes is None else sizes
    rss = sizes.get("VmRSS", 0)
    found = [Limit("MemAvailable", rss + _available(), rss)]
    for version, directory in _cgroup_dirs():
        if (limit := _cgroup_limit(version, directory)) is not None:
            found.append(Limit(f"cgroup {version} limit", limit, _working_set(version, directory)))
    for name, measure in zip(ADDRESS_SPACE, ("VmSize", "VmData"), strict=True):
        soft = resource.getrlimit(getattr(resource, name))[0]
        if soft != resource.RLIM_INFINITY:
            found.append(Limit(name, soft, sizes.get(measure, 0)))
    return [limit.shared(share) for limit in found]


def tightest(share: int = 1, sizes: dict[str, int] | None = None, found: list[Limit] | None = None) -> Limit:
    """The limit with the least headroom left (of `found`, another rank's, where given): the one that ends the
    rank first."""
    return min((limit.shared(share) for limit in found) if found else limits(share, sizes),
               key=lambda limit: limit.headroom)


def memory_report(share: int = 1) -> dict:
    """This rank's memory for its heartbeat: resident size, peak, and its tightest limit with its use of it."""
    sizes = _status()  # read once a sample: for the report and for the limits
    limit = tightest(share, sizes)
    return {"rss": sizes.get("VmRSS", 0), "peak": sizes.get("VmHWM", 0), "limit": limit.limit,
            "limit_used": limit.used, "limit_name": limit.name}


def near_limit(report: dict) -> str | None:
    """'410 of 420 MiB (cgroup v1 limit)' for a memory report at NEAR_LIMIT or above (or NEAR_ADDRESS_SPACE
    from an address space limit); else None."""
    if not report:
        return None
    headroom = report["limit"] - report["limit_used"]
    near = NEAR_ADDRESS_SPACE if report["limit_name"] in ADDRESS_SPACE else 0
    if headroom > max((1 - NEAR_LIMIT) * report["limit"], near):
        return None
    return Limit(report["limit_name"], report["limit"], report["limit_used"]).describe()


def limited(report: dict) -> str | None:
    """'1310 of 1660 MiB (RLIMIT_AS)' for a rank under a limit of its own (not only the machine's free memory)."""
    if not report or report["limit_name"] == "MemAvailable":
        return None
    return Limit(report["limit_name"], report["limit"], report["limit_used"]).describe()


def grew(told: dict, now: dict) -> bool:
    """A rank's use of its limit grew by a tenth of the limit since it last told rank 0: worth telling at once
    (a step's first allocations can end it before the next heartbeat)."""
    return bool(now) and now["limit_used"] - told.get("limit_used", 0) > (1 - NEAR_LIMIT) * now["limit"]


def ran_out_of(error: BaseException) -> str | None:
    """The resource `error` says is exhausted, 'memory', 'threads' or 'open files', or None for any other error
    (TensorFlow's ResourceExhaustedError is a GPU's out of memory or a CPU allocation refused, but also a full disk
    or a quota, which writes.py names). Known by its class's name: `tf.errors` is imported lazily, which a rank out
    of files or memory may be unable to do."""
    exhausted = "ResourceExhaustedError" in (cls.__name__ for cls in type(error).__mro__)
    if isinstance(error, MemoryError) or (exhausted and re.search(r"\bOOM\b|alloc|out of memory", str(error), re.I)):
        return "memory"
    if re.search(MAP_FAILED, str(error)):  # a library's load (ImportError, OSError, TensorFlow's NotFoundError)
        return "memory"
    if isinstance(error, RuntimeError) and "can't start new thread" in str(error):
        return "threads"
    if isinstance(error, OSError) and error.errno in (errno.EMFILE, errno.ENFILE):
        return "open files"
    return None


ADVICE = {
    "memory": "lower --batch-size, or give each rank more memory (the container's, pod's or job's limit)",
    "memory to load": "give each rank more memory (the container's, pod's or job's limit, ulimit -v): TensorFlow's "
                      "and Horovod's libraries alone need it",
    "threads": "raise the limit on processes and threads (ulimit -u, the pids cgroup) or on memory, which each "
               "thread's stack takes from (ulimit -v)",
    "open files": "raise the limit on open files (ulimit -n)",
}


def ran_out(error: BaseException, rank: int | None = None) -> RanOut | None:
    """The one line for an `error` that says a resource ran out, naming the rank (the launcher's, before Horovod
    knows it), the resource and, for memory, the limit it met; None for any other error."""
    what = ran_out_of(error)
    if what is None:
        return None
    if rank is None:
        rank = next((os.environ[name] for name in LAUNCHER_RANKS if name in os.environ), 0)
    where = ""
    if what == "memory":
        with contextlib.suppress(OSError, MemoryError):
            where = f" at {tightest().describe()}"
    advice = ADVICE["memory to load" if re.search(MAP_FAILED, str(error)) else what]
    detail = next((line.strip() for line in str(error).splitlines() if line.startswith("OOM ")), first_line(error))
    return RanOut(f"rank {rank} ran out of {what}{where}: {detail[:200]}; {advice}")
