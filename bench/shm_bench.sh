#!/usr/bin/env bash
#
# Benchmark of issue 4: perftest over softrdma's shared-memory link and over
# its TCP link, next to anchors measured in the same run on the same host,
# printed as one table with the ratios and a verdict per target.
#
#   softrdma    perftest through `softrdma run`, both sides on this host
#               (127.0.0.1): column "softrdma shm" with the default link
#               (same-host peers take the shared-memory link), column
#               "softrdma tcp" with SOFTRDMA_LINK=tcp on both sides.
#               ib_write_lat, ib_send_lat -s 2 (-n <iters>); ib_write_bw -s
#               65536 and 1048576, ib_read_bw and ib_send_bw -s 65536,
#               ib_atomic_bw (-D <duration>). SOFTRDMA_LOG=1 is set for every
#               softrdma process: the "link" columns show the links it logged
#               (shm, tcp, udp, self = in-process; "!" marks a link other
#               than the one the column asks for, e.g. a fallback; "?" none).
#   scale       build/bin/softrdma-bench-scale (bench/probes/scale_probe.cpp)
#               through `softrdma run`: 1000 RC QPs between two processes,
#               on each link (setup time, bytes per QP), and 10000 MRs of
#               4 KiB in one process (registration time, bytes per MR);
#               and perftest itself with 1000 QPs: ib_write_bw -q 1000 -s
#               4096 -n 100, on each link.
#   anchors     softrdma-bench-memcpy (single-thread memcpy, warm buffers);
#               softrdma-bench-pingpong (two processes bouncing one cache
#               line of shared memory); ucx_perftest with UCX_TLS=posix,self
#               and UCX_TLS=tcp,self (tag_lat -s 2, ucp_put_bw and tag_bw);
#               iperf3, one stream on 127.0.0.1.
#
# Targets (issue 4; medians, same run; "stretch" targets do not count in the
# exit status):
#   shm  ib_write_lat, ib_send_lat 2 B   <= 1.00x UCX posix tag_lat;
#                                        stretch <= 2.00x cache-line ping-pong
#   shm  ib_write_bw 64 KiB              >= 0.80x memcpy 64 KiB,
#                                        >= 1.00x UCX posix ucp_put_bw 64 KiB
#   shm  ib_write_bw 1 MiB               >= 0.85x memcpy 1 MiB
#   shm  ib_read_bw 64 KiB               within 10% of ib_write_bw 64 KiB
#   shm  ib_send_bw 64 KiB               >= 10 GB/s
#   shm  ib_atomic_bw                    >= 10 M ops/s
#   tcp  ib_write_bw 1 MiB               >= 0.90x iperf3, one stream
#   tcp  ib_write_lat 2 B                <= 1.00x UCX tcp tag_lat
#   both 1000 RC QPs / 10000 MRs         work
#
# Latencies are measured in rounds (--rounds, default 3): each round runs the
# ping-pong probe, UCX's tag_lat (posix, tcp) and the softrdma latency cases
# back to back, so that anchor and case see the same machine (two vCPUs may
# move between cores of a host within seconds, and a cache line then takes
# 0.04 or 0.24 us to cross); then UCX posix ucp_put_bw, shm ib_write_bw and
# shm ib_read_bw at 64 KiB (measured once, ib_read_bw came out 12 % over the
# median of ib_write_bw's rounds, which spread from 88 to 101 GB/s, in one run
# of three). A figure measured in rounds is the median over them; a ratio
# between two of them is the median of the rounds' ratios. A second ping-pong
# probe ends each round; the footer gives each round's own ratios of the
# paired rows and its ping-pong at both ends (see bench/README.md).
#
# Units: latency in microseconds, one way (the median of perftest's
# per-iteration half round trips, from the samples -H lists: its t_typical
# is that median to two places; ucx_perftest's 50.0%ile column of
# the Final line of tag_lat, also half a round trip; the ping-pong probe's
# median). Bandwidth in GB/s = 10^9 bytes/s everywhere (perftest and
# ucx_perftest print MB/s meaning 2^20 bytes/s: converted; iperf3 bits/s:
# divided by 8). Message rate in M ops/s (perftest's MsgRate, Mpps).
#
# Usage: shm_bench.sh [--duration S] [--iters N] [--rounds N] [--qps N]
#                     [--mrs N] [--quick] [--verbose]
#   --duration  seconds per bandwidth case (perftest -D, iperf3 -t; default 3)
#   --iters     perftest latency iterations (default 20000)
#   --rounds    rounds of the latencies and of ib_write_bw 64 KiB against
#               UCX put and ib_read_bw 64 KiB (default 3)
#   --qps       RC QPs per process in the scale test (default 1000)
#   --mrs       MRs in the scale test (default 10000)
#   --quick     --duration 1 --iters 5000 --rounds 1, shorter anchors (a
#               smoke run; the figures are noisier)
# A full run takes about 2 minutes (--quick: 1). Needs a build with the probes
# (SOFTRDMA_BUILD, default <repo>/build), perftest, ucx-utils (ucx_perftest)
# and iperf3; a missing tool makes its rows read "n/a (tool missing)".
# Output: the table on stdout (progress on stderr), raw logs in
# $SOFTRDMA_BUILD/test-logs/shm_bench-*/ (run.log has a verdict per case).
# Exit status: 0 targets met, 1 a target missed, 2 a measurement failed (or
# a tool is missing).

