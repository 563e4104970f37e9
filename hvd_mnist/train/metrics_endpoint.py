"""Rank 0's HTTP endpoint for Prometheus: one thread and one event loop, bounded against strangers.

prometheus_client's own server starts a thread per connection and waits on each for as long as the client
likes: 300 connections that send half a request hold 300 threads of the training process. Here a fixed loop
serves every connection, a request must arrive whole within HEADER_TIMEOUT_S, at most MAX_CONNECTIONS are
held (a new one pushes out the oldest still sending its request), and the page is rendered at most every
RENDER_EVERY_S, so scraping as fast as possible costs the training thread nothing more than scraping once.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_CONNECTIONS = 64
HEADER_TIMEOUT_S = 5.0  # a whole request, from accept to its blank line; then as long again to send the page
MAX_REQUEST_BYTES = 8192
RENDER_EVERY_S = 0.5
POLL_S = 0.25
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # Prometheus's text exposition format
PATHS = ("/metrics", "/")


@dataclass
class _Connection:
    sock: socket.socket
    deadline: float
    request: bytearray = field(default_factory=bytearray)
    reply: memoryview | None = None  # set once the request is whole: what is left to send


class MetricsEndpoint:
    """Serves `render()` (the page's bytes) at http://ADDRESS:PORT/metrics from one daemon thread."""

    def __init__(self, address: str, port: int, render: Callable[[], bytes]) -> None:
        """Binds at once, so that a taken port is an OSError here (the caller names it), not in the thread."""
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self._listener = socket.create_server((address, port), family=family, backlog=MAX_CONNECTIONS,
                                              dualstack_ipv6=address == "::")
        self._listener.setblocking(False)
        self._render = render
        self._page, self._rendered_at = b"", -RENDER_EVERY_S
        self._connections: dict[socket.socket, _Connection] = {}
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="hvd-mnist-metrics", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self._listener.getsockname()[1]

    def close(self) -> None:
        self._closed.set()
        self._thread.join()

    # --- the loop ----------------------------------------------------------------------------------------------

    def _serve(self) -> None:
        try:
            while not self._closed.is_set():
                for key, events in self._selector.select(POLL_S):
                    if key.fileobj is self._listener:
                        self._accept()
                    elif (connection := self._connections.get(key.fileobj)) is None:
                        continue  # pushed out by a newer one since select() returned
                    elif events & selectors.EVENT_READ:
                        self._read(connection)
                    else:
                        self._write(connection)
                now = time.monotonic()
                for connection in [c for c in self._connections.values() if c.deadline < now]:
                    self._drop(connection)
        finally:
            for connection in list(self._connections.values()):
                self._drop(connection)
            self._selector.close()
            self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors, or the peer gave up: nothing to serve
                return
            if len(self._connections) >= MAX_CONNECTIONS:
                self._drop(min(self._connections.values(), key=lambda c: (c.reply is not None, c.deadline)))
            sock.setblocking(False)
            self._connections[sock] = _Connection(sock, time.monotonic() + HEADER_TIMEOUT_S)
            self._selector.register(sock, selectors.EVENT_READ)

    def _read(self, connection: _Connection) -> None:
        try:
            data = connection.sock.recv(MAX_REQUEST_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        connection.request += data
        if not data or len(connection.request) > MAX_REQUEST_BYTES:
            self._drop(connection)
        elif b"\r\n\r\n" in connection.request or b"\n\n" in connection.request:
            connection.reply = memoryview(self._reply(bytes(connection.request)))
            connection.deadline = time.monotonic() + HEADER_TIMEOUT_S
            self._selector.modify(connection.sock, selectors.EVENT_WRITE)

    def _write(self, connection: _Connection) -> None:
        try:
            sent = connection.sock.send(connection.reply)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            sent = len(connection.reply)
        connection.reply = connection.reply[sent:]
        if not connection.reply:
            self._drop(connection)

    def _drop(self, connection: _Connection) -> None:
        self._connections.pop(connection.sock, None)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(connection.sock)
        connection.sock.close()

    # --- HTTP --------------------------------------------------------------------------------------------------

    def _reply(self, request: bytes) -> bytes:
        """The whole response to a request: the page for GET or HEAD of /metrics (or /), else an error."""
        method, _, rest = request.split(b"\r\n", 1)[0].split(b"\n", 1)[0].decode("latin-1").partition(" ")
        path = rest.split(" ", 1)[0].split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            return _response("405 Method Not Allowed", b"only GET and HEAD\n", "text/plain")
        if path not in PATHS:
            return _response("404 Not Found", b"metrics are at /metrics\n", "text/plain")
        now = time.monotonic()
        if now - self._rendered_at >= RENDER_EVERY_S:
            try:
                self._page, self._rendered_at = self._render(), now
            except Exception as err:  # a collector's bug must not end the endpoint's thread
                return _response("500 Internal Server Error", f"{type(err).__name__}: {err}\n".encode(), "text/plain")
        return _response("200 OK", self._page, CONTENT_TYPE, body=method == "GET")


def _response(status: str, page: bytes, content_type: str, body: bool = True) -> bytes:
    head = (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(page)}\r\n"
            "Connection: close\r\n\r\n").encode()
    return head + page if body else head
