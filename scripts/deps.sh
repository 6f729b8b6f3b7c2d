#!/usr/bin/env bash
# Installs what softrdma needs to build and what its tests drive (Debian 12, as root).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends \
  build-essential cmake clang libclang-rt-14-dev clang-format googletest libgtest-dev \
  libibverbs-dev librdmacm-dev ibverbs-utils rdmacm-utils ibverbs-providers perftest qperf \
  iperf3 ucx-utils libucx-dev openmpi-bin libopenmpi-dev iproute2 procps coreutils python3 \
  python3-pyverbs