set -u

# shellcheck source-path=SCRIPTDIR source=../tests/integration/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../tests/integration/lib.sh"

DURATION=3
LAT_ITERS=20000
ROUNDS=3
SCALE_QPS=1000
SCALE_MRS=10000
QUICK=0
while [[ $# -gt 0 ]]; do
	case $1 in
	--duration | --iters | --rounds | --qps | --mrs)
		[[ $# -ge 2 && $2 =~ ^[1-9][0-9]*$ ]] || srdma_die "$1 needs a positive number"
		case $1 in
		--duration) DURATION=$2 ;;
		--iters) LAT_ITERS=$2 ;;
		--rounds) ROUNDS=$2 ;;
		--qps) SCALE_QPS=$2 ;;
		--mrs) SCALE_MRS=$2 ;;
		esac
		shift
		;;
	--quick)
		QUICK=1
		DURATION=1
		LAT_ITERS=5000
		ROUNDS=1
		;;
	-v | --verbose) T_VERBOSE=1 ;;
	-h | --help)
		srdma_usage
		exit 0
		;;
	*) srdma_die "unknown argument: $1 (see --help)" ;;
	esac
	shift
done
# perftest refuses fewer than 5 iterations.
((LAT_ITERS >= 5)) || srdma_die "--iters needs at least 5"

srdma_require_build
PROBE_DIR=$SOFTRDMA_BUILD/bin
for probe in memcpy pingpong scale; do
	[[ -x $PROBE_DIR/softrdma-bench-$probe ]] ||
		srdma_die "$PROBE_DIR/softrdma-bench-$probe not found (build the bench/ targets: cmake --build $SOFTRDMA_BUILD)"
done

# Tools: a missing one is reported in its rows, not fatal.
declare -A HAVE
for tool in ib_write_lat ib_send_lat ib_write_bw ib_read_bw ib_send_bw ib_atomic_bw ucx_perftest iperf3; do
	if command -v "$tool" >/dev/null; then HAVE[$tool]=1; else HAVE[$tool]=0; fi
done

srdma_log_init shm_bench
srdma_install_traps
srdma_private_rundir || srdma_die "cannot create a private run directory"
# Leave room for the table: cases that would start later fail unrun.
T_BUDGET=${SOFTRDMA_BENCH_BUDGET:-900}

# The shm column is the default link: an inherited SOFTRDMA_LINK would make it
# something else. Every softrdma process logs its link choices.
unset SOFTRDMA_LINK
export SOFTRDMA_LOG=1

RUNLOG=$T_LOGDIR/run.log
measure_pair() { run_pair "$@" >>"$RUNLOG"; }
measure_single() { run_single "$@" >>"$RUNLOG"; }
client_log() { echo "$T_LOGDIR/$(_srdma_slug "$1").client.log"; }
single_log() { echo "$T_LOGDIR/$(_srdma_slug "$1").log"; }
last_verdict() { tail -n1 "$T_LOGDIR/results.txt"; }
progress() { echo "shm_bench: $*" >&2; }

# Results. V[key] is a figure (a bare number in the unit of the key's row),
# WHY[key] says why V[key] is missing, LINK[key] the links a softrdma case
# logged. Keys: shm,<case> and tcp,<case> for softrdma, a,<anchor> for
# anchors.
declare -A V WHY LINK

# missing KEY REASON: the figure KEY could not be measured.
missing() {
	V[$1]=
	WHY[$1]=$2
}

# --- parsers: print the figure, or nothing if it is not there ----------------

# perftest bw table: BW average (4th column) of the row for SIZE, in GB/s. The
# header says MB/sec (perftest's MB is 2^20 bytes) or, with --report_gbits,
# Gb/sec (10^9 bits).
parse_perftest_gbs() {
	[[ -f $1 ]] || return 0
	awk -v size="$2" '
		/#bytes/ { unit = ($0 ~ /Gb\/sec/) ? "gb" : "mb"; next }
		unit != "" && $1 == size && $4 ~ /^[0-9.]+$/ {
			v = (unit == "mb") ? $4 * 1048576 / 1e9 : $4 / 8
			printf "%.3f\n", v; exit }' "$1"
}

