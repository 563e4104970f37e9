"""Heartbeats between every rank and rank 0 on a side channel, so that a failed or hung collective has a cause.

Horovod cannot say which rank went quiet: under MPI a collective with a stopped peer waits forever, and
under Gloo it fails after Gloo's timeout as if the peer had died. So every rank keeps a TCP connection to
rank 0 and sends its step once a second; rank 0 answers with what it knows: ranks that died (their
connection closed), ranks that stopped answering (connection open, no heartbeat), the reason a rank gave
for failing, and the last good checkpoint. A rank that fails for a reason it can state (no space left on
device, say) sends that reason first, so that the others repeat it instead of guessing. Each heartbeat also
says where the rank's main thread is (whereabouts.py): a rank that answers but has made no progress for
roles.STUCK_AFTER_S is named as stuck, with its frame and whether it waits in a collective. Rank 0 can ask every
rank for a dump of its stacks and flight record (whereabouts.py), which each sends from its own threads, so a
rank whose main thread is stuck still answers.

Rank 0 and the others play different parts behind this interface (roles.py; `for_rank` picks the part); causes.py
puts what they know into the words of the one-line error.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from hvd_mnist.runtime.boot.process import Process
from hvd_mnist.runtime.health.causes import describe
from hvd_mnist.runtime.health.whereabouts import Whereabouts


class RankLiveness(NamedTuple):
    """What rank 0 can tell of one rank from outside: its last step, seconds since it was last heard, and
    seconds since its main thread last made progress (growing while the heartbeat stays fresh: alive but stuck)."""

    step: int
    heartbeat_age: float
    progress_age: float
    memory: dict  # its last resources.memory_report(): resident size, peak, its tightest limit


class Heartbeats:
    """The side channel of one rank, for one world (an elastic reset makes a new one); alone, it knows nothing."""

    def __init__(self, rank: int, size: int, whereabouts: Whereabouts | None = None) -> None:
        self.rank, self.size = rank, size
        self.step = -1  # told by the training loop, through the supervisor (progressed)
        self.whereabouts = whereabouts or Whereabouts()  # the rank's, kept across worlds (elastic resets)
        self.on_dump_request: Callable[[str], None] = lambda why: None  # rank 0: another rank asks for dumps
        self.memory: Callable[[], dict] = dict  # this rank's memory report, sent with each heartbeat
        self._checkpoint: str | None = None
        self._lock = threading.Lock()
        self._stopped = threading.Event()

    def start(self, broadcast: Callable[[object], object]) -> None:
        """A collective: rank 0's offer (address, port, secret) reaches every rank through `broadcast`."""
        if self.size > 1:
            self._begin(broadcast(self._offer()))

    def _offer(self) -> dict | None:
        return None

    def _begin(self, offer: dict) -> None:
        pass

    def stop(self) -> None:
        self._stopped.set()

    def progressed(self, step: int) -> None:
        """The main thread finished `step`."""
        self.step = step
        self.whereabouts.progressed()

    @property
    def checkpoint(self) -> str | None:
        """The last good checkpoint: rank 0's own knowledge, which it tells every rank at once."""
        return self.knowledge().get("checkpoint", self._checkpoint)

    @checkpoint.setter
    def checkpoint(self, path: str | None) -> None:
        self._checkpoint = path
        self._publish()

    def _publish(self) -> None:
        """Tell the others what this rank knows now (rank 0's part)."""

    def knowledge(self) -> dict:
        """What this rank knows of the others: died, silent (and their processes), a stated error, the checkpoint."""
        return {}

    def state_failure(self, message: str) -> None:
        """Tell the others why this rank is about to end."""

    def cause(self, wait: float = 0.0) -> str | None:
        """Why the collectives stopped, as far as this rank knows; waits up to `wait` s for news to arrive."""
        deadline = time.monotonic() + wait
        while True:
            text = describe(self.knowledge())
            if text or time.monotonic() >= deadline:
                return text
            time.sleep(0.2)

    def ranks(self) -> dict[int, RankLiveness]:
        """Each rank this one hears (itself: heard now)."""
        return {self.rank: RankLiveness(self.step, 0.0, self.whereabouts.since_progress(), self.memory())}

    def gather_dumps(self, why: str, wait: float) -> dict[int, str]:
        """Rank 0: every rank's dump that arrives within `wait` s (a stopped or dead rank sends none), its own
        included; alone, only its own."""
        return {self.rank: self.whereabouts.dump(self.rank, why)}

    def ask_for_dumps(self, why: str) -> None:
        """Any rank but 0: ask rank 0 to gather and write every rank's dump."""

    def silent_processes(self) -> list[Process]:
        """The processes of the ranks that stopped answering, as rank 0 describes them."""
        processes = self.knowledge().get("processes", {})
        return [Process(**process) for process in processes.values() if process]
