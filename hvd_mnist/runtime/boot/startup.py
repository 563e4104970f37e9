"""Process start-up and exit: import TensorFlow without its C++ start-up lines or Keras, time each phase, end
quickly."""

from __future__ import annotations

import atexit
import contextlib
import functools
import glob
import importlib.metadata
import logging
import os
import sys
import tempfile
import time
import typing
from collections.abc import Callable, Iterator
from typing import IO, NoReturn

from hvd_mnist.errors import RunEnded, first_line
from hvd_mnist.runtime.boot import lazy_api
from hvd_mnist.runtime.boot.process import seconds_since_start
from hvd_mnist.runtime.health.resources import ran_out

# What TensorFlow 2.21's __init__ imports to load all of Keras eagerly, and lets fail (import_tensorflow_quietly).
KERAS_EAGER_LOAD = "keras.src.optimizers"
# The TensorFlow versions that the start-up hooks (lazy_api's stand-ins, the `typing` patch) were tested with: each is
# a bet on one TensorFlow's internals, so any other version is imported as TensorFlow does (hooks_on).
HOOKS_TESTED_WITH = ("2.21.0",)
# The process that started this one, read before the seconds of start-up in which it could die (stopping.py).
LAUNCHER_PID = os.getppid()


@contextlib.contextmanager
def _native_stderr_held_back(show: Callable[[], bool] = lambda: False) -> Iterator[None]:
    """Hold back what native code writes to file descriptor 2 in the block; show it only if the block raises,
    or if `show()` says so after it."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        except BaseException:
            _replay(capture, saved)
            raise
        else:
            if show():
                _replay(capture, saved)
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _replay(capture: IO[bytes], saved: int) -> None:
    os.dup2(saved, 2)
    capture.seek(0)
    sys.stderr.write(capture.read().decode(errors="replace"))


def gpus_quietly() -> list:
    """TensorFlow's GPUs. On a machine without an NVIDIA device (the GPU image run on CPU), CUDA's "failed call
    to cuInit" lines only say that, which the start-up line says too: they are dropped. Where /dev/nvidia*
    exists and no GPU is found, they are the diagnosis, and are shown."""
    import tensorflow as tf

    found: list = []
    with _native_stderr_held_back(show=lambda: not found and bool(glob.glob("/dev/nvidia[0-9]*"))):
        found.extend(tf.config.list_physical_devices("GPU"))
    return found


def import_tensorflow_quietly() -> None:
    """Import TensorFlow (and Horovod's TensorFlow ops) with their start-up lines held back, without Keras, and
    with TensorFlow's API modules imported as they are used (lazy_api.py) where hooks_on says so.

    TensorFlow 2.21 logs through absl before any log level applies, so TF_CPP_MIN_LOG_LEVEL no longer hides
    "oneDNN custom operations are on" and the absl banner, which every rank would print. Its `__init__` also
    loads Keras 3 eagerly, in an import that it lets fail: held back, Keras (and, through it, matplotlib) is
    loaded only by a model that is a Keras one (import_keras). Horovod built by scripts/build_horovod.sh no longer
    needs Keras at import either (its patch 8); an unpatched one loads it, as before.
    """
    if "tensorflow" in sys.modules:
        return
    unusable, hooks = None, hooks_on()
    if hooks:
        lazy_api.install()
    compiled_once = _forward_refs_compiled_once() if hooks else contextlib.nullcontext()
    with _native_stderr_held_back(), _hidden("matplotlib"), compiled_once:
        with _hidden(KERAS_EAGER_LOAD):
            import tensorflow
        if hooks:
            lazy_api.settle_namesakes()

        try:
            import horovod.tensorflow  # noqa: F401
        except (ImportError, OSError, tensorflow.errors.NotFoundError) as err:
            unusable = err  # raised below, once the native lines of the failed load are discarded
    if unusable is not None:
        raise ran_out(unusable) or RunEnded(horovod_unusable(unusable, tensorflow.__version__))


def hooks_on() -> bool:
    """Whether the start-up hooks apply: HVD_MNIST_LAZY_TF_API is not 0 (docs/guide.md) and the installed TensorFlow,
    read from its package's metadata without importing it, is one of HOOKS_TESTED_WITH; else a debug line says so."""
    if os.environ.get("HVD_MNIST_LAZY_TF_API", "1") == "0":
        return False
    versions = []
    for package in ("tensorflow", "tensorflow-cpu"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions.append(importlib.metadata.version(package))
    if any(version in HOOKS_TESTED_WITH for version in versions):
        return True
    logging.getLogger("hvd_mnist").debug("start-up hooks off: TensorFlow %s, tested with %s only",
                                         " and ".join(versions) or "not installed", ", ".join(HOOKS_TESTED_WITH))
    return False


def import_keras() -> None:
    """Load Keras 3 for a model that is a Keras one, without matplotlib (see _hidden)."""
    with _hidden("matplotlib"):
        import keras  # noqa: F401


def horovod_unusable(err: BaseException, tensorflow_version: str) -> str:
    """One line for a Horovod that is missing, or built against another TensorFlow (its op library does not
    load: undefined symbols), with the way out."""
    fix = "build it against this TensorFlow with scripts/build_horovod.sh (docs/guide.md, Set-up)"
    if isinstance(err, ModuleNotFoundError) and (err.name or "").split(".")[0] == "horovod":
        return f"Horovod is not installed in {sys.prefix}; {fix}"
    return f"Horovod cannot load against the installed TensorFlow {tensorflow_version} ({first_line(err)}); {fix}"


@contextlib.contextmanager
def _hidden(module: str) -> Iterator[None]:
    """Make `module` unimportable within the block, unless it is already loaded.

    Keras loads matplotlib.pyplot if it is installed (as it is with the benchmark's and `hvd-mnist plot`'s
    extras): 0.45 s of a rank's start-up for plotting helpers nobody here calls (docs/benchmark.md). Keras takes
    an ImportError as "no matplotlib", as TensorFlow takes one of KERAS_EAGER_LOAD as "no Keras"; later imports
    work as usual.
    """
    if module in sys.modules:
        yield
        return
    sys.modules[module] = None  # type: ignore[assignment]  # the import system's "not importable" marker
    try:
        yield
    finally:
        del sys.modules[module]


@contextlib.contextmanager
def _forward_refs_compiled_once() -> Iterator[None]:
    """Within the block, `typing` compiles the text of each forward reference once.

    TensorFlow's generated op modules declare about 1,400 TypeVars whose 19,000 constraints are strings
    ("_atypes.Float32", ...), and typing compiles each into a ForwardRef: 18,000 compile() calls of a few
    dozen texts, 0.15 s of each rank's import (docs/benchmark.md). typing finds `compile` among its own globals
    before the builtins, so a cached one placed there serves it; equal texts give equal code objects.
    """
    typing.compile = functools.lru_cache(maxsize=None)(compile)  # type: ignore[attr-defined]
    try:
        yield
    finally:
        del typing.compile  # type: ignore[attr-defined]


def end_process(code: int) -> NoReturn:
    """Exit with `code`, skipping the interpreter's teardown once TensorFlow is loaded.

    Unloading TensorFlow's modules and objects takes over a second of every run's wall time, after the last
    file was written (docs/benchmark.md). The exit handlers still run (logging's flush, Horovod's shutdown,
    TensorFlow's clean-up of its temporary files), and MPI is finalized as mpirun expects; then the process
    ends at once.
    """
    if "tensorflow" not in sys.modules:
        sys.exit(code)
    atexit._run_exitfuncs()  # what sys.exit would run first; os._exit skips the rest of the teardown
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


_phases: dict[str, float] = {}


def phase_done(name: str) -> float:
    """Record that a phase of the run ended, in seconds since the process started (metrics.jsonl's `start`
    and `end` events carry them, so a slow launch can be read phase by phase); returns those seconds."""
    _phases[name] = round(seconds_since_start(), 3)
    return _phases[name]


def phases() -> dict[str, float]:
    return dict(_phases)


def process_started_at() -> float:
    """When this process started, as a Unix time: with it a launcher's own share of a start-up (from its launch
    to this process's start) can be read beside the phases."""
    return round(time.time() - seconds_since_start(), 3)
