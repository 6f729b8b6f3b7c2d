#!/usr/bin/env bash
#
# UCX (Debian's ucx-utils 1.13) over softrdma: ucx_perftest with UCX's verbs transports
# (rc_verbs, ud_verbs for wire-up) on softrdma0, server and client as two processes: on one host
# over the shared-memory link and the TCP link, or (--netns) in two network namespaces joined by a
# veth pair. UCX lists an IB device only when
# /dev/infiniband/<dev_name> is a character device (`softrdma devnode`, docs/compatibility.md):
# the script makes it when missing, and removes it again, so it needs root; without root or
# ucx_perftest it exits 77 (skipped).
#
# Usage: ucx.sh [--netns] [--filter ERE] [--verbose] [--list]
# Output: one line per case, "PASS name" or "FAIL name (reason)", then "N passed, M failed".
# Environment: SOFTRDMA_BUILD (default <repo>/build), SOFTRDMA_TEST_LOGDIR.

set -u

# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

srdma_parse_suite_args "$@"
srdma_require_build

if ! command -v ucx_perftest >/dev/null; then
	echo "skipped: ucx_perftest (ucx-utils) is not installed"
	exit 77
fi
if ((EUID != 0)); then
	echo "skipped: making $(basename "$0")'s device node takes root"
	exit 77
fi

T_BUDGET=${SOFTRDMA_TEST_BUDGET:-200}
CASE_TMO=60

SNS= # the server's namespace
CNS= # the client's
SERVER_ADDR=127.0.0.1
if ((NETNS)); then
	why=$(srdma_netns_available) || {
		echo "skipped: $why"
		exit 77
	}
fi
srdma_log_init ucx
srdma_install_traps
srdma_private_rundir || srdma_die "cannot create a run directory"
if ((NETNS)); then
	srdma_netns_setup || srdma_die "namespace setup failed"
	SNS=$NS_A
	CNS=$NS_B
	SERVER_ADDR=$ADDR_A
fi

((LIST)) || srdma_devnode

# run_case NAME LINK TEST ARGS...: ucx_perftest TEST between two processes; LINK "auto" (shared
# memory on one host, TCP across namespaces) or "tcp". Passes when both sides exit 0 and the client prints its results.
run_case() {
	local name=$1 link=$2
	shift 2
	want "$name" || return 0
	local logs server client rc_s rc_c
	logs=$T_LOGDIR/$(_srdma_slug "$name")
	mkdir -p "$logs"
	local -a run=(env "SOFTRDMA_LINK=$link" "UCX_TLS=rc_verbs,ud_verbs,self"
		"UCX_NET_DEVICES=softrdma0:1" "UCX_WARN_UNUSED_ENV_VARS=n" "${SRDMA_RUN[@]}")
	srdma_next_port "$SNS"
	srdma_spawn server "$logs/server.log" "$CASE_TMO" "$SNS" "${run[@]}" ucx_perftest -p "$PORT"
	if ! srdma_wait_listen "$server" "$PORT" "$SNS" 20; then
		srdma_kill "$server"
		srdma_record "$name" fail "$LISTEN_ERR" "$logs/server.log"
		return
	fi
	srdma_spawn client "$logs/client.log" "$CASE_TMO" "$CNS" \
		"${run[@]}" ucx_perftest "$SERVER_ADDR" -p "$PORT" "$@"
	srdma_wait_bounded "$client" "$CASE_TMO"
	rc_c=$WAIT_RC
	srdma_wait_bounded "$server" 10
	rc_s=$WAIT_RC
	if [[ $rc_c != 0 || $rc_s != 0 ]]; then
		srdma_record "$name" fail "client $rc_c, server $rc_s" "$logs/client.log" "$logs/server.log"
	elif ! grep -q '^Final:' "$logs/client.log"; then
		srdma_record "$name" fail "no results printed" "$logs/client.log"
	elif grep -q 'UCX  ERROR' "$logs/client.log" "$logs/server.log"; then
		srdma_record "$name" fail "UCX reported an error" "$logs/client.log" "$logs/server.log"
	else
		srdma_record "$name" pass
	fi
}

run_case "ucx_perftest tag_lat 2 B" auto -t tag_lat -s 2 -n 20000
run_case "ucx_perftest tag_bw 64 KiB" auto -t tag_bw -s 65536 -n 5000
run_case "ucx_perftest ucp_put_bw 64 KiB" auto -t ucp_put_bw -s 65536 -n 5000
run_case "ucx_perftest ucp_get 64 KiB" auto -t ucp_get -s 65536 -n 5000
run_case "ucx_perftest ucp_add" auto -t ucp_add -n 20000
if ((!NETNS)); then # across namespaces every case is on the TCP link already
	run_case "ucx_perftest tag_lat 2 B over the TCP link" tcp -t tag_lat -s 2 -n 20000
	run_case "ucx_perftest ucp_put_bw 64 KiB over the TCP link" tcp -t ucp_put_bw -s 65536 -n 2000
fi

srdma_summary
