"""A rank's memory limits read where the kernel enforces them (a real cgroup, real rlimits), and the one line for a
resource that ran out."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest
import tensorflow as tf

from hvd_mnist.errors import RanOut
from hvd_mnist.runtime.health import resources
from hvd_mnist.runtime.health.causes import describe

MIB = 2**20
PROBE = "import json; from hvd_mnist.runtime.health import resources as r; print(json.dumps(r.memory_report({share})))"


def report_under(setup: str, share: int = 1) -> dict:
    """The memory report of a new process that ran the shell lines `setup` first (a ulimit, joining a cgroup)."""
    code = PROBE.format(share=share)
    out = subprocess.run(["sh", "-c", f'{setup}; exec "$0" -c "$1"', sys.executable, code], capture_output=True,
                         text=True, check=True, cwd=Path(__file__).resolve().parents[1])
    return json.loads(out.stdout)


def test_a_cgroup_limit_is_seen_and_shared(memory_cgroup):
    join = f"echo $$ > {memory_cgroup(420 * MIB)}/cgroup.procs"
    alone, shared = report_under(join), report_under(join, share=2)
    assert alone["limit_name"].startswith("cgroup v") and alone["limit"] == 420 * MIB, alone
    assert shared["limit"] == 210 * MIB, shared
    assert 0 < alone["limit_used"] < alone["limit"] and alone["rss"] > 0 and alone["peak"] >= alone["rss"]


def test_ranks_share_a_limit_only_within_one_cgroup(memory_cgroup):
    """The key that groups ranks sharing a limit: the same cgroup gives the same key, another cgroup or none
    another (by its inode, as any container sees it, and the machine's boot)."""
    key = "from hvd_mnist.runtime.health import resources as r; print(r.cgroup_key())"
    first, second = (f"echo $$ > {memory_cgroup(420 * MIB)}/cgroup.procs" for _ in range(2))
    keys = [subprocess.run(["sh", "-c", f'{setup}; exec "$0" -c "$1"', sys.executable, key], capture_output=True,
                           text=True, check=True).stdout for setup in (first, first, second, "true")]
    assert keys[0] == keys[1] and len({keys[0], keys[2], keys[3]}) == 3, keys


@pytest.mark.parametrize(("ulimit", "name"), [("-v", "RLIMIT_AS"), ("-d", "RLIMIT_DATA")])
def test_an_rlimit_is_seen(ulimit, name):
    report = report_under(f"ulimit {ulimit} 900000")
    assert (report["limit_name"], report["limit"]) == (name, 900000 * 1024), report


def test_without_limits_the_machines_available_memory_is_the_limit():
    report = report_under("true")
    if report["limit_name"] != "MemAvailable":
        pytest.skip(f"this process already runs under {report['limit_name']}")
    assert report["limit"] > report["rss"]


@pytest.mark.parametrize(("error", "what"), [
    (MemoryError("Unable to allocate 44.9 MiB"), "memory"),
    (tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor with shape[20000,500]"), "memory"),
    (RuntimeError("can't start new thread"), "threads"),
    (OSError(errno.EMFILE, "Too many open files"), "open files"),
])
def test_running_out_is_one_line_naming_the_rank_and_the_resource(error, what):
    ended = resources.ran_out(error, 1)
    assert isinstance(ended, RanOut) and str(ended).startswith(f"rank 1 ran out of {what}"), ended
    assert "\n" not in str(ended) and "unexpected" not in str(ended)


@pytest.mark.parametrize("error", [
    RuntimeError("other"), OSError(errno.ENOSPC, "No space left"), ValueError(),
    tf.errors.ResourceExhaustedError(None, None, "ckpt-1000_temp/part-00000-of-00001.data-00000-of-00001.tempstate1; "
                                                 "No space left on device"),  # a full disk, as TensorFlow says it
])
def test_other_errors_are_not_running_out(error):
    assert resources.ran_out(error, 1) is None


def test_the_others_repeat_a_stated_cause_once_and_name_a_death_near_the_limit():
    stated = "rank 1 ran out of memory at 2000 of 2100 MiB (RLIMIT_AS): OOM"
    assert describe({"error": [1, stated]}) == stated
    assert describe({"error": [0, "could not write"]}) == "rank 0 failed: could not write"
    near = {"limit": 420 * MIB, "limit_used": 410 * MIB, "limit_name": "cgroup v1 limit"}
    far = {"limit": 1660 * MIB, "limit_used": 1300 * MIB, "limit_name": "RLIMIT_AS"}
    machine = {"limit": 9000 * MIB, "limit_used": 500 * MIB, "limit_name": "MemAvailable"}
    assert describe({"died": [1, 2, 3, 4], "last_memory": {"1": near, "3": far, "4": machine}}) == (
        "rank 1 died at 410 of 420 MiB (cgroup v1 limit): most likely killed for memory; rank 3 died (its connection "
        "closed), last heard at 1300 of 1660 MiB (RLIMIT_AS); rank(s) 2, 4 died (their connection closed)")
    assert resources.near_limit({**far, "limit_used": 1410 * MIB}) == "1410 of 1660 MiB (RLIMIT_AS)"  # < 256 MiB left
    assert resources.near_limit({**near, "limit_used": 300 * MIB}) is None
    assert resources.grew({}, far) and not resources.grew(far, {**far, "limit_used": 1400 * MIB})
