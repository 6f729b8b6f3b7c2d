#!/usr/bin/env bash
#
# Benchmark of issue 2: softrdma's TCP link between two network namespaces
# (joined by a veth pair, so traffic takes the cross-host path), next to
# plain-TCP anchors measured in the same run on the same link:
#
#   bandwidth  ib_write_bw -s 1048576 -D <duration>   vs  iperf3, one stream
#   latency    ib_write_lat -s 2                      vs  qperf tcp_lat -m 2
#
# Targets: bandwidth >= 0.8 x iperf3, latency <= 1.5 x qperf tcp_lat. Both
# perftest and qperf report one-way latency (half the round trip); the ratio
# uses averages on both sides (t_avg vs qperf's mean); perftest's median
# (t_typical) is shown for information.
#
# Usage: tcp_link_bench.sh [--duration S] [--verbose]
# Needs root (namespaces), iperf3, qperf, perftest and a build
# (SOFTRDMA_BUILD, default <repo>/build).
# Exit status: 0 targets met, 1 a target missed, 2 a measurement failed.

set -u

# shellcheck source-path=SCRIPTDIR source=../tests/integration/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../tests/integration/lib.sh"

DURATION=5
while [[ $# -gt 0 ]]; do
	case $1 in
	--duration)
		[[ $# -ge 2 && $2 =~ ^[0-9]+$ ]] || srdma_die "--duration needs seconds"
		DURATION=$2
		shift
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

srdma_require_build
for tool in iperf3 qperf ib_write_bw ib_write_lat; do
	command -v "$tool" >/dev/null || srdma_die "$tool not installed"
done
why=$(srdma_netns_available) || srdma_die "cannot create network namespaces: $why"

srdma_log_init tcp_link_bench
srdma_install_traps
srdma_netns_setup 2>"$T_LOGDIR/netns-setup.log" ||
	srdma_die "namespace setup failed, see $T_LOGDIR/netns-setup.log"

# Each measurement is a case of the harness (its PASS/FAIL line goes to the
# run log, not to our table); the figures are parsed from the client logs.
RUNLOG=$T_LOGDIR/run.log
measure_pair() { run_pair "$@" >>"$RUNLOG"; }
client_log() { echo "$T_LOGDIR/$(_srdma_slug "$1").client.log"; }

# --- parsers: print the figure, or nothing if it is not there --------------

# iperf3 -J: end.sum_received.bits_per_second, in Gb/s (10^9 bit/s). iperf3
# pretty-prints its JSON one key per line, so awk is enough (no jq needed).
parse_iperf3_gbps() {
	[[ -f $1 ]] || return 0
	awk '/"sum_received"/ { s = 1 }
		s && /"bits_per_second"/ { v = $2; gsub(/[^0-9.eE+-]/, "", v); printf "%.3f\n", v / 1e9; exit }' "$1"
}

# qperf: "latency  =  12.345 us" (unit ns/us/ms/sec), in microseconds.
parse_qperf_us() {
	[[ -f $1 ]] || return 0
	awk '$1 == "latency" && $2 == "=" {
		v = $3; gsub(",", "", v)
		f = ($4 == "ns") ? 0.001 : ($4 == "us") ? 1 : ($4 == "ms") ? 1000 : ($4 == "sec") ? 1e6 : -1
		if (f > 0) printf "%.3f\n", v * f
		exit }' "$1"
}

# perftest bw table: BW average (4th column) of the row for SIZE, in Gb/s.
# The header says whether it is MB/sec (perftest's MB = 2^20 bytes) or
# Gb/sec (10^9 bits, with --report_gbits).
parse_perftest_gbps() {
	[[ -f $1 ]] || return 0
	awk -v size="$2" '
		/#bytes/ { unit = ($0 ~ /Gb\/sec/) ? "gb" : "mb"; next }
		unit != "" && $1 == size && $4 ~ /^[0-9.]+$/ {
			v = $4; if (unit == "mb") v = v * 1048576 * 8 / 1e9
			printf "%.3f\n", v; exit }' "$1"
}

# perftest lat table: the column named COL (t_avg, t_typical) of the row for
# SIZE, in microseconds. Column names contain no blanks up to t_avg, so the
# header tokens line up with the data columns.
parse_perftest_lat() {
	[[ -f $1 ]] || return 0
	awk -v size="$2" -v col="$3" '
		/#bytes/ { for (i = 1; i <= NF; i++) if (index($i, col "[") == 1) c = i; next }
		c && $1 == size && $c ~ /^[0-9.]+$/ { printf "%.3f\n", $c; exit }' "$1"
}

# --- measurements ----------------------------------------------------------

echo "tcp_link_bench: $NS_A ($ADDR_A) <-> $NS_B ($ADDR_B), ${DURATION}s per bandwidth run, logs in $T_LOGDIR" >&2

# Anchors first, with the stock libraries (they do not use verbs).
srdma_next_port "$NS_A"
measure_pair --raw --port "$PORT" --timeout $((DURATION + 60)) "iperf3" \
	"iperf3 -s -1 -B $ADDR_A -p $PORT" \
	"iperf3 -c $ADDR_A -p $PORT -t $DURATION -J" "$NS_A" "$NS_B"
IPERF_GBPS=$(parse_iperf3_gbps "$(client_log iperf3)")

# qperf's server never exits: a standing server, one client run.
QPERF_US=
srdma_next_port "$NS_A"
qport=$PORT
srdma_next_port "$NS_A"
dport=$PORT
if srdma_server_start --raw "qperf" "qperf -lp $qport" "$qport" "$NS_A" 600; then
	run_single --raw --timeout $((DURATION + 60)) "qperf tcp_lat" \
		"qperf -lp $qport -ip $dport -e 5 -m 2 -t $DURATION $ADDR_A tcp_lat" "$NS_B" >>"$RUNLOG"
	QPERF_US=$(parse_qperf_us "$T_LOGDIR/qperf_tcp_lat.log")
	srdma_server_stop
else
	echo "qperf server: $LISTEN_ERR" >>"$RUNLOG"
fi

# softrdma. -F: no CPU-frequency warning noise; --report_gbits: same unit
# as iperf3.
srdma_next_port "$NS_A"
bw_args="-d softrdma0 -p $PORT -s 1048576 -D $DURATION --report_gbits -F"
measure_pair --port "$PORT" --timeout $((DURATION + 90)) "ib_write_bw" \
	"ib_write_bw $bw_args" "ib_write_bw $bw_args $ADDR_A" "$NS_A" "$NS_B"
SR_GBPS=$(parse_perftest_gbps "$(client_log ib_write_bw)" 1048576)

srdma_next_port "$NS_A"
lat_args="-d softrdma0 -p $PORT -s 2 -n 10000 -F"
measure_pair --port "$PORT" --timeout 120 "ib_write_lat" \
	"ib_write_lat $lat_args" "ib_write_lat $lat_args $ADDR_A" "$NS_A" "$NS_B"
SR_LAT_AVG=$(parse_perftest_lat "$(client_log ib_write_lat)" 2 t_avg)
SR_LAT_TYP=$(parse_perftest_lat "$(client_log ib_write_lat)" 2 t_typical)

srdma_cleanup

# --- the table -------------------------------------------------------------

STATUS=0
# row METRIC SOFTRDMA ANCHOR ANCHOR_NAME OP LIMIT: ratio = softrdma / anchor,
# checked against LIMIT with OP (ge / le); empty OP = informational row.
row() {
	local metric=$1 mine=$2 anchor=$3 aname=$4 op=$5 limit=$6 ratio=n/a verdict target
	target=${op:+$([[ $op == ge ]] && echo ">=" || echo "<=") ${limit}x}
	if [[ -n $mine && -n $anchor ]]; then
		ratio=$(awk -v a="$mine" -v b="$anchor" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }')
	fi
	if [[ -z $op ]]; then
		verdict=info
	elif [[ $ratio == n/a ]]; then
		verdict=ERROR
		STATUS=2
	elif awk -v r="$ratio" -v l="$limit" -v op="$op" 'BEGIN { exit !((op == "ge") ? r >= l : r <= l) }'; then
		verdict=ok
	else
		verdict=MISSED
		((STATUS == 0)) && STATUS=1
	fi
	printf '%-28s %10s %10s  %-22s %6s  %-8s %s\n' \
		"$metric" "${mine:-n/a}" "${anchor:-n/a}" "$aname" "$ratio" "${target:--}" "$verdict"
}

printf '%-28s %10s %10s  %-22s %6s  %-8s %s\n' \
	metric softrdma anchor "anchor is" ratio target verdict
row "write bw 1 MiB (Gb/s)" "$SR_GBPS" "$IPERF_GBPS" "iperf3, 1 stream" ge 0.8
row "write lat 2 B avg (us)" "$SR_LAT_AVG" "$QPERF_US" "qperf tcp_lat (mean)" le 1.5
row "write lat 2 B median (us)" "$SR_LAT_TYP" "$QPERF_US" "qperf tcp_lat (mean)" "" ""

if ((STATUS == 2)); then
	echo "some figures are missing; see $RUNLOG and $T_LOGDIR/FAILURES.txt" >&2
fi
exit "$STATUS"
