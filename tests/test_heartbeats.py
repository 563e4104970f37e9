"""The heartbeat side channel on real local TCP connections, three 'ranks' in one process: who went silent, who
died, who is alive but stuck and where, the reason a rank gave, the last checkpoint told to everyone, and a stop
that never hangs."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from helpers import wait_for as wait_for_seconds

from hvd_mnist.runtime.boot.process import Process, boot_id, start_ticks
from hvd_mnist.runtime.health import roles as heartbeats_module
from hvd_mnist.runtime.health import transport
from hvd_mnist.runtime.health import watchdog as watchdog_module
from hvd_mnist.runtime.health.causes import describe
from hvd_mnist.runtime.health.guard import link_failure
from hvd_mnist.runtime.health.roles import for_rank
from hvd_mnist.runtime.health.watchdog import Watchdog

# Quick heartbeats, and a silence that no stall of a loaded machine's threads reaches by chance: the tests that
# expect no cause wait past it, and the one that expects a silent rank waits for it as long as it must.
SILENT_AFTER_S = 2.0
PAST_SILENCE_S = SILENT_AFTER_S + 0.5
SILENCE_WAIT_S = 30.0


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(heartbeats_module, "HEARTBEAT_S", 0.05)
    monkeypatch.setattr(heartbeats_module, "SILENT_AFTER_S", SILENT_AFTER_S)


@pytest.fixture
def ranks(fast):
    """Heartbeats of ranks 0, 1 and 2, connected; all stopped afterwards (each stop within a second)."""
    offers = []
    chief = for_rank(0, 3, local_only=True)
    chief.start(lambda offer: offers.append(offer) or offer)
    others = [for_rank(rank, 3) for rank in (1, 2)]
    for heartbeats in others:
        heartbeats.start(lambda _offer: offers[0])
    everyone = [chief, *others]
    wait_for(lambda: len(chief._connections) == 2)
    yield everyone
    for heartbeats in everyone:
        stopper = threading.Thread(target=heartbeats.stop)
        stopper.start()
        stopper.join(timeout=2)
        assert not stopper.is_alive(), f"rank {heartbeats.rank} hung in stop()"


def wait_for(condition, seconds: float = 5.0) -> None:
    wait_for_seconds(condition, seconds)


def test_all_well_means_no_cause(ranks):
    time.sleep(PAST_SILENCE_S)
    assert [heartbeats.cause() for heartbeats in ranks] == [None, None, None]


def test_a_silent_rank_is_named_by_every_other_rank(ranks):
    chief, one, two = ranks
    one._stopped.set()  # its heartbeats stop, its connection stays open: a stopped process
    wait_for(lambda: "rank(s) 1 stopped answering" in (two.cause() or ""), SILENCE_WAIT_S)
    assert "rank(s) 1 stopped answering" in chief.cause()
    assert [p.pid for p in two.silent_processes()] == [Process.this(1).pid]  # where to find it, for elastic runs


def test_a_dead_rank_and_a_dead_chief(ranks):
    chief, one, two = ranks
    one._chief.shut()  # its connection closes without a goodbye: the process died
    wait_for(lambda: chief.cause() == "rank(s) 1 died (their connection closed)")
    wait_for(lambda: two.cause() == "rank(s) 1 died (their connection closed)")
    chief._listener.close()
    for connection in list(chief._connections.values()):
        connection.shut()
    wait_for(lambda: two.cause() == "rank(s) 0 died (their connection closed)")


def test_a_stated_reason_reaches_every_rank_and_beats_the_death_that_follows(ranks):
    chief, one, two = ranks
    one.state_failure("could not write metrics to /x: no space left on device")
    one._chief.shut()
    for heartbeats in (chief, two):
        wait_for(lambda h=heartbeats: (h.cause() or "").startswith("rank 1 failed: could not write metrics"))


def test_a_rank_alive_but_stuck_is_named_with_its_frame_by_every_rank(ranks):
    chief, one, two = ranks
    stuck_since = time.monotonic() - heartbeats_module.STUCK_AFTER_S - 5
    one.whereabouts._progressed = stuck_since  # its main thread: no step for 15 s, outside any collective
    with contextlib.ExitStack() as blocks:
        for waiting in (chief, two):  # the others wait in the next collective, and progressed a moment ago
            blocks.enter_context(waiting.whereabouts.within(300, "training"))
        wait_for(lambda: "alive but stuck" in (two.cause() or ""), SILENCE_WAIT_S)
    for heartbeats in (chief, two):
        cause = heartbeats.cause()
        assert cause.startswith("rank(s) 1 alive but stuck for 1"), cause
        # The main thread's innermost frame of this repository's code: the test waiting in helpers.wait_for.
        assert "rank 1 in tests/helpers.py:" in cause and cause.endswith(" wait_for (not in a collective)"), cause
    ages = chief.ranks()
    assert ages[1].progress_age > heartbeats_module.STUCK_AFTER_S and ages[1].heartbeat_age < SILENT_AFTER_S
    assert ages[0].progress_age < heartbeats_module.STUCK_AFTER_S


def test_ranks_that_all_wait_in_a_collective_are_named_as_such():
    training = "training after step 300"
    stuck = {0: {"since_progress": 31, "waiting_in": training, "frame": "hvd_mnist/train/loop.py:120 _train"},
             1: {"since_progress": 30, "waiting_in": training, "frame": "hvd_mnist/train/loop.py:120 _train"}}
    assert describe({"stuck": stuck}) == ("rank(s) 0, 1 alive but stuck for 31 s, rank 0 in "
                                          "hvd_mnist/train/loop.py:120 _train (waiting in training after step 300)")
    stuck[1] |= {"waiting_in": "averaging the metrics after step 300"}
    assert describe({"stuck": stuck}) == ("rank(s) 0, 1 alive but stuck for 31 s, each in a different collective: "
                                          "rank 0 in training after step 300, rank 1 in averaging the metrics after "
                                          "step 300 (a collective that not every rank entered)")
    stuck[1] |= {"waiting_in": None, "frame": "hvd_mnist/data/pipeline.py:9 next_batch"}
    assert describe({"stuck": stuck}) == ("rank(s) 1 alive but stuck for 30 s, rank 1 in "
                                          "hvd_mnist/data/pipeline.py:9 next_batch (not in a collective)")
    assert describe({"silent": {"1": 9}, "stuck": stuck}).startswith("rank(s) 1 stopped answering")


def test_rank_0_gathers_every_ranks_stacks_and_flight_record_from_their_side_threads(ranks):
    chief, one, two = ranks
    with one.whereabouts.within(40, "training", nbytes=1_590_040):
        pass
    with two.whereabouts.within(50, "averaging the metrics"):  # still in it when the dump is taken
        dumps = chief.gather_dumps("no progress for 30 s", wait=10)
    assert sorted(dumps) == [0, 1, 2]
    for rank, text in dumps.items():
        assert text.startswith(f"hvd_mnist rank {rank} on ") and "no progress for 30 s" in text.splitlines()[0]
        assert "--- thread MainThread (main)" in text and "test_heartbeats.py" in text, text  # this test's frame
        assert "--- thread hvd-mnist-heartbeats" in text  # every thread's stack
    assert "after step 40       training  1.59 MB allreduced  0.0" in dumps[1], dumps[1]
    assert "after step 50       averaging the metrics  STILL IN IT after" in dumps[2], dumps[2]
    assert "in a guarded block: averaging the metrics after step 50" in dumps[2]
    one._chief.shut()  # a rank that died sends no dump, and is not waited for
    wait_for(lambda: chief.knowledge()["died"] == [1])
    started = time.monotonic()
    assert sorted(chief.gather_dumps("again", wait=20)) == [0, 2]
    assert time.monotonic() - started < 10


def test_another_rank_can_ask_rank_0_to_gather_the_dumps(ranks):
    chief, one, _ = ranks
    asked = []
    chief.on_dump_request = asked.append
    one.ask_for_dumps("no progress for 30 s (training after step 7)")
    wait_for(lambda: asked == ["no progress for 30 s (training after step 7)"])


def test_the_chiefs_checkpoint_is_told_at_once(ranks):
    chief, one, _ = ranks
    chief.checkpoint = "/runs/a/checkpoints/ckpt-40"
    wait_for(lambda: one.checkpoint == "/runs/a/checkpoints/ckpt-40", seconds=10)


def test_a_rank_that_said_goodbye_is_not_dead(ranks):
    chief, one, _ = ranks
    one.stop()
    time.sleep(PAST_SILENCE_S)
    assert chief.cause() is None


def test_describe_prefers_a_reason_to_a_death_to_silence():
    assert describe({"error": [2, "x"], "died": [1], "silent": {"3": 9}}) == "rank 2 failed: x"
    assert describe({"died": [1, 0], "silent": {"3": 9}}) == "rank(s) 0, 1 died (their connection closed)"
    assert describe({"silent": {"3": 9, "1": 7}}).startswith("rank(s) 1, 3 stopped answering (no heartbeat for 9 s")
    assert describe({}) is None


def test_the_watchdog_fires_after_the_timeout_and_can_be_told_to_wait_on():
    """(Its callback says "wait on" here: the other answer ends the process, which is test_reliability's part.)"""
    fired = []
    watchdog = Watchdog(0.3, lambda step, what, waited: fired.append((step, what)) or True)
    started = time.monotonic()
    with watchdog.watching(7, "training"):
        wait_for(lambda: len(fired) >= 2, seconds=30)  # fired, was re-armed, fired again
    assert time.monotonic() - started >= 0.6
    ended = len(fired)
    time.sleep(0.5)
    assert fired == [(7, "training")] * ended  # disarmed when the block ended
    with watchdog.watching(8, "quick"):
        pass
    time.sleep(0.5)
    assert len(fired) == ended


def test_a_failed_link_is_named_when_no_rank_died():
    """Gloo's own words for the connection that broke (here from a real run over a shaper that dropped every
    large packet), else the generic cause."""
    gloo = ("[/tmp/horovod-0.28.1/third_party/compatible17_gloo/gloo/transport/tcp/pair.cc:590] Read error "
            "[127.0.0.1]:34696: Connection timed out")
    assert link_failure(gloo) == ("the connection to 127.0.0.1:34696 failed (read error: connection timed out) and "
                                  "no rank is known to have died: the network between the ranks drops or blocks "
                                  "their traffic")
    assert link_failure("Horovod has been shut down.") == "a worker died or is unreachable"


def test_the_watchdog_gives_up_early_once_a_peer_is_gone(monkeypatch):
    """A block waiting on a peer known to be gone ends after the grace period, long before the timeout; one
    whose peers are all there waits on."""
    monkeypatch.setattr(watchdog_module, "HOPELESS_GRACE_S", 0.5)
    gone = False
    fired = []
    watchdog = Watchdog(60, lambda step, what, waited: fired.append(waited) or True, hopeless=lambda: gone)
    with watchdog.watching(3, "training"):
        time.sleep(2.0)
        assert fired == []
        gone = True
        wait_for(lambda: fired, seconds=30)
    assert 2.5 <= fired[0] < 60


def test_a_process_is_killed_only_if_it_is_the_same_one():
    """A live child: a record with another start time (its pid reused by a stranger) or from another boot is
    left alone; the true record kills it."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        real = Process(rank=1, host=socket.gethostname(), boot_id=boot_id(), pid=child.pid,
                       start_ticks=start_ticks(child.pid))
        assert real.start_ticks > 0
        stale = dataclasses.replace(real, start_ticks=real.start_ticks - 1)
        elsewhere = dataclasses.replace(real, boot_id="another-boot")
        assert not stale.kill() and not elsewhere.kill()
        assert child.poll() is None
        assert real.kill()
        assert child.wait(timeout=5) == -signal.SIGKILL
    finally:
        child.kill()
        child.wait()


def closed_by_peer(sock: socket.socket, seconds: float) -> bool:
    """True if the other side closes `sock` within `seconds` (an orderly close or a reset)."""
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_strangers_cannot_hold_threads_or_connections_without_bound(ranks, monkeypatch):
    """100 idle connections to rank 0's port: at most MAX_UNAUTHENTICATED get a thread, each closed after the
    hello timeout, the rest closed at once; the ranks' own heartbeats go on meanwhile."""
    monkeypatch.setattr(heartbeats_module, "HELLO_TIMEOUT_S", 0.5)
    chief, _, _ = ranks
    threads_before = threading.active_count()
    strangers = [socket.create_connection(("127.0.0.1", chief._listener.port), timeout=5) for _ in range(100)]
    try:
        time.sleep(0.2)
        assert threading.active_count() - threads_before <= transport.MAX_UNAUTHENTICATED
        assert all(closed_by_peer(sock, seconds=3) for sock in strangers)
        wait_for(lambda: threading.active_count() <= threads_before)
        assert [heartbeats.cause() for heartbeats in ranks] == [None, None, None]
    finally:
        for sock in strangers:
            sock.close()


def test_a_hello_with_the_wrong_secret_is_closed_and_counts_for_no_rank(ranks):
    chief, _, _ = ranks
    with socket.create_connection(("127.0.0.1", chief._listener.port), timeout=5) as sock:
        sock.sendall(json.dumps({"secret": "0" * 32, "rank": 1, "process": None}).encode() + b"\n")
        assert closed_by_peer(sock, seconds=3)  # no answer, no view of the run
    time.sleep(PAST_SILENCE_S)
    assert chief.cause() is None  # rank 1's own connection is neither replaced nor counted dead
    assert sorted(chief._connections) == [1, 2]


def test_ranks_on_one_machine_listen_on_loopback_only(ranks):
    chief, _, _ = ranks
    assert chief._listener.sock.getsockname()[0] == "127.0.0.1"
