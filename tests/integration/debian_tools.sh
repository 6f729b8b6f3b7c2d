#!/usr/bin/env bash
#
# Acceptance matrix of issue 2: unmodified Debian RDMA tools (ibverbs-utils,
# perftest, qperf) run as separate server and client processes on top of
# softrdma, either both on the host (loopback, 127.0.0.1) or in two network
# namespaces joined by a veth pair (--netns).
#
# Usage: debian_tools.sh [--netns] [--quick] [--filter ERE] [--verbose] [--list]
#   --netns      server in namespace A, client in namespace B (needs root;
#                exits 77 = skipped when namespaces are not available)
#   --quick      fewer iterations and a 540 s overall budget (for ctest)
#   --filter E   only cases whose name matches the extended regex E
#   --verbose    on failure also print the tails of the logs to stderr
#   --list       print the selected case names and exit
#
# Output: one line per case, "PASS name" or "FAIL name (reason)", then
# exactly "N passed, M failed". Exit status 0 iff nothing failed.
# Logs of every case: $SOFTRDMA_BUILD/test-logs/<run>/ (FAILURES.txt holds the
# tails of failed cases). Environment: SOFTRDMA_BUILD (default <repo>/build),
# SOFTRDMA_TEST_BUDGET (seconds), SOFTRDMA_TEST_LOGDIR,
# SOFTRDMA_TEST_PORT_BASE, SOFTRDMA_TEST_STDBUF=0.

set -u

# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
IT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

srdma_parse_suite_args "$@"

# ---------------------------------------------------------------------------
# Mode-dependent parameters

if ((QUICK)); then
	T_BUDGET=${SOFTRDMA_TEST_BUDGET:-540}
	PP_TMO=60       # pingpong case bound
	PT_TMO=120      # perftest case bound
	QP_TMO=30       # qperf client bound
	PP_LONG_ITERS=10000
	PP_BIG_ITERS=100 # iterations for the 64 KiB / 1 MiB pingpongs
	PT_SWEEP_ITERS=100
else
	T_BUDGET=${SOFTRDMA_TEST_BUDGET:-0}
	PP_TMO=300
	PT_TMO=900
	QP_TMO=60
	PP_LONG_ITERS=100000
	PP_BIG_ITERS= # tool default (1000)
	PT_SWEEP_ITERS= # tool default (5000 for ib_write_bw, else 1000)
fi

# Where the server listens and where the client goes.
SNS=
CNS=
HOST=127.0.0.1

# ---------------------------------------------------------------------------
# Device cases (one process each; in netns mode inside namespace A)

device_cases() {
	if want "ibv_devices"; then
		run_single --timeout 30 \
			--expect '^[[:space:]]+softrdma0[[:space:]]+[0-9a-f]{16}[[:space:]]*$' \
			"ibv_devices" "ibv_devices" "$SNS"
	fi
	if want "ibv_devinfo -v"; then
		# GID lines are printed only for non-zero GIDs whose type query works,
		# and on Ethernet they end in ", RoCE v1|v2".
		run_single --timeout 30 \
			--expect 'hca_id:[[:space:]]+softrdma0' \
			--expect 'state:[[:space:]]+PORT_ACTIVE' \
			--expect 'link_layer:[[:space:]]+Ethernet' \
			--expect 'GID\[ *0\]:[[:space:]]+[0-9a-fA-F:.]+, RoCE v[12]' \
			--reject 'failed' \
			"ibv_devinfo -v" "ibv_devinfo -v" "$SNS"
	fi
	if want "ibv_asyncwatch"; then
		# A daemon: it prints "<dev>: async event FD <n>" and then blocks in
		# ibv_get_async_event. Pass = still running when `timeout 2` stops it
		# (rc 124) and the line was printed. stdbuf is needed even when
		# SOFTRDMA_TEST_STDBUF=0: killed by a signal, the tool never flushes
		# a fully buffered stdout.
		run_single --timeout 2 --expect-rc 124 \
			--expect '^softrdma0: async event FD [0-9]+' \
			"ibv_asyncwatch" "stdbuf -oL ibv_asyncwatch" "$SNS"
	fi
}

# ---------------------------------------------------------------------------
# ibv_*_pingpong. Both sides print "<iters> iters in <t> seconds = ..." after
# the exchange; the count must be the one asked for (default 1000).

