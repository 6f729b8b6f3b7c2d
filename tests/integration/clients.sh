#!/bin/bash
# clients.sh N CMD [ARGS...]: runs N copies of one client command at once (ibv_xsrq_pingpong's
# server takes several clients) and waits for all. Each copy's output follows, headed by its
# number; the status is 0 only when every copy exited 0. The caller's timeout bounds the whole.
set -u
n=$1
shift
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$dir"' EXIT
pids=()
for i in $(seq 1 "$n"); do
	"$@" >"$dir/$i" 2>&1 &
	pids+=($!)
done
failed=0
for i in $(seq 1 "$n"); do
	wait "${pids[$((i - 1))]}" || failed=$((failed + 1))
done
for i in $(seq 1 "$n"); do
	echo "--- client $i"
	cat "$dir/$i"
done
echo "clients with a non-zero status: $failed of $n"
((failed == 0))