# perftest bw table: MsgRate[Mpps] (5th column) of the row for SIZE.
parse_perftest_mpps() {
	[[ -f $1 ]] || return 0
	awk -v size="$2" '
		/#bytes/ { hdr = 1; next }
		hdr && $1 == size && $5 ~ /^[0-9.]+$/ { printf "%.3f\n", $5; exit }' "$1"
}

# perftest -H: the median of the per-iteration samples (one-way us) listed
# after the "#, usec" line, to three places (the samples themselves come in
# steps of ~0.005 us on this host). t_typical is the same median printed to
# two: 0.10 us is anything from 0.095 to 0.105, a tenth of the shared-memory
# figures and of the margin their targets are judged by.
parse_perftest_samples_median() {
	[[ -f $1 ]] || return 0
	awk -F', *' '/^#, usec/ { on = 1; next } on && NF == 2 && $2 ~ /^[0-9.]+$/ { print $2 }' "$1" |
		sort -g | awk '{ v[NR] = $1 } END { if (NR) printf "%.3f\n", v[int((NR + 1) / 2)] }'
}

# perftest lat table: the column named COL (t_typical, t_avg) of the row for
# SIZE, in microseconds. Column names contain no blanks up to t_avg, so the
# header tokens line up with the data columns.
parse_perftest_lat() {
	[[ -f $1 ]] || return 0
	awk -v size="$2" -v col="$3" '
		/#bytes/ { for (i = 1; i <= NF; i++) if (index($i, col "[") == 1) c = i; next }
		c && $1 == size && $c ~ /^[0-9.]+$/ { printf "%.3f\n", $c; exit }' "$1"
}

# ucx_perftest's last line, "Final: <iters> <50.0%ile> <avg> <overall>
# <bw avg> <bw overall> <msgrate avg> <msgrate overall>": latencies in
# microseconds (one way for the ping-pong tests such as tag_lat; the
# percentile is over UCX's queue of the most recent iterations), bandwidth in
# MB/s of 2^20 bytes. WHAT: lat prints the median latency (us), bw the overall
# bandwidth of the whole run (GB/s).
parse_ucx() {
	[[ -f $1 ]] || return 0
	awk -v what="$2" '
		$1 == "Final:" && NF >= 9 {
			if (what == "lat" && $3 ~ /^[0-9.]+$/) printf "%.3f\n", $3
			if (what == "bw" && $7 ~ /^[0-9.]+$/) printf "%.3f\n", $7 * 1048576 / 1e9
			exit }' "$1"
}

# iperf3 -J: end.sum_received.bits_per_second, in GB/s. iperf3 pretty-prints
# its JSON one key per line, so awk is enough (no jq needed).
parse_iperf3_gbs() {
	[[ -f $1 ]] || return 0
	awk '/"sum_received"/ { s = 1 }
		s && /"bits_per_second"/ { v = $2; gsub(/[^0-9.eE+-]/, "", v); printf "%.3f\n", v / 8e9; exit }' "$1"
}

# softrdma-bench-memcpy: "size <SIZE> B: median <GB/s> GB/s (...)".
parse_memcpy_gbs() {
	[[ -f $1 ]] || return 0
	awk -v size="$2" '$1 == "size" && $2 == size && $4 == "median" { print $5; exit }' "$1"
}

# softrdma-bench-pingpong: "one-way latency: median <us> us (...)".
parse_pingpong_us() {
	[[ -f $1 ]] || return 0
	awk '$1 == "one-way" && $3 == "median" { print $4; exit }' "$1"
}

# softrdma-bench-scale: the value of KEY on the line starting with TAG
# (scale-qps, scale-mrs), whose fields are key=value.
parse_scale() {
	[[ -f $1 ]] || return 0
	awk -v tag="$2" -v key="$3" '
		$1 == tag { for (i = 2; i <= NF; i++) if (index($i, key "=") == 1) { print substr($i, length(key) + 2); exit } }' "$1"
}

