"""Liveness: heartbeats between every rank and rank 0 on a side channel, and a watchdog on every collective.

Horovod cannot say which rank went quiet: under MPI a collective with a stopped peer waits forever, and
under Gloo it fails after Gloo's timeout as if the peer had died. So every rank keeps a TCP connection to
rank 0 and sends its step once a second; rank 0 answers with what it knows: ranks that died (their
connection closed), ranks that stopped answering (connection open, no heartbeat), the reason a rank gave
for failing, and the last good checkpoint. A collective that does not return within --collective-timeout
then ends every live rank with one line naming the cause, and a rank that fails for a reason it can state
(no space left on device, say) sends that reason first, so that the others repeat it instead of guessing.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import secrets
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

log = logging.getLogger("hvd_mnist")

HEARTBEAT_S = 1.0
SILENT_AFTER_S = 5.0  # a connected rank without a heartbeat for this long has stopped answering
STATE_WAIT_S = 0.3  # how long a failing rank gives its reason to reach the others
MAX_LINE = 1 << 16
SIOCGIFADDR = 0x8915


@dataclass(frozen=True)
class Process:
    """Who a rank is on its machine, so a peer on the same machine can find it (and only it)."""

    rank: int
    host: str
    boot_id: str
    pid: int
    start_ticks: int

    @classmethod
    def this(cls, rank: int) -> Process:
        return cls(rank, socket.gethostname(), _boot_id(), os.getpid(), _start_ticks(os.getpid()))

    def same_machine(self) -> bool:
        return self.boot_id == _boot_id() and self.host == socket.gethostname()

    def kill(self) -> bool:
        """SIGKILL this process if it runs on this machine and is still the same process; True if done."""
        if not self.same_machine() or _start_ticks(self.pid) != self.start_ticks:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        return True


def _boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id") as handle:
        return handle.read().strip()


def _start_ticks(pid: int) -> int:
    """The process's start time in clock ticks since boot (0 when there is no such process)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0


def local_addresses() -> list[str]:
    """This machine's IPv4 addresses, those of Horovod's chosen interface (HOROVOD_GLOO_IFACE) first, loopback last."""
    preferred = os.environ.get("HOROVOD_GLOO_IFACE")
    found: list[tuple[int, str]] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address on this interface
            address = socket.inet_ntoa(packed[20:24])
            order = 0 if name == preferred else 2 if address.startswith("127.") else 1
            found.append((order, address))
    return [address for _, address in sorted(found)] or ["127.0.0.1"]


@dataclass
class _PeerState:
    """What rank 0 knows of one other rank."""

    process: dict | None = None
    last_heard: float = field(default_factory=time.monotonic)
    step: int = -1
    closed: bool = False
    finished: bool = False  # said goodbye: it ended normally, its closed connection is no death


