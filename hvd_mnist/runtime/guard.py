"""Every blocking collective of a rank runs under a guard: bounded in time, and explained in one line if it fails."""

from __future__ import annotations

import contextlib
import logging
import re
import sys
from collections.abc import Iterator

import horovod.tensorflow as hvd
import tensorflow as tf

from hvd_mnist.errors import RunEnded, StopRequested, WorkerLost
from hvd_mnist.runtime.distribution import World
from hvd_mnist.runtime.heartbeats import Heartbeats
from hvd_mnist.runtime.watchdog import Watchdog

log = logging.getLogger("hvd_mnist")
CAUSE_WAIT_S = 3.0  # after a failed collective, how long to wait for the heartbeats to tell why


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
        self.heartbeats = Heartbeats.for_rank(0, 1)  # alone until a world starts its side channel
        self.watchdog = Watchdog(timeout, self._timed_out, self._peer_gone)

    def start_heartbeats(self, world: World, step: int) -> None:
        """A new side channel for this world (a collective: every rank calls it at the same point)."""
        self.heartbeats = Heartbeats.for_rank(world.rank, world.size, local_only=world.local_size == world.size)
        with self.guarded(step, "starting the heartbeats"):
            self.heartbeats.start(lambda offer: hvd.broadcast_object(offer, root_rank=0, name="heartbeats"))

    def stop_heartbeats(self) -> None:
        self.heartbeats.stop()

    @contextlib.contextmanager
    def guarded(self, step: int, what: str) -> Iterator[None]:
        """A block of collectives: bounded by the timeout; a failed one becomes WorkerLost with its cause
        (elastic runs leave the failure to Horovod, which rolls back and goes on with the survivors)."""
        with self.watchdog.watching(step, what):
            try:
                yield
            except tf.errors.OpError as err:
                if self.elastic:
                    raise
                cause = self.heartbeats.cause(wait=CAUSE_WAIT_S) or link_failure(err.message)
                raise WorkerLost(self._failed(step, cause)) from None

    def state(self, error: RunEnded) -> None:
        """Before this rank ends for a reason of its own, tell the others (a consequence is not a reason)."""
        if not isinstance(error, WorkerLost | StopRequested):
            self.heartbeats.state_failure(str(error))

    def last_checkpoint(self) -> str:
        return f"; last good checkpoint: {self.heartbeats.checkpoint or 'none'}"

    def _failed(self, step: int, cause: str | None) -> str:
        """The one line for a collective that failed, or that the watchdog gave up on, for `cause`."""
        return f"collective failed after step {step}: {cause}{self.last_checkpoint()}; rerun with --resume"

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
        print(f"hvd-mnist: error: no progress for {self.timeout:.0f} s ({what} after step {step}): "
              f"{self.heartbeats.cause() or 'a rank stopped answering'}{self.last_checkpoint()}; rerun with --resume",
              file=sys.stderr, flush=True)
        return False
