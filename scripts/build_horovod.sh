#!/usr/bin/env bash
# Build Horovod's wheel against the TensorFlow installed beside PYTHON, with ten small patches: two that current
# TensorFlow needs, two for a quiet console, four for a faster launch, two for faster steps. scripts/setup_env.sh
# and docker/Dockerfile (both flavors) call this, so the builds cannot drift apart.
#
#   build_horovod.sh PYTHON OUT_DIR      the HOROVOD_* build variables come from the environment
#
# The patches, each applied to exactly one line of the unpacked sdist (the build stops if that line is not there
# exactly once, so an unknown sdist is never built unpatched; the sdist's SHA-256 is checked first):
# 1. horovod/tensorflow/CMakeLists.txt stops compiling xla_mpi_ops.cc, which includes headers that TensorFlow
#    2.19+ wheels no longer ship; its code is all inside `#if HAVE_GPU` and only registers XLA custom calls for
#    jit-compiled allreduces on GPUs, which hvd_mnist does not use.
# 2. horovod/common/util.py mutes its build probe (a forked child of horovodrun that imports TensorFlow) at the
#    file-descriptor level, as its docstring says it does: TensorFlow 2.21 logs from C++ straight to fd 2, so
#    every `horovodrun` otherwise prints TensorFlow's start-up lines before any worker starts.
# 3. horovod/runner/launch.py ends a failed job with one line instead of a Python traceback, after the
#    workers' own one-line errors.
# 4. horovod/common/util.py answers horovodrun's "built with MPI / Gloo?" probes by loading Horovod's TensorFlow
#    library with TensorFlow's two shared libraries, instead of importing TensorFlow's Python in a forked child
#    per probe (2-3 s each, before any worker starts); on any failure it falls back to the import.
# 5. horovod/common/tensor_queue.{h,cc} and operations.cc (five lines): a rank's background thread with nothing
#    queued waits for its next tensor (10 ms at most) instead of meeting the other ranks every 1 ms cycle, and
#    the tensor that ends the wait starts a cycle at once. Under Gloo those idle meetings took the compute cores
#    and held each allreduce back up to a cycle: 0.71-0.84x PyTorch DDP at batch 100 before, 0.97-1.17x after.
# 6. third_party/gloo/gloo/transport/tcp/pair.cc (two lines): when Gloo's event-loop thread finds a connection
#    locked by the thread that is sending on it, it yields the core before polling again. It polled again at
#    once: 900-3,600 epoll_wait calls per allreduce of the MLP's gradient, on the core the sender needed to finish
#    (5-7 after). Gloo at batch 100: 9.8-11.4 -> 5.2-5.5 ms/step.
# 7. horovod/tensorflow/mpi_ops.cc (GPU builds only): defines stream_executor::gpu::AsGpuStreamValue, which
#    Horovod declares and TensorFlow 2.18+ no longer exports (its library then fails to load: "undefined symbol
#    _ZN15stream_executor3gpu16AsGpuStreamValueEPNS_6StreamE"), from the Stream's own platform_specific_handle().
# 8. horovod/tensorflow/__init__.py imports SyncBatchNormalization, a Keras layer, on first use instead of at every
#    import: with it, a trainer that uses no Keras loads none (about 0.15 s of every rank's start-up, docs/benchmark.md).
# 9. horovod/common/util.py keeps the answers of horovodrun's "built with ...?" probes in ~/.horovod/built.json,
#    keyed by the probed library file (path, size, inode, modification time): what a library was built with
#    cannot change, and each probe loads TensorFlow's 790 MB library in a forked child (0.4 s of every launch
#    before any worker starts). A file that is unreadable, damaged or not writable is a cache miss.
# 10. horovod/runner/common/util/tiny_shell_exec.py runs horovodrun's `mpirun --version` probe (5 ms) as a plain
#    subprocess, instead of under a freshly spawned Python that watches it (80 ms of every launch).
# Horovod 0.28.1's vendored flatbuffers and some of its headers do not compile with GCC 13 or newer (Debian
# 13's default is GCC 14); where the default g++ is that new, the build uses g++-12 (CXX overrides).
set -euo pipefail

HOROVOD_VERSION=0.28.1
SDIST_SHA256=92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0