class _Connection:
    """A TCP connection carrying one JSON object per line, writable from several threads.

    Only the thread that reads it closes its buffered file: closing a buffered reader from another thread
    while it waits in readline deadlocks on the reader's lock. Other threads `shut` the socket, which wakes
    that reader with end-of-file.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.stream = sock.makefile("rwb")
        self.lock = threading.Lock()

    def send(self, message: dict) -> None:
        with self.lock:
            self.stream.write((json.dumps(message) + "\n").encode())
            self.stream.flush()

    def receive(self) -> dict | None:
        """The next message, or None once the other side closed."""
        line = self.stream.readline(MAX_LINE)
        return json.loads(line) if line else None

    def shut(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """By the reading thread, when it is done."""
        self.shut()
        with contextlib.suppress(OSError, ValueError):
            self.stream.close()
        self.sock.close()


class Heartbeats:
    """The side channel of one rank, for one world (an elastic reset makes a new one)."""

    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size = rank, size
        self.step = -1  # set by the training loop
        self._checkpoint: str | None = None
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._secret = ""
        self._listener: socket.socket | None = None
        # rank 0: the other ranks, their connections and the first reason any rank gave for failing
        self._peers: dict[int, _PeerState] = {}
        self._connections: dict[int, _Connection] = {}
        self._error: tuple[int, str] | None = None
        # the other ranks: the connection to rank 0, its last message and when it came
        self._chief: _Connection | None = None
        self._answer: dict = {}
        self._chief_heard = time.monotonic()
        self._chief_closed = False

    # --- set-up (a collective: every rank calls it at the same point) ----------------------------------------

    def start(self, broadcast: Callable[[object], object]) -> None:
        """Rank 0 listens; the address, port and a secret go to every rank through `broadcast`; the others connect."""
        if self.size == 1:
            return
        offer = None
        if self.rank == 0:
            self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind(("0.0.0.0", 0))
            self._listener.listen(self.size)
            offer = {"addresses": local_addresses(), "port": self._listener.getsockname()[1],
                     "secret": secrets.token_hex(16)}
            self._peers = {rank: _PeerState() for rank in range(1, self.size)}
        offer = broadcast(offer)
        self._secret = offer["secret"]
        target, args = (self._serve, ()) if self.rank == 0 else (self._heartbeat, (offer,))
        threading.Thread(target=target, args=args, name="hvd-mnist-heartbeats", daemon=True).start()

    def stop(self) -> None:
        """End the channel; a rank that stops normally says goodbye, so rank 0 does not count it as dead."""
        self._stopped.set()
        if self._chief is not None:
            with contextlib.suppress(OSError, ValueError):
                self._chief.send({"bye": True})
            self._chief.shut()
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
        with self._lock:
            connections = list(self._connections.values())
        for connection in connections:
            connection.shut()

    @property
    def checkpoint(self) -> str | None:
        """The last good checkpoint: rank 0's own knowledge, which it tells every rank at once."""
        return self._checkpoint if self.rank == 0 else self._knowledge().get("checkpoint")

    @checkpoint.setter
    def checkpoint(self, path: str | None) -> None:
        self._checkpoint = path
        self._publish()

    # --- rank 0 --------------------------------------------------------------------------------------------------

    def _serve(self) -> None:
        while not self._stopped.is_set():
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve_one, args=(_Connection(sock),), daemon=True).start()

    def _serve_one(self, connection: _Connection) -> None:
        """One other rank: read its hello and heartbeats, answer each with what rank 0 knows."""
        rank = None
        try:
            hello = connection.receive()
            if not hello or hello.get("secret") != self._secret or hello.get("rank") not in self._peers:
                return
            rank = hello["rank"]
            with self._lock:
                self._peers[rank] = _PeerState(process=hello.get("process"))
                self._connections[rank] = connection
            while (message := connection.receive()) is not None:
                with self._lock:
                    peer = self._peers[rank]
                    peer.finished = peer.finished or bool(message.get("bye"))
                    peer.last_heard, peer.step = time.monotonic(), message.get("step", peer.step)
                    news = bool(message.get("error")) and self._error is None
                    if news:
                        self._error = (rank, message["error"])
                if news:
                    self._publish()
                else:
                    connection.send(self._view())
        except (OSError, ValueError, AttributeError):
            pass
        finally:
            connection.close()
            if rank is not None:
                with self._lock:
                    self._peers[rank].closed = True
                    self._connections.pop(rank, None)

    def _view(self) -> dict:
        """What rank 0 tells every rank: who died, who went silent (and where they run), why, the checkpoint."""
        now = time.monotonic()
        with self._lock:
            died = sorted(rank for rank, peer in self._peers.items() if peer.closed and not peer.finished)
            silent = {rank: round(now - peer.last_heard) for rank, peer in self._peers.items()
                      if not peer.closed and not peer.finished and now - peer.last_heard > SILENT_AFTER_S}
            processes = {rank: self._peers[rank].process for rank in silent}
            return {"died": died, "silent": silent, "processes": processes, "error": self._error,
                    "checkpoint": self._checkpoint}

    def _publish(self) -> None:
        """Rank 0: tell every connected rank now (a new checkpoint, or a reason for failing)."""
        if self.rank != 0:
            return
        view = self._view()
        with self._lock:
            connections = list(self._connections.values())
        for connection in connections:
            with contextlib.suppress(OSError, ValueError):
                connection.send(view)

    # --- the other ranks -----------------------------------------------------------------------------------------

    def _heartbeat(self, offer: dict) -> None:
        """Connect to rank 0 and say who this is; then send the step every second while a reader keeps rank 0's
        messages."""
        sock = self._connect(offer)
        if sock is None:
            self._chief_closed = True
            return
        self._chief = _Connection(sock)
        threading.Thread(target=self._read_chief, name="hvd-mnist-heartbeats-in", daemon=True).start()
        with contextlib.suppress(OSError, ValueError):
            self._chief.send({"secret": self._secret, "rank": self.rank, "process": asdict(Process.this(self.rank))})
            while not self._stopped.wait(HEARTBEAT_S):
                self._chief.send({"step": self.step})

    def _read_chief(self) -> None:
        try:
            while (message := self._chief.receive()) is not None:
                with self._lock:
                    self._answer, self._chief_heard = message, time.monotonic()
        except (OSError, ValueError):
            pass
        finally:
            self._chief.close()
        if not self._stopped.is_set():
            self._chief_closed = True

    @staticmethod
    def _connect(offer: dict) -> socket.socket | None:
        for address in offer["addresses"]:
            try:
                sock = socket.create_connection((address, offer["port"]), timeout=3)
            except OSError:
                continue
            sock.settimeout(None)
            return sock
        return None

    # --- what a rank knows when a collective fails or hangs -------------------------------------------------------

    def _knowledge(self) -> dict:
        if self.size == 1:
            return {}
        if self.rank == 0:
            return self._view()
        with self._lock:
            answer = dict(self._answer)
        quiet = time.monotonic() - self._chief_heard
        if self._chief_closed:
            answer["died"] = [0]
        elif quiet > SILENT_AFTER_S + HEARTBEAT_S:
            answer["silent"] = {0: round(quiet)}
        return answer

    def cause(self, wait: float = 0.0) -> str | None:
        """Why the collectives stopped, as far as this rank knows; waits up to `wait` s for news to arrive."""
        deadline = time.monotonic() + wait
        while True:
            text = describe(self._knowledge())
            if text or time.monotonic() >= deadline:
                return text
            time.sleep(0.2)

    def silent_processes(self) -> list[Process]:
        """The processes of the ranks that stopped answering, as rank 0 describes them."""
        processes = self._knowledge().get("processes", {})
        return [Process(**process) for process in processes.values() if process]

    def state_failure(self, message: str) -> None:
        """Tell the others why this rank is about to end (rank 0 tells everyone at once)."""
        if self.size == 1:
            return
        if self.rank == 0:
            with self._lock:
                self._error = self._error or (0, message)
            self._publish()
        elif self._chief is not None:
            with contextlib.suppress(OSError, ValueError):
                self._chief.send({"step": self.step, "error": message})
        time.sleep(STATE_WAIT_S)  # a moment for the message to travel before this process ends


