#!/usr/bin/env bash
#
# Self-test of lib.sh's mechanics, independent of softrdma: it drives plain
# TCP tools (iperf3, sleep, false) with --raw, so the harness can be trusted
# before the library works. Checks verdicts and reasons, time bounds, that no
# process survives a case, namespace creation/removal, and cleanup on
# SIGINT/SIGTERM. Needs iperf3; the netns part needs root (else skipped).
#
# Usage: selftest_lib.sh        (exit 0 iff every expectation held)

set -u

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$HERE/lib.sh"

SOFTRDMA_TEST_LOGDIR=$(mktemp -d /tmp/softrdma-selftest-XXXXXX)
export SOFTRDMA_TEST_LOGDIR
srdma_log_init selftest
srdma_install_traps

OK=0
BAD=0
expect_that() { # expect_that DESCRIPTION COMMAND...
	local what=$1
	shift
	if "$@"; then
		OK=$((OK + 1))
		echo "ok   - $what"
	else
		BAD=$((BAD + 1))
		echo "FAIL - $what"
	fi
}

# last_result_is PATTERN: the last verdict in results.txt matches the ERE.
last_result_is() { tail -n1 "$T_LOGDIR/results.txt" | grep -Eq -- "$1"; }
no_leftovers() { ((${#SRDMA_PIDS[@]} == 0)) && ! pgrep -f "$1" >/dev/null; }

# Run a lib function quietly (its verdict line goes to results.txt anyway).
quiet() { "$@" >/dev/null; }

command -v iperf3 >/dev/null || srdma_die "iperf3 needed"
# A sleep duration unique to this run, so pgrep finds only our sleeps.
NAP=31.$$
MARK="sleep $NAP"

# 1. a good pair passes
srdma_next_port
quiet run_pair --raw --port "$PORT" --expect 'receiver' \
	"pass" "iperf3 -s -1 -p $PORT -B 127.0.0.1" "iperf3 -c 127.0.0.1 -p $PORT -t 1"
expect_that "good pair passes" last_result_is '^PASS pass$'

# 2. an output check that does not hold fails with the regex in the reason
srdma_next_port
quiet run_pair --raw --port "$PORT" --expect 'no such line' \
	"expect" "iperf3 -s -1 -p $PORT -B 127.0.0.1" "iperf3 -c 127.0.0.1 -p $PORT -t 1"
expect_that "failed --expect is reported" last_result_is '^FAIL expect \(no line matching /no such line/'

# 3. a reject pattern fails the case
srdma_next_port
quiet run_pair --raw --port "$PORT" --reject 'receiver' \
	"reject" "iperf3 -s -1 -p $PORT -B 127.0.0.1" "iperf3 -c 127.0.0.1 -p $PORT -t 1"
expect_that "--reject is reported" last_result_is '^FAIL reject \(.*receiver'

# 4. a hanging client is cut at its timeout, the server killed after grace
srdma_next_port
start=$SECONDS
quiet run_pair --raw --port "$PORT" --timeout 2 --server-grace 1 \
	"client-hang" "iperf3 -s -p $PORT -B 127.0.0.1" "sleep $NAP"
expect_that "client timeout reported" last_result_is '^FAIL client-hang \(client timed out after 2s\)'
expect_that "client timeout bounded (<= 12 s)" test $((SECONDS - start)) -le 12
expect_that "nothing left after client timeout" no_leftovers "$MARK"
expect_that "port free after the case" bash -c "[[ -z \$(ss -Hltn 'sport = :$PORT') ]]"

# 5. a server that never listens
srdma_next_port
start=$SECONDS
quiet run_pair --raw --port "$PORT" --listen-timeout 1 \
	"no-listen" "sleep $NAP" "true"
expect_that "not listening reported" last_result_is "^FAIL no-listen \(server not listening on port $PORT after 1s\)"
expect_that "listen wait bounded" test $((SECONDS - start)) -le 8
expect_that "silent server killed" no_leftovers "$MARK"

# 6. a server that dies at once is reported without waiting
srdma_next_port
start=$SECONDS
quiet run_pair --raw --port "$PORT" "early-exit" "false" "true"
expect_that "early exit reported" last_result_is '^FAIL early-exit \(server exited \(rc=1\) before listening'
expect_that "early exit is fast" test $((SECONDS - start)) -le 3

# 7. a server that keeps running after the client
srdma_next_port
quiet run_pair --raw --port "$PORT" --server-grace 1 \
	"server-stays" "iperf3 -s -p $PORT -B 127.0.0.1" "iperf3 -c 127.0.0.1 -p $PORT -t 1"
expect_that "lingering server reported" last_result_is '^FAIL server-stays \(server still running 1s'
expect_that "lingering server killed" bash -c "[[ -z \$(ss -Hltn 'sport = :$PORT') ]]"

# 8. run_single: rc, expected timeout (daemon style), budget exhaustion
quiet run_single --raw "single-ok" "true"
expect_that "run_single pass" last_result_is '^PASS single-ok$'
# Commands are split on whitespace, so anything fancier goes in a script.
printf '#!/bin/sh\necho daemon-up\nexec sleep 9\n' >"$T_LOGDIR/daemon.sh"
chmod +x "$T_LOGDIR/daemon.sh"
quiet run_single --raw --timeout 1 --expect-rc 124 --expect "^daemon-up" "daemon" "$T_LOGDIR/daemon.sh"
expect_that "daemon-style expected timeout passes" last_result_is '^PASS daemon$'
T_BUDGET=$((SECONDS + 10))
quiet run_single --raw "budget" "true"
expect_that "exhausted budget fails without running" last_result_is '^FAIL budget \(time budget exhausted'
T_BUDGET=0

# 9. summary line
out=$(srdma_summary 2>/dev/null)
expect_that "summary line format" bash -c "[[ '$out' =~ ^[0-9]+\ passed,\ [0-9]+\ failed$ ]]"

# 9b. additions for rdmacm_tools.sh: a never-exiting server (--server-daemon),
# a custom readiness predicate, expected failures, the private run directory.
srdma_next_port
quiet run_pair --raw --server-daemon --port "$PORT" --expect receiver \
	"daemon-server" "iperf3 -s -p $PORT -B 127.0.0.1" "iperf3 -c 127.0.0.1 -p $PORT -t 1"
expect_that "--server-daemon: a server still running passes" last_result_is '^PASS daemon-server$'
expect_that "--server-daemon: the server is killed" bash -c "[[ -z \$(ss -Hltn 'sport = :$PORT') ]]"
never_ready() { return 1; }
srdma_next_port
quiet run_pair --raw --listen-check never_ready --listen-timeout 1 --port "$PORT" \
	"listen-check" "iperf3 -s -1 -p $PORT -B 127.0.0.1" "true"
expect_that "--listen-check predicate is used" last_result_is "^FAIL listen-check \(server not listening on port $PORT after 1s\)"
fails_before=$T_FAIL
SRDMA_XFAIL='^xf-'
quiet run_single --raw "xf-fails" "false"
expect_that "XFAIL: listed failing case reported" last_result_is '^XFAIL xf-fails \(rc=1\)$'
expect_that "XFAIL: not counted as a failure" test "$T_FAIL" -eq "$fails_before"
quiet run_single --raw "xf-passes" "true"
expect_that "XPASS: listed passing case reported" last_result_is '^XPASS xf-passes$'
out=$(srdma_summary 2>/dev/null)
expect_that "summary with XFAIL: ', N skipped'" bash -c "[[ '$out' =~ ^[0-9]+\ passed,\ [0-9]+\ failed,\ 1\ skipped$ ]]"
SRDMA_XFAIL=
T_XFAIL=0
T_XPASS=0
# shellcheck disable=SC2016 # expanded by the child shell
rundir=$(env -u SOFTRDMA_RUNDIR bash -c '
	source "$1"
	srdma_private_rundir || exit 1
	d=$SOFTRDMA_RUNDIR
	[[ -d $d && $(stat -c %a "$d") == 1777 ]] || exit 1
	srdma_cleanup
	echo "$d"' rundir "$HERE/lib.sh")
expect_that "private run dir created and then removed" bash -c "[[ -n '$rundir' && ! -e '$rundir' ]]"

# 10. namespaces: setup, a cross-namespace pair, teardown
if why=$(srdma_netns_available); then
	if srdma_netns_setup; then
		expect_that "namespaces created" bash -c "ip netns list | grep -q '^$NS_A' && ip netns list | grep -q '^$NS_B'"
		srdma_next_port "$NS_A"
		quiet run_pair --raw --port "$PORT" --expect receiver "netns-pair" \
			"iperf3 -s -1 -p $PORT -B $ADDR_A" "iperf3 -c $ADDR_A -p $PORT -t 1" "$NS_A" "$NS_B"
		expect_that "pair across namespaces passes" last_result_is '^PASS netns-pair$'
		expect_that "server port not visible on the host" bash -c "[[ -z \$(ss -Hltn 'sport = :$PORT') ]]"
		a=$NS_A b=$NS_B
		srdma_netns_teardown
		expect_that "namespaces removed" bash -c "! ip netns list | grep -Eq '^($a|$b)( |\$)'"
	else
		expect_that "netns setup" false
		srdma_netns_teardown
	fi

	# 11. SIGINT / SIGTERM in the middle of a case: everything is cleaned up.
	# Background jobs of a non-interactive shell start with SIGINT ignored
	# (and an ignored signal cannot be trapped), so restore the default.
	for sig in INT TERM; do
		child_log=$T_LOGDIR/signal-$sig.out
		# shellcheck disable=SC2016 # expanded by the child shell
		env --default-signal=INT bash -c '
			set -u
			source "$1"
			SOFTRDMA_TEST_LOGDIR=$2; srdma_log_init sig
			srdma_install_traps
			srdma_netns_setup || exit 3
			echo "$NS_A $NS_B"
			srdma_next_port "$NS_A"
			run_pair --raw --port "$PORT" --timeout 60 "sig" \
				"iperf3 -s -p $PORT" "sleep $3" "$NS_A" "$NS_B"
		' sigtest "$HERE/lib.sh" "$T_LOGDIR" "$NAP" >"$child_log" 2>&1 &
		child=$!
		sleep 3
		kill "-$sig" "$child"
		srdma_wait_bounded "$child" 20
		rc=$WAIT_RC
		read -r a b <"$child_log"
		want_rc=130
		[[ $sig == TERM ]] && want_rc=143
		expect_that "SIG$sig: exit $want_rc (got $rc)" test "$rc" = "$want_rc"
		expect_that "SIG$sig: namespaces removed" bash -c "! ip netns list | grep -Eq '^(${a:-x}|${b:-x})( |\$)'"
		expect_that "SIG$sig: no process left" no_leftovers "$MARK"
	done
else
	echo "skip - netns checks ($why)"
fi

echo "selftest: $OK ok, $BAD failed (logs: $T_LOGDIR)"
((BAD == 0))
