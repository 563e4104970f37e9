"""The heartbeats' transport: TCP connections carrying one JSON object per line, and a listener that strangers
on the network cannot make hold threads or connections without bound."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import struct
import threading
import time
from collections.abc import Callable

MAX_LINE = 1 << 16  # a heartbeat or a view is a few hundred bytes
HELLO_TIMEOUT_S = 5.0  # an accepted connection that sends no valid hello within this is closed
MAX_UNAUTHENTICATED = 8  # connections held at once before their hello; more are closed on accept
SIOCGIFADDR = 0x8915


def interface_address(name: str) -> str | None:
    """The IPv4 address of a network interface, or None if it has none (or no such interface)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            packed = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def local_addresses() -> list[str]:
    """This machine's IPv4 addresses, those of Horovod's chosen interface (HOROVOD_GLOO_IFACE) first, loopback last."""
    preferred = os.environ.get("HOROVOD_GLOO_IFACE")
    found = []
    for _, name in socket.if_nameindex():
        address = interface_address(name)
        if address is not None:
            found.append((0 if name == preferred else 2 if address.startswith("127.") else 1, address))
    return [address for _, address in sorted(found)] or ["127.0.0.1"]


def listen_address(local_only: bool) -> str:
    """Where rank 0 listens: loopback when every rank runs on this machine, else the interface Horovod uses
    (HOROVOD_GLOO_IFACE, set by horovodrun) where known, else every interface."""
    if local_only:
        return "127.0.0.1"
    iface = os.environ.get("HOROVOD_GLOO_IFACE")
    return (interface_address(iface) if iface else None) or "0.0.0.0"


class Connection:
    """One JSON object per line over a socket, writable from several threads.

    Lines are cut from its own buffer, not a buffered file, so that a read can have a deadline and another
    thread can wake a blocked reader by shutting the socket.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buffer = b""
        self._send_lock = threading.Lock()

    def send(self, message: dict) -> None:
        data = (json.dumps(message) + "\n").encode()
        with self._send_lock:
            self.sock.sendall(data)

    def receive(self, deadline: float | None = None) -> dict | None:
        """The next message, or None once the other side closed; TimeoutError past `deadline` (monotonic),
        ValueError for a line that is too long or not JSON."""
        while b"\n" not in self._buffer:
            if len(self._buffer) > MAX_LINE:
                raise ValueError("line too long")
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError("no complete line in time")
                self.sock.settimeout(remaining)
            chunk = self.sock.recv(MAX_LINE)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def authenticated(self) -> None:
        """Past the hello: reads block again, with no deadline."""
        self.sock.settimeout(None)

    def shut(self) -> None:
        """Wake whoever reads or writes it, from any thread."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.shut()
        self.sock.close()


def connect(addresses: list[str], port: int) -> Connection | None:
    """A connection to the first of the addresses that answers (3 s each), or None."""
    for address in addresses:
        try:
            sock = socket.create_connection((address, port), timeout=3)
        except OSError:
            continue
        sock.settimeout(None)
        return Connection(sock)
    return None


class Listener:
    """Accepts connections and hands each to `serve` on a thread of its own, holding at most
    MAX_UNAUTHENTICATED of them before `serve` declares them authenticated; the rest are closed at once."""

    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((address, 0))
        self.sock.listen(socket.SOMAXCONN)  # a short queue would let a burst of strangers delay the ranks' connect
        self._unauthenticated = threading.BoundedSemaphore(MAX_UNAUTHENTICATED)

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]

    def serve_forever(self, serve: Callable[[Connection, Callable[[], None]], None]) -> None:
        """Until closed: `serve(connection, authenticated)` for each connection; `serve` calls `authenticated()`
        once the hello checked out, and the connection no longer counts against the cap."""
        while True:
            try:
                sock, _ = self.sock.accept()
            except OSError:
                return
            if not self._unauthenticated.acquire(blocking=False):
                sock.close()  # a flood of strangers: no thread, no descriptor kept
                continue
            threading.Thread(target=self._serve_one, args=(Connection(sock), serve), daemon=True).start()

    def _serve_one(self, connection: Connection, serve: Callable[[Connection, Callable[[], None]], None]) -> None:
        released = threading.Event()

        def authenticated() -> None:
            connection.authenticated()
            released.set()
            self._unauthenticated.release()

        try:
            serve(connection, authenticated)
        finally:
            if not released.is_set():
                self._unauthenticated.release()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
