#!/usr/bin/env bash
#
# Benchmark of issue 3: softrdma's RDMA CM and rsockets, next to plain TCP.
#
#   connection setup   cmtime -c <conns>: connections/s of the connect step
#                      (REQ/REP/RTU, from cmtime's "connect" total) and of the
#                      whole setup (resolve addr + resolve route + create qp
#                      + connect), and disconnects/s; best of --runs runs
#   stream bandwidth   rstream -S <size> -C <count> over rsockets (softrdma)
#                      vs rstream -T s (the same program on plain TCP sockets,
#                      stock libraries) and iperf3 (one stream), if installed
#
# It prints figures and ratios and asserts nothing about speed. A failed
# measurement says so in its row, and its ratios read n/a. On one host the
# loopback mode uses softrdma's same-host (shared-memory) link; the netns mode
# its TCP link.
#
# Usage: cm_bench.sh [--mode loopback|netns|both] [--conns N] [--runs R]
#                    [--size S] [--count C] [--verbose]
#   --mode    loopback (127.0.0.1), netns (server in namespace A, client in B,
#             veth; needs root) or both (default: both if namespaces can be
#             made, else loopback)
#   --conns   cmtime connections (default 1000)
#   --runs    cmtime runs per mode, the best is shown (default 3)
#   --size    rstream transfer size in bytes (default 1048576)
#   --count   rstream transfer count (default 1000)
# Exit status: 0, or 2 if the build or a namespace setup is missing (a failed
# measurement is reported in the table, not in the exit status).
# Logs: $SOFTRDMA_BUILD/test-logs/cm_bench-*/ (run.log has the verdict lines).

set -u

# shellcheck source-path=SCRIPTDIR source=../tests/integration/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../tests/integration/lib.sh"

