"""What the heartbeats know, in the words of the one-line error: a stated reason beats a death, which beats
silence, which beats a rank that is stuck."""

from __future__ import annotations

from collections.abc import Iterable

from hvd_mnist.runtime.health.resources import ADDRESS_SPACE, limited, near_limit


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