fail() { printf 'build_horovod: error: %s\n' "$*" >&2; exit 1; }
(($# == 2)) || fail "usage: build_horovod.sh PYTHON OUT_DIR"
PYTHON="$1"
OUT_DIR="$2"
work="$(mktemp -d -t horovod-build.XXXXXX)"
trap 'rm -rf "$work"' EXIT

quietly() {  # run a command with its output in $work/log, shown only when it fails
  "$@" > "$work/log" 2>&1 || { tail -n 40 "$work/log" >&2; fail "$* failed"; }
}
quietly "$PYTHON" -m pip download --disable-pip-version-check -q --no-deps --no-binary horovod \
  --no-build-isolation -d "$work" "horovod==$HOROVOD_VERSION"
sdist="$work/horovod-$HOROVOD_VERSION.tar.gz"
[[ -f "$sdist" ]] || fail "pip did not fetch the sdist horovod-$HOROVOD_VERSION.tar.gz"
echo "$SDIST_SHA256  $sdist" | sha256sum --check --quiet - >/dev/null 2>&1 \
  || fail "$(basename "$sdist") has SHA-256 $(sha256sum "$sdist" | cut -d' ' -f1), expected $SDIST_SHA256"
tar -xzf "$sdist" -C "$work"
src="$work/horovod-$HOROVOD_VERSION"

patch_line() {  # patch_line FILE OLD NEW: replace the one line OLD of FILE with NEW (\\n: a new line; none: delete)
  local file="$src/$1" found
  found="$(grep -cxF -- "$2" "$file" || true)"
  ((found == 1)) || fail "$1 holds the line to patch $found times, expected once: $2"
  awk -v old="$2" -v new="$3" '$0 == old { if (new != "") print new; next } { print }' "$file" > "$file.patched"
  ! cmp -s "$file" "$file.patched" || fail "$1 is unchanged by the patch of: $2"
  mv "$file.patched" "$file"
  (($(grep -cxF -- "$2" "$file" || true) == $(printf '%b\n' "$3" | grep -cxF -- "$2" || true))) \
    || fail "$1 still holds the patched line"  # (once more where the new text ends with it: an insertion)
}
# shellcheck disable=SC2016  # the CMake line is matched literally
patch_line horovod/tensorflow/CMakeLists.txt \
  'list(APPEND TF_SOURCES "${PROJECT_SOURCE_DIR}/horovod/tensorflow/xla_mpi_ops.cc")' ''
patch_line horovod/common/util.py "            sys.stderr = open(os.devnull, 'w')" \
  "            sys.stderr = open(os.devnull, 'w'); os.dup2(sys.stderr.fileno(), 1); os.dup2(sys.stderr.fileno(), 2)"
patch_line horovod/common/util.py "            ext = importlib.import_module('.' + ext_base_name, 'horovod')" \
  "            ext = _tensorflow_library() if ext_base_name == 'tensorflow' and fn_desc in ('built with MPI', 'built with Gloo') else None\n            ext = ext or importlib.import_module('.' + ext_base_name, 'horovod')"
patch_line horovod/common/util.py "def extension_available(ext_base_name, verbose=False):" \
  "def _tensorflow_library():\n    # hvd_mnist: Horovod's TensorFlow library without importing TensorFlow's Python; None if that fails.\n    try:\n        import ctypes, importlib.util\n        from horovod.common.basics import HorovodBasics\n        tf_dir = os.path.dirname(importlib.util.find_spec('tensorflow').origin)\n        for lib in ('libtensorflow_framework.so.2', 'libtensorflow_cc.so.2'):\n            ctypes.CDLL(os.path.join(tf_dir, lib), mode=ctypes.RTLD_GLOBAL)\n        return HorovodBasics(os.path.join(os.path.dirname(os.path.dirname(__file__)), 'tensorflow', '__init__.py'), 'mpi_lib')\n    except Exception:\n        return None\n\n\ndef extension_available(ext_base_name, verbose=False):"
patch_line horovod/common/tensor_queue.h "#include <mutex>" "#include <condition_variable>\n#include <mutex>"
patch_line horovod/common/tensor_queue.h "  void RemoveJoinTensor();" \
  "  void RemoveJoinTensor();\n\n  // hvd_mnist: wait while nothing is queued, until stop() or the timeout; true if the queue was empty.\n  template <class Stop> bool WaitForMessages(std::chrono::milliseconds timeout, Stop stop) {\n    std::unique_lock<std::mutex> lock(mutex_);\n    if (!message_queue_.empty()) return false;\n    queued_.wait_for(lock, timeout, [&] { return !message_queue_.empty() || stop(); });\n    return true;\n  }\n  std::condition_variable queued_;"
patch_line horovod/common/tensor_queue.cc "  tensor_table_.emplace(e.tensor_name, std::move(e));" \
  "  tensor_table_.emplace(e.tensor_name, std::move(e));\n  queued_.notify_one();"
patch_line horovod/common/tensor_queue.cc "    tensor_table_.emplace(entries[i].tensor_name, std::move(entries[i]));" \
  "    tensor_table_.emplace(entries[i].tensor_name, std::move(entries[i]));\n    queued_.notify_one();"
patch_line horovod/common/operations.cc "  // This delay determines thread frequency and communication message latency" \
  "  // hvd_mnist: while this rank has nothing to send, wait for it (10 ms at most) instead of meeting the other\n  // ranks every cycle, then start the cycle at once.\n  auto& first_set = state.process_set_table.Get(0);\n  if (!state.dynamic_process_sets && state.process_set_table.Ids().size() == 1 && !first_set.joined &&\n      first_set.tensor_queue.WaitForMessages(std::chrono::milliseconds(10), [&state] { return state.shut_down.load(); })) {\n    state.last_cycle_start = std::chrono::steady_clock::time_point();\n  }\n  // This delay determines thread frequency and communication message latency"
patch_line third_party/gloo/gloo/transport/tcp/pair.cc "#include <unistd.h>" "#include <unistd.h>\n#include <sched.h>"
patch_line third_party/gloo/gloo/transport/tcp/pair.cc "  if (!lock) {" \
  "  if (!lock) {\n    sched_yield();  // hvd_mnist: let the thread that holds this pair run, instead of polling again at once"
patch_line horovod/tensorflow/mpi_ops.cc '#include "tensorflow/compiler/xla/stream_executor/stream.h"' \
  '#include "tensorflow/compiler/xla/stream_executor/stream.h"\nnamespace stream_executor {\nnamespace gpu {\n// hvd_mnist: TensorFlow 2.18+ no longer exports this; the Stream hands out its CUDA stream itself.\nGpuStreamHandle AsGpuStreamValue(Stream* stream) {\n  return static_cast<GpuStreamHandle>(stream->platform_specific_handle().stream);\n}\n} // namespace gpu\n} // namespace stream_executor'
patch_line horovod/tensorflow/__init__.py "from horovod.tensorflow.sync_batch_norm import SyncBatchNormalization" \
  "def __getattr__(name):  # hvd_mnist: the Keras layer, and so Keras, imported on first use\n    if name == 'SyncBatchNormalization':\n        from horovod.tensorflow.sync_batch_norm import SyncBatchNormalization\n        return SyncBatchNormalization\n    raise AttributeError('module {!r} has no attribute {!r}'.format(__name__, name))"
patch_line horovod/common/util.py "def _check_extension_lambda(ext_base_name, fn, fn_desc, verbose):" \
  "def _check_extension_lambda(ext_base_name, fn, fn_desc, verbose):\n    # hvd_mnist: a build probe's answer kept in ~/.horovod/built.json, keyed by the probed library file.\n    import glob\n    libs = glob.glob(os.path.join(os.path.dirname(os.path.dirname(__file__)), ext_base_name, 'mpi_lib*.so'))\n    if verbose or not fn_desc.startswith('built') or len(libs) != 1:\n        return _probe_extension(ext_base_name, fn, fn_desc, verbose)\n    st = os.stat(libs[0])\n    library = '{} {} {} {}'.format(libs[0], st.st_size, st.st_ino, st.st_mtime_ns)\n    path = os.path.join(os.path.expanduser('~'), '.horovod', 'built.json')\n    try:\n        with open(path) as f:\n            answers = {k: v for k, v in json.load(f).items() if k.startswith(library + ':') and isinstance(v, bool)}\n    except Exception:\n        answers = {}\n    key = library + ': ' + fn_desc\n    if key not in answers:\n        answers[key] = _probe_extension(ext_base_name, fn, fn_desc, verbose)\n        if not isinstance(answers[key], bool):\n            return answers[key]\n        try:\n            os.makedirs(os.path.dirname(path), exist_ok=True)\n            with open(path + '.{}'.format(os.getpid()), 'w') as f:\n                json.dump(answers, f)\n            os.replace(path + '.{}'.format(os.getpid()), path)\n        except OSError:\n            pass\n    return answers[key]\n\n\ndef _probe_extension(ext_base_name, fn, fn_desc, verbose):"
patch_line horovod/runner/common/util/tiny_shell_exec.py \
  "        exit_code = safe_shell_exec.execute(command, env=env, stdout=output, stderr=output)" \
  "        # hvd_mnist: a probe of milliseconds (mpirun --version), run without a spawned Python to watch it\n        import subprocess\n        done = subprocess.run(command, shell=True, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)\n        output.write(done.stdout)\n        exit_code = done.returncode"
patch_line horovod/runner/launch.py "    _run(args)" \
  "    try:\n        _run(args)\n    except RuntimeError as err:\n        sys.exit('horovodrun: error: ' + ' '.join(str(err).split()))"

if [[ -z "${CXX:-}" ]] && (( $(g++ -dumpversion | cut -d. -f1) >= 13 )); then
  command -v g++-12 >/dev/null || fail "Horovod $HOROVOD_VERSION does not compile with g++ $(g++ -dumpversion);" \
    "install g++-12 (apt-get install g++-12) or set CXX to an older g++"
  export CC=gcc-12 CXX=g++-12
fi

mkdir -p "$OUT_DIR"
MAKEFLAGS="${MAKEFLAGS:--j$(nproc)}" quietly "$PYTHON" -m pip wheel --disable-pip-version-check -q \
  --no-build-isolation --no-cache-dir --no-deps -w "$OUT_DIR" "$src"
ls "$OUT_DIR/horovod-$HOROVOD_VERSION-"*.whl >/dev/null 2>&1 || fail "no horovod wheel in $OUT_DIR"
