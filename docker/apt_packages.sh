#!/bin/sh
# Install one stage's Debian packages for one flavor of the image, then drop apt's lists and caches.
#
#   apt_packages.sh builder|runtime cpu|gpu
#
# The GPU flavor first enables Debian's contrib and non-free components, where Debian 13 ships CUDA 12.4
# (nvidia-cuda-toolkit: nvcc, headers, the CUDA runtime) and NCCL 2.22 (libnccl-dev, libnccl2). Its builder
# compiles Horovod's NCCL operations with them; its runtime carries libnccl2 only: TensorFlow's [and-cuda]
# wheels bring the CUDA runtime and cuDNN, and the host's driver brings libcuda.
set -eu
stage="$1"
flavor="$2"
case "$stage/$flavor" in
  builder/cpu) packages="g++ g++-12 make cmake libopenmpi-dev openmpi-bin" ;;
  builder/gpu) packages="g++ g++-12 make cmake libopenmpi-dev openmpi-bin nvidia-cuda-toolkit libnccl-dev" ;;
  runtime/cpu) packages="openmpi-bin openssh-client openssh-server" ;;
  runtime/gpu) packages="openmpi-bin openssh-client openssh-server libnccl2" ;;
  *) echo "apt_packages.sh: error: unknown stage/flavor $stage/$flavor (builder|runtime cpu|gpu)" >&2; exit 2 ;;
esac
if [ "$flavor" = gpu ]; then  # a base from mmdebstrap has sources.list; Debian's images have debian.sources
  sed -i -E 's/^(deb .*) main$/\1 main contrib non-free/' /etc/apt/sources.list 2>/dev/null || true
  sed -i -E 's/^Components: main$/Components: main contrib non-free/' /etc/apt/sources.list.d/debian.sources \
    2>/dev/null || true
fi
apt-get update
# shellcheck disable=SC2086  # the package list is meant to split into words
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $packages
# Python's headers come with the python:3.13-slim base; a bare Debian base gets Debian's.
if [ "$stage" = builder ] && ! python3 -c 'import os, sys, sysconfig
sys.exit(not os.path.exists(sysconfig.get_paths()["include"] + "/Python.h"))'; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3-dev
fi
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/debconf/*-old
