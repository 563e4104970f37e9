"""A real Slurm cluster on one machine: munged, slurmctld and one slurmd per "node", each node a network namespace
with its own host name and address (scripts/bench/netns.py's NetnsCluster).

Everything lives in two temporary folders, one for Slurm (slurm.conf, state, spool, logs) and one owned by the
munge user (munged refuses to run as root; its key, socket and logs). `close()` cancels every job, stops the
daemons and removes the namespaces and folders, so nothing is left running or on disk. Slurm's commands run on
the first node, where slurmctld listens.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from scripts.bench.netns import ClusterUnavailable, Host, NetnsCluster, stop_all

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "srun")
READY_TIMEOUT_S = 90.0  # a node that died is declared down after SlurmdTimeout (30 s), then comes back
KILL_WAIT_S = 20  # SIGTERM to SIGKILL on cancel, requeue and time-out: long enough for a checkpoint here


def missing_daemons() -> list[str]:
    """Slurm's and munge's programs this machine lacks (scripts/setup_env.sh --dev installs them)."""
    found = [shutil.which(name) or shutil.which(name, path="/usr/sbin") for name in DAEMONS]
    return [name for name, path in zip(DAEMONS, found, strict=True) if path is None]


class SlurmCluster:
    """Build with `start()`, tear down with `close()` (safe after a partial start, and twice)."""

    def __init__(self, workdir: Path, nodes: tuple[str, str] = ("node1", "node2")) -> None:
        self.workdir = workdir
        self.net = NetnsCluster(workdir / "net", names=nodes, subnet="10.201.0")
        self.conf = workdir / "slurm.conf"
        self.munge_dir: Path | None = None
        self._daemons: dict[str, subprocess.Popen] = {}

    @property
    def nodes(self) -> list[Host]:
        return self.net.hosts

    def start(self) -> None:
        """Namespaces, munged, slurmctld, the slurmds; returns when every node is idle."""
        if missing := missing_daemons():
            raise ClusterUnavailable(f"missing {', '.join(missing)} (apt-get install slurm-wlm munge)")
        (self.workdir / "net").mkdir(exist_ok=True)
        self.net.start()
        self._start_munged()
        self._write_conf()
        self._daemons["slurmctld"] = self._spawn(self.nodes[0], "slurmctld",
                                                 ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        for node in self.nodes:
            self._start_slurmd(node)
        self._wait_until_idle()

    def _start_slurmd(self, node: Host) -> None:
        """The node's slurmd, with the node's own TmpFS, as on real nodes (PMIx keeps per-step folders there)."""
        node_tmp = self.workdir / f"tmp.{node.name}"
        node_tmp.mkdir(exist_ok=True)
        own_tmp = ["sh", "-c", 'mount --bind "$0" "$1" && shift && exec "$@"', str(node_tmp), str(self.workdir / "tmp")]
        self._daemons[node.name] = self._spawn(node, f"slurmd.{node.name}",
                                               [*own_tmp, "slurmd", "-D", "-N", node.name, "-f", str(self.conf)])

    def _spawn(self, host: Host, name: str, argv: list[str]) -> subprocess.Popen:
        with (self.workdir / f"{name}.out").open("w") as out:
            return subprocess.Popen(self.net.on_host(host, argv), stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, env=self.env())

    def _start_munged(self) -> None:
        """munged as the munge user, on its own socket and a fresh key, in a folder only munge can write."""
        munge = pwd.getpwnam("munge")
        self.munge_dir = Path(tempfile.mkdtemp(prefix="hvd-mnist-munge-"))
        key = self.munge_dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        for path in (self.munge_dir, key):
            os.chown(path, munge.pw_uid, munge.pw_gid)
        self.munge_dir.chmod(0o711)  # clients reach the socket; only munge writes here
        argv = ["runuser", "-u", "munge", "--", shutil.which("munged", path="/usr/sbin:/usr/bin") or "munged",
                f"--socket={self.munge_socket}", f"--key-file={key}", f"--pid-file={self.munge_dir / 'munged.pid'}",
                f"--log-file={self.munge_dir / 'munged.log'}", f"--seed-file={self.munge_dir / 'munged.seed'}"]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)  # it daemonizes once ready
        if proc.returncode != 0:
            raise RuntimeError(f"munged did not start: {proc.stderr.strip()}")

    @property
    def munge_socket(self) -> Path:
        assert self.munge_dir is not None
        return self.munge_dir / "munge.socket"

    def _write_conf(self) -> None:
        """One partition of every node, 2 CPUs each (the machine's cores, shared), no accounting daemon: each run
        of a job is recorded in a job completion file, which `sacct --completion` reads."""
        work = self.workdir
        for folder in ("state", "tmp", *(f"spool/{node.name}" for node in self.nodes)):
            (work / folder).mkdir(parents=True, exist_ok=True)
        # slurmd loads a cgroup plugin even when nothing is tracked by cgroups; this machine kind has v1's.
        (work / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n")
        controller = self.nodes[0]
        nodes = "".join(f"NodeName={n.name} NodeAddr={n.address} CPUs={os.cpu_count()} State=UNKNOWN\n"
                        for n in self.nodes)
        self.conf.write_text(
            f"ClusterName=hvdtest\nSlurmctldHost={controller.name}({controller.address})\n"
            f"AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket={self.munge_socket}\n"
            "SlurmUser=root\nSlurmdUser=root\n"
            f"StateSaveLocation={work / 'state'}\nSlurmdSpoolDir={work / 'spool'}/%n\n"
            f"SlurmctldPidFile={work}/slurmctld.pid\nSlurmdPidFile={work}/slurmd.%n.pid\n"
            f"TmpFS={work / 'tmp'}\nSlurmctldLogFile={work}/slurmctld.log\nSlurmdLogFile={work}/slurmd.%n.log\n"
            "SlurmctldDebug=info\nSlurmdDebug=info\n"
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nMpiDefault=none\n"
            "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\nSchedulerType=sched/backfill\n"
            "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
            f"JobCompType=jobcomp/filetxt\nJobCompLoc={work / 'jobcomp.log'}\n"
            f"KillWait={KILL_WAIT_S}\nJobRequeue=0\nReturnToService=2\nSlurmdTimeout=30\nMinJobAge=600\n"
            "SchedulerParameters=sched_interval=2\n"
            f"{nodes}PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n")

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        return {**(os.environ if base is None else base), "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        """A Slurm command (sbatch, scontrol, ...) on the first node."""
        proc = subprocess.run(self.net.on_host(self.nodes[0], list(argv)), capture_output=True, text=True,
                              env=self.env(), timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def _wait_until_idle(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            states = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout.split()
            if states.count("idle") == len(self.nodes):
                return
            dead = [name for name, proc in self._daemons.items() if proc.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"Slurm did not come up (sinfo: {' '.join(states)}; exited: {dead})\n"
                                   + self.logs())

    def logs(self) -> str:
        """The tails of the daemons' logs, for a failure's message."""
        parts = []
        for log in sorted(self.workdir.glob("*.log")) + sorted(self.workdir.glob("*.out")):
            parts.append(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:]))
        return "\n".join(parts)

    def sbatch(self, *args: str, cwd: Path) -> int:
        """Submit a batch job from `cwd` (on the first node); its job id."""
        proc = self.run("sh", "-c", 'cd "$0" && exec sbatch --parsable "$@"', str(cwd), *args)
        return int(proc.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """`scontrol show job`'s fields (JobState, Restarts, ExitCode, ...)."""
        text = self.run("scontrol", "show", "job", "-o", str(job_id)).stdout
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def wait_for_job(self, job_id: int, states: set[str], timeout: float) -> dict[str, str]:
        """Poll until the job is in one of `states`; its fields. Fails with the daemons' logs on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            fields = self.job(job_id)
            if fields.get("JobState") in states:
                return fields
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} is {fields.get('JobState')} after {timeout:.0f} s, "
                                     f"not {sorted(states)}\n{self.logs()}")
            time.sleep(0.5)

    def kill_node(self, node: Host) -> None:
        """SIGKILL everything on a node at once (slurmd, slurmstepd, the job's ranks), as when it fails."""
        listed = subprocess.run(["ip", "netns", "pids", node.netns], capture_output=True, text=True, timeout=30)
        for pid in map(int, listed.stdout.split()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._daemons[node.name].wait(timeout=10)

    def revive_node(self, node: Host) -> None:
        """Start a killed node's slurmd again; returns when every node is idle (the node's jobs have ended)."""
        self._start_slurmd(node)
        self._wait_until_idle()

    def processes_on(self, node: Host) -> list[int]:
        """The pids still running in a node's namespace, other than the cluster's daemons."""
        own = {proc.pid for proc in self._daemons.values()}
        listed = subprocess.run(["ip", "netns", "pids", node.netns], capture_output=True, text=True, timeout=30)
        return [pid for pid in map(int, listed.stdout.split()) if pid not in own and not _is_daemon(pid)]

    def close(self) -> None:
        """Cancel every job, stop the daemons, then remove the namespaces (with anything left in them) and munge's
        folder."""
        if self._daemons.get("slurmctld") and self._daemons["slurmctld"].poll() is None:
            subprocess.run(self.net.on_host(self.nodes[0], ["scancel", "--full", "--user=root"]),
                           capture_output=True, env=self.env(), timeout=30)
        stop_all(self._daemons.values(), grace_s=15, killed_s=10)
        self._daemons.clear()
        self.net.close()
        if self.munge_dir is not None:
            pid_file = self.munge_dir / "munged.pid"
            if pid_file.exists():
                subprocess.run(["kill", pid_file.read_text().strip()], capture_output=True, timeout=10)
                deadline = time.monotonic() + 10
                while self.munge_socket.exists() and time.monotonic() < deadline:
                    time.sleep(0.1)
            shutil.rmtree(self.munge_dir, ignore_errors=True)
            self.munge_dir = None


def _is_daemon(pid: int) -> bool:
    """True for the cluster's own daemons (slurmctld's helper slurmscriptd among them), not a job's processes."""
    try:
        name = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return True  # gone meanwhile
    return name in ("slurmd", "slurmctld", "slurmscriptd")