# The links softrdma logged (SOFTRDMA_LOG=1) in the given logs: "shm", "tcp",
# "udp" or "self" (in-process), several joined by "+", "?" if none.
observed_links() {
	local links
	links=$(cat "$@" 2>/dev/null | awk '
		/softrdma: / && / in-process link/ { seen["self"] = 1; next }
		/softrdma: / { for (i = 2; i <= NF; i++) if ($(i + 1) == "link" && $i ~ /^[a-z-]+$/) seen[$i] = 1 }
		END { for (l in seen) print l }' | sort | paste -sd+)
	echo "${links:-?}"
}

# fail_last KEY: the last case gave no figure for KEY. The cell says failed
# or "no figure"; the notes under the table get the harness's verdict.
declare -A NOTES
fail_last() {
	local v
	v=$(last_verdict)
	if [[ $v == PASS* ]]; then
		missing "$1" "no figure"
		NOTES["no figure in the log of: ${v#PASS }"]=1
	else
		missing "$1" failed
		NOTES["$v"]=1
	fi
}

# take KEY FIGURE: store the figure of the last case, or why it is missing.
take() {
	if [[ -n $2 && $(last_verdict) == PASS* ]]; then
		V[$1]=$2
	else
		fail_last "$1"
	fi
}

# --- anchors -------------------------------------------------------------------

# Other busy processes on the machine skew every figure: measure how many
# CPUs were busy during one second (from /proc/stat) before and after the run,
# when none of ours are running.
cpus_busy() {
	local a b
	a=$(awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8, $5 + $6; exit }' /proc/stat)
	sleep 1
	b=$(awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8, $5 + $6; exit }' /proc/stat)
	awk -v a="$a" -v b="$b" -v n="$(nproc)" 'BEGIN {
		split(a, x, " "); split(b, y, " "); busy = y[1] - x[1]; idle = y[2] - x[2]
		printf "%.2f\n", (busy + idle > 0) ? n * busy / (busy + idle) : 0 }'
}
BUSY_START=$(cpus_busy)
if awk -v b="$BUSY_START" 'BEGIN { exit !(b > 0.2) }'; then
	echo "shm_bench: warning: the machine is not idle ($BUSY_START CPUs busy): figures may be low" >&2
fi
echo "shm_bench: ${DURATION}s per bandwidth case, $LAT_ITERS latency iterations, scale $SCALE_QPS QPs / $SCALE_MRS MRs, logs in $T_LOGDIR" >&2

memcpy_reps=25 pingpong_batches=10000
((QUICK)) && memcpy_reps=9 pingpong_batches=2000

progress "memcpy probe"
name="memcpy probe"
measure_single --raw --timeout 60 "$name" "$PROBE_DIR/softrdma-bench-memcpy --reps $memcpy_reps 65536 1048576"
take a,memcpy_64k "$(parse_memcpy_gbs "$(single_log "$name")" 65536)"
take a,memcpy_1m "$(parse_memcpy_gbs "$(single_log "$name")" 1048576)"

# ROUND_TAG names the latency round a case belongs to (in its log's name).
ROUND_TAG=
# pingpong_case [KEY [WHEN]]: the probe, into KEY (a,pingpong); WHEN names a
# second probe of the round in its log's name.
pingpong_case() {
	local key=${1:-a,pingpong} name="pingpong probe${2:-}$ROUND_TAG"
	progress "cache-line $name"
	measure_single --raw --timeout 60 "$name" "$PROBE_DIR/softrdma-bench-pingpong --batches $pingpong_batches"
	take "$key" "$(parse_pingpong_us "$(single_log "$name")")"
}

# ucx_case KEY TLS TEST SIZE ITERS WHAT: one ucx_perftest run (its server
# serves one test and exits). WHAT is lat or bw (see parse_ucx).
ucx_case() {
	local key=$1 tls=$2 test=$3 size=$4 iters=$5 what=$6 name env_str
	if ((!HAVE[ucx_perftest])); then
		missing "$key" "n/a (tool missing)"
		return
	fi
	env_str="env UCX_TLS=$tls,self"
	# UCX's tcp transport would use every interface (lo and eth0, as lanes
	# of one endpoint); lo alone is one path, as iperf3's 127.0.0.1 stream.
	[[ $tls == tcp ]] && env_str+=" UCX_NET_DEVICES=lo"
	name="ucx $tls $test -s $size$ROUND_TAG"
	progress "$name"
	srdma_next_port "" # on the host
	measure_pair --raw --port "$PORT" --timeout 120 "$name" \
		"$env_str ucx_perftest -p $PORT" \
		"$env_str ucx_perftest 127.0.0.1 -p $PORT -t $test -s $size -n $iters"
	take "$key" "$(parse_ucx "$(client_log "$name")" "$what")"
}

# Iterations: each run a second or two on this class of machine.
q=1
((QUICK)) && q=5
ucx_case a,ucx_posix_put_1m posix ucp_put_bw 1048576 $((20000 / q)) bw
ucx_case a,ucx_posix_tag_64k posix tag_bw 65536 $((100000 / q)) bw
ucx_case a,ucx_tcp_put_64k tcp ucp_put_bw 65536 $((50000 / q)) bw
ucx_case a,ucx_tcp_put_1m tcp ucp_put_bw 1048576 $((5000 / q)) bw

if ((HAVE[iperf3])); then
	progress "iperf3"
	name="iperf3"
	srdma_next_port "" # on the host
	measure_pair --raw --port "$PORT" --timeout $((DURATION + 60)) "$name" \
		"iperf3 -s -1 -p $PORT" "iperf3 -c 127.0.0.1 -p $PORT -t $DURATION -J"
	take a,iperf3 "$(parse_iperf3_gbs "$(client_log "$name")")"
