"""A throwaway cluster of "hosts" on one machine: network namespaces joined by a veth pair, sshd in each.

Every host is a network namespace with one interface named `hvd0` (the same name on every host, as Horovod
wants a common interface), its own address in 10.200.0.0/24 and, through a UTS namespace, its own host name.
`ip netns exec` bind-mounts /etc/netns/<namespace>/hosts over /etc/hosts, so the host names resolve inside the
namespaces and nowhere else. Each host runs its own sshd on port 22, accepting only a throwaway key. Launchers
started with `exec_argv` on the first host find, first on PATH, an `ssh` wrapper that uses that key and writes
no known_hosts file.
Traffic only ever flows between addresses inside these namespaces.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from bench.links import remove_namespace
from helpers import sshd_privsep_dir

SSHD = "/usr/sbin/sshd"
INTERFACE = "hvd0"
SSH_WAIT_S = 20.0


class ClusterUnavailable(Exception):
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


def missing_tools() -> list[str]:
    """The programs the cluster needs that this machine lacks."""
    missing = [tool for tool in ("ip", "unshare", "ssh", "ssh-keygen") if shutil.which(tool) is None]
    return missing if os.access(SSHD, os.X_OK) else [*missing, f"{SSHD} (openssh-server)"]


class NetnsCluster:
    """Build with `start()`, tear down with `close()` (safe to call after a partial start, and twice)."""

    def __init__(self, workdir: Path, names: tuple[str, str] = ("hostA", "hostB"), subnet: str = "10.200.0") -> None:
        tag = f"hvdt{os.getpid()}"
        self.workdir = workdir
        self.hosts = [Host(name, f"{subnet}.{i + 1}", f"{tag}h{i}") for i, name in enumerate(names)]
        self.veth = (f"{tag}va", f"{tag}vb")
        self.bin_dir = workdir / "bin"
        self._created: list[str] = []
        self._sshd: dict[str, subprocess.Popen] = {}

    def start(self, ssh: bool = True) -> None:
        """Create namespaces, link, addresses and (with `ssh`) keys and sshds; raise ClusterUnavailable where
        impossible."""
        if os.geteuid() != 0:
            raise ClusterUnavailable("needs root (CAP_NET_ADMIN) to create network namespaces")
        if missing := missing_tools():
            raise ClusterUnavailable(f"missing {', '.join(missing)}")
        for host in self.hosts:
            proc = subprocess.run(["ip", "netns", "add", host.netns], capture_output=True, text=True, timeout=30)
            if proc.returncode != 0:
                raise ClusterUnavailable(f"`ip netns add` failed: {proc.stderr.strip()}")
            self._created.append(host.netns)
        self._link()
        if not ssh:
            return
        self._write_ssh_files()
        for host in self.hosts:
            self._start_sshd(host)
        for host in self.hosts:
            self._wait_for_ssh(host)

    def _link(self) -> None:
        """One veth pair between the two namespaces, both ends renamed to INTERFACE, addresses up."""
        run("ip", "link", "add", self.veth[0], "type", "veth", "peer", "name", self.veth[1])
        for host, end in zip(self.hosts, self.veth, strict=True):
            run("ip", "link", "set", end, "netns", host.netns)
            run("ip", "-n", host.netns, "link", "set", end, "name", INTERFACE)
            run("ip", "-n", host.netns, "addr", "add", f"{host.address}/24", "dev", INTERFACE)
            run("ip", "-n", host.netns, "link", "set", INTERFACE, "up")
            run("ip", "-n", host.netns, "link", "set", "lo", "up")
        etc_hosts = "127.0.0.1 localhost\n" + "".join(f"{h.address} {h.name}\n" for h in self.hosts)
        for host in self.hosts:
            etc = Path("/etc/netns") / host.netns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(etc_hosts)

    def _write_ssh_files(self) -> None:
        """Client key, host key, authorized_keys, client config and the `ssh` wrapper."""
        key, host_key = self.workdir / "id_ed25519", self.workdir / "ssh_host_ed25519_key"
        for path in (key, host_key):
            run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hvd-mnist-test", "-f", str(path))
        (self.workdir / "authorized_keys").write_text(key.with_suffix(".pub").read_text())
        (self.workdir / "ssh_config").write_text(
            "Host *\n"
            f"  IdentityFile {key}\n  IdentitiesOnly yes\n  BatchMode yes\n  ConnectTimeout 10\n"
            "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  GlobalKnownHostsFile /dev/null\n"
            "  LogLevel ERROR\n")
        self.bin_dir.mkdir(exist_ok=True)
        wrapper = self.bin_dir / "ssh"
        wrapper.write_text(f'#!/bin/sh\nexec {shutil.which("ssh")} -F {self.workdir / "ssh_config"} "$@"\n')
        wrapper.chmod(0o755)

    def _start_sshd(self, host: Host) -> None:
        """sshd in the foreground inside the host's namespace, listening on its address only."""
        sshd_privsep_dir()
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
        """`base` with the ssh wrapper first on PATH."""
        return {**base, "PATH": f"{self.bin_dir}{os.pathsep}{base.get('PATH', '')}"}

    def close(self) -> None:
        """Stop sshd and every process left in the namespaces, delete them and their /etc/netns files."""
        for proc in self._sshd.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self._sshd.values():
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        for netns in self._created:
            remove_namespace(netns)
        self._created.clear()
        self._sshd.clear()
        # The peer end disappears with its namespace; the root-namespace end exists only after a failed move.
        subprocess.run(["ip", "link", "del", self.veth[0]], capture_output=True, timeout=30)
