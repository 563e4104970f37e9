"""N "hosts" on one machine with real, shaped links between them: a network namespace per host, all joined by a
bridge in a namespace of its own, each host's link limited to a rate by `tc ... tbf` on its sending side.

This kernel has no `netem`, so no delay or loss can be added: the latency between hosts is the bridge's own.
Launchers run on host 0 and reach the others through an `ssh` that is a script first on PATH: it runs the
command in that host's namespace (under the host's name) instead of logging in, so horovodrun and mpirun work
unchanged and nothing needs sshd. Traffic flows only between addresses inside these namespaces.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

INTERFACE = "hvd0"  # the same name on every host, as Horovod wants a common interface
SUBNET = "10.210.0"
SSH_WRAPPER = """#!/bin/sh
# `ssh [OPTIONS] HOST [OPTIONS] COMMAND...` as mpirun and horovodrun call it (horovodrun puts -p, -i and -o
# after the host): COMMAND runs in HOST's network namespace.
host=""
while [ $# -gt 0 ]; do
  case "$1" in
    -o|-p|-i|-l|-F|-E) shift 2 ;;
    -*) shift ;;
    *) if [ -n "$host" ]; then break; fi; host="$1"; shift ;;
  esac
done
exec ip netns exec "{prefix}$host" unshare --uts sh -c 'hostname "$0" && eval "$1"' "$host" "$*"
"""


class LinksUnavailable(RuntimeError):
    """This machine cannot make the namespaces or shape the links (not root, no tc); the reason is the message."""


def _run(*argv: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")


class ShapedHosts:
    """`start()` builds the hosts, `close()` removes everything (safe after a partial start, and twice).

    `rate_mbit` shapes every host's sending side (None: unshaped); `queue_ms` is tbf's `latency`, the longest a
    packet may wait in the queue before it is dropped: a short queue on a slow link drops packets under a burst.
    """

    def __init__(self, n: int, workdir: Path, rate_mbit: float | None = None, queue_ms: float = 10_000) -> None:
        self.names = [f"h{i}" for i in range(n)]
        self.prefix = f"hvdl{os.getpid()}"
        self.switch = f"{self.prefix}sw"
        self.workdir = workdir
        self.rate_mbit = rate_mbit
        self.queue_ms = queue_ms
        self.bin_dir = workdir / "bin"
        self._namespaces: list[str] = []

    def namespace(self, host: str) -> str:
        return f"{self.prefix}{host}"

    def address(self, index: int) -> str:
        return f"{SUBNET}.{index + 1}"

    def start(self) -> None:
        if os.geteuid() != 0:
            raise LinksUnavailable("needs root (CAP_NET_ADMIN) to create network namespaces")
        if missing := [tool for tool in ("ip", "tc", "unshare") if shutil.which(tool) is None]:
            raise LinksUnavailable(f"missing {', '.join(missing)}")
        for namespace in (self.switch, *map(self.namespace, self.names)):
            _run("ip", "netns", "add", namespace)
            self._namespaces.append(namespace)
        _run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.switch, "link", "set", "br0", "up")
        hosts_file = "127.0.0.1 localhost\n" + "".join(f"{self.address(i)} {name}\n"
                                                         for i, name in enumerate(self.names))
        for index, host in enumerate(self.names):
            self._attach(index, host)
            etc = Path("/etc/netns") / self.namespace(host)
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts_file)
        self.bin_dir.mkdir(parents=True, exist_ok=True)
        wrapper = self.bin_dir / "ssh"
        wrapper.write_text(SSH_WRAPPER.format(prefix=self.prefix))
        wrapper.chmod(0o755)

    def _attach(self, index: int, host: str) -> None:
        """A veth pair from the host to the bridge, the host's end named INTERFACE, addressed, up and shaped."""
        namespace, port = self.namespace(host), f"p{index}"
        _run("ip", "-n", namespace, "link", "add", INTERFACE, "type", "veth", "peer", "name", port,
             "netns", self.switch)
        _run("ip", "-n", self.switch, "link", "set", port, "master", "br0", "up")
        _run("ip", "-n", namespace, "addr", "add", f"{self.address(index)}/24", "dev", INTERFACE)
        _run("ip", "-n", namespace, "link", "set", INTERFACE, "up")
        _run("ip", "-n", namespace, "link", "set", "lo", "up")
        if self.rate_mbit is not None:
            # At least 128 KB: a veth hands tbf segmentation-offload packets of up to 64 KB, and tbf drops any
            # packet larger than its bucket. 4 ms of traffic on fast links.
            burst = max(128_000, int(self.rate_mbit * 1e6 / 8 / 250))
            _run("tc", "-n", namespace, "qdisc", "add", "dev", INTERFACE, "root", "tbf", "rate",
                 f"{self.rate_mbit}mbit", "burst", str(burst), "latency", f"{self.queue_ms:g}ms")

    def on_host(self, index: int, argv: list[str]) -> list[str]:
        """argv that runs `argv` on host `index` (its namespace, under its name)."""
        host = self.names[index]
        return ["ip", "netns", "exec", self.namespace(host), "unshare", "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', host, *argv]

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """`base` with the ssh wrapper first on PATH."""
        return {**base, "PATH": f"{self.bin_dir}{os.pathsep}{base.get('PATH', '')}"}

    def host_spec(self) -> str:
        """`-H` for horovodrun and mpirun: one slot per host."""
        return ",".join(f"{name}:1" for name in self.names)

    def close(self) -> None:
        """Kill what still runs in the namespaces, then delete them and their /etc/netns files."""
        for namespace in self._namespaces:
            remove_namespace(namespace)
        self._namespaces.clear()


def remove_namespace(namespace: str) -> None:
    """SIGTERM, then SIGKILL, what still runs in a network namespace (stray ranks), then delete it and its
    /etc/netns files. The tests' clusters end theirs this way too."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        listed = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True, timeout=30)
        pids = [int(pid) for pid in listed.stdout.split()]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        time.sleep(0.5)
    subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=30)
    shutil.rmtree(Path("/etc/netns") / namespace, ignore_errors=True)