pingpong_case() {
	local tool=$1
	shift
	local args="$*" iters=1000 name
	if [[ $args =~ (^|[[:space:]])-n[[:space:]]+([0-9]+) ]]; then
		iters=${BASH_REMATCH[2]}
	fi
	name="$tool${args:+ $args}"
	want "$name" || return 0
	srdma_next_port "$SNS"
	run_pair --port "$PORT" --timeout "$PP_TMO" \
		--expect "^$iters iters in [0-9.]+ seconds" \
		--expect-server "^$iters iters in [0-9.]+ seconds" \
		--reject "couldn'?t|failed|error" \
		"$name" \
		"$tool -p $PORT $args" \
		"$tool -p $PORT $args $HOST" \
		"$SNS" "$CNS"
}

pingpong_cases() {
	local t big sizes s
	big=${PP_BIG_ITERS:+-n $PP_BIG_ITERS}
	for t in rc uc ud srq; do
		local tool=ibv_${t}_pingpong
		pingpong_case "$tool"
		pingpong_case "$tool" -g 0
		pingpong_case "$tool" -e
		# UD: a message must fit the port's active MTU (4096 on softrdma);
		# the 40-byte GRH lands in extra buffer space, it does not count.
		# (ud_pingpong's --help claims a 2048 default; the code uses 1024.)
		if [[ $t == ud ]]; then
			sizes="1 2048 4096"
		else
			sizes="1 4096 65536 1048576"
		fi
		for s in $sizes; do
			if ((s >= 65536)); then
				# shellcheck disable=SC2086 # $big is "" or "-n N"
				pingpong_case "$tool" -s "$s" $big
			else
				pingpong_case "$tool" -s "$s"
			fi
		done
		pingpong_case "$tool" -n "$PP_LONG_ITERS"
	done
	pingpong_case ibv_rc_pingpong -N
	# -t: the extended CQ (ibv_start_poll, completion timestamps); it posts its answer from
	# inside the poll batch. With -e every event must find a completion.
	pingpong_case ibv_rc_pingpong -t
	pingpong_case ibv_rc_pingpong -t -e
	pingpong_case ibv_rc_pingpong -t -e -n "$PP_LONG_ITERS"
	# Regions on demand: -o, implicit (-O), prefetched (-P, ibv_advise_mr).
	pingpong_case ibv_rc_pingpong -o
	pingpong_case ibv_rc_pingpong -o -P
	pingpong_case ibv_rc_pingpong -O
	pingpong_case ibv_rc_pingpong -O -P
	# Device memory (-j; -c validates what arrived).
	pingpong_case ibv_rc_pingpong -j
	pingpong_case ibv_rc_pingpong -j -c
	udp_link_case
	xsrq_case 1 -n 100
	xsrq_case 1 -n 100 -e
	xsrq_case 4 -n 100
	xsrq_case 4 -n 100 -e
}

# ibv_xsrq_pingpong (XRC): the server and every client print "success". With several clients the
# server sends each client's messages through the other clients' receive QPs: the client
# processes share one XRC domain (/tmp/xrc_domain), and a target relays what is for another
# process's SRQ to it.
xsrq_case() {
	local clients=$1 name
	shift
	local args="$*"
	name="ibv_xsrq_pingpong${args:+ $args}"
	((clients == 1)) || name="$name -c $clients, $clients clients"
	want "$name" || return 0
	srdma_next_port "$SNS"
	XSRQ_CLIENTS=$clients
	run_pair --port "$PORT" --timeout "$PP_TMO" \
		--expect-server '^success$' --check xsrq_check \
		--reject "couldn'?t|failed|error" \
		"$name" \
		"ibv_xsrq_pingpong -p $PORT -c $clients $args" \
		"$IT_DIR/clients.sh $clients ibv_xsrq_pingpong -p $PORT $args $HOST" \
		"$SNS" "$CNS"
}

# Every client printed "success".
xsrq_check() {
	local n
	n=$(grep -c '^success$' "$1")
	((n == XSRQ_CLIENTS)) || echo "$n of $XSRQ_CLIENTS clients printed success"
	((n == XSRQ_CLIENTS))
}

# UD over the UDP link (opt-in with SOFTRDMA_UD_LINK=udp; UD otherwise rides the stream link).
udp_link_case() {
	local name="ibv_ud_pingpong over the UDP link"
	want "$name" || return 0
	srdma_next_port "$SNS"
	run_pair --port "$PORT" --timeout "$PP_TMO" \
		--expect "^1000 iters in [0-9.]+ seconds" \
		--expect-server "^1000 iters in [0-9.]+ seconds" \
		--reject "couldn'?t|failed|error" \
		"$name" \
		"env SOFTRDMA_UD_LINK=udp ibv_ud_pingpong -p $PORT" \
		"env SOFTRDMA_UD_LINK=udp ibv_ud_pingpong -p $PORT $HOST" \
		"$SNS" "$CNS"
}

