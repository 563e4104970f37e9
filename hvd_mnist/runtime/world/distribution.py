"""Distribution set-up: start Horovod (through mpi4py under mpirun), pin one device per process."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import socket
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf

from hvd_mnist.errors import UserError
from hvd_mnist.runtime.boot import native_lines
from hvd_mnist.runtime.boot.startup import gpus_quietly

# Where Linux lists RDMA devices (InfiniBand, Omni-Path, EFA, RoCE): what Open MPI's cm layer would use.
FABRIC_DEVICES = "/sys/class/infiniband"


@dataclass(frozen=True)
class World:
    """This process's place in the job."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    controller: str
    device: str

    @property
    def is_chief(self) -> bool:
        return self.rank == 0

    def refreshed(self) -> World:
        """The same process after an elastic reset: new rank and size, same device."""
        return dataclasses.replace(self, rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(),
                                   local_size=hvd.local_size())


def launched_by_plain_mpirun() -> bool:
    """True under `mpirun` (or `horovodrun --mpi`), false under `horovodrun --gloo` or a bare `python`."""
    mpi_env = any(key in os.environ for key in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"))
    return mpi_env and os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR") is None


def init_horovod() -> str:
    """Start Horovod; under MPI hand it mpi4py's COMM_WORLD so both share one MPI communicator.

    Sharing COMM_WORLD lets code written with mpi4py (e.g. site-specific barriers or gathers)
    run beside Horovod in the same job without a second MPI initialization. Horovod's own log lines go to the
    rank's dump from here on, not to the console (native_lines.py).
    """
    native_lines.start()
    if launched_by_plain_mpirun() and hvd.mpi_built():
        open_mpi_defaults(os.environ)
        from mpi4py import MPI

        hvd.init(comm=MPI.COMM_WORLD)
        return "mpi"
    hvd.init()  # HVD: one process per device (examples/custom_loop.py names each step of the pattern so)
    return "mpi" if hvd.mpi_enabled() else "gloo"


def open_mpi_defaults(environ: MutableMapping[str, str]) -> None:
    """Open MPI's settings for a rank, each only where the user set none (a list of transports to exclude is
    extended).

    It yields the core while it waits: its busy polling in Horovod's per-cycle coordination otherwise takes CPU
    from the compute threads. On a machine with no InfiniBand, Omni-Path or EFA device it skips the layers that
    only drive those fabrics, whose probes find nothing (docs/benchmark.md):
    - the `cm` messaging layer (0.2 s of every MPI_Init here; the layer chosen, ob1, is the same);
    - the `ofi` transport, where a list of transports to exclude leaves it in: horovodrun's `-mca btl ^openib`
      replaces Debian's default `^uct,openib,ofi`, and libfabric's probe then took 0.3 s of every MPI_Init.
    """
    environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    if any(Path(FABRIC_DEVICES).glob("*")):
        return
    environ.setdefault("OMPI_MCA_pml", "^cm")
    excluded = environ.get("OMPI_MCA_btl", "")
    if excluded.startswith("^") and "ofi" not in excluded[1:].split(","):
        environ["OMPI_MCA_btl"] = f"{excluded},ofi"


def bind_to_cores(local_rank: int, local_size: int) -> list[int] | None:
    """Move every thread of this process onto its local rank's share of the cores; returns that share.

    Only when the launcher left each rank free on every core (horovodrun, mpirun --bind-to none);
    a binding made by mpirun, Slurm or a cpuset is kept as it is (returns None). Threads started
    later inherit the share, so ranks no longer preempt each other's compute threads.
    """
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < (os.cpu_count() or 1) or local_size > len(allowed):
        return None
    per_rank = len(allowed) // local_size
    share = allowed[local_rank * per_rank:(local_rank + 1) * per_rank]
    for thread in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(thread), share)
    return share


def pin_device(local_rank: int, local_size: int, bind_cpus: bool = True) -> str:
    """One GPU per process by local rank, with memory growth; on CPU, split the cores between ranks.

    `bind_cpus` also binds each rank to its share of the cores (see bind_to_cores).
    """
    gpus = gpus_quietly()
    if gpus:  # HVD: pin each process to its own GPU by its rank on this host
        gpu = gpus[local_rank % len(gpus)]
        tf.config.set_visible_devices(gpu, "GPU")
        tf.config.experimental.set_memory_growth(gpu, True)
        return f"GPU:{local_rank % len(gpus)}"
    cores = bind_to_cores(local_rank, local_size) if bind_cpus else None
    threads = len(cores) if cores else max(1, len(os.sched_getaffinity(0)) // local_size)
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, threads)))
    return f"CPU ({threads} threads" + (f", cores {cores[0]}-{cores[-1]})" if cores else ")")


def slurm_tasks_on_node(tasks_per_node: str, node_id: int) -> int:
    """The task count of node `node_id` in Slurm's SLURM_STEP_TASKS_PER_NODE notation, e.g. "2(x3),1"."""
    counts: list[int] = []
    for count, repeat in re.findall(r"(\d+)(?:\(x(\d+)\))?", tasks_per_node):
        counts += [int(count)] * int(repeat or 1)
    return counts[node_id]


def local_slot() -> tuple[int, int]:
    """(this rank's index on its node, the ranks on its node), by which it takes a device.

    Under `srun` with one task per rank, Slurm's own placement (SLURM_LOCALID): it is what
    --gpus-per-node and --ntasks-per-node were given for, and it holds where MPI cannot tell nodes
    apart. Anywhere else Horovod's, also under mpirun inside an allocation, whose ranks inherit the
    SLURM_LOCALID of the one daemon srun started per node.
    """
    env = os.environ
    if "SLURM_LOCALID" in env and env.get("SLURM_STEP_NUM_TASKS") == str(hvd.size()):
        with contextlib.suppress(ValueError, IndexError, KeyError):
            tasks = slurm_tasks_on_node(env["SLURM_STEP_TASKS_PER_NODE"], int(env.get("SLURM_NODEID", "0")))
            return int(env["SLURM_LOCALID"]), tasks
    return hvd.local_rank(), hvd.local_size()


def setup_world(bind_cpus: bool = True) -> World:
    """Initialize Horovod and pin this process's device; call before TensorFlow runs any op."""
    controller = init_horovod()
    local_rank, local_size = local_slot()
    device = pin_device(local_rank, local_size, bind_cpus)
    return World(hvd.rank(), hvd.size(), local_rank, local_size, controller, device)


def placement(world: World, elastic: bool) -> str:
    """Which device each rank took, on which host, for rank 0's start-up line (one rank's in elastic runs,
    where no collective may come before hvd.elastic.run)."""
    mine = (world.rank, socket.gethostname(), world.device)
    ranks = [mine] if elastic else hvd.allgather_object(mine, name="placement")
    return "; ".join(f"rank {rank} on {host}: {device}" for rank, host, device in ranks)


def on_chief(world: World, action: Callable[[], Any], name: str) -> Any:
    """Run `action` on rank 0 only and hand its result, or its UserError, to every rank (HVD: rank 0 writes).

    Without this, a check that fails on rank 0 alone (say, an unwritable output directory) would
    leave the other ranks waiting forever in their next collective operation.
    """
    outcome = None
    if world.is_chief:
        try:
            outcome = (None, action())
        except UserError as err:
            outcome = (str(err), None)
    error, value = hvd.broadcast_object(outcome, root_rank=0, name=name)
    if error is not None:
        raise UserError(error)
    return value
