"""The metrics endpoint on its own, in this process: one thread whatever its clients do, a request that never
ends dropped, the page rendered at most every RENDER_EVERY_S however fast it is scraped."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

from hvd_mnist.train.telemetry.metrics_endpoint import (
    HEADER_TIMEOUT_S,
    MAX_CONNECTIONS,
    RENDER_EVERY_S,
    MetricsEndpoint,
)


@pytest.fixture
def endpoint():
    renders = []

    def render() -> bytes:
        renders.append(time.monotonic())
        return b"hvd_mnist_step 7.0\n"

    served = MetricsEndpoint("127.0.0.1", 0, render)
    served.renders = renders
    yield served
    served.close()


def get(port: int, path: str = "/metrics") -> tuple[float, int, str]:
    started = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            status, body = answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        status, body = err.code, err.read().decode()
    return time.monotonic() - started, status, body


def half_open(port: int, count: int) -> list[socket.socket]:
    strangers = []
    for _ in range(count):
        stranger = socket.create_connection(("127.0.0.1", port), timeout=5)
        stranger.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        strangers.append(stranger)
    return strangers


def test_a_scrape_gets_the_page_and_other_paths_do_not(endpoint):
    assert get(endpoint.port)[1:] == (200, "hvd_mnist_step 7.0\n")
    assert get(endpoint.port, "/")[1] == 200
    assert get(endpoint.port, "/secret")[1] == 404


def test_three_hundred_half_open_connections_take_no_thread_and_block_no_scrape(endpoint):
    threads = threading.active_count()
    strangers = half_open(endpoint.port, 300)
    try:
        time.sleep(3.0)  # a thread per connection would show by now (a second is enough); a fixed number never
        assert threading.active_count() == threads
        seconds, status, _ = get(endpoint.port)
        assert status == 200 and seconds < 1.0, seconds
        assert len(endpoint._connections) <= MAX_CONNECTIONS
    finally:
        for stranger in strangers:
            stranger.close()


def test_a_request_that_never_ends_is_dropped(endpoint):
    (stranger,) = half_open(endpoint.port, 1)
    stranger.settimeout(HEADER_TIMEOUT_S + 10)
    started = time.monotonic()
    assert stranger.recv(100) == b""  # closed by the endpoint, unanswered
    assert HEADER_TIMEOUT_S - 0.5 < time.monotonic() - started < HEADER_TIMEOUT_S + 5
    stranger.close()


def test_scraping_as_fast_as_possible_renders_at_most_every_interval(endpoint):
    started = time.monotonic()
    for _ in range(30):
        get(endpoint.port)
    elapsed = time.monotonic() - started
    assert len(endpoint.renders) <= 1 + elapsed / RENDER_EVERY_S, (len(endpoint.renders), elapsed)
    gaps = [later - earlier for earlier, later in zip(endpoint.renders, endpoint.renders[1:], strict=False)]
    assert all(gap >= RENDER_EVERY_S for gap in gaps), gaps


def test_closing_ends_the_thread_and_frees_the_port():
    served = MetricsEndpoint("127.0.0.1", 0, lambda: b"")
    port = served.port
    served.close()
    with socket.socket() as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))
