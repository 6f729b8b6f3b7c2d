#!/usr/bin/env bash
# Installs dependencies, builds softrdma, and shows the main job: an unmodified Debian RDMA
# program pair (ibv_rc_pingpong) talking over softrdma0 with no RDMA hardware or kernel module.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ]; then bash scripts/deps.sh; fi
cmake -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)"
echo "== ibv_devices through softrdma"
build/bin/softrdma run -- ibv_devices
echo "== ibv_rc_pingpong server and client, two processes"
port=$((20000 + RANDOM % 20000))
build/bin/softrdma run -- timeout 30 ibv_rc_pingpong -p "$port" -n 1000 &
server=$!
sleep 0.5
build/bin/softrdma run -- timeout 30 ibv_rc_pingpong -p "$port" -n 1000 127.0.0.1
wait "$server"