# ---------------------------------------------------------------------------
# perftest. The client prints a table headed by " #bytes  #iterations ...";
# each row starts with the size and the iteration count (bw tools: iterations
# x number of QPs). A case passes if the row for the expected last size shows
# the expected count (and, for -a sweeps, all 23 sizes 2..8 MiB are there).
# perftest prints no "error/fail/unable/couldn't/cannot" in normal output, so
# any such line is a failure.

PT_SIZE=''
PT_ITERS=''
PT_ROWS=''

perftest_check() {
	local clog=$1
	awk -v size="$PT_SIZE" -v iters="$PT_ITERS" -v rows="$PT_ROWS" '
		/#bytes/ { hdr = 1; next }
		hdr && $1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ {
			n++
			if ((size == "" || $1 == size) && (iters == "" || $2 == iters)) ok = 1
			last = $1 " x " $2
		}
		END {
			if (!hdr) { print "no #bytes results table"; exit 1 }
			if (!ok) {
				printf "no result row for size %s with %s iterations (last row: %s)\n",
					(size == "" ? "any" : size), (iters == "" ? "any" : iters),
					(last == "" ? "none" : last)
				exit 1
			}
			if (rows != "" && n != rows) { printf "%d result rows, expected %d\n", n, rows; exit 1 }
		}' "$clog"
}

# perftest_case TOOL SIZE ITERS ROWS [ARGS...]
#   SIZE/ITERS/ROWS: expected last-size row, its count, number of rows ("" = any)
perftest_case() {
	local tool=$1 size=$2 iters=$3 rows=$4
	shift 4
	local args="$*" name
	name="$tool${args:+ $args}"
	want "$name" || return 0
	PT_SIZE=$size PT_ITERS=$iters PT_ROWS=$rows
	srdma_next_port "$SNS"
	run_pair --port "$PORT" --timeout "$PT_TMO" \
		--reject "couldn'?t|fail|error|unable|cannot|not supported" \
		--check perftest_check \
		"$name" \
		"$tool -d softrdma0 -p $PORT $args" \
		"$tool -d softrdma0 -p $PORT $args $HOST" \
		"$SNS" "$CNS"
}

perftest_cases() {
	local tool def iters sweep size
	for tool in ib_send_bw ib_write_bw ib_read_bw ib_atomic_bw \
		ib_send_lat ib_write_lat ib_read_lat ib_atomic_lat; do
		def=1000
		[[ $tool == ib_write_bw ]] && def=5000
		if [[ $tool == ib_atomic_* ]]; then
			# perftest rejects -a for atomics ("Message size cannot be changed
			# for Atomic tests": -a sets the size to 8 MiB before the check),
			# so the atomic tools run their only size, 8 bytes.
			perftest_case "$tool" 8 "$def" ""
			size=8
		else
			iters=${PT_SWEEP_ITERS:-$def}
			sweep="-a${PT_SWEEP_ITERS:+ -n $PT_SWEEP_ITERS}"
			# shellcheck disable=SC2086 # $sweep is several words
			perftest_case "$tool" 8388608 "$iters" 23 $sweep
			size=65536
		fi
		if [[ $tool == *_bw ]]; then
			perftest_case "$tool" "$size" $((def * 8)) "" -q 8
			perftest_case "$tool" "$size" "$def" "" -b
		fi
	done
	# UD messages are capped at the MTU (perftest shrinks the 64 KiB default).
	perftest_case ib_send_bw "" 1000 "" -c UD
	perftest_case ib_write_bw 65536 5000 "" -c UC
	perftest_case ib_send_bw 65536 1000 "" -c XRC
	perftest_case ib_write_bw 65536 5000 "" -c XRC
	# Regions on demand (perftest refuses --odp for atomics itself).
	perftest_case ib_send_bw 65536 1000 "" --odp
	perftest_case ib_write_bw 65536 5000 "" --odp
	perftest_case ib_read_bw 65536 1000 "" --odp
	perftest_case ib_write_lat 2 1000 "" --odp
	perftest_case ib_read_lat 2 1000 "" --odp
}