MODE=
CONNS=1000
RUNS=3
SIZE=1048576
COUNT=1000
while [[ $# -gt 0 ]]; do
	case $1 in
	--mode)
		[[ $# -ge 2 && $2 =~ ^(loopback|netns|both)$ ]] || srdma_die "--mode needs loopback, netns or both"
		MODE=$2
		shift
		;;
	--conns | --runs | --count)
		[[ $# -ge 2 && $2 =~ ^[1-9][0-9]*$ ]] || srdma_die "$1 needs a positive number"
		case $1 in
		--conns) CONNS=$2 ;;
		--runs) RUNS=$2 ;;
		--count) COUNT=$2 ;;
		esac
		shift
		;;
	--size)
		[[ $# -ge 2 && $2 =~ ^[1-9][0-9]*$ ]] || srdma_die "--size needs a size in bytes (rstream reads it with atoi)"
		SIZE=$2
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
for tool in cmtime rstream; do
	command -v "$tool" >/dev/null || srdma_die "$tool not installed (rdmacm-utils)"
done
HAVE_IPERF3=0
command -v iperf3 >/dev/null && HAVE_IPERF3=1

if [[ -z $MODE ]]; then
	if srdma_netns_available >/dev/null; then MODE=both; else MODE=loopback; fi
elif [[ $MODE != loopback ]]; then
	why=$(srdma_netns_available) || srdma_die "cannot create network namespaces: $why"
fi

srdma_log_init cm_bench
srdma_install_traps
srdma_private_rundir || srdma_die "cannot create a private run directory"
SRDMA_LISTEN_CHECK=srdma_is_cm_or_tcp_listening

# Each measurement is a case of the harness (its verdict goes to run.log);
# the figures are parsed from the client logs.
RUNLOG=$T_LOGDIR/run.log
measure_pair() { run_pair "$@" >>"$RUNLOG"; }
client_log() { echo "$T_LOGDIR/$(_srdma_slug "$1").client.log"; }
last_verdict() { tail -n1 "$T_LOGDIR/results.txt"; }

# --- parsers: print the figure, or nothing if it is not there --------------

# cmtime's table: "<step> : total_ms max_ms min_us us/conn" (step names have
# blanks: the numbers are the last four fields). Prints
# "<connect/s> <setup/s> <disconnect/s>".
parse_cmtime() {
	[[ -f $1 ]] || return 0
	awk -v n="$2" -F: '
		/^(create id|resolve addr|resolve route|create qp|connect|disconnect|destroy) *:/ {
			step = $1; sub(/ +$/, "", step)
			split($2, f, " "); ms[step] = f[1]; seen[step] = 1
		}
		END {
			if (!seen["connect"] || ms["connect"] <= 0) exit
			setup = ms["resolve addr"] + ms["resolve route"] + ms["create qp"] + ms["connect"]
			printf "%.0f %.0f %s\n", n / (ms["connect"] / 1000), n / (setup / 1000),
				(ms["disconnect"] > 0) ? sprintf("%.0f", n / (ms["disconnect"] / 1000)) : "n/a"
		}' "$1"
}

# rstream's result line (after "name bytes xfers iters total time Gb/sec
# usec/xfer"): Gb/sec is the next to last field.
parse_rstream_gbps() {
	[[ -f $1 ]] || return 0
	awk '$1 == "name" && $2 == "bytes" { hdr = 1; next }
		hdr && NF >= 7 && $(NF - 1) ~ /^[0-9.]+$/ { print $(NF - 1); exit }' "$1"
}

# iperf3 -J: end.sum_received.bits_per_second, in Gb/s.
parse_iperf3_gbps() {
	[[ -f $1 ]] || return 0
	awk '/"sum_received"/ { s = 1 }
		s && /"bits_per_second"/ { v = $2; gsub(/[^0-9.eE+-]/, "", v); printf "%.3f\n", v / 1e9; exit }' "$1"
}

ratio() {
	awk -v a="$1" -v b="$2" 'BEGIN { if (a != "" && b != "" && b > 0) printf "%.2f", a / b; else print "n/a" }'
}

# --- one mode ----------------------------------------------------------------

declare -A R # results: R[mode,key]

bench_mode() {
	local mode=$1 sns='' cns='' host=127.0.0.1 i name fig best_c='' best_s='' best_d=''
	if [[ $mode == netns ]]; then
		if ! srdma_netns_setup 2>"$T_LOGDIR/netns-setup.log"; then
			echo "netns setup failed, see $T_LOGDIR/netns-setup.log" >&2
			srdma_netns_teardown
			return 1
		fi
		sns=$NS_A cns=$NS_B host=$ADDR_A
	fi
	echo "cm_bench: $mode: server ${sns:-host}, client ${cns:-host}, connecting to $host" >&2

	# cmtime: best of RUNS (highest connect rate).
	for ((i = 1; i <= RUNS; i++)); do
		name="$mode cmtime -c $CONNS run $i"
		srdma_next_port "$sns"
		measure_pair --server-daemon --port "$PORT" --timeout 300 \
			--reject 'fail|error|event:' \
			"$name" "cmtime -p $PORT" "cmtime -s $host -p $PORT -c $CONNS" "$sns" "$cns"
		if [[ $(last_verdict) != PASS* ]]; then
			echo "  $(last_verdict)" >&2
			continue
		fi
		fig=$(parse_cmtime "$(client_log "$name")" "$CONNS")
		[[ -n $fig ]] || continue
		read -r c s d <<<"$fig"
		echo "  cmtime run $i: connect $c/s, setup $s/s, disconnect $d/s" >&2
		if [[ -z $best_c ]] || ((c > best_c)); then
			best_c=$c best_s=$s best_d=$d
		fi
	done
	R[$mode,conn]=$best_c
	R[$mode,setup]=$best_s
	R[$mode,disc]=$best_d

	# rstream over rsockets (softrdma).
	local rs_args="-S $SIZE -C $COUNT"
	name="$mode rstream $rs_args (rsockets)"
	srdma_next_port "$sns"
	measure_pair --port "$PORT" --timeout 300 --reject 'fail|error' \
		"$name" "rstream -p $PORT $rs_args" "rstream -s $host -p $PORT $rs_args" "$sns" "$cns"
	R[$mode,rs]=$(parse_rstream_gbps "$(client_log "$name")")
	if [[ -z ${R[$mode,rs]} ]]; then
		R[$mode,rs_why]=$(last_verdict)
		if grep -qs 'Function not implemented' "$T_LOGDIR/$(_srdma_slug "$name")".*.log; then
			R[$mode,rs_why]="rsockets not implemented yet (rsocket: ENOSYS)"
		fi
	fi

	# The same program on plain TCP sockets, stock libraries.
	name="$mode rstream $rs_args -T s (TCP)"
	srdma_next_port "$sns"
	measure_pair --raw --port "$PORT" --timeout 300 --reject 'fail|error' \
		"$name" "rstream -T s -p $PORT $rs_args" "rstream -T s -s $host -p $PORT $rs_args" "$sns" "$cns"
	R[$mode,tcp]=$(parse_rstream_gbps "$(client_log "$name")")

	R[$mode,iperf]=
	if ((HAVE_IPERF3)); then
		name="$mode iperf3"
		srdma_next_port "$sns"
		measure_pair --raw --port "$PORT" --timeout 60 "$name" \
			"iperf3 -s -1 -p $PORT" "iperf3 -c $host -p $PORT -t 5 -J" "$sns" "$cns"
		R[$mode,iperf]=$(parse_iperf3_gbps "$(client_log "$name")")
	fi

	srdma_cleanup_mode
}

# Between modes: stop leftovers and remove the namespaces, keep the run dir.
srdma_cleanup_mode() {
	local pid
	for pid in "${SRDMA_PIDS[@]}"; do
		srdma_kill "$pid"
	done
	SRDMA_PIDS=()
	srdma_netns_teardown
}

echo "cm_bench: mode=$MODE conns=$CONNS runs=$RUNS rstream -S $SIZE -C $COUNT, logs in $T_LOGDIR" >&2
MODES=()
case $MODE in
both) MODES=(loopback netns) ;;
*) MODES=("$MODE") ;;
esac
STATUS=0
for m in "${MODES[@]}"; do
	bench_mode "$m" || STATUS=2
