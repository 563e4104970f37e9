"""Heartbeats between every rank and rank 0 on a side channel, so that a failed or hung collective has a cause.

Horovod cannot say which rank went quiet: under MPI a collective with a stopped peer waits forever, and
under Gloo it fails after Gloo's timeout as if the peer had died. So every rank keeps a TCP connection to
rank 0 and sends its step once a second; rank 0 answers with what it knows: ranks that died (their
connection closed), ranks that stopped answering (connection open, no heartbeat), the reason a rank gave
for failing, and the last good checkpoint. A rank that fails for a reason it can state (no space left on
device, say) sends that reason first, so that the others repeat it instead of guessing. Each heartbeat also
says where the rank's main thread is (whereabouts.py): a rank that answers but has made no progress for
STUCK_AFTER_S is named as stuck, with its frame and whether it waits in a collective. Rank 0 can ask every
rank for a dump of its stacks and flight record (whereabouts.py), which each sends from its own threads, so a
rank whose main thread is stuck still answers.

Rank 0 and the others play different parts behind one interface: `Heartbeats.for_rank` picks the part.
"""

from __future__ import annotations

import contextlib
import hmac
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import NamedTuple

from hvd_mnist.runtime.boot.process import Process
from hvd_mnist.runtime.health.resources import ADDRESS_SPACE, grew, limited, near_limit
from hvd_mnist.runtime.health.transport import (
    HELLO_TIMEOUT_S,
    Connection,
    Listener,
    connect,
    listen_address,
    local_addresses,
)
from hvd_mnist.runtime.health.whereabouts import Whereabouts

HEARTBEAT_S = 1.0
MEMORY_EVERY_S = 0.2  # how often a rank samples its memory (the OOM killer gives no warning)
SILENT_AFTER_S = 5.0  # a connected rank without a heartbeat for this long has stopped answering
STATE_WAIT_S = 0.3  # how long a failing rank gives its reason to reach the others
STUCK_AFTER_S = 10.0  # a rank that answers but has not progressed for this long is stuck


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

    @staticmethod
    def for_rank(rank: int, size: int, local_only: bool = False, whereabouts: Whereabouts | None = None) -> Heartbeats:
        """Rank 0's part, another rank's part, or nothing to do for a world of one.

        `local_only`: every rank runs on this machine, so rank 0 listens on loopback only.
        """
        if size == 1:
            return Heartbeats(rank, size, whereabouts)
        if rank == 0:
            return ChiefHeartbeats(rank, size, local_only, whereabouts)
        return WorkerHeartbeats(rank, size, whereabouts)

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


@dataclass
class _PeerState:
    """What rank 0 knows of one other rank."""

    process: dict | None = None
    last_heard: float = field(default_factory=time.monotonic)
    step: int = -1
    where: dict = field(default_factory=dict)  # its last Whereabouts.report()
    memory: dict = field(default_factory=dict)  # its last memory report
    dump: tuple[int, str] | None = None  # (request number, text): its answer to rank 0's last dump request
    closed: bool = False
    finished: bool = False  # said goodbye: it ended normally, its closed connection is no death

    def progress_age(self, now: float) -> float:
        """Seconds since its main thread last progressed, as of its last heartbeat plus the time since."""
        return self.where.get("since_progress", 0.0) + now - self.last_heard


