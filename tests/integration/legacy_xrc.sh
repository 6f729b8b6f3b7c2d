#!/usr/bin/env bash
#
# Acceptance of issue 5's legacy XRC: examples/ofed_xrc/xrc_rcv_qp.c, a program written against
# the OFED 1.5 man pages, run as separate processes. The creator makes the XRC receive QP and
# exits; two receivers registered for it earlier keep receiving through it (each on its own XRC
# SRQ); after the last ibv_unreg_xrc_rcv_qp, a query of the QP number fails with EINVAL. A fourth
# process, the remote node, sends: a round while the creator lives, a round after it has gone.
#
# Usage: legacy_xrc.sh [--netns] [--filter ERE] [--verbose] [--list]
#   --netns   the creator and the receivers in namespace A, the sender in namespace B (needs
#             root; exits 77 = skipped when namespaces are not available)
#
# Output: one line per case, "PASS name" or "FAIL name (reason)", then "N passed, M failed".
# Environment: SOFTRDMA_BUILD (default <repo>/build), SOFTRDMA_TEST_LOGDIR.

set -u

# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

srdma_parse_suite_args "$@"
srdma_require_build
DEMO=$SOFTRDMA_BUILD/examples/xrc_rcv_qp
[[ -x $DEMO ]] || srdma_die "$DEMO not built"

T_BUDGET=${SOFTRDMA_TEST_BUDGET:-240}
CASE_TMO=60
PER_ROUND=50 # messages to each receiver per round

RNS= # namespace of the creator and the receivers
SNS= # the sender's
if ((NETNS)); then
	why=$(srdma_netns_available) || {
		echo "skipped: $why"
		exit 77
	}
fi
srdma_log_init legacy-xrc
srdma_install_traps
srdma_private_rundir || srdma_die "cannot create a run directory"
if ((NETNS)); then
	srdma_netns_setup || srdma_die "namespace setup failed"
	RNS=$NS_A
	SNS=$NS_B
fi

# run_case NAME LINK [CREATE-ARGS...]: LINK "auto" (shared memory on one host) or "tcp".
run_case() {
	local name=$1 link=$2
	shift 2
	want "$name" || return 0
	local dir logs=$T_LOGDIR/$(_srdma_slug "$name")
	dir=$(mktemp -d "/tmp/softrdma-xrc-XXXXXX") || return 1
	mkdir -p "$logs"
	local send create ra rb rc_c rc_s rc_a rc_b
	local -a run=(env "SOFTRDMA_LINK=$link" "${SRDMA_RUN[@]}")
	# The sender first: the creator connects its QP to the sender's.
	srdma_spawn send "$logs/send.log" "$CASE_TMO" "$SNS" \
		"${run[@]}" "$DEMO" send "$dir" "$PER_ROUND" A B
	srdma_spawn create "$logs/create.log" "$CASE_TMO" "$RNS" \
		"${run[@]}" "$DEMO" create "$dir" "$@"
	srdma_spawn ra "$logs/recv-A.log" "$CASE_TMO" "$RNS" \
		"${run[@]}" "$DEMO" recv "$dir" A "$PER_ROUND"
	srdma_spawn rb "$logs/recv-B.log" "$CASE_TMO" "$RNS" \
		"${run[@]}" "$DEMO" recv "$dir" B "$PER_ROUND" --after A
	srdma_wait_bounded "$create" "$CASE_TMO"
	rc_c=$WAIT_RC
	# Round 2 starts once the creator's process is gone for good.
	touch "$dir/creator.gone"
	srdma_wait_bounded "$send" "$CASE_TMO"
	rc_s=$WAIT_RC
	srdma_wait_bounded "$ra" "$CASE_TMO"
	rc_a=$WAIT_RC
	srdma_wait_bounded "$rb" "$CASE_TMO"
	rc_b=$WAIT_RC
	local left
	left=$(ls -A "$SOFTRDMA_RUNDIR" 2>/dev/null | grep -v '^cm$' | tr '\n' ' ')
	rm -rf "$dir"
	local all=("$logs/create.log" "$logs/send.log" "$logs/recv-A.log" "$logs/recv-B.log")
	if [[ $rc_c != 0 || $rc_s != 0 || $rc_a != 0 || $rc_b != 0 ]]; then
		srdma_record "$name" fail "create $rc_c, send $rc_s, recv A $rc_a, recv B $rc_b" "${all[@]}"
	elif ! grep -q "round 2, $PER_ROUND messages" "$logs/recv-A.log" ||
		! grep -q "round 2, $PER_ROUND messages" "$logs/recv-B.log" ||
		! grep -q "QP .* is gone (query: EINVAL)" "$logs/recv-B.log"; then
		srdma_record "$name" fail "a receiver did not report what it should" "${all[@]}"
	elif [[ -n $left ]]; then
		srdma_record "$name" fail "left in the run directory: $left" "${all[@]}"
	else
		srdma_record "$name" pass
	fi
}

run_case "xrc_rcv_qp creator unregisters and exits" auto
run_case "xrc_rcv_qp creator exits registered" auto --exit-registered
run_case "xrc_rcv_qp over the TCP link" tcp

srdma_summary
