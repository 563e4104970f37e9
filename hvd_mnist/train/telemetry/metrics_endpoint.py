"""Rank 0's HTTP endpoint for Prometheus: asyncio's streams on one event-loop thread, bounded against strangers.

prometheus_client's own server starts a thread per connection and waits on each for as long as the client
likes: 300 connections that send half a request hold 300 threads of the training process. Here one loop
serves every connection, a request must arrive whole within HEADER_TIMEOUT_S, at most MAX_CONNECTIONS are
held (a new one pushes out the oldest still sending its request), and the page is rendered at most every
RENDER_EVERY_S, so scraping as fast as possible costs the training thread nothing more than scraping once.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable

MAX_CONNECTIONS = 64
HEADER_TIMEOUT_S = 5.0  # a whole request, from accept to its blank line; then as long again to send the page
MAX_REQUEST_BYTES = 8192
RENDER_EVERY_S = 0.5
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # Prometheus's text exposition format
PATHS = ("/metrics", "/")


class MetricsEndpoint:
    """Serves `render()` (the page's bytes) at http://ADDRESS:PORT/metrics from one daemon thread."""

    def __init__(self, address: str, port: int, render: Callable[[], bytes]) -> None:
        """Binds at once, so that a taken port is an OSError here (the caller names it), not in the thread."""
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        listener = socket.create_server((address, port), family=family, backlog=MAX_CONNECTIONS,
                                        dualstack_ipv6=address == "::")
        self._render = render
        self._page, self._rendered_at = b"", -RENDER_EVERY_S
        self._connections: dict[asyncio.StreamWriter, bool] = {}  # oldest first; True once its request is whole
        self._loop = asyncio.new_event_loop()
        self._server = self._loop.run_until_complete(asyncio.start_server(self._serve, sock=listener,
                                                                          limit=MAX_REQUEST_BYTES))
        self.port = listener.getsockname()[1]
        self._thread = threading.Thread(target=self._loop.run_forever, name="hvd-mnist-metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.run_until_complete(self._shut())
        self._loop.close()

    async def _shut(self) -> None:
        """The listener closed and every connection cut, its task left to end as for a peer gone."""
        self._server.close()
        for writer in self._connections:
            writer.transport.abort()
        await asyncio.gather(*asyncio.all_tasks() - {asyncio.current_task()}, self._server.wait_closed(),
                             return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._connections) >= MAX_CONNECTIONS:
            oldest = next((w for w, whole in self._connections.items() if not whole), next(iter(self._connections)))
            oldest.transport.abort()  # its _serve ends with a ConnectionError and forgets it
            self._connections.pop(oldest)
        self._connections[writer] = False
        try:
            request = await asyncio.wait_for(_request(reader), HEADER_TIMEOUT_S)
            self._connections[writer] = True
            writer.write(self._reply(request))
            await asyncio.wait_for(writer.drain(), HEADER_TIMEOUT_S)
        except (TimeoutError, ValueError, ConnectionError):
            pass  # too slow, too long or gone: nothing to serve
        finally:
            self._connections.pop(writer, None)
            writer.transport.abort()

    def _reply(self, request: bytes) -> bytes:
        """The whole response to a request: the page for GET or HEAD of /metrics (or /), else an error."""
        method, _, rest = request.split(b"\n", 1)[0].decode("latin-1").partition(" ")
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


async def _request(reader: asyncio.StreamReader) -> bytes:
    """A request's head, up to its blank line; ValueError past MAX_REQUEST_BYTES, ConnectionError if cut short."""
    head = b""
    while (line := await reader.readline()).strip():
        head += line
        if len(head) > MAX_REQUEST_BYTES:
            raise ValueError("request too long")
    if not line:
        raise ConnectionError("closed before its blank line")
    return head


def _response(status: str, page: bytes, content_type: str, body: bool = True) -> bytes:
    head = (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(page)}\r\n"
            "Connection: close\r\n\r\n").encode()
    return head + page if body else head
