"""A throwaway cluster of "hosts" on one machine, for the shaped-link benchmark and the multi-host and Slurm tests:
a network namespace per host, all on one bridge in a namespace of its own, each host's sending side held to a rate
by `tc ... tbf` where asked (this kernel has no `netem`: no delay or loss can be added).

Every host has one interface named `hvd0` (the same name on every host, as Horovod wants a common interface), its
own address and, through a UTS namespace, its own host name. `ip netns exec` bind-mounts /etc/netns/<namespace>/hosts
over /etc/hosts, so the host names resolve inside the namespaces and nowhere else. Launchers run on the first host
(`exec_argv`) and reach the others through an `ssh` first on PATH (`env`): with `start(sshd=True)` the real ssh with
a throwaway key, to an sshd on port 22 of each host; otherwise a script that runs the command in that host's
namespace instead of logging in. Traffic only ever flows between addresses inside these namespaces.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

SSHD = "/usr/sbin/sshd"
INTERFACE = "hvd0"
SSH_WAIT_S = 20.0
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
_clusters = itertools.count()  # namespace names unique to each cluster of this process


class ClusterUnavailable(RuntimeError):
    """This machine cannot build the cluster (no privileges, missing tools); the reason is the message."""


@dataclass(frozen=True)
class Host:
    """One simulated machine."""

    name: str
    address: str
    netns: str


def run(*argv: str) -> subprocess.CompletedProcess:
    """Run a short administrative command; raise with its stderr if it fails."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def stop_all(procs: Iterable[subprocess.Popen], grace_s: float, killed_s: float = 5) -> None:
    """SIGTERM every process that still runs, then SIGKILL each one that has not ended within `grace_s` (and wait
    `killed_s` for it)."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=killed_s)


class NetnsCluster:
    """Build with `start()`, tear down with `close()` (safe to call after a partial start, and twice).

    `rate_mbit` shapes every host's sending side (None: unshaped); `queue_ms` is tbf's `latency`, the longest a
    packet may wait in the queue before it is dropped: a short queue on a slow link drops packets under a burst.
    """

    def __init__(self, workdir: Path, names: Sequence[str] = ("hostA", "hostB"), subnet: str = "10.200.0",
                 rate_mbit: float | None = None, queue_ms: float = 10_000) -> None:
        self.prefix = f"hvd{os.getpid()}n{next(_clusters)}"
        self.switch = f"{self.prefix}sw"
        self.workdir = workdir
        self.hosts = [Host(name, f"{subnet}.{i + 1}", f"{self.prefix}{name}") for i, name in enumerate(names)]
        self.rate_mbit = rate_mbit
        self.queue_ms = queue_ms
        self.bin_dir = workdir / "bin"
        self._created: list[str] = []
        self._sshd: dict[str, subprocess.Popen] = {}

    def start(self, sshd: bool = False) -> None:
        """Namespaces, bridge, links, addresses and the `ssh` (with `sshd`: keys and an sshd on every host); raise
        ClusterUnavailable where impossible."""
        if os.geteuid() != 0:
            raise ClusterUnavailable("needs root (CAP_NET_ADMIN) to create network namespaces")
        if missing := self.missing_tools(sshd):
            raise ClusterUnavailable(f"missing {', '.join(missing)}")
        for netns in (self.switch, *(host.netns for host in self.hosts)):
            proc = subprocess.run(["ip", "netns", "add", netns], capture_output=True, text=True, timeout=30)
            if proc.returncode != 0:
                raise ClusterUnavailable(f"`ip netns add` failed: {proc.stderr.strip()}")
            self._created.append(netns)
        run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        run("ip", "-n", self.switch, "link", "set", "br0", "up")
        etc_hosts = "127.0.0.1 localhost\n" + "".join(f"{h.address} {h.name}\n" for h in self.hosts)
        for index, host in enumerate(self.hosts):
            self._attach(index, host)
            etc = Path("/etc/netns") / host.netns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(etc_hosts)
        self.bin_dir.mkdir(parents=True, exist_ok=True)
        if not sshd:
            self._write_ssh(SSH_WRAPPER.format(prefix=self.prefix))
            return
        self._write_ssh_files()
        for host in self.hosts:
            self._start_sshd(host)
        for host in self.hosts:
            self._wait_for_ssh(host)

    def missing_tools(self, sshd: bool) -> list[str]:
        """The programs this cluster needs that this machine lacks."""
        tools = ("ip", "unshare", *(("tc",) if self.rate_mbit else ()), *(("ssh", "ssh-keygen") if sshd else ()))
        missing = [tool for tool in tools if shutil.which(tool) is None]
        return [*missing, f"{SSHD} (openssh-server)"] if sshd and not os.access(SSHD, os.X_OK) else missing

    def _attach(self, index: int, host: Host) -> None:
        """A veth pair from the host to the bridge, the host's end named INTERFACE, addressed, up and shaped."""
        port = f"p{index}"
        run("ip", "-n", host.netns, "link", "add", INTERFACE, "type", "veth", "peer", "name", port, "netns",
            self.switch)
        run("ip", "-n", self.switch, "link", "set", port, "master", "br0", "up")
        run("ip", "-n", host.netns, "addr", "add", f"{host.address}/24", "dev", INTERFACE)
        run("ip", "-n", host.netns, "link", "set", INTERFACE, "up")
        run("ip", "-n", host.netns, "link", "set", "lo", "up")
        if self.rate_mbit is not None:
            # At least 128 KB: a veth hands tbf segmentation-offload packets of up to 64 KB, and tbf drops any
            # packet larger than its bucket. 4 ms of traffic on fast links.
            burst = max(128_000, int(self.rate_mbit * 1e6 / 8 / 250))
            run("tc", "-n", host.netns, "qdisc", "add", "dev", INTERFACE, "root", "tbf", "rate",
                f"{self.rate_mbit}mbit", "burst", str(burst), "latency", f"{self.queue_ms:g}ms")

    def _write_ssh(self, script: str) -> None:
        wrapper = self.bin_dir / "ssh"
        wrapper.write_text(script)
        wrapper.chmod(0o755)

    def _write_ssh_files(self) -> None:
        """Client key, host key, authorized_keys, client config and the `ssh` that uses them."""
        key, host_key = self.workdir / "id_ed25519", self.workdir / "ssh_host_ed25519_key"
        for path in (key, host_key):
            run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hvd-mnist-test", "-f", str(path))
        (self.workdir / "authorized_keys").write_text(key.with_suffix(".pub").read_text())
        (self.workdir / "ssh_config").write_text(
            "Host *\n"
            f"  IdentityFile {key}\n  IdentitiesOnly yes\n  BatchMode yes\n  ConnectTimeout 10\n"
            "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  GlobalKnownHostsFile /dev/null\n"
            "  LogLevel ERROR\n")
        self._write_ssh(f'#!/bin/sh\nexec {shutil.which("ssh")} -F {self.workdir / "ssh_config"} "$@"\n')

    def _start_sshd(self, host: Host) -> None:
        """sshd in the foreground inside the host's namespace, listening on its address only."""
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation folder
        config = self.workdir / f"sshd_config.{host.name}"
        config.write_text(
            f"ListenAddress {host.address}\nPort 22\nHostKey {self.workdir / 'ssh_host_ed25519_key'}\n"
            f"AuthorizedKeysFile {self.workdir / 'authorized_keys'}\nPidFile {self.workdir}/sshd.{host.name}.pid\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "UsePAM no\nStrictModes no\nLogLevel INFO\n")
        self._sshd[host.name] = subprocess.Popen(
            self.on_host(host, [SSHD, "-D", "-f", str(config), "-E", str(self.sshd_log(host))]),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _wait_for_ssh(self, host: Host) -> None:
        """Poll `ssh HOST true` from the first host until it succeeds; fail with sshd's log if it never does."""
        deadline = time.monotonic() + SSH_WAIT_S
        while True:
            proc = subprocess.run(self.exec_argv(["ssh", host.name, "true"]), env=self.env(dict(os.environ)),
                                  capture_output=True, text=True, timeout=SSH_WAIT_S)
            if proc.returncode == 0:
                return
            if time.monotonic() > deadline or self._sshd[host.name].poll() is not None:
                log = self.sshd_log(host).read_text() if self.sshd_log(host).exists() else ""
                raise RuntimeError(f"ssh to {host.name} failed: {proc.stderr.strip()}\nsshd log:\n{log}")
            time.sleep(0.3)

    def sshd_log(self, host: Host) -> Path:
        return self.workdir / f"sshd.{host.name}.log"

    def host_spec(self, slots: int = 1) -> str:
        """`-H` argument for horovodrun and mpirun: every host with `slots` slots."""
        return ",".join(f"{h.name}:{slots}" for h in self.hosts)

    @staticmethod
    def on_host(host: Host, argv: list[str]) -> list[str]:
        """argv that runs `argv` in the host's network namespace under the host's name (each step execs)."""
        set_name = 'hostname "$0" && exec "$@"'
        return ["ip", "netns", "exec", host.netns, "unshare", "--uts", "sh", "-c", set_name, host.name, *argv]

    def exec_argv(self, argv: list[str]) -> list[str]:
        """argv that runs `argv` on the first host (where launchers start)."""
        return self.on_host(self.hosts[0], argv)

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """`base` with the `ssh` first on PATH."""
        return {**base, "PATH": f"{self.bin_dir}{os.pathsep}{base.get('PATH', '')}"}

    def close(self) -> None:
        """Stop sshd and every process left in the namespaces, delete them and their /etc/netns files."""
        stop_all(self._sshd.values(), grace_s=5)
        self._sshd.clear()
        for netns in self._created:
            remove_namespace(netns)
        self._created.clear()


def remove_namespace(namespace: str) -> None:
    """SIGTERM, then SIGKILL, what still runs in a network namespace (stray ranks), then delete it and its
    /etc/netns files."""
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
