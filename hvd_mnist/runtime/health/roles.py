"""Rank 0's part of the heartbeats (hear every rank, answer with what it knows) and the others' part (connect,
say who it is, send the step and memory, keep rank 0's answer)."""

from __future__ import annotations

import contextlib
import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from hvd_mnist.runtime.boot.process import Process
from hvd_mnist.runtime.health.heartbeats import Heartbeats, RankLiveness
from hvd_mnist.runtime.health.resources import grew, near_limit
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


def for_rank(rank: int, size: int, local_only: bool = False, whereabouts: Whereabouts | None = None) -> Heartbeats:
    """Rank 0's part, another rank's part, or nothing to do for a world of one.

    `local_only`: every rank runs on this machine, so rank 0 listens on loopback only.
    """
    if size == 1:
        return Heartbeats(rank, size, whereabouts)
    if rank == 0:
        return ChiefHeartbeats(rank, size, local_only, whereabouts)
    return WorkerHeartbeats(rank, size, whereabouts)


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
