#!/usr/bin/env bash
#
# rdma-core's own test suite on softrdma: the pyverbs tests that Debian's python3-pyverbs ships
# (/usr/share/doc/rdma-core/tests, some files gzipped), run on softrdma0 through `softrdma run` by
# pyverbs_suite.py. Tests for other devices (mlx5, EFA, CUDA) and for what softrdma does not offer
# (raw packet QPs, parent domains, device import) skip themselves; the suite's expected failures,
# each with its reason, are listed in pyverbs_suite.py. Without the suite or /usr/bin/python3's
# pyverbs it exits 77 (skipped).
#
# Usage: pyverbs.sh [--verbose] [TEST ...]   (TEST as unittest names it: tests.test_mr, ...)
# Output: one line per test ("PASS id", "FAIL id (error)", "SKIP id (reason)", "XFAIL id
# (reason)"), then "N passed, M failed, K skipped". Exit 0 iff nothing failed unexpectedly.
# Environment: SOFTRDMA_BUILD (default <repo>/build), SOFTRDMA_TEST_LOGDIR.

set -u

# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

SUITE_SRC=/usr/share/doc/rdma-core/tests
PYTHON=/usr/bin/python3 # Debian's: pyverbs is installed for it alone
names=()
for a in "$@"; do
	case $a in
	-v | --verbose) T_VERBOSE=1 ;;
	-*) srdma_die "unknown argument: $a" ;;
	*) names+=("$a") ;;
	esac
done
srdma_require_build

if [[ ! -f $SUITE_SRC/run_tests.py ]] || ! "$PYTHON" -c 'import pyverbs' 2>/dev/null; then
	echo "skipped: rdma-core's test suite (python3-pyverbs) is not installed"
	exit 77
fi

srdma_log_init pyverbs
srdma_install_traps
srdma_private_rundir || srdma_die "cannot create a run directory"
SUITE=$T_LOGDIR/suite
if ! mkdir -p "$SUITE" || ! cp -r "$SUITE_SRC" "$SUITE/tests"; then
	srdma_die "cannot copy the suite"
fi
gunzip -q "$SUITE"/tests/*.gz || srdma_die "cannot unpack the suite"

LOG=$T_LOGDIR/pyverbs.log
timeout 240 "${SRDMA_RUN[@]}" "$PYTHON" "$(dirname "${BASH_SOURCE[0]}")/pyverbs_suite.py" \
	"$SUITE" softrdma0 "${names[@]}" >"$LOG" 2>&1
rc=$?
if ((T_VERBOSE)); then
	cat "$LOG"
else
	grep -E '^(FAIL|XFAIL|XPASS) |^[0-9]+ passed' "$LOG"
fi
if ! grep -Eq '^[0-9]+ passed' "$LOG"; then
	# It died or timed out before its summary: what ran is in the log.
	((rc == 124)) && why="did not finish within 240 s" || why="stopped (rc=$rc)"
	tail -n "$T_TAIL_LINES" "$LOG" >&2
	echo "FAIL the suite $why"
	echo "$(grep -c '^PASS ' "$LOG") passed, 1 failed"
	rc=1
fi
echo "logs: $T_LOGDIR"
exit $((rc == 0 ? 0 : 1))
