"""Fixtures and session hooks (the helpers the tests share are in helpers.py)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import image_build
import numpy as np
import pytest


@pytest.hookimpl(trylast=True)  # after -m/-k have deselected: a run without the container tests builds nothing
def pytest_collection_modifyitems(session, config, items) -> None:
    """test_containers.py runs last, and the image it needs starts building now, in the background."""
    containers = [item for item in items if item.path.name == "test_containers.py"]
    if containers:
        items[:] = [item for item in items if item.path.name != "test_containers.py"] + containers
        image_build.start()


def pytest_sessionfinish(session, exitstatus) -> None:
    if (build := image_build.started()) is not None:
        build.stop()


@pytest.fixture
def tmpfs(tmp_path) -> Iterator[Callable[[str], Path]]:
    """`tmpfs(SIZE)` mounts a tmpfs of SIZE (mount's `size=`, such as "1m") under tmp_path and returns it; the test
    is skipped where mounting is not allowed (it needs root), and every mount is undone afterwards."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        mount_point = tmp_path / f"tmpfs-{size}"
        mount_point.mkdir()
        made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)],
                              capture_output=True)
        if made.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
        mounted.append(mount_point)
        return mount_point

    yield mount
    for mount_point in mounted:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


@pytest.fixture
def memory_cgroup() -> Iterator[Callable[[int], Path]]:
    """`memory_cgroup(BYTES)` makes a memory cgroup (v1 or v2, whichever this machine has) under this process's own,
    limited to BYTES, and returns it (a process joins it by writing its pid to its cgroup.procs); the test is
    skipped where none can be made (it needs root), and every one is removed afterwards."""
    from hvd_mnist.runtime.health.resources import CGROUP_ROOT

    here = [line.split(":", 2) for line in Path("/proc/self/cgroup").read_text().splitlines()]
    v1 = [path for _, controllers, path in here if "memory" in controllers.split(",")]
    parent = (CGROUP_ROOT / "memory" / v1[0].lstrip("/") if v1
              else CGROUP_ROOT / next(path for _, kind, path in here if kind == "").lstrip("/"))
    made: list[Path] = []

    def make(limit: int) -> Path:
        group = parent / f"hvd-mnist-test-{os.getpid()}-{len(made)}"
        try:
            group.mkdir()
        except OSError as err:
            pytest.skip(f"cannot make a memory cgroup under {parent}: {err}")
        made.append(group)
        try:
            (group / ("memory.limit_in_bytes" if v1 else "memory.max")).write_text(str(limit))
        except OSError as err:  # cgroup v2 without the memory controller enabled for the parent's children
            pytest.skip(f"cannot limit memory in {group}: {err}")
        return group

    yield make
    for group in made:
        with contextlib.suppress(OSError):  # one group still busy leaves the others removed
            group.rmdir()


@pytest.fixture
def tiny_split():
    """120 distinct synthetic examples whose first two pixels encode their index."""
    from hvd_mnist.data.sources import Split

    count = 120
    images = np.random.default_rng(1).integers(0, 256, size=(count, 784), dtype=np.uint8)
    images[:, 0], images[:, 1] = np.arange(count) // 256, np.arange(count) % 256
    return Split(images, np.arange(count, dtype=np.int64) % 10)