else
	missing a,iperf3 "n/a (tool missing)"
fi

# --- softrdma: perftest on each link -------------------------------------------

# perftest_case COL KEY KIND TOOL ARGS: one perftest run through softrdma on
# column COL's link (shm: the default, tcp: SOFTRDMA_LINK=tcp). KIND says
# what to read: lat (the median of the client's samples, size 2), bw:<size>
# (GB/s), rate:<size> (Mpps).
perftest_case() {
	local col=$1 key=$2 kind=$3 tool=$4 args=$5 name env_str='' tmo log fig client_args
	key=$col,$key
	if ((!HAVE[$tool])); then
		missing "$key" "n/a (tool missing)"
		return
	fi
	[[ $col == tcp ]] && env_str="env SOFTRDMA_LINK=tcp "
	name="$col $tool $args$ROUND_TAG"
	progress "$name"
	srdma_next_port "" # on the host
	tmo=$((DURATION + 60))
	[[ $kind == lat ]] && tmo=180
	# The client of a latency case lists its samples (-H) for their median.
	[[ $kind == lat ]] && client_args="-H $args" || client_args=$args
	measure_pair --port "$PORT" --timeout "$tmo" "$name" \
		"$env_str$tool -d softrdma0 -p $PORT -F $args" \
		"$env_str$tool -d softrdma0 -p $PORT -F $client_args 127.0.0.1"
	log=$(client_log "$name")
	LINK[$key]=$(observed_links "$log" "$T_LOGDIR/$(_srdma_slug "$name").server.log")
	case $kind in
	lat)
		fig=$(parse_perftest_samples_median "$log")
		[[ -n $fig ]] || fig=$(parse_perftest_lat "$log" 2 t_typical)
		;;
	bw:*) fig=$(parse_perftest_gbs "$log" "${kind#bw:}") ;;
	rate:*) fig=$(parse_perftest_mpps "$log" "${kind#rate:}") ;;
	esac
	take "$key" "$fig"
}

# scale_qps COL: the QP scale probe on COL's link.
scale_qps() {
	local col=$1 name env_str='' log
	[[ $col == tcp ]] && env_str="env SOFTRDMA_LINK=tcp "
	name="$col scale qps $SCALE_QPS"
	progress "$name"
	measure_single --timeout 240 "$name" "${env_str}$PROBE_DIR/softrdma-bench-scale qps $SCALE_QPS"
	log=$(single_log "$name")
	LINK[$col,qps_ms]=$(observed_links "$log")
	if [[ $(last_verdict) == PASS* && $(parse_scale "$log" scale-qps ok) == 1 ]]; then
		V[$col,qps_ms]=$(parse_scale "$log" scale-qps setup_ms)
		V[$col,qps_bytes]=$(parse_scale "$log" scale-qps bytes_per_qp)
	else
		fail_last "$col,qps_ms"
		missing "$col,qps_bytes" "-"
	fi
}
# Rounds of the anchors and the cases back to back (see the header): the
# latencies, and ib_write_bw 64 KiB with UCX's put, whose figure moved by a
# fifth from run to run (93-127 GB/s on 2026-12-06, ours 112-120).
# R[key,round] holds a round's figure; V[key] becomes the median of the rounds.
declare -A R
ROUND_KEYS=("a,pingpong" "a,ucx_posix_lat" "shm,write_lat" "shm,send_lat" "a,ucx_tcp_lat" "tcp,write_lat" "tcp,send_lat"
	"a,ucx_posix_put_64k" "shm,write_64k" "shm,read_64k" "a,pingpong_end")
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 }
	END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
lat_args="-s 2 -n $LAT_ITERS"
for ((round = 1; round <= ROUNDS; round++)); do
	((ROUNDS > 1)) && ROUND_TAG=" round $round"
	pingpong_case
	ucx_case a,ucx_posix_lat posix tag_lat 2 $((1000000 / q)) lat
	perftest_case shm write_lat lat ib_write_lat "$lat_args"
	perftest_case shm send_lat lat ib_send_lat "$lat_args"
	ucx_case a,ucx_tcp_lat tcp tag_lat 2 $((100000 / q)) lat
	perftest_case tcp write_lat lat ib_write_lat "$lat_args"
	perftest_case tcp send_lat lat ib_send_lat "$lat_args"
	ucx_case a,ucx_posix_put_64k posix ucp_put_bw 65536 $((200000 / q)) bw
	perftest_case shm write_64k bw:65536 ib_write_bw "-s 65536 -D $DURATION"
	perftest_case shm read_64k bw:65536 ib_read_bw "-s 65536 -D $DURATION"
	# Again at the round's end: whether the CPUs moved during it (the footer).
	((ROUNDS > 1)) && pingpong_case a,pingpong_end " end"
	for key in "${ROUND_KEYS[@]}"; do
		[[ -n ${V[$key]:-} ]] && R[$key,$round]=${V[$key]}
	done
