#!/usr/bin/env bash
# Launch hvd_mnist on several hosts with Open MPI's mpirun: one rank per slot, the rest of the arguments go to
# `python -m hvd_mnist`.
#
#   scripts/mpirun_cluster.sh -H host1:4,host2:4 --lr 0.1 --steps 2000 --output-dir /shared/runs/a
#   HVD_MNIST_HOSTS=host1:4,host2:4 scripts/mpirun_cluster.sh --data-dir /shared/mnist
#   scripts/mpirun_cluster.sh --dry-run -H host1:4,host2:4      # print the mpirun command only
#   cd /shared/me && /path/to/mpirun_cluster.sh -H host1:4,host2:4 -- --model my_models:small_cnn   # ./my_models.py
#
# Options (before the trainer's arguments; `--` ends them explicitly):
#   -H HOSTS      host:slots,... (default: $HVD_MNIST_HOSTS); slots = GPUs (or ranks) on that host
#   -np N         number of ranks (default: the sum of the slots)
#   --dry-run     print the command instead of running it
# Environment:
#   HVD_MNIST_PYTHON       the Python that has hvd_mnist on every host (default: python on PATH)
#   HVD_MNIST_MPIRUN_ARGS  extra mpirun arguments, e.g. "-mca btl_tcp_if_include eth0 -x NCCL_SOCKET_IFNAME=eth0"
#   NCCL_DEBUG             exported to every rank (default: WARN)
#   PYTHONPATH             exported to every rank as it is here (a relative entry means the same folder: below)
# Every host needs passwordless ssh from this one, the same paths (Python, data, output directory) and Open MPI.
# Every rank starts in the directory this script is started from (mpirun -wdir), so relative paths and
# `python -m`, which puts the current directory first on the Python path, work as in a local run:
# `--model my_models:small_cnn` finds ./my_models.py on every host, and a module elsewhere is found through
# PYTHONPATH. That directory must exist at the same path on every host (shared storage): mpirun stops at once,
# naming the directory and the host, where it does not.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
die() { printf 'mpirun_cluster: error: %s\n' "$*" >&2; exit 2; }

hosts="${HVD_MNIST_HOSTS:-}"
np=""
dry_run=0
while (($#)); do
  case "$1" in
    -H|--hosts) (($# >= 2)) || die "$1 needs a value"; hosts="$2"; shift 2 ;;
    -np|--np) (($# >= 2)) || die "$1 needs a value"; np="$2"; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) break ;;
  esac
done

[[ -n "$hosts" ]] || die "no hosts: pass -H host1:4,host2:4 or set HVD_MNIST_HOSTS"
total=0
IFS=',' read -r -a entries <<< "$hosts"
for entry in "${entries[@]}"; do
  [[ "$entry" =~ ^[A-Za-z0-9._-]+:([1-9][0-9]*)$ ]] || die "bad host entry '$entry' (want name:slots)"
  total=$((total + BASH_REMATCH[1]))
done
np="${np:-$total}"
[[ "$np" =~ ^[1-9][0-9]*$ ]] || die "bad -np '$np'"
((np <= total)) || die "-np $np is more than the $total slots in '$hosts'"

export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
# Empty when unset: mpirun warns about exporting an unset variable; the dynamic loader and Python ignore it empty.
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}" PYTHONPATH="${PYTHONPATH:-}"
cmd=(mpirun -np "$np" -H "$hosts" -wdir "$PWD"
     -bind-to none -map-by slot
     -x NCCL_DEBUG -x LD_LIBRARY_PATH -x PATH -x PYTHONPATH
     -mca pml ob1 -mca btl ^openib)
[[ $(id -u) -ne 0 ]] || cmd+=(--allow-run-as-root)
read -r -a extra <<< "${HVD_MNIST_MPIRUN_ARGS:-}"
cmd+=("${extra[@]}" "${HVD_MNIST_PYTHON:-python}" -m hvd_mnist "$@")

if ((dry_run)); then
  printf '%q ' "${cmd[@]}"
  printf '\n'
else
  exec "${cmd[@]}"
fi