done
srdma_cleanup

# --- the table ---------------------------------------------------------------

for m in "${MODES[@]}"; do
	echo
	echo "== $m"
	printf '%-46s %12s\n' "cmtime -c $CONNS (best of $RUNS)" "conn/s"
	printf '  %-44s %12s\n' "connect (REQ/REP/RTU)" "${R[$m,conn]:-n/a}"
	printf '  %-44s %12s\n' "setup (resolve+route+qp+connect)" "${R[$m,setup]:-n/a}"
	printf '  %-44s %12s\n' "disconnect" "${R[$m,disc]:-n/a}"
	printf '%-46s %12s\n' "stream bandwidth, rstream -S $SIZE -C $COUNT" "Gb/s"
	if [[ -n ${R[$m,rs]:-} ]]; then
		printf '  %-44s %12s\n' "rstream over rsockets (softrdma)" "${R[$m,rs]}"
	else
		printf '  %-44s %12s  (%s)\n' "rstream over rsockets (softrdma)" "FAILED" "${R[$m,rs_why]:-no figure}"
	fi
	printf '  %-44s %12s\n' "rstream -T s (plain TCP)" "${R[$m,tcp]:-n/a}"
	if ((HAVE_IPERF3)); then
		printf '  %-44s %12s\n' "iperf3, 1 stream" "${R[$m,iperf]:-n/a}"
	else
		printf '  %-44s %12s\n' "iperf3" "not installed"
	fi
	printf '%-46s %12s\n' "ratios" ""
	printf '  %-44s %12s\n' "rsockets / rstream -T s" "$(ratio "${R[$m,rs]:-}" "${R[$m,tcp]:-}")"
	((HAVE_IPERF3)) && printf '  %-44s %12s\n' "rsockets / iperf3" "$(ratio "${R[$m,rs]:-}" "${R[$m,iperf]:-}")"
	((HAVE_IPERF3)) && printf '  %-44s %12s\n' "rstream -T s / iperf3" "$(ratio "${R[$m,tcp]:-}" "${R[$m,iperf]:-}")"
done
echo
echo "logs: $T_LOGDIR (verdicts in run.log, failures in FAILURES.txt)"
exit "$STATUS"
