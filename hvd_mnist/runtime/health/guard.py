"""Every blocking collective of a rank runs under a guard: bounded in time, and explained in one line if it fails."""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import threading
import time
from collections.abc import Iterator

import horovod.tensorflow as hvd
import tensorflow as tf

from hvd_mnist.errors import RunEnded, StopRequested, WorkerLost
from hvd_mnist.runtime.health.dumps import watch_requests, write_dumps
from hvd_mnist.runtime.health.heartbeats import RankLiveness
from hvd_mnist.runtime.health.resources import memory_report, ran_out_of
from hvd_mnist.runtime.health.roles import for_rank
from hvd_mnist.runtime.health.watchdog import Watchdog
from hvd_mnist.runtime.health.whereabouts import Whereabouts
from hvd_mnist.runtime.storage.rundir import RunDir
from hvd_mnist.runtime.world.distribution import World

log = logging.getLogger("hvd_mnist")
CAUSE_WAIT_S = 3.0  # after a failed collective, how long to wait for the heartbeats to tell why
DUMP_WAIT_S = 3.0  # how long rank 0 waits for the other ranks' dumps


def link_failure(message: str) -> str:
    """The cause of a failed collective that no heartbeat explains: no rank is known to have died, so the
    connection the transport names (Gloo's "Read error [ADDRESS]:PORT: REASON") is what failed: a link that
    drops, blocks or cannot carry the ranks' traffic (a firewall, a partition, a traffic shaper whose bucket
    is smaller than a packet, which drops every large one)."""
    found = re.search(r"\b(Read|Write|Connect)\w* (error|timeout) \[?([\w.:-]+?)\]?:(\d+)(?:: ([^\n\]]+))?", message)
    if found is None:
        return "a worker died or is unreachable"
    verb, kind, host, port, reason = found.groups()
    what = f"{verb.lower()} {kind}" + (f": {reason.strip().lower()}" if reason else "")
    return (f"the connection to {host}:{port} failed ({what}) and no rank is known to have died: the network "
            "between the ranks drops or blocks their traffic")


