#!/usr/bin/env bash
#
# Open MPI (Debian's openmpi-bin 4.1) over UCX over softrdma: examples/mpi/exchange_check.c, built
# with mpicc, run by mpirun with `--mca pml ucx` and UCX's verbs transports on softrdma0, its ranks
# as processes of one host, over the shared-memory link and the TCP link. The program checks every
# byte it receives; UCX registers and caches its buffers as it goes (regions that overlap,
# outgrow each other and share pages), which is what this suite is about. Needs root for the
# device node UCX looks for (made and removed again, as ucx.sh does); without root, mpirun or
# mpicc it exits 77 (skipped).
#
# Usage: mpi.sh [--filter ERE] [--verbose] [--list]
# Output: one line per case, "PASS name" or "FAIL name (reason)", then "N passed, M failed".
# Environment: SOFTRDMA_BUILD (default <repo>/build), SOFTRDMA_TEST_LOGDIR.

set -u

# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

srdma_parse_suite_args "$@"
((NETNS)) && srdma_die "mpi.sh runs on one host only"
srdma_require_build

for tool in mpirun mpicc; do
	if ! command -v "$tool" >/dev/null; then
		echo "skipped: $tool (openmpi-bin, libopenmpi-dev) is not installed"
		exit 77
	fi
done
if ((EUID != 0)); then
	echo "skipped: making $(basename "$0")'s device node takes root"
	exit 77
fi

T_BUDGET=${SOFTRDMA_TEST_BUDGET:-200}
CASE_TMO=60
srdma_log_init mpi
srdma_install_traps
srdma_private_rundir || srdma_die "cannot create a run directory"
PROGRAM=$T_LOGDIR/exchange_check
if ((!LIST)); then
	srdma_devnode
	mpicc -O2 -o "$PROGRAM" "$SRDMA_REPO_ROOT/examples/mpi/exchange_check.c" ||
		srdma_die "mpicc failed"
fi

# run_case NAME LINK RANKS: the program on RANKS ranks; LINK "auto" (shared memory) or "tcp".
# Passes when mpirun exits 0 and rank 0 printed "OK: 0 errors".
run_case() {
	local name=$1 link=$2 ranks=$3
	want "$name" || return 0
	local log pid
	log=$T_LOGDIR/$(_srdma_slug "$name").log
	srdma_spawn pid "$log" "$CASE_TMO" "" "${SRDMA_RUN[@]}" mpirun --allow-run-as-root \
		--oversubscribe -np "$ranks" --mca pml ucx -x LD_LIBRARY_PATH -x SOFTRDMA_RUNDIR \
		-x "SOFTRDMA_LINK=$link" -x UCX_TLS=rc_verbs,ud_verbs,self -x UCX_NET_DEVICES=softrdma0:1 \
		-x UCX_WARN_UNUSED_ENV_VARS=n "$PROGRAM"
	srdma_wait_bounded "$pid" "$CASE_TMO"
	if [[ $WAIT_RC != 0 ]]; then
		srdma_record "$name" fail "mpirun $WAIT_RC" "$log"
	elif ! grep -q '^OK: 0 errors' "$log"; then
		srdma_record "$name" fail "no verdict printed" "$log"
	else
		srdma_record "$name" pass
	fi
}

for round in 1 2 3; do
	run_case "MPI exchanges, 2 ranks, run $round" auto 2
done
run_case "MPI exchanges, 4 ranks" auto 4
run_case "MPI exchanges, 2 ranks over the TCP link" tcp 2

srdma_summary