def describe(known: dict) -> str | None:
    """One phrase for what the heartbeats know: a stated reason beats a death, which beats silence."""
    if known.get("error"):
        rank, message = known["error"]
        return f"rank {rank} failed: {message}"
    if known.get("died"):
        return f"rank(s) {_ranks(known['died'])} died (their connection closed)"
    if known.get("silent"):
        silent = known["silent"]
        seconds = max(silent.values())
        return (f"rank(s) {_ranks(silent)} stopped answering (no heartbeat for {seconds} s: stopped, swapping, "
                "stuck or cut off)")
    return None


def _ranks(ranks) -> str:
    return ", ".join(str(rank) for rank in sorted(int(r) for r in ranks))


class Watchdog:
    """Ends the process when one collective (or the wait for one) takes longer than the timeout.

    A thread of its own, since the main thread is blocked inside Horovod's op, which no Python code can
    interrupt. `on_timeout` decides: it returns True to keep waiting (elastic runs, after killing a stopped
    peer so that Horovod sees it fail) or writes the one-line error, after which the process exits.
    """

    def __init__(self, timeout: float, on_timeout: Callable[[int, str], bool]) -> None:
        self.timeout = timeout
        self._on_timeout = on_timeout
        self._armed: tuple[float, int, str] | None = None
        self._lock = threading.Lock()
        if timeout > 0:
            threading.Thread(target=self._watch, name="hvd-mnist-watchdog", daemon=True).start()

    @contextlib.contextmanager
    def watching(self, step: int, what: str) -> Iterator[None]:
        """Arm the watchdog for the block: it must finish within the timeout."""
        with self._lock:
            self._armed = (time.monotonic(), step, what)
        try:
            yield
        finally:
            with self._lock:
                self._armed = None

    def _watch(self) -> None:
        while True:
            time.sleep(min(1.0, self.timeout / 10))
            with self._lock:
                armed = self._armed
            if armed is None or time.monotonic() - armed[0] < self.timeout:
                continue
            _, step, what = armed
            if self._on_timeout(step, what):
                with self._lock:
                    if self._armed is armed:
                        self._armed = (time.monotonic(), step, what)
                continue
            sys.stderr.flush()
            os._exit(1)