class ChiefHeartbeats(Heartbeats):
    """Rank 0: listens, hears every other rank, and answers each heartbeat with what it knows."""

    def __init__(self, rank: int, size: int, local_only: bool, whereabouts: Whereabouts | None) -> None:
        super().__init__(rank, size, whereabouts)
        self.local_only = local_only
        self._dump_request: dict = {"number": 0, "why": ""}  # told to every rank; each answers a new number once
        self._secret = secrets.token_hex(16)
        self._listener: Listener | None = None
        self._peers = {other: _PeerState() for other in range(1, size)}
        self._connections: dict[int, Connection] = {}
        self._error: tuple[int, str] | None = None

    def _offer(self) -> dict:
        address = listen_address(self.local_only)
        self._listener = Listener(address)
        addresses = local_addresses() if address == "0.0.0.0" else [address]
        return {"addresses": addresses, "port": self._listener.port, "secret": self._secret}

    def _begin(self, offer: dict) -> None:
        threading.Thread(target=self._listener.serve_forever, args=(self._serve_one,), name="hvd-mnist-heartbeats",
                         daemon=True).start()

    def stop(self) -> None:
        super().stop()
        if self._listener is not None:
            self._listener.close()
        for connection in self._open_connections():
            connection.shut()

    def _serve_one(self, connection: Connection, authenticated: Callable[[], None]) -> None:
        """One connection: a rank's hello within HELLO_TIMEOUT_S, then its heartbeats, each answered."""
        rank = None
        try:
            hello = connection.receive(deadline=time.monotonic() + HELLO_TIMEOUT_S)
            if not self._valid(hello):
                return
            rank = hello["rank"]
            authenticated()
            with self._lock:
                self._peers[rank] = _PeerState(process=hello.get("process"), memory=hello.get("memory") or {})
                self._connections[rank] = connection
            while (message := connection.receive()) is not None:
                if "dump" in message or "dump_all" in message:
                    self._dump_message(rank, message)
                elif self._heard(rank, message):
                    self._publish()
                else:
                    connection.send(self.knowledge())
        except (OSError, ValueError, AttributeError, TypeError):
            pass  # a closed, broken or foreign connection: for a rank, its closing is what counts
        finally:
            connection.close()
            if rank is not None:
                with self._lock:
                    self._peers[rank].closed = True
                    self._connections.pop(rank, None)

    def _valid(self, hello: object) -> bool:
        """A hello from one of this world's ranks: the secret compared in constant time."""
        return (isinstance(hello, dict) and isinstance(hello.get("rank"), int) and hello["rank"] in self._peers
                and hmac.compare_digest(str(hello.get("secret", "")).encode(), self._secret.encode()))

    def _heard(self, rank: int, message: dict) -> bool:
        """Note a heartbeat; True if it carried the first stated error, which every rank must hear now."""
        with self._lock:
            peer = self._peers[rank]
            peer.finished = peer.finished or bool(message.get("bye"))
            peer.last_heard, peer.step = time.monotonic(), message.get("step", peer.step)
            peer.where = {key: message[key] for key in ("since_progress", "waiting_in", "frame") if key in message}
            peer.memory = message.get("memory", peer.memory)
            news = bool(message.get("error")) and self._error is None
            if news:
                self._error = (rank, message["error"])
        return news

    def _dump_message(self, rank: int, message: dict) -> None:
        """A rank's dump, in answer to a request; or a rank's request that rank 0 gather them all."""
        if "dump_all" in message:
            threading.Thread(target=self.on_dump_request, args=(str(message["dump_all"]),), daemon=True).start()
            return
        number, text = message["dump"]
        with self._lock:
            self._peers[rank].dump = (int(number), str(text))

    def gather_dumps(self, why: str, wait: float) -> dict[int, str]:
        with self._lock:
            number = self._dump_request["number"] + 1
            self._dump_request = {"number": number, "why": why}
        self._publish()
        dumps = super().gather_dumps(why, wait)
        deadline = time.monotonic() + wait
        while True:
            with self._lock:
                answered = {rank: peer.dump[1] for rank, peer in self._peers.items()
                            if peer.dump is not None and peer.dump[0] == number}
                waiting = [rank for rank, peer in self._peers.items() if rank not in answered and not peer.closed
                           and time.monotonic() - peer.last_heard <= SILENT_AFTER_S]
            if not waiting or time.monotonic() >= deadline:
                return {**dumps, **answered}
            time.sleep(0.05)

    def knowledge(self) -> dict:
        now = time.monotonic()
        with self._lock:
            died = sorted(rank for rank, peer in self._peers.items() if peer.closed and not peer.finished)
            silent = {rank: round(now - peer.last_heard) for rank, peer in self._peers.items()
                      if not peer.closed and not peer.finished and now - peer.last_heard > SILENT_AFTER_S}
            processes = {rank: self._peers[rank].process for rank in silent}
            memory = {rank: self._peers[rank].memory for rank in died if self._peers[rank].memory}
            places = {rank: {**peer.where, "since_progress": peer.progress_age(now)}
                      for rank, peer in self._peers.items()
                      if "since_progress" in peer.where and rank not in silent and not peer.closed}
        if self.whereabouts.since_progress() > STUCK_AFTER_S:  # its frame costs a stack walk: only when it counts
            places[self.rank] = self.whereabouts.report()
        stuck = {rank: {**place, "since_progress": round(place["since_progress"])} for rank, place in places.items()
                 if place["since_progress"] > STUCK_AFTER_S}
        return {"died": died, "last_memory": memory, "silent": silent, "processes": processes, "stuck": stuck,
                "error": self._error, "checkpoint": self._checkpoint, "dump": self._dump_request}

    def ranks(self) -> dict[int, RankLiveness]:
        now = time.monotonic()
        with self._lock:
            heard = {rank: RankLiveness(peer.step, now - peer.last_heard, peer.progress_age(now), peer.memory)
                     for rank, peer in self._peers.items()}
        return {**super().ranks(), **heard}

    def _open_connections(self) -> list[Connection]:
        with self._lock:
            return list(self._connections.values())

    def _publish(self) -> None:
        """Tell every connected rank now (a new checkpoint, or a reason for failing)."""
        view = self.knowledge()
        for connection in self._open_connections():
            with contextlib.suppress(OSError, ValueError):
                connection.send(view)

    def state_failure(self, message: str) -> None:
        with self._lock:
            self._error = self._error or (0, message)
        self._publish()
        time.sleep(STATE_WAIT_S)  # a moment for the message to travel before this process ends