done
ROUND_TAG=
for key in "${ROUND_KEYS[@]}"; do
	figures=()
	for ((round = 1; round <= ROUNDS; round++)); do
		[[ -n ${R[$key,$round]:-} ]] && figures+=("${R[$key,$round]}")
	done
	((${#figures[@]})) && V[$key]=$(median "${figures[@]}")
done

for col in shm tcp; do
	# shm's runs in the rounds above.
	[[ $col == shm ]] || perftest_case $col write_64k bw:65536 ib_write_bw "-s 65536 -D $DURATION"
	perftest_case $col write_1m bw:1048576 ib_write_bw "-s 1048576 -D $DURATION"
	[[ $col == shm ]] || perftest_case $col read_64k bw:65536 ib_read_bw "-s 65536 -D $DURATION"
	perftest_case $col send_64k bw:65536 ib_send_bw "-s 65536 -D $DURATION"
	perftest_case $col atomic rate:8 ib_atomic_bw "-D $DURATION"
	perftest_case $col qps_perftest bw:4096 ib_write_bw "-q $SCALE_QPS -s 4096 -n 100"
	scale_qps $col
done

name="scale mrs $SCALE_MRS"
progress "$name"
measure_single --timeout 240 "$name" "$PROBE_DIR/softrdma-bench-scale mrs $SCALE_MRS 4096"
log=$(single_log "$name")
if [[ $(last_verdict) == PASS* && $(parse_scale "$log" scale-mrs ok) == 1 ]]; then
	V[shm,mrs_ms]=$(parse_scale "$log" scale-mrs reg_ms)
	V[shm,mrs_bytes]=$(parse_scale "$log" scale-mrs bytes_per_mr)
else
	fail_last shm,mrs_ms
	missing shm,mrs_bytes "-"
fi
# MRs are per process: there is no second link to measure them on.
missing tcp,mrs_ms "-"
missing tcp,mrs_bytes "-"

srdma_cleanup
progress "done"

# --- the table -------------------------------------------------------------------

STATUS=0
status_at_least() { ((STATUS < $1)) && STATUS=$1; }

# Units of the figures, by the key's case name.
unit_of() {
	case ${1#*,} in
	*lat | pingpong) echo us ;;
	atomic) echo "Mop/s" ;;
	*_ms) echo ms ;;
	*_bytes) echo B ;;
	*) echo "GB/s" ;;
	esac
}

# cell KEY: the figure with its unit, or why it is missing.
cell() {
	if [[ -n ${V[$1]:-} ]]; then
		echo "${V[$1]} $(unit_of "$1")"
	else
		echo "${WHY[$1]:-n/a}"
	fi
}

# link_cell COL CASE: the links COL's case logged, "!" if not COL's own; "-"
# if it did not run or failed before logging any.
link_cell() {
	local l=${LINK[$1,$2]:-}
	if [[ -z $l || ($l == "?" && -z ${V[$1,$2]:-}) ]]; then
		echo -
		return
	fi
	[[ $l == "$1" ]] || l="$l!"
	echo "$l"
}

table_line() {
	printf '%-26s %-18s %-5s %-18s %-5s %-30s %-18s %6s  %-15s %s\n' "$@"
}
table_line metric "softrdma shm" link "softrdma tcp" link anchor "anchor value" ratio target verdict

