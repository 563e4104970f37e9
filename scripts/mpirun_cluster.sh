#!/usr/bin/env bash
# Launch hvd_mnist on several hosts with Open MPI's mpirun: one rank per slot, the rest of the arguments go to
# `python -m hvd_mnist`.
#
#   scripts/mpirun_cluster.sh -H host1:4,host2:4 --lr 0.1 --steps 2000 --output-dir /shared/runs/a
#   HVD_MNIST_HOSTS=host1:4,host2:4 scripts/mpirun_cluster.sh --data-dir /shared/mnist
#   scripts/mpirun_cluster.sh --dry-run -H host1:4,host2:4      # print the mpirun command only
#
# Options (before the trainer's arguments; `--` ends them explicitly):
#   -H HOSTS      host:slots,... (default: $HVD_MNIST_HOSTS); slots = GPUs (or ranks) on that host
#   -np N         number of ranks (default: the sum of the slots)
#   --dry-run     print the command instead of running it
# Environment:
#   HVD_MNIST_PYTHON       the Python that has hvd_mnist on every host (default: python on PATH)
#   HVD_MNIST_MPIRUN_ARGS  extra mpirun arguments, e.g. "-mca btl_tcp_if_include eth0 -x NCCL_SOCKET_IFNAME=eth0"
#   NCCL_DEBUG             exported to every rank (default: WARN)
# Every host needs passwordless ssh from this one, the same paths (Python, data, output directory) and Open MPI.
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
# Empty when unset: mpirun warns about exporting an unset variable, and the dynamic loader ignores an empty one.
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
cmd=(mpirun -np "$np" -H "$hosts"
     -bind-to none -map-by slot
     -x NCCL_DEBUG -x LD_LIBRARY_PATH -x PATH
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