class WorkerHeartbeats(Heartbeats):
    """Any rank but 0: connects to rank 0, sends its step every second, keeps rank 0's latest answer."""

    def __init__(self, rank: int, size: int, whereabouts: Whereabouts | None) -> None:
        super().__init__(rank, size, whereabouts)
        self._chief: Connection | None = None
        self._dumped = 0  # the last dump request answered
        self._answer: dict = {}
        self._chief_heard = time.monotonic()
        self._chief_closed = False

    def _begin(self, offer: dict) -> None:
        threading.Thread(target=self._heartbeat, args=(offer,), name="hvd-mnist-heartbeats", daemon=True).start()

    def _heartbeat(self, offer: dict) -> None:
        """Connect and say who this is; then send the step every second while a reader keeps the answers."""
        self._chief = connect(offer["addresses"], offer["port"])
        if self._chief is None:
            self._chief_closed = True
            return
        with contextlib.suppress(OSError, ValueError):
            self._chief.send({"secret": offer["secret"], "rank": self.rank, "process": asdict(Process.this(self.rank)),
                              "memory": self.memory()})
            threading.Thread(target=self._read_chief, name="hvd-mnist-heartbeats-in", daemon=True).start()
            sent, memory, told = time.monotonic(), {}, {}
            while not self._stopped.wait(MEMORY_EVERY_S):  # near its limit, each sample goes: it may be the last
                with contextlib.suppress(OSError, MemoryError):  # out of files or memory: the last sample stands
                    memory = self.memory()
                if time.monotonic() - sent >= HEARTBEAT_S or near_limit(memory) or grew(told, memory):
                    self._chief.send({"step": self.step, **self.whereabouts.report(), "memory": memory})
                    sent, told = time.monotonic(), memory

    def _read_chief(self) -> None:
        try:
            while (message := self._chief.receive()) is not None:
                with self._lock:
                    self._answer, self._chief_heard = message, time.monotonic()
                request = message.get("dump") or {"number": 0}
                if request["number"] > self._dumped:  # answered from this thread: the main one may be stuck
                    self._dumped = request["number"]
                    self._chief.send({"dump": [request["number"], self.whereabouts.dump(self.rank, request["why"])]})
        except (OSError, ValueError):
            pass
        finally:
            self._chief.close()
        if not self._stopped.is_set():
            self._chief_closed = True

    def stop(self) -> None:
        """A rank that stops normally says goodbye, so that rank 0 does not count it as dead."""
        super().stop()
        if self._chief is not None:
            with contextlib.suppress(OSError, ValueError):
                self._chief.send({"bye": True})
            self._chief.shut()

    def knowledge(self) -> dict:
        with self._lock:
            answer = dict(self._answer)
        quiet = time.monotonic() - self._chief_heard
        if self._chief_closed:
            answer["died"] = [0]
        elif quiet > SILENT_AFTER_S + HEARTBEAT_S:
            answer["silent"] = {0: round(quiet)}
        return answer

    def ask_for_dumps(self, why: str) -> None:
        if self._chief is not None:
            with contextlib.suppress(OSError, ValueError):
                self._chief.send({"dump_all": why})

    def state_failure(self, message: str) -> None:
        if self._chief is not None:
            with contextlib.suppress(OSError, ValueError):
                self._chief.send({"step": self.step, "error": message})
        time.sleep(STATE_WAIT_S)  # a moment for the message to travel before this process ends