# paired_ratio KEY ANCHOR_KEY: the median of the rounds' KEY/ANCHOR_KEY, for
# figures measured in rounds; nothing otherwise.
paired_ratio() {
	local ratios=() round
	for ((round = 1; round <= ROUNDS; round++)); do
		[[ -n ${R[$1,$round]:-} && -n ${R[$2,$round]:-} ]] || continue
		ratios+=("$(awk -v a="${R[$1,$round]}" -v b="${R[$2,$round]}" 'BEGIN { if (b > 0) printf "%.4f", a / b }')")
	done
	((${#ratios[@]})) || return 0
	awk -v m="$(median "${ratios[@]}")" 'BEGIN { printf "%.2f", m }'
}

# row METRIC CASE COL ANCHOR_NAME ANCHOR_KEY OP LIMIT [stretch]
#   CASE: softrdma case (both columns are shown); COL: the column the target
#   is about. OP: le / ge (ratio COL/anchor against LIMIT), range (LIMIT is
#   "lo-hi"), abs_ge (COL's figure itself >= LIMIT, no anchor), works (COL's
#   case ran; COL both: both columns'), info (no target; the ratio is shown if
#   there is an anchor). A "stretch" target's miss does not count.
row() {
	local metric=$1 case=$2 col=$3 aname=$4 akey=$5 op=$6 limit=$7 stretch=${8:-}
	local mine='' anchor='' acell=- ratio=- target verdict ok
	if [[ $col == both ]]; then
		[[ -n ${V[shm,$case]:-} && -n ${V[tcp,$case]:-} ]] && mine=1
	else
		mine=${V[$col,$case]:-}
	fi
	if [[ -n $akey ]]; then
		anchor=${V[$akey]:-}
		acell=$(cell "$akey")
		if [[ -n $mine && -n $anchor ]]; then
			ratio=$(paired_ratio "$col,$case" "$akey")
			[[ -n $ratio ]] ||
				ratio=$(awk -v a="$mine" -v b="$anchor" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }')
		else
			ratio=n/a
		fi
	fi
	case $op in
	le) target="$col <= ${limit}x" ;;
	ge) target="$col >= ${limit}x" ;;
	range) target="$col ${limit}x" ;;
	abs_ge) target="$col >= $limit $(unit_of "$case")" ;;
	works) [[ $col == both ]] && target="both work" || target="$col works" ;;
	info) target=- ;;
	esac
	if [[ $op == info ]]; then
		verdict=info
	elif [[ $op == works ]]; then
		if [[ -n $mine ]]; then verdict=ok; else verdict=FAILED; fi
	elif [[ $op == abs_ge && -z $mine ]] || [[ $ratio == n/a ]]; then
		verdict=ERROR
	else
		case $op in
		le) ok=$(awk -v r="$ratio" -v l="$limit" 'BEGIN { print (r <= l) }') ;;
		ge) ok=$(awk -v r="$ratio" -v l="$limit" 'BEGIN { print (r >= l) }') ;;
		range) ok=$(awk -v r="$ratio" -v l="$limit" 'BEGIN { split(l, b, "-"); print (r >= b[1] && r <= b[2]) }') ;;
		abs_ge) ok=$(awk -v v="$mine" -v l="$limit" 'BEGIN { print (v >= l) }') ;;
		esac
		if ((ok)); then verdict=ok; else verdict=MISSED; fi
	fi
	if [[ -n $stretch && $verdict != info ]]; then
		[[ $verdict == ok ]] && verdict="ok (stretch)" || verdict="${verdict,,} (stretch)"
	else
		case $verdict in
		ERROR) status_at_least 2 ;;
		MISSED | FAILED) status_at_least 1 ;;
		esac
	fi
	table_line "$metric" "$(cell "shm,$case")" "$(link_cell shm "$case")" \
		"$(cell "tcp,$case")" "$(link_cell tcp "$case")" "$aname" "$acell" "$ratio" "$target" "$verdict"
}

row "ib_write_lat 2 B" write_lat shm "UCX posix tag_lat" a,ucx_posix_lat le 1.00
row "ib_write_lat 2 B" write_lat shm "cache-line ping-pong" a,pingpong le 2.00 stretch
row "ib_send_lat 2 B" send_lat shm "UCX posix tag_lat" a,ucx_posix_lat le 1.00
row "ib_send_lat 2 B" send_lat shm "cache-line ping-pong" a,pingpong le 2.00 stretch
row "ib_write_bw 64 KiB" write_64k shm "memcpy 64 KiB" a,memcpy_64k ge 0.80
row "ib_write_bw 64 KiB" write_64k shm "UCX posix ucp_put_bw 64 KiB" a,ucx_posix_put_64k ge 1.00
row "ib_write_bw 1 MiB" write_1m shm "memcpy 1 MiB" a,memcpy_1m ge 0.85
row "ib_write_bw 1 MiB" write_1m shm "UCX posix ucp_put_bw 1 MiB" a,ucx_posix_put_1m info ""
row "ib_read_bw 64 KiB" read_64k shm "ib_write_bw 64 KiB, shm" shm,write_64k range 0.90-1.10
row "ib_send_bw 64 KiB" send_64k shm "" "" abs_ge 10
row "ib_send_bw 64 KiB" send_64k shm "UCX posix tag_bw 64 KiB" a,ucx_posix_tag_64k info ""
row "ib_atomic_bw 8 B" atomic shm "" "" abs_ge 10
row "ib_write_bw 1 MiB" write_1m tcp "iperf3, 1 stream" a,iperf3 ge 0.90
row "ib_write_lat 2 B" write_lat tcp "UCX tcp tag_lat" a,ucx_tcp_lat le 1.00
row "ib_write_bw 64 KiB" write_64k tcp "UCX tcp ucp_put_bw 64 KiB" a,ucx_tcp_put_64k info ""
row "ib_write_bw 1 MiB" write_1m tcp "UCX tcp ucp_put_bw 1 MiB" a,ucx_tcp_put_1m info ""
row "ib_write_bw -q $SCALE_QPS 4 KiB" qps_perftest both "" "" works ""
row "$SCALE_QPS RC QPs, setup" qps_ms both "" "" works ""
row "  bytes per QP" qps_bytes shm "" "" info ""
row "$SCALE_MRS MRs x 4 KiB, reg" mrs_ms shm "" "" works ""
row "  bytes per MR" mrs_bytes shm "" "" info ""