class CollectiveGuard:
    """The watchdog and the heartbeats of one rank, and the one-line messages made from them.

    `--collective-timeout` bounds each guarded block: a hung peer ends every live rank with the cause (or,
    in elastic runs, a stopped peer on this machine is killed so that Horovod Elastic treats it as lost).
    """

    def __init__(self, timeout: float, elastic: bool) -> None:
        self.timeout = timeout
        self.elastic = elastic
        self.whereabouts = Whereabouts()
        self.heartbeats = for_rank(0, 1, whereabouts=self.whereabouts)  # alone until a world starts
        self.watchdog = Watchdog(timeout, self._timed_out, self._peer_gone)
        self.run_dir: RunDir | None = None  # where the dumps go (debug/), once every rank knows it
        self.memory_share = 1  # how many ranks share this rank's memory limit (its cgroup's, the machine's)
        self._dumping = threading.Lock()  # one gathering at a time: the watchdog's, a request's, another rank's

    def start_heartbeats(self, world: World, step: int) -> None:
        """A new side channel for this world (a collective: every rank calls it at the same point)."""
        self.heartbeats = for_rank(world.rank, world.size, local_only=world.local_size == world.size,
                                              whereabouts=self.whereabouts)
        self.heartbeats.on_dump_request = self.dump
        self.heartbeats.memory = lambda: memory_report(self.memory_share)
        with self.guarded(step, "starting the heartbeats"):
            self.heartbeats.start(lambda offer: hvd.broadcast_object(offer, root_rank=0, name="heartbeats"))

    def stop_heartbeats(self) -> None:
        self.heartbeats.stop()

    def dumps_into(self, run_dir: RunDir, answers_requests: bool) -> None:
        """Dumps go to `run_dir`'s debug/ from now on; rank 0 (`answers_requests`) also answers `hvd-mnist debug`."""
        self.run_dir = run_dir
        if answers_requests:
            watch_requests(run_dir, self.dump)

    def dump(self, why: str) -> str:
        """Every rank's stacks and flight record into debug/, gathered by rank 0 (another rank asks it to, or,
        where rank 0 died or stopped answering, writes its own); the tail of the one-line error that says where
        they are ('' before there is a run directory)."""
        if self.run_dir is None:
            return ""
        known = self.heartbeats.knowledge()
        chief_lost = 0 in known.get("died", []) or 0 in known.get("silent", {})
        if self.heartbeats.rank != 0 and not chief_lost:
            self.heartbeats.ask_for_dumps(why)
            time.sleep(DUMP_WAIT_S)  # for rank 0 to gather this rank's dump too, before this process ends
            return f"; stacks in {self.run_dir.debug}/"
        with self._dumping:
            failed = write_dumps(self.run_dir.debug, self.heartbeats.gather_dumps(why, DUMP_WAIT_S))
        if failed:
            return f"; could not write stacks to {self.run_dir.debug}/: {failed.lower()}"
        return f"; stacks in {self.run_dir.debug}/"

    @contextlib.contextmanager
    def guarded(self, step: int, what: str, nbytes: int | None = None) -> Iterator[None]:
        """A block of collectives: bounded by the timeout and kept in the flight record (`nbytes`: what it
        allreduces, where known); a failed one becomes WorkerLost with its cause (elastic runs leave the failure
        to Horovod, which rolls back and goes on with the survivors)."""
        with self.whereabouts.within(step, what, nbytes), self.watchdog.watching(step, what):
            try:
                yield
            except tf.errors.OpError as err:
                if self.elastic or ran_out_of(err):  # this rank ran out: its own cause, not a collective's
                    raise
                cause = self.heartbeats.cause(wait=CAUSE_WAIT_S) or link_failure(err.message)
                raise WorkerLost(self._failed(step, cause)) from None

    def state(self, error: RunEnded) -> None:
        """Before this rank ends for a reason of its own, tell the others (a consequence is not a reason)."""
        if not isinstance(error, WorkerLost | StopRequested):
            self.heartbeats.state_failure(str(error))

    def checkpointed(self, path: str | None) -> None:
        """Rank 0's last good checkpoint, which every rank names if the run fails."""
        self.heartbeats.checkpoint = path

    def liveness(self) -> tuple[dict[int, RankLiveness], str | None]:
        return self.heartbeats.ranks(), self.heartbeats.checkpoint

    def progressed(self, step: int) -> None:
        self.heartbeats.progressed(step)

    def last_checkpoint(self) -> str:
        return f"; last good checkpoint: {self.heartbeats.checkpoint or 'none'}"

    def _failed(self, step: int, cause: str | None) -> str:
        """The one line for a collective that failed, or that the watchdog gave up on, for `cause`."""
        dumped = self.dump(f"collective failed after step {step}: {cause}") if self.heartbeats.rank == 0 else ""
        return f"collective failed after step {step}: {cause}{dumped}{self.last_checkpoint()}; rerun with --resume"

    def _peer_gone(self) -> bool:
        """A peer died or said it is ending: a collective waiting for it cannot finish (elastic runs leave that
        to Horovod, which goes on without it)."""
        known = self.heartbeats.knowledge()
        return not self.elastic and bool(known.get("died") or known.get("error"))

    def _timed_out(self, step: int, what: str, waited: float) -> bool:
        """The watchdog fired: kill stopped peers here in elastic runs (True: keep waiting), else say why."""
        if waited < self.timeout:  # a peer is gone: the collective would fail, given a working error path
            print(f"hvd-mnist: error: {self._failed(step, self.heartbeats.cause())}", file=sys.stderr, flush=True)
            return False
        if self.elastic:
            killed = [process.rank for process in self.heartbeats.silent_processes() if process.kill()]
            if killed:
                log.warning("rank(s) %s stopped answering for %.0f s; killed, so that the others go on without "
                            "them", ", ".join(map(str, killed)), self.timeout)
                return True
        line = (f"no progress for {self.timeout:.0f} s ({what} after step {step}): "
                f"{self.heartbeats.cause() or 'a rank stopped answering'}")
        print(f"hvd-mnist: error: {line}{self.dump(line)}{self.last_checkpoint()}; rerun with --resume",
              file=sys.stderr, flush=True)
        return False
