#!/usr/bin/env bash
# Build hvd_mnist's container images with docker or podman, from docker/Dockerfile (one recipe, two flavors).
#
#   scripts/build_images.sh [--engine docker|podman] [--local-base] [--gpu] [--tag PREFIX] [--ca-bundle FILE]
#
#   --engine      which engine (default: $HVD_MNIST_ENGINE, else docker if its daemon answers, else podman)
#   --local-base  make the images' base (Debian 13, Python 3.13) from Debian's mirror with mmdebstrap
#                 instead of pulling python:3.13-slim-trixie; done anyway when the pull fails (no registry)
#   --gpu         also build the GPU image: Debian 13's CUDA 12.4 and NCCL from the same mirror, Horovod with
#                 NCCL (builds on a machine without a GPU; about 2 GB of CUDA packages in its builder stage)
#   --tag PREFIX  image names PREFIX:cpu and PREFIX:gpu (default: hvd-mnist)
#   --ca-bundle   a CA bundle for pip inside the build, given as a build secret (never stored in a layer),
#                 for machines behind a TLS-inspecting proxy
# Prints the image names it built, one per line, last. A failure prints one line and exits non-zero.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BASE="docker.io/library/python:3.13-slim-trixie"
LOCAL_BASE="localhost/hvd-mnist-base:trixie-1"  # Debian 13 with its python3 3.13, made here (-N: its recipe)
DEBIAN_SUITE="trixie"
PULL_TIMEOUT_S=60

fail() { printf 'build_images: error: %s\n' "$*" >&2; exit 1; }
say() { printf 'build_images: %s\n' "$*" >&2; }

engine="${HVD_MNIST_ENGINE:-}"
local_base=false
gpu=false
prefix="hvd-mnist"
ca_bundle=""
while (($#)); do
  case "$1" in
    --engine) engine="${2:?--engine needs docker or podman}"; shift 2 ;;
    --local-base) local_base=true; shift ;;
    --gpu) gpu=true; shift ;;
    --tag) prefix="${2:?--tag needs a name}"; shift 2 ;;
    --ca-bundle) ca_bundle="${2:?--ca-bundle needs a file}"; shift 2 ;;
    -h|--help) sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) fail "unknown option $1 (see --help)" ;;
  esac
done
if [[ -z "$engine" ]]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then engine=docker
  elif command -v podman >/dev/null; then engine=podman
  else fail "no container engine: install docker or podman (scripts/setup_env.sh installs podman)"; fi
fi
command -v "$engine" >/dev/null || fail "$engine is not installed"
[[ -z "$ca_bundle" || -f "$ca_bundle" ]] || fail "CA bundle $ca_bundle not found"

pulled() {  # pulled IMAGE: true if the engine has it or can pull it now
  "$engine" image inspect "$1" >/dev/null 2>&1 && return 0
  timeout "$PULL_TIMEOUT_S" "$engine" pull -q "$1" >/dev/null 2>&1
}

make_local_base() {  # Debian 13's minimal system with its python3 (3.13) and venv, from apt's mirror
  if "$engine" image inspect "$LOCAL_BASE" >/dev/null 2>&1; then
    say "reusing the local base $LOCAL_BASE"
    return
  fi
  command -v mmdebstrap >/dev/null || fail "making the local base needs mmdebstrap (apt-get install mmdebstrap)"
  local mirror work tarball
  mirror="$(grep -hsE '^[[:space:]]*(URIs:|deb[[:space:]])' /etc/apt/sources.list /etc/apt/sources.list.d/* \
    | grep -oE 'https?://[^ ]+/debian/?' | head -n 1 || true)"
  mirror="${mirror:-http://deb.debian.org/debian}"
  work="$(mktemp -d -t hvd-mnist-base.XXXXXX)"
  tarball="$work/base.tar"
  say "making $LOCAL_BASE from $mirror $DEBIAN_SUITE (about 2 minutes, once)"
  mmdebstrap --quiet --variant=minbase --include=ca-certificates,python3,python3-venv \
    "$DEBIAN_SUITE" "$tarball" "$mirror" || { rm -rf "$work"; fail "mmdebstrap $DEBIAN_SUITE failed"; }
  "$engine" import --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' "$tarball" "$LOCAL_BASE" >/dev/null \
    || { rm -rf "$work"; fail "$engine import of the local base failed"; }
  rm -rf "$work"
}

build() {  # build IMAGE [BUILD ARGS...]
  local image="$1"
  shift
  local args=(build -f "$ROOT/docker/Dockerfile" -t "$image" "$@")
  [[ "$engine" == podman ]] && args+=(--pull=never --format docker)
  [[ -n "$ca_bundle" ]] && args+=(--secret "id=pip_cert,src=$ca_bundle")
  say "building $image with $engine"
  DOCKER_BUILDKIT=1 "$engine" "${args[@]}" "$ROOT" >&2 || fail "building $image failed (see the build output above)"
  printf '%s\n' "$image"
}

base="$BASE"
if $local_base || ! pulled "$BASE"; then
  $local_base || say "cannot pull $BASE; making an equivalent base locally"
  make_local_base
  base="$LOCAL_BASE"
fi
flavors=(cpu)
$gpu && flavors+=(gpu)
built=()
for flavor in "${flavors[@]}"; do
  built+=("$(build "$prefix:$flavor" --build-arg "BASE_IMAGE=$base" --build-arg "FLAVOR=$flavor")")
  size="$("$engine" image inspect --format '{{.Size}}' "$prefix:$flavor")"
  say "$prefix:$flavor is $((size / 1000000)) MB"
done
printf '%s\n' "${built[@]}"
