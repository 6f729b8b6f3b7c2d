#!/usr/bin/env bash
# ab_latency.sh: is one build of softrdma faster than another at perftest latency over
# the shared-memory link? A/B in alternated pairs, for changes too small for shm_bench.sh.
#
# Usage: ab_latency.sh [--pairs N] [--test T] [--size S] [--iters N] LIB_A LIB_B
#   LIB_A, LIB_B  directories holding the two builds' libibverbs.so.1 and librdmacm.so.1
#                 (an older commit's: git worktree add /tmp/old <commit>, then
#                 cmake -B /tmp/old/build && cmake --build /tmp/old/build --target ibverbs rdmacm)
#   --pairs   pairs of runs (default 20); each pair runs A and B back to back, the order
#             alternating from pair to pair
#   --test    ib_send_lat (default) or ib_write_lat; --size bytes (default 2);
#             --iters iterations per run (default 20000)
#
# A run's figure is the 10%-trimmed mean of perftest's per-iteration samples (-H), one-way us.
# On a VM the two vCPUs sit on other host cores from one process launch to the next (a run of
# the same build reads 0.18 or 0.45 us), so a pair whose two runs differ by more than 1.25x
# compared two placements: it is printed and left out. The summary is the median of B/A over
# the pairs left, and how many there were; with fewer than 10 the answer is noise.
# Everything binds 127.0.0.1; logs go to build/test-logs/ab_latency-<date>-<pid>/.
# Exit status: 0 when the pairs were measured, 2 when a run failed.
set -euo pipefail
cd "$(dirname "$0")/.."

PAIRS=20 TEST=ib_send_lat SIZE=2 ITERS=20000
while (($#)); do
	case $1 in
	--pairs) PAIRS=$2; shift 2 ;;
	--test) TEST=$2; shift 2 ;;
	--size) SIZE=$2; shift 2 ;;
	--iters) ITERS=$2; shift 2 ;;
	-h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) break ;;
	esac
done
if (($# != 2)); then
	echo "usage: $0 [--pairs N] [--test T] [--size S] [--iters N] LIB_A LIB_B" >&2
	exit 2
fi
LIB_A=$(realpath "$1") LIB_B=$(realpath "$2")
for lib in "$LIB_A" "$LIB_B"; do
	[[ -e $lib/libibverbs.so.1 ]] || { echo "no libibverbs.so.1 in $lib" >&2; exit 2; }
done
command -v "$TEST" > /dev/null || { echo "$TEST missing (apt-get install perftest)" >&2; exit 2; }

LOGS=build/test-logs/ab_latency-$(date +%Y%m%d-%H%M%S)-$$
mkdir -p "$LOGS"
RUNDIR=$(mktemp -d /dev/shm/softrdma-ab.XXXXXX)
SERVER=
cleanup() {
	[[ -n $SERVER ]] && kill "$SERVER" 2> /dev/null && wait "$SERVER" 2> /dev/null
	rm -rf "$RUNDIR"
}
trap cleanup EXIT

# run LIB NAME: one server/client pair; prints the client's trimmed mean (empty: it failed).
run() {
	local lib=$1 name=$2 port=$((20000 + RANDOM % 2000))
	LD_LIBRARY_PATH=$lib SOFTRDMA_RUNDIR=$RUNDIR timeout 60 \
		"$TEST" -s "$SIZE" -n "$ITERS" -p "$port" > "$LOGS/$name.server.log" 2>&1 &
	SERVER=$!
	sleep 0.3
	LD_LIBRARY_PATH=$lib SOFTRDMA_RUNDIR=$RUNDIR timeout 60 \
		"$TEST" -s "$SIZE" -n "$ITERS" -H -p "$port" 127.0.0.1 > "$LOGS/$name.client.log" 2>&1 || true
	wait "$SERVER" 2> /dev/null || true
	SERVER=
	awk -F', *' '/^#, usec/ { on = 1; next } on && NF == 2 { print $2 }' "$LOGS/$name.client.log" |
		sort -g | awk '{ v[NR] = $1 } END {
			k = int(NR / 10); n = 0; s = 0
			for (i = k + 1; i <= NR - k; i++) { s += v[i]; n++ }
			if (n > 0) printf "%.4f\n", s / n }'
}

for ((pair = 1; pair <= PAIRS; pair++)); do
	if ((pair % 2)); then
		a=$(run "$LIB_A" "$pair-a") b=$(run "$LIB_B" "$pair-b")
	else
		b=$(run "$LIB_B" "$pair-b") a=$(run "$LIB_A" "$pair-a")
	fi
	if [[ -z $a || -z $b ]]; then
		echo "pair $pair: a run failed (logs: $LOGS)" >&2
		exit 2
	fi
	r=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", b / a }')
	kept=$(awk -v r="$r" 'BEGIN { print (r > 0.8 && r < 1.25) ? "" : "  (two placements: left out)" }')
	echo "pair $pair: A $a us  B $b us  B/A $r$kept"
done | tee "$LOGS/pairs.log"
mapfile -t ratios < <(awk '/B\/A/ && !/left out/ { print $NF }' "$LOGS/pairs.log")
if ((${#ratios[@]} == 0)); then
	echo "$TEST $SIZE B: no pair ran in one placement"
	exit 0
fi
printf '%s\n' "${ratios[@]}" | sort -g | awk -v t="$TEST" -v s="$SIZE" '{ v[NR] = $1 } END {
	m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
	printf "%s %s B: median B/A %.3f over %d pairs in one placement (B faster below 1)\n", t, s, m, NR }'
