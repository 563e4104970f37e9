"""scripts/slurm.sbatch on a real Slurm cluster (tests/slurm_cluster.py): two nodes, one rank each, started by
`srun --mpi=pmix`; a requeue, the time-limit warning, the time limit itself, scancel and a node that dies.

The interrupted jobs must end with the same weights as the uninterrupted one: that is the bit-exact resume
guarantee (test_checkpoints.py), here carried across Slurm's requeue.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from helpers import ROOT, launcher_env, read_metrics, started, wait_for, wait_for_step
from slurm_cluster import KILL_WAIT_S, SlurmCluster

from hvd_mnist.runtime.world.distribution import slurm_tasks_on_node

pytestmark = pytest.mark.slow

SBATCH = str(ROOT / "scripts" / "slurm.sbatch")
CPU_NODES = ("--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=0", "--cpus-per-task=1")
STEPS = 1500
LONG_STEPS = 30000  # 130 s or more on a fast day here (10,000 once finished in 45 s): past 60 s, the latest that
# Slurm ends a job with a 30-second limit
TRAIN = ("--checkpoint-every", "100", "--log-every", "100")
JOB_TIMEOUT_S = 300
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"}


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A controller and two slurmd nodes; torn down, with everything they ran, after the module."""
    with pytest.MonkeyPatch.context() as patch:  # sbatch exports the environment to the job; undone after the module
        for name, value in {**launcher_env(), "HVD_MNIST_PYTHON": sys.executable}.items():
            patch.setenv(name, value)
        with started(SlurmCluster(tmp_path_factory.mktemp("slurm")), "a Slurm cluster") as cluster:
            yield cluster


class Job:
    """One submission of scripts/slurm.sbatch from its own folder."""

    def __init__(self, slurm: SlurmCluster, folder: Path, *options: str, steps: int = STEPS) -> None:
        self.slurm = slurm
        self.id = slurm.sbatch(*CPU_NODES, *options, SBATCH, *TRAIN, "--steps", str(steps), cwd=folder)
        self.run_dir = folder / "runs" / f"slurm-{self.id}"
        self.output = folder / f"hvd-mnist-{self.id}.out"

    def wait(self, states: set[str] = ENDED) -> dict[str, str]:
        return self.slurm.wait_for_job(self.id, states, JOB_TIMEOUT_S)

    def finish(self) -> dict[str, str]:
        """Wait for the job's end through its requeues. Slurm holds a requeued job for two minutes (its
        BeginTime); that hold is lifted here (StartTime=now), as a user in a hurry would, once the first run's
        processes are gone from both nodes (a step started sooner finds the old one's PMIx socket in use)."""
        while True:
            fields = self.wait(ENDED | {"PENDING"})
            if fields["JobState"] != "PENDING":
                return fields
            wait_for(lambda: not any(self.slurm.processes_on(node) for node in self.slurm.nodes), 60,
                     "the first run's processes to end")
            self.slurm.run("scontrol", "update", f"JobId={self.id}", "StartTime=now")
            self.wait(ENDED | {"RUNNING"})

    def log(self) -> str:
        return self.output.read_text(errors="replace") if self.output.exists() else ""

    def final_weights(self, steps: int = STEPS) -> str:
        """The one weights hash every rank reported at the end (and that they agree)."""
        end = read_metrics(self.run_dir)[-1]
        assert end["event"] == "end" and end["step"] == steps, self.log()[-3000:]
        assert len(end["weights_sha256"]) == 2 and len(set(end["weights_sha256"])) == 1
        return end["weights_sha256"][0]


@pytest.fixture(scope="module")
def uninterrupted(slurm, tmp_path_factory) -> str:
    """The final weights of a job that nothing interrupted."""
    job = Job(slurm, tmp_path_factory.mktemp("uninterrupted"))
    fields = job.wait()
    assert fields["JobState"] == "COMPLETED", job.log()[-3000:]
    return job.final_weights()


def resumed_at_the_stop_step(job: Job) -> int:
    """The step at which the job's first run stopped; checks that it logged the stop and that the second run
    started from that step's checkpoint."""
    events = read_metrics(job.run_dir)
    stops = [e["step"] for e in events if e["event"] == "stopped"]
    starts = [e["start_step"] for e in events if e["event"] == "start"]
    assert stops and starts == [0, stops[0]], job.log()[-3000:]
    assert f"resumed from {job.run_dir.relative_to(job.run_dir.parents[1])}/checkpoints/ckpt-{stops[0]}" in job.log()
    return stops[0]


def test_sbatch_trains_on_two_nodes(slurm, uninterrupted, tmp_path):
    """srun places one rank on each node; each pins its device by SLURM_LOCALID, and the weights agree."""
    job = Job(slurm, tmp_path)
    assert job.wait()["JobState"] == "COMPLETED", job.log()[-3000:]
    log = job.log()
    assert "2 rank(s) over mpi; rank 0 on node1: CPU" in log and "rank 1 on node2: CPU" in log, log[-3000:]
    assert job.final_weights() == uninterrupted  # and the same as another job: the run is deterministic