# ---------------------------------------------------------------------------
# qperf. One server serves the tests one after the other (it forks a child
# per test); a client run per test so that one failure does not hide the
# rest. After a failure the server is restarted, since a stuck test child
# would block the next request. Every test prints "<test>:" then its main
# figure: bw / send_bw+recv_bw / latency / msg_rate, which must be > 0.

QP_PORT=
QP_SERVER_OFFSET=0
QP_RESTARTS=0

qperf_server_start() {
	srdma_next_port "$SNS"
	QP_PORT=$PORT
	QP_RESTARTS=$((QP_RESTARTS + 1))
	local bound
	bound=$(srdma_case_timeout 3600)
	((bound > 0)) || return 1
	srdma_server_start "qperf server $QP_RESTARTS" "qperf -lp $QP_PORT" "$QP_PORT" "$SNS" "$bound"
}

qperf_check() {
	local clog=$1 test
	test=$QP_TEST
	grep -q "^$test:\$" "$clog" || {
		echo "no '$test:' header"
		return 1
	}
	awk '
		$1 ~ /^(bw|recv_bw|latency|msg_rate)$/ && $2 == "=" {
			seen = 1; v = $3; gsub(",", "", v)
			if (v + 0 > 0) ok = 1; else bad = $0
		}
		END {
			if (!seen) { print "no bw/latency/msg_rate line"; exit 1 }
			if (!ok) { print "zero result: " bad; exit 1 }
		}' "$clog" || return 1
	# Only what the shared server printed during this test counts.
	local line
	line=$(tail -c +"$((QP_SERVER_OFFSET + 1))" "$SERVER_LOG" | grep -Ei -m1 'fail|error') && {
		echo "server: ${line:0:120}"
		return 1
	}
	return 0
}

QP_TEST=
qperf_cases() {
	local tests="rc_bw rc_lat rc_rdma_write_bw rc_rdma_read_bw rc_rdma_write_lat
		rc_rdma_read_lat rc_compare_swap_mr rc_fetch_add_mr uc_bw uc_lat ud_bw ud_lat"
	local t selected=()
	for t in $tests; do
		want "qperf $t" && selected+=("$t")
	done
	((${#selected[@]})) || return 0

	for t in "${selected[@]}"; do
		if [[ -z $SERVER_PID ]] && ! qperf_server_start; then
			srdma_record "qperf $t" fail "qperf server: ${LISTEN_ERR:-no time left}" "$SERVER_LOG"
			continue
		fi
		QP_TEST=$t
		QP_SERVER_OFFSET=$(stat -c %s "$SERVER_LOG")
		if ! run_single --timeout "$QP_TMO" \
			--reject 'fail|error' --check qperf_check --also-log "$SERVER_LOG" \
			"qperf $t" "qperf -lp $QP_PORT $HOST -t 1 $t" "$CNS"; then
			srdma_server_stop
		elif ! kill -0 "$SERVER_PID" 2>/dev/null; then
			srdma_server_stop
		fi
	done
	srdma_server_stop
}

# ---------------------------------------------------------------------------

main() {
	if ((LIST)); then
		device_cases
		pingpong_cases
		perftest_cases
		qperf_cases
		exit 0
	fi

	local mode=loopback why
	if ((NETNS)); then
		mode=netns
		if ! why=$(srdma_netns_available); then
			echo "SKIP debian_tools --netns ($why)"
			echo "0 passed, 0 failed"
			exit 77
		fi
	fi
	if ! why=$(srdma_check_build); then
		echo "FAIL setup ($why)"
		echo "0 passed, 1 failed"
		exit 1
	fi
	srdma_check_build >/dev/null # outside the subshell: sets SRDMA_RUN
	srdma_log_init "debian_tools-$mode"
	srdma_install_traps

	if ((NETNS)); then
		if ! srdma_netns_setup 2>"$T_LOGDIR/netns-setup.log"; then
			srdma_record "netns setup" fail "see netns-setup.log" "$T_LOGDIR/netns-setup.log"
			srdma_summary
			exit 1
		fi
		SNS=$NS_A
		CNS=$NS_B
		HOST=$ADDR_A
	fi
	echo "debian_tools: mode=$mode quick=$QUICK server=${SNS:-host} client=${CNS:-host}" \
		"host=$HOST ports from $SRDMA_PORT_BASE, logs in $T_LOGDIR" >&2

	device_cases
	pingpong_cases
	perftest_cases
	qperf_cases

	srdma_cleanup
	((T_PASS + T_FAIL > 0)) || echo "warning: no case matches --filter '$FILTER'" >&2
	srdma_summary
}

main
