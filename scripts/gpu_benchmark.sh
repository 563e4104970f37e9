#!/usr/bin/env bash
# The GPU variant of scripts/benchmark.py: the compute floor and hvd_mnist np=1 on one GPU, mixed precision
# off and on (the trainer's --mixed-precision). Extra arguments go to benchmark.py (--out, --repeats, --steps).
# Without a GPU it prints one error line and exits 1.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${HVD_MNIST_VENV:-$ROOT/.venv}/bin/python"
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "gpu_benchmark: error: no GPU found (nvidia-smi lists none)" >&2
  exit 1
fi
exec "$PYTHON" "$ROOT/scripts/benchmark.py" --gpu "$@"
