"""The training side's one door to the runtime: the Supervisor, and the plain values training holds (World,
RunDir, the start-up phases, `writing`), named in `__all__` (tests/test_layout.py allows no other way in).

The training loop asks it to guard a collective, tells it the step and each good checkpoint, asks whether a
stop was requested, and runs inside its `watching` block, which turns whatever ends the run into one line
that every rank can repeat. Lightning keeps the same machinery in connectors beside its loops.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import horovod.tensorflow as hvd
import tensorflow as tf

from hvd_mnist.errors import RunEnded, StopRequested, WriteFailed, crashed
from hvd_mnist.runtime import faults
from hvd_mnist.runtime.boot.startup import import_keras, phase_done, phases, process_started_at
from hvd_mnist.runtime.health import whereabouts
from hvd_mnist.runtime.health.guard import CollectiveGuard
from hvd_mnist.runtime.health.heartbeats import RankLiveness
from hvd_mnist.runtime.health.resources import Limit, cgroup_key, limits, ran_out, tightest
from hvd_mnist.runtime.health.stopping import StopSignal, describe, first_cause
from hvd_mnist.runtime.storage.rundir import RunDir
from hvd_mnist.runtime.storage.writes import writing
from hvd_mnist.runtime.world.distribution import World, on_chief
from hvd_mnist.runtime.world.elastic import VariablesState, elastic_signal, run_elastic

__all__ = ["Limit", "RankLiveness", "RunDir", "Supervisor", "World", "import_keras", "phase_done", "phases",
           "process_started_at", "writing"]
log = logging.getLogger("hvd_mnist")

T = TypeVar("T")


class Supervisor:
    """Keeps one rank's run alive and explained: the guard on collectives, the heartbeats, signals, faults and
    the run's ending."""

    def __init__(self, collective_timeout: float, elastic: bool) -> None:
        self.elastic = elastic
        self.crash_dir: Path | None = None  # where a traceback goes: the run directory, on rank 0, once it exists
        self.world: World | None = None
        self._guard = CollectiveGuard(collective_timeout, elastic)
        self._stop = StopSignal()
        self._elastic_state: VariablesState | None = None
        threading.excepthook = self._thread_failed

    # --- the session's ends ------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def ending(self) -> Iterator[None]:
        """Whatever the block raises leaves as a RunEnded: ours as they are, anything else as one line with its
        traceback in a file (the run directory's, once there is one)."""
        try:
            yield
        except RunEnded:
            raise
        except Exception as err:
            raise ran_out(err, self.world and self.world.rank) or crashed(err, self.crash_dir) from None

    def _thread_failed(self, args: threading.ExceptHookArgs) -> None:
        """A background thread's exception never prints a traceback: one that ran out (of threads, memory,
        files) ends the rank, its cause told to the others first; any other is logged with its traceback's file."""
        if args.exc_type is SystemExit or args.exc_value is None:
            return
        ended = ran_out(args.exc_value, self.world and self.world.rank)
        if ended is None:
            log.error("thread %s failed: %s", args.thread and args.thread.name, crashed(args.exc_value, self.crash_dir))
            return
        print(f"hvd-mnist: error: {ended}", file=sys.stderr, flush=True)
        self._guard.state(ended)
        os._exit(ended.exit_code)  # the main thread may be blocked in a collective; the checkpoints are whole

    def guarded(self, step: int, what: str, nbytes: int | None = None) -> contextlib.AbstractContextManager[None]:
        """A block of collectives, bounded by --collective-timeout and kept in the flight record (`nbytes`: what
        it allreduces); a failed one ends the run naming the cause, with every rank's stacks in debug/."""
        return self._guard.guarded(step, what, nbytes)

    def memory_limit(self, world: World) -> tuple[int, Limit]:
        """The rank with the least memory left under its tightest limit, and that limit (each rank's share where
        ranks of a node share one cgroup): every rank learns it, so that all refuse a batch that one cannot hold.
        Each rank's heartbeats carry its memory against its share from now on, and the Supervisor serves this
        world (on_chief) from here, the session's first collective."""
        self.world = world
        if self.elastic:  # no collective before hvd.elastic.run: the node's ranks may share one limit
            self._guard.memory_share = world.local_size
            return world.rank, tightest(world.local_size)
        with self.guarded(0, "comparing the ranks' memory limits"):
            ranks = hvd.allgather_object((cgroup_key(), limits()), name="memory_limits")  # each rank's, unshared
        keys = [key for key, _ in ranks]
        self._guard.memory_share = keys.count(keys[world.rank])
        tightest_each = [tightest(keys.count(key), found=found) for key, found in ranks]
        return min(enumerate(tightest_each), key=lambda ranked: ranked[1].headroom)

    def run_dir_known(self, run_dir: RunDir, is_chief: bool) -> None:
        """The run directory exists: rank 0's tracebacks and every rank's dumps go there, and rank 0 answers
        `hvd-mnist debug`."""
        if is_chief:
            self.crash_dir = run_dir.path
        self._guard.dumps_into(run_dir, answers_requests=is_chief)

    @contextlib.contextmanager
    def watching(self, world: World, step: int, checkpoint: str | None) -> Iterator[None]:
        """Training in this world: heartbeats and signal handlers for the block, and its failures made endings.

        A rank that ends for a reason of its own tells the others first, so that they repeat it; in elastic runs
        a failed collective goes to Horovod Elastic instead, which rolls back and goes on with the survivors.
        """
        self.world = world
        self._guard.start_heartbeats(world, step)
        if world.is_chief:
            self._guard.checkpointed(checkpoint)
        self._stop.install(watch_launcher=world.size > 1)
        try:
            yield
        except WriteFailed as err:
            self._guard.state(err)  # the others add the last good checkpoint themselves
            raise WriteFailed(f"{err}{self.last_checkpoint()}; free space and rerun with --resume") from None
        except RunEnded as err:
            self._guard.state(err)
            raise
        except Exception as err:
            if self.elastic and (signal := elastic_signal(err)) is not None:
                raise signal from None
            ended = ran_out(err, world.rank) or crashed(err, self.crash_dir)
            self._guard.state(ended)  # the others repeat this rank's cause instead of "a worker died"
            raise ended from None
        finally:
            self._stop.uninstall()
            self._guard.stop_heartbeats()

    def run_elastic(self, variables: list[tf.Variable], broadcast: Callable[[], None], world: World, run_dir: RunDir,
                    train: Callable[[World], T], on_reset: Callable[[], None]) -> T:
        """Horovod Elastic: `train(world)` after every reset, once the survivors rolled `variables` back to the last
        commit and `broadcast` gave a joining worker rank 0's values; `on_reset` is told of each reset."""
        self._elastic_state = VariablesState(variables, broadcast)
        self._elastic_state.register_reset_callbacks([on_reset])
        return run_elastic(self._elastic_state, world, run_dir, train)

    def commit(self) -> None:
        """An elastic commit: a reset rolls back to here."""
        self._elastic_state.commit()

    def training_done(self) -> None:
        """No stop request can be honoured after the last step: a signal now ends the process as usual."""
        self._stop.uninstall()

    # --- what training tells it --------------------------------------------------------------------------------

    def progress(self, step: int) -> None:
        """This rank reached `step` (the heartbeats carry it to rank 0)."""
        self._guard.progressed(step)

    def checkpointed(self, path: str) -> None:
        """Rank 0 wrote a good checkpoint: every rank can name it from now on if the run fails."""
        self._guard.checkpointed(path)

    def last_checkpoint(self) -> str:
        """'; last good checkpoint: PATH' (or none), the tail of every failure's line."""
        return self._guard.last_checkpoint()

    # --- what training asks it ---------------------------------------------------------------------------------

    def liveness(self) -> tuple[dict[int, RankLiveness], str | None]:
        """For watching from outside (rank 0): each rank's last step, seconds since it was last heard and since
        it last progressed, and the last good checkpoint."""
        return self._guard.liveness()

    def on_chief(self, action: Callable[[], T], name: str) -> T:
        """`action` on rank 0 only, its result or its UserError handed to every rank (HVD: rank 0 writes)."""
        return on_chief(self.world, action, name)

    def weights_digests(self, step: int, digest: str) -> list[str]:
        """Every rank's digest of its weights, which must all be equal after training."""
        with self.guarded(step, "comparing the ranks' weights"):
            return hvd.allgather_object(digest, name="weights_digest")

    @property
    def stop_vote(self) -> float:
        """1.0 once a stop was requested on this rank (averaged over the ranks with the metrics), else 0.0."""
        return self._stop.vote

    def stopped(self, step: int, saved: str) -> StopRequested:
        """The ending of a run that every rank stopped at `step` after a stop request, once rank 0's checkpoint is
        written: a collective, in which the ranks agree on the signal that came first, so that every rank
        reports it and exits with its status (a rank that only heard of it would say SIGTERM)."""
        with self.guarded(step, "agreeing why the ranks stop"):
            requests = hvd.allgather_object(self._stop.request, name="stop_requests")
        signum = first_cause(requests)
        return StopRequested(f"{describe(signum)} at step {step}; {saved}; continue with --resume", 128 + signum,
                             reason=describe(signum))

    def planned_fault(self, point: str) -> int | None:
        """The step at which a fault is injected at `point` on this rank (the reliability tests), or None."""
        return faults.planned_step(point, self.world.rank)

    @property
    def recording(self) -> bool:
        """The flight recorder is on (HVD_MNIST_FLIGHT_RECORDER): each step's allreduce is timed too."""
        return whereabouts.RECORDING

    @staticmethod
    def planned_delay(rank: int) -> float:
        """Seconds of planned slowness in each of `rank`'s steps (HVD_MNIST_FAULT=slow:...; the straggler tests)."""
        return faults.planned_delay(rank)

    def fault(self, point: str, step: int) -> None:
        """Inject the planned fault if it is due here (a real signal to this process, or an exception)."""
        faults.maybe_fault(point, self.world.rank, step, lambda: self._lone_collective(step))

    def _lone_collective(self, step: int) -> None:
        with self.guarded(step, "an allreduce no other rank enters (HVD_MNIST_FAULT)"):
            hvd.allreduce(tf.zeros([1]), name="hvd_mnist_fault_lone")