echo
echo "host: $(nproc) CPUs, $(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo); CPUs busy with other work: $BUSY_START before the run, $(cpus_busy) after"
echo "ratio = the target's column / anchor; GB/s = 10^9 bytes/s; latencies are one-way medians."
echo "latencies, shm ib_write_bw 64 KiB against UCX put and shm ib_read_bw 64 KiB against it: median of $ROUNDS rounds of anchors and cases run back to back; their ratios: median of the rounds' ratios."
# Each round's figures: on a VM the two vCPUs may move between hosts' cores mid-run (the ping-pong
# went from 0.21 to 0.05 us between two rounds), and a median then mixes two machines.
if ((ROUNDS > 1)); then
	rounds_line="rounds (ping-pong, UCX posix, shm write_lat, shm send_lat; us):"
	pp_lo='' pp_hi=''
	for ((round = 1; round <= ROUNDS; round++)); do
		rounds_line+=" $round: ${R[a,pingpong,$round]:--} ${R[a,ucx_posix_lat,$round]:--} ${R[shm,write_lat,$round]:--} ${R[shm,send_lat,$round]:--};"
		pp=${R[a,pingpong,$round]:-}
		[[ -n $pp ]] || continue
		[[ -z $pp_lo ]] || awk -v a="$pp" -v b="$pp_lo" 'BEGIN { exit !(a < b) }' && pp_lo=$pp
		[[ -z $pp_hi ]] || awk -v a="$pp" -v b="$pp_hi" 'BEGIN { exit !(a > b) }' && pp_hi=$pp
	done
	echo "${rounds_line%;}"
	# Each round's own ratios of the paired rows, and its ping-pong at the start and at the end.
	moved=0
	for ((round = 1; round <= ROUNDS; round++)); do
		pp=${R[a,pingpong,$round]:-} pe=${R[a,pingpong_end,$round]:-}
		line="round $round ratios (ping-pong ${pp:--} -> ${pe:--} us):"
		for pair in "shm,write_lat a,ucx_posix_lat write_lat/UCX" "shm,send_lat a,ucx_posix_lat send_lat/UCX" \
			"shm,write_64k a,ucx_posix_put_64k write/put" "shm,read_64k shm,write_64k read/write"; do
			read -r k1 k2 label <<<"$pair"
			ratio=$(awk -v a="${R[$k1,$round]:-}" -v b="${R[$k2,$round]:-}" 'BEGIN { if (a != "" && b > 0) printf "%.2f", a / b; else print "-" }')
			line+=" $label $ratio,"
		done
		if [[ -n $pp && -n $pe ]] && awk -v a="$pp" -v b="$pe" 'BEGIN { exit !(a > 2 * b || b > 2 * a) }'; then
			line+=" the CPUs moved during the round"
			moved=1
		fi
		echo "${line%,}"
		[[ -n $pe ]] || continue
		awk -v a="$pe" -v b="$pp_lo" 'BEGIN { exit !(b == "" || a < b) }' && pp_lo=$pe
		awk -v a="$pe" -v b="$pp_hi" 'BEGIN { exit !(b == "" || a > b) }' && pp_hi=$pe
	done
	if ((moved)) || { [[ -n $pp_lo ]] && awk -v lo="$pp_lo" -v hi="$pp_hi" 'BEGIN { exit !(hi > 2 * lo) }'; }; then
		echo "note: the ping-pong changed more than 2x within the run: the CPUs moved; compare rounds, not medians."
	fi
fi
echo "link: links logged by SOFTRDMA_LOG=1 (self = in-process); '!' = not the column's link."
absent=()
for tool in "${!HAVE[@]}"; do
	((HAVE[$tool])) || absent+=("$tool")
done
((${#absent[@]})) && echo "tools missing: ${absent[*]}"
if [[ -n ${NOTES[*]+set} ]]; then
	echo "failures (log tails in $T_LOGDIR/FAILURES.txt):"
	printf '  %s\n' "${!NOTES[@]}" | sort
fi
echo "logs: $T_LOGDIR (verdicts in run.log)"
case $STATUS in
0) echo "all targets met" ;;
1) echo "some targets missed" ;;
*) echo "some figures are missing (a tool is missing or a measurement failed)" ;;
esac
exit "$STATUS"