def describe(known: dict) -> str | None:
    """One phrase for what the heartbeats know: a stated reason beats a death, which beats silence."""
    if known.get("error"):
        rank, message = known["error"]
        return message if message.startswith(f"rank {rank} ") else f"rank {rank} failed: {message}"
    if known.get("died"):
        return died_phrase(known["died"], known.get("last_memory") or {})
    if known.get("silent"):
        silent = known["silent"]
        seconds = max(silent.values())
        return (f"rank(s) {_ranks(silent)} stopped answering (no heartbeat for {seconds} s: stopped, swapping, "
                "stuck or cut off)")
    if known.get("stuck"):
        return stuck_phrase(known["stuck"])
    return None


# A rank near a cgroup's or the machine's limit meets the OOM killer; near its address space, an allocation fails
# in native code, which may end the process without a word (an abort, a segmentation fault).
OUT_OF = {False: "killed for memory", True: "out of address space"}


def died_phrase(died: list, memory: dict) -> str:
    """Ranks whose connection closed; one last heard near its memory limit was most likely the OOM killer's (or
    out of address space), and one under a limit of its own is named with where it stood."""
    memory = {int(rank): report for rank, report in memory.items()}  # JSON made the keys strings on the way
    phrases, others = [], []
    for rank in died:
        if near := near_limit(memory.get(rank, {})):
            why = OUT_OF[memory[rank]["limit_name"] in ADDRESS_SPACE]
            phrases.append(f"rank {rank} died at {near}: most likely {why}")
        elif stood := limited(memory.get(rank, {})):
            phrases.append(f"rank {rank} died (its connection closed), last heard at {stood}")
        else:
            others.append(rank)
    if others:
        phrases.append(f"rank(s) {_ranks(others)} died (their connection closed)")
    return "; ".join(phrases)


def stuck_phrase(stuck: dict) -> str:
    """Ranks that answer but do not progress: those outside any collective are the likely cause; if every one
    waits in a collective, the job waits on itself: in different ones, each is named (a collective that the
    ranks did not all enter, the classic hang of data-parallel code)."""
    outside = {rank: place for rank, place in stuck.items() if not place.get("waiting_in")}
    blocks = {place.get("waiting_in") for place in stuck.values()}
    if not outside and len(blocks) > 1:
        seconds = max(place["since_progress"] for place in stuck.values())
        each = ", ".join(f"rank {rank} in {stuck[rank]['waiting_in']}" for rank in sorted(stuck, key=int))
        return (f"rank(s) {_ranks(stuck)} alive but stuck for {seconds} s, each in a different collective: {each} "
                "(a collective that not every rank entered)")
    named = outside or stuck
    rank, place = max(named.items(), key=lambda item: item[1]["since_progress"])
    where = f"in {place.get('frame') or 'an unknown frame'}"
    waiting = "not in a collective" if not place.get("waiting_in") else f"waiting in {place['waiting_in']}"
    return (f"rank(s) {_ranks(named)} alive but stuck for {place['since_progress']} s, rank {rank} {where} "
            f"({waiting})")


def _ranks(ranks: Iterable) -> str:
    return ", ".join(str(rank) for rank in sorted(int(r) for r in ranks))