def test_requeue_resumes_from_the_stop_step(slurm, uninterrupted, tmp_path):
    """`scontrol requeue` (what preemption with PreemptMode=REQUEUE does): SIGTERM, a checkpoint at the stop
    step, and the requeued job resumes from it by itself."""
    job = Job(slurm, tmp_path)
    wait_for_step(job.run_dir, 300, JOB_TIMEOUT_S)
    slurm.run("scontrol", "requeue", str(job.id))
    fields = job.finish()
    assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "1", job.log()[-3000:]
    assert 300 <= resumed_at_the_stop_step(job) < STEPS
    assert f"resuming {job.run_dir.relative_to(tmp_path)}" in job.log()
    assert job.final_weights() == uninterrupted
    # Two runs of one job in Slurm's job completion records (jobcomp/filetxt logs a requeued run as PENDING).
    runs = slurm.run("sacct", "--completion", "-j", str(job.id), "-n", "-P", "-o", "JobID,State").stdout.split()
    assert runs == [f"{job.id}|PENDING", f"{job.id}|COMPLETED"], runs


def test_time_limit_warning_checkpoints_and_requeues(slurm, uninterrupted, tmp_path):
    """--signal=B:USR1@120 in the script: Slurm signals the batch shell before the time limit. Delivered here
    the way slurmctld does (to the batch shell only), so that the test does not wait for Slurm's 30-second
    time-limit sweep; the next test hits a real limit."""
    job = Job(slurm, tmp_path)
    wait_for_step(job.run_dir, 300, JOB_TIMEOUT_S)
    slurm.run("scancel", "--batch", "--signal=USR1", str(job.id))
    fields = job.finish()
    assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "1", job.log()[-3000:]
    assert "near its time limit: stopping at a checkpoint, then requeueing" in job.log()
    assert 300 <= resumed_at_the_stop_step(job) < STEPS
    assert job.final_weights() == uninterrupted


def test_a_job_at_its_time_limit_checkpoints_and_requeues_itself(slurm, tmp_path):
    """A run longer than --time=0:30 gets the warning from Slurm itself, at its limit (`@1`: Slurm's time-limit
    sweep runs every 30 s, so the script's 120-s lead would come at once): it checkpoints, requeues itself, and,
    given a longer limit for its second run, finishes from the stop step."""
    job = Job(slurm, tmp_path, "--time=0:30", "--signal=B:USR1@1", steps=LONG_STEPS)
    job.wait(ENDED | {"RUNNING"})
    fields = job.wait(ENDED | {"PENDING"})
    assert fields["JobState"] == "PENDING" and fields["Restarts"] == "1", job.log()[-3000:]
    slurm.run("scontrol", "update", f"JobId={job.id}", "TimeLimit=10")
    fields = job.finish()
    assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "1", job.log()[-3000:]
    assert "near its time limit: stopping at a checkpoint, then requeueing" in job.log()
    assert 0 < resumed_at_the_stop_step(job) < LONG_STEPS
    job.final_weights(LONG_STEPS)


def test_scancel_stops_every_rank_with_a_checkpoint(slurm, tmp_path):
    """scancel: SIGTERM to every rank, KillWait, SIGKILL. The ranks stop at a checkpoint within KillWait, say
    so in one line, and the job is not requeued; nothing stays on either node."""
    job = Job(slurm, tmp_path)
    wait_for_step(job.run_dir, 300, JOB_TIMEOUT_S)
    slurm.run("scancel", str(job.id))
    fields = job.wait()
    assert fields["JobState"] == "CANCELLED" and fields["Restarts"] == "0"
    step = next(e["step"] for e in read_metrics(job.run_dir) if e["event"] == "stopped")
    assert (job.run_dir / "checkpoints" / f"ckpt-{step}.index").exists()
    log = job.log()
    assert f" at step {step}; " in log and "stopped:" in log and "Traceback" not in log, log[-3000:]
    wait_for(lambda: not any(slurm.processes_on(node) for node in slurm.nodes), KILL_WAIT_S + 10,
             "the job's processes to end on both nodes")


def test_a_node_that_dies_ends_the_job_with_one_line(slurm, tmp_path):
    """Everything on node2 is killed at once (slurmd, slurmstepd, the rank): the rank on node1, blocked in an
    MPI allreduce that never fails by itself, ends within the watchdog's grace with the one line that names
    the dead rank, and nothing is left running on node1. node2 is brought back for the tests that follow."""
    job = Job(slurm, tmp_path, "--no-requeue")
    wait_for_step(job.run_dir, 300, JOB_TIMEOUT_S)
    node1, node2 = slurm.nodes
    try:
        slurm.kill_node(node2)
        died = re.compile(r"^hvd-mnist: error: collective failed after step \d+: rank\(s\) 1 died \(their "
                          r"connection closed\); stacks in runs/slurm-\d+/debug/; last good checkpoint: "
                          r"runs/slurm-\d+/checkpoints/ckpt-\d+; rerun with --resume$", re.M)
        wait_for(lambda: died.search(job.log()), 60, "the one-line error on node1")
        wait_for(lambda: not slurm.processes_on(node1), KILL_WAIT_S + 30, "the job's processes to end on node1")
    finally:
        slurm.revive_node(node2)
    log = job.log()
    assert "Traceback" not in log, log[-3000:]
    assert not [pid for pid in slurm.processes_on(node2)], "node2 still runs something"


def test_slurm_task_counts_are_read_per_node():
    """SLURM_STEP_TASKS_PER_NODE's compact form, as srun sets it for uneven layouts."""
    assert [slurm_tasks_on_node("2(x3),1", node) for node in range(4)] == [2, 2, 2, 1]
    assert slurm_tasks_on_node("4", 0) == 4 and slurm_tasks_on_node("1,3", 1) == 3
