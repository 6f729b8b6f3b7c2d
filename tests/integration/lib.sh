# shellcheck shell=bash
#
# Helpers for the integration tests and benchmarks that drive unmodified
# Debian RDMA tools (ibverbs-utils, perftest, qperf) through `softrdma run`.
#
# Source it; do not execute it. Callers use `set -u` (not `set -e`: a failing
# case must be recorded, not abort the whole run).
#
# Design rules (the reasons matter more than the code):
#   * Every process we start runs under coreutils `timeout`, which puts it in
#     its own process group. So nothing outlives its time bound even if this
#     shell is SIGKILLed (ctest's TIMEOUT does that), and one `kill -- -PGID`
#     removes the tool together with anything it forked (qperf forks per test).
#   * We wait on background jobs with the `wait` builtin or short sleeps, never
#     on a foreground child: bash runs traps only between commands, and a
#     foreground child would delay Ctrl-C handling until it exits.
#   * None of the server tools can bind a chosen address: the pingpongs bind
#     the wildcard (AF_UNSPEC, AI_PASSIVE), perftest 4.5-0.17 binds INADDR_ANY
#     (its --source_ip option is shadowed by the raw-Ethernet option of the
#     same name) and qperf binds [::]. Isolation therefore comes from unique
#     ports (loopback mode) or from the namespaces (netns mode); clients always
#     connect to 127.0.0.1 or to the server namespace's veth address.
#   * Ports come from a per-run range >= 20000 and below the kernel's ephemeral
#     range (32768+), and are skipped if anything already uses them.

# ---------------------------------------------------------------------------
# Locations

SRDMA_LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SRDMA_REPO_ROOT=$(cd "$SRDMA_LIB_DIR/../.." && pwd)
SOFTRDMA_BUILD=${SOFTRDMA_BUILD:-$SRDMA_REPO_ROOT/build}
SOFTRDMA_BIN=$SOFTRDMA_BUILD/bin/softrdma

# Prefix that makes a command use our libraries. `stdbuf -oL` keeps stdout
# line-buffered: when a hung tool is killed we still see what it printed, and
# stdout/stderr interleave in the right order in the log. Set
# SOFTRDMA_TEST_STDBUF=0 to run the tools completely untouched.
SRDMA_RUN=()

srdma_die() {
	echo "error: $*" >&2
	exit 2
}

# Fail early and loudly if the build is missing: silently running the stock
# libraries would test nothing. srdma_check_build prints the problem and
# returns 1; srdma_require_build exits instead.
srdma_check_build() {
	if [[ ! -x $SOFTRDMA_BIN ]]; then
		echo "softrdma CLI not found at $SOFTRDMA_BIN (build first, or set SOFTRDMA_BUILD)"
		return 1
	fi
	if [[ ! -e $SOFTRDMA_BUILD/lib/libibverbs.so.1 ]]; then
		echo "$SOFTRDMA_BUILD/lib/libibverbs.so.1 not found (build first)"
		return 1
	fi
	local tool
	for tool in timeout ss ip stdbuf; do
		if ! command -v "$tool" >/dev/null; then
			echo "required tool '$tool' not found"
			return 1
		fi
	done
	SRDMA_RUN=("$SOFTRDMA_BIN" run --)
	if [[ ${SOFTRDMA_TEST_STDBUF:-1} != 0 ]]; then
		SRDMA_RUN+=(stdbuf -oL)
	fi
}

srdma_require_build() {
	local why
	why=$(srdma_check_build) || srdma_die "$why"
	srdma_check_build >/dev/null # again, outside the subshell, to set SRDMA_RUN
}

# ---------------------------------------------------------------------------
# Results and logs

T_PASS=0
T_FAIL=0
# Expected failures: cases whose name matches the ERE SRDMA_XFAIL (empty =
# none) and fail are printed "XFAIL name (reason)" and counted in T_XFAIL, not
# in T_FAIL; if such a case passes it is printed "XPASS name" and counted as a
# pass (and in T_XPASS): a hint that the entry may go, unless it is flaky.
SRDMA_XFAIL=${SRDMA_XFAIL:-}
T_XFAIL=0
T_XPASS=0
T_LOGDIR=
T_VERBOSE=${SOFTRDMA_TEST_VERBOSE:-0}
T_TAIL_LINES=25
# Wall-clock budget for the whole run (seconds, 0 = none). Cases that would
# start after it ran out are failed without running, so the summary line is
# printed before an outer watchdog (ctest TIMEOUT) kills us without cleanup.
T_BUDGET=0

# srdma_log_init SUITE: create a fresh log directory for this run.
srdma_log_init() {
	local suite=$1 base
	base=${SOFTRDMA_TEST_LOGDIR:-$SOFTRDMA_BUILD/test-logs}
	T_LOGDIR=$base/$suite-$(date +%Y%m%d-%H%M%S)-$$
	if ! mkdir -p "$T_LOGDIR" 2>/dev/null; then
		T_LOGDIR=$(mktemp -d "/tmp/softrdma-$suite-XXXXXX") || srdma_die "cannot create a log directory"
	fi
	: >"$T_LOGDIR/results.txt"
}

# File-name-safe version of a case name.
_srdma_slug() {
	local s=$1
	s=${s//\//_}
	s=${s// /_}
	printf '%s' "$s"
}

# srdma_record NAME pass|fail [REASON [LOG...]]
# Prints the one-line verdict; on failure also keeps the tails of the given
# logs in FAILURES.txt (and on stderr with --verbose).
srdma_record() {
	local name=$1 status=$2 reason=${3:-} log verdict=FAIL
	shift $(($# < 3 ? $# : 3))
	if [[ $status == pass ]]; then
		T_PASS=$((T_PASS + 1))
		if srdma_is_xfail "$name"; then
			T_XPASS=$((T_XPASS + 1))
			echo "XPASS $name (on the expected-failure list)"
			printf 'XPASS %s\n' "$name" >>"$T_LOGDIR/results.txt"
			return 0
		fi
		echo "PASS $name"
		printf 'PASS %s\n' "$name" >>"$T_LOGDIR/results.txt"
		return 0
	fi
	if srdma_is_xfail "$name"; then
		verdict=XFAIL
		T_XFAIL=$((T_XFAIL + 1))
	else
		T_FAIL=$((T_FAIL + 1))
	fi
	echo "$verdict $name ($reason)"
	printf '%s %s (%s)\n' "$verdict" "$name" "$reason" >>"$T_LOGDIR/results.txt"
	{
		echo "=== $verdict $name ($reason)"
		for log in "$@"; do
			[[ -f $log ]] || continue
			echo "--- tail of $log"
			tail -n "$T_TAIL_LINES" "$log"
		done
		echo
	} >>"$T_LOGDIR/FAILURES.txt"
	if [[ $T_VERBOSE == 1 ]]; then
		for log in "$@"; do
			[[ -f $log ]] || continue
			echo "    --- $(basename "$log")"
			tail -n "$T_TAIL_LINES" "$log" | sed 's/^/    | /'
		done >&2
	fi
	return 1
}

# srdma_is_xfail NAME: true if NAME is on the expected-failure list.
srdma_is_xfail() {
	[[ -n $SRDMA_XFAIL && $1 =~ $SRDMA_XFAIL ]]
}

# Print the closing summary; returns the suite's exit status. Expected
# failures are reported as skipped (", N skipped" may follow the counts).
srdma_summary() {
	echo "logs: $T_LOGDIR" >&2
	if ((T_XFAIL > 0 || T_XPASS > 0)); then
		echo "($T_XFAIL expected failures (XFAIL), $T_XPASS unexpected passes (XPASS))" >&2
	fi
	if ((T_XFAIL > 0)); then
		echo "$T_PASS passed, $T_FAIL failed, $T_XFAIL skipped"
	else
		echo "$T_PASS passed, $T_FAIL failed"
	fi
	((T_FAIL == 0))
}

# Seconds left in the budget (a large number when there is no budget).
srdma_budget_left() {
	if ((T_BUDGET <= 0)); then
		echo 999999
	else
		echo $((T_BUDGET - SECONDS))
	fi
}

# srdma_case_timeout WANTED: WANTED capped by the remaining budget (minus a
# margin for teardown); prints 0 if there is no room for the case.
srdma_case_timeout() {
	local want=$1 left
	left=$(($(srdma_budget_left) - 15))
	if ((left < 5)); then
		echo 0
	elif ((want > left)); then
		echo "$left"
	else
		echo "$want"
	fi
}

# ---------------------------------------------------------------------------
# Processes

SRDMA_PIDS=() # every background job we started and have not reaped

# _srdma_in_ns NS CMD...: run CMD in netns NS, or on the host if NS is empty.
_srdma_in_ns() {
	local ns=$1
	shift
	if [[ -n $ns ]]; then
		ip netns exec "$ns" "$@"
	else
		"$@"
	fi
}

# srdma_spawn VAR LOG TIMEOUT NS CMD...
# Starts CMD in the background, stdin from /dev/null, stdout+stderr to LOG
# (which starts with the command line, so a log tail is self-explanatory),
# bounded by TIMEOUT seconds (then SIGTERM, SIGKILL 5 s later). `timeout`
# is the outermost process and `ip netns exec` execs in place, so the pid in
# VAR is also the process group id of everything CMD starts.
srdma_spawn() {
	local -n _pid_out=$1
	local log=$2 tmo=$3 ns=$4
	shift 4
	local -a pre=(timeout -k 5 "$tmo")
	[[ -n $ns ]] && pre+=(ip netns exec "$ns")
	printf '$ %s\n' "${pre[*]} $*" >"$log"
	"${pre[@]}" "$@" </dev/null >>"$log" 2>&1 &
	_pid_out=$!
	SRDMA_PIDS+=("$_pid_out")
}

_srdma_forget_pid() {
	local pid=$1 i
	for i in "${!SRDMA_PIDS[@]}"; do
		[[ ${SRDMA_PIDS[i]} == "$pid" ]] && unset 'SRDMA_PIDS[i]'
	done
}

# srdma_kill PID: terminate the process group PID (TERM, then KILL after 3 s)
# and reap it. Safe to call on an already finished job.
srdma_kill() {
	local pid=$1 i
	kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
	for ((i = 0; i < 30; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	kill -KILL -- "-$pid" 2>/dev/null
	wait "$pid" 2>/dev/null
	_srdma_forget_pid "$pid"
}

# srdma_wait_bounded PID SECS: wait at most SECS for PID to exit.
# Sets WAIT_RC to its exit status, or to "timeout" (after killing it).
WAIT_RC=
srdma_wait_bounded() {
	local pid=$1 secs=$2 deadline
	deadline=$((SECONDS + secs))
	# Bash reaps finished children on SIGCHLD, so kill -0 fails as soon as the
	# job is done (no zombie lingering while we poll).
	while kill -0 "$pid" 2>/dev/null; do
		if ((SECONDS >= deadline)); then
			srdma_kill "$pid"
			WAIT_RC=timeout
			return
		fi
		sleep 0.1
	done
	wait "$pid"
	WAIT_RC=$?
	_srdma_forget_pid "$pid"
}

# srdma_is_listening PORT [NS]: true if some TCP socket listens on PORT.
srdma_is_listening() {
	local port=$1 ns=${2:-}
	[[ -n $(_srdma_in_ns "$ns" ss -Hltn "sport = :$port" 2>/dev/null) ]]
}

# srdma_cm_rundir: the run directory softrdma's libraries use (as
# core::RunDirectory()).
srdma_cm_rundir() {
	echo "${SOFTRDMA_RUNDIR:-/dev/shm/softrdma}"
}

# srdma_is_cm_listening PORT [NS]: true if a softrdma CM id listens on PORT in
# NS (any port space). librdmacm's listeners open no TCP socket: a listening
# id publishes "<run dir>/cm/<netns inode>-<ps>-<port>-<pid>-<n>" with a
# non-zero "listen" line (src/cm/registry.cpp), removed when the id goes.
srdma_is_cm_listening() {
	local port=$1 ns=${2:-} dir nsid f
	dir=$(srdma_cm_rundir)/cm
	[[ -d $dir ]] || return 1
	nsid=$(_srdma_in_ns "$ns" stat -L -c %i /proc/self/ns/net 2>/dev/null) || return 1
	for f in "$dir/$nsid"-*-"$port"-*; do
		[[ -f $f ]] || continue
		grep -Eq '^listen [1-9]' "$f" 2>/dev/null && return 0
	done
	return 1
}

# srdma_is_cm_or_tcp_listening PORT [NS]: a CM listener or a TCP socket (the
# rsockets tools' -T s mode, perftest's out-of-band exchange).
srdma_is_cm_or_tcp_listening() {
	srdma_is_cm_listening "$@" || srdma_is_listening "$@"
}

# srdma_wait_listen PID PORT NS SECS [CHECK]: wait until PORT listens in NS,
# while the server PID is still alive. CHECK is the predicate, called as
# CHECK PORT NS (default srdma_is_listening: a TCP socket). Sets LISTEN_ERR
# and returns 1 on failure.
LISTEN_ERR=
srdma_wait_listen() {
	local pid=$1 port=$2 ns=$3 secs=$4 check=${5:-srdma_is_listening} deadline
	deadline=$((SECONDS + secs))
	while ! "$check" "$port" "$ns"; do
		if ! kill -0 "$pid" 2>/dev/null; then
			wait "$pid"
			LISTEN_ERR="server exited (rc=$?) before listening on port $port"
			_srdma_forget_pid "$pid"
			return 1
		fi
		if ((SECONDS >= deadline)); then
			LISTEN_ERR="server not listening on port $port after ${secs}s"
			return 1
		fi
		sleep 0.05
	done
}

# ---------------------------------------------------------------------------
# Ports

SRDMA_PORT_BASE=${SOFTRDMA_TEST_PORT_BASE:-$((20000 + ($$ % 40) * 300))}
_SRDMA_PORT_NEXT=$SRDMA_PORT_BASE
PORT=

# srdma_next_port [NS]: set PORT to a fresh port nobody uses (host and NS).
srdma_next_port() {
	local ns=${1:-}
	while :; do
		PORT=$_SRDMA_PORT_NEXT
		_SRDMA_PORT_NEXT=$((_SRDMA_PORT_NEXT + 1))
		((PORT < 32768)) || srdma_die "ran out of test ports (base $SRDMA_PORT_BASE)"
		[[ -z $(ss -Htan "sport = :$PORT" 2>/dev/null) ]] || continue
		[[ -z $ns || -z $(ip netns exec "$ns" ss -Htan "sport = :$PORT" 2>/dev/null) ]] || continue
		return 0
	done
}

# ---------------------------------------------------------------------------
# Output checks. Each returns 0 on success; on failure prints the reason.

# srdma_check_expect LOG REGEX: LOG has a line matching the ERE.
srdma_check_expect() {
	grep -Eq -- "$2" "$1" && return 0
	echo "no line matching /$2/ in $(basename "$1")"
	return 1
}

# srdma_check_reject LOG REGEX: no line of LOG matches the ERE (any case).
srdma_check_reject() {
	local line
	line=$(grep -Ei -m1 -- "$2" "$1") || return 0
	echo "$(basename "$1"): ${line:0:120}"
	return 1
}

# ---------------------------------------------------------------------------
# The case runners

# run_pair [options] NAME SERVER_CMD CLIENT_CMD [SERVER_NS [CLIENT_NS]]
#
# Starts SERVER_CMD (in SERVER_NS if given), waits until it listens on the
# --port, runs CLIENT_CMD (in CLIENT_NS if given), then gives the server a
# bounded time to exit on its own. Commands are split on whitespace (no
# quoting). Both are prefixed with `softrdma run --` unless --raw.
#
# Options:
#   --port P              TCP port the server listens on (required)
#   --timeout S           bound for the client and the server (default 60)
#   --listen-timeout S    bound for the server to start listening (default 20)
#   --server-grace S      bound for the server to exit after the client (10)
#   --expect ERE          the client log must match (repeatable)
#   --expect-server ERE   the server log must match (repeatable)
#   --reject ERE          neither log may match, case-insensitive (repeatable)
#   --check FUNC          FUNC CLIENT_LOG SERVER_LOG must return 0; its stdout
#                         is the failure reason
#   --raw                 do not prefix `softrdma run --` (anchors, self-tests)
#   --listen-check FUNC   readiness predicate, FUNC PORT NS (default
#                         $SRDMA_LISTEN_CHECK, itself srdma_is_listening)
#   --server-daemon       the server never exits by itself (cmtime, rcopy):
#                         it must still be running (or have exited 0) when the
#                         client is done, and is then killed with its group
# Returns 0 on PASS, 1 on FAIL.
SRDMA_LISTEN_CHECK=${SRDMA_LISTEN_CHECK:-srdma_is_listening}
# What run_pair puts before a client's command, e.g. (env SOFTRDMA_RUNDIR=...)
# for a client that plays another host.
SRDMA_CLIENT_ENV=()

run_pair() {
	local port='' tmo=60 ltmo=20 grace=10 raw=0 daemon=0
	local lcheck=$SRDMA_LISTEN_CHECK
	local -a expect=() expect_srv=() reject=() checks=()
	while [[ $# -gt 0 && $1 == --* ]]; do
		case $1 in
		--port) port=$2 ;;
		--timeout) tmo=$2 ;;
		--listen-timeout) ltmo=$2 ;;
		--server-grace) grace=$2 ;;
		--expect) expect+=("$2") ;;
		--expect-server) expect_srv+=("$2") ;;
		--reject) reject+=("$2") ;;
		--check) checks+=("$2") ;;
		--listen-check) lcheck=$2 ;;
		--raw)
			raw=1
			shift
			continue
			;;
		--server-daemon)
			daemon=1
			shift
			continue
			;;
		*) srdma_die "run_pair: unknown option $1" ;;
		esac
		shift 2
	done
	local name=$1 server_str=$2 client_str=$3 sns=${4:-} cns=${5:-}
	[[ -n $port ]] || srdma_die "run_pair $name: --port is required"

	local -a scmd ccmd prefix=()
	read -r -a scmd <<<"$server_str"
	read -r -a ccmd <<<"$client_str"
	((raw)) || prefix=("${SRDMA_RUN[@]}")

	local slug slog clog
	slug=$(_srdma_slug "$name")
	slog=$T_LOGDIR/$slug.server.log
	clog=$T_LOGDIR/$slug.client.log

	tmo=$(srdma_case_timeout "$tmo")
	if ((tmo == 0)); then
		srdma_record "$name" fail "time budget exhausted, not run"
		return 1
	fi

	local spid cpid src crc reason
	# The server's bound covers its own startup, the whole client run and the
	# grace period, so it can never outlive the case.
	srdma_spawn spid "$slog" $((ltmo + tmo + grace)) "$sns" "${prefix[@]}" "${scmd[@]}"
	if ! srdma_wait_listen "$spid" "$port" "$sns" "$ltmo" "$lcheck"; then
		srdma_kill "$spid"
		srdma_record "$name" fail "$LISTEN_ERR" "$slog"
		return 1
	fi

	srdma_spawn cpid "$clog" "$tmo" "$cns" "${SRDMA_CLIENT_ENV[@]}" "${prefix[@]}" "${ccmd[@]}"
	wait "$cpid"
	crc=$?
	_srdma_forget_pid "$cpid"

	if ((daemon)) && kill -0 "$spid" 2>/dev/null; then
		srdma_kill "$spid"
		src=0
	else
		srdma_wait_bounded "$spid" "$grace"
		src=$WAIT_RC
	fi

	reason=
	if ((crc == 124)); then
		reason="client timed out after ${tmo}s"
	elif ((crc != 0)); then
		reason="client rc=$crc"
	elif [[ $src == timeout ]]; then
		reason="server still running ${grace}s after the client finished"
	elif ((src == 124)); then
		reason="server timed out"
	elif ((src != 0)); then
		reason="server rc=$src"
	fi

	local re fn out
	if [[ -z $reason ]]; then
		for re in "${reject[@]}"; do
			out=$(srdma_check_reject "$clog" "$re") || { reason=$out; break; }
			out=$(srdma_check_reject "$slog" "$re") || { reason=$out; break; }
		done
	fi
	if [[ -z $reason ]]; then
		for re in "${expect[@]}"; do
			out=$(srdma_check_expect "$clog" "$re") || { reason=$out; break; }
		done
	fi
	if [[ -z $reason ]]; then
		for re in "${expect_srv[@]}"; do
			out=$(srdma_check_expect "$slog" "$re") || { reason=$out; break; }
		done
	fi
	if [[ -z $reason ]]; then
		for fn in "${checks[@]}"; do
			out=$("$fn" "$clog" "$slog") || { reason=${out:-check $fn failed}; break; }
		done
	fi

	if [[ -n $reason ]]; then
		srdma_record "$name" fail "$reason" "$slog" "$clog"
		return 1
	fi
	srdma_record "$name" pass
}

# run_single [options] NAME CMD [NS]
# Runs one command (no server). Options as run_pair (--timeout, --expect,
# --reject, --check FUNC LOG, --raw) plus:
#   --expect-rc N   required exit status (default 0); 124 means "was still
#                   running when the timeout stopped it" (for daemons such as
#                   ibv_asyncwatch)
#   --also-log F    another log (e.g. a shared server's) to show on failure
run_single() {
	local tmo=60 raw=0 want_rc=0
	local -a expect=() reject=() checks=() also=()
	while [[ $# -gt 0 && $1 == --* ]]; do
		case $1 in
		--timeout) tmo=$2 ;;
		--expect) expect+=("$2") ;;
		--reject) reject+=("$2") ;;
		--check) checks+=("$2") ;;
		--expect-rc) want_rc=$2 ;;
		--also-log) also+=("$2") ;;
		--raw)
			raw=1
			shift
			continue
			;;
		*) srdma_die "run_single: unknown option $1" ;;
		esac
		shift 2
	done
	local name=$1 cmd_str=$2 ns=${3:-}
	local -a cmd prefix=()
	read -r -a cmd <<<"$cmd_str"
	((raw)) || prefix=("${SRDMA_RUN[@]}")

	local log pid rc reason='' re fn out t
	log=$T_LOGDIR/$(_srdma_slug "$name").log
	t=$(srdma_case_timeout "$tmo")
	if ((t == 0)); then
		srdma_record "$name" fail "time budget exhausted, not run"
		return 1
	fi
	# A shortened bound would turn an expected timeout into a false pass.
	if ((want_rc == 124 && t < tmo)); then
		srdma_record "$name" fail "time budget exhausted, not run"
		return 1
	fi
	srdma_spawn pid "$log" "$t" "$ns" "${prefix[@]}" "${cmd[@]}"
	wait "$pid"
	rc=$?
	_srdma_forget_pid "$pid"

	if ((rc != want_rc)); then
		if ((rc == 124)); then
			reason="timed out after ${t}s"
		elif ((want_rc == 124)); then
			reason="exited early (rc=$rc)"
		else
			reason="rc=$rc"
		fi
	fi
	if [[ -z $reason ]]; then
		for re in "${reject[@]}"; do
			out=$(srdma_check_reject "$log" "$re") || { reason=$out; break; }
		done
	fi
	if [[ -z $reason ]]; then
		for re in "${expect[@]}"; do
			out=$(srdma_check_expect "$log" "$re") || { reason=$out; break; }
		done
	fi
	if [[ -z $reason ]]; then
		for fn in "${checks[@]}"; do
			out=$("$fn" "$log") || { reason=${out:-check $fn failed}; break; }
		done
	fi
	if [[ -n $reason ]]; then
		srdma_record "$name" fail "$reason" "$log" "${also[@]}"
		return 1
	fi
	srdma_record "$name" pass
}

# Long-running servers shared by several clients (qperf serves test after
# test).
# srdma_server_start [--raw] NAME CMD PORT [NS [TIMEOUT [LISTEN_TIMEOUT]]]
# sets SERVER_PID and SERVER_LOG; returns 1 and sets LISTEN_ERR if the server
# does not come up.
SERVER_PID=
SERVER_LOG=
srdma_server_start() {
	local -a prefix=("${SRDMA_RUN[@]}")
	if [[ $1 == --raw ]]; then
		prefix=()
		shift
	fi
	# The readiness predicate is $SRDMA_LISTEN_CHECK (see run_pair).
	local name=$1 cmd_str=$2 port=$3 ns=${4:-} tmo=${5:-600} ltmo=${6:-20}
	local -a cmd
	read -r -a cmd <<<"$cmd_str"
	SERVER_LOG=$T_LOGDIR/$(_srdma_slug "$name").server.log
	srdma_spawn SERVER_PID "$SERVER_LOG" "$tmo" "$ns" "${prefix[@]}" "${cmd[@]}"
	if ! srdma_wait_listen "$SERVER_PID" "$port" "$ns" "$ltmo" "$SRDMA_LISTEN_CHECK"; then
		srdma_kill "$SERVER_PID"
		SERVER_PID=
		return 1
	fi
}

srdma_server_stop() {
	[[ -n $SERVER_PID ]] && srdma_kill "$SERVER_PID"
	SERVER_PID=
}

# ---------------------------------------------------------------------------
# Network namespaces: two namespaces joined by a veth pair.
#
# Names carry our pid so that concurrent runs never collide; the /24 is
# derived from it too, which only matters for readability since the veth
# pair lives entirely inside the two namespaces (the host has no route).

NS_A=
NS_B=
ADDR_A=
ADDR_B=
_SRDMA_VETH_A=
_SRDMA_NETNS_UP=0

# srdma_netns_available: true if we may create namespaces (root + ip netns).
# On failure prints why.
srdma_netns_available() {
	if ((EUID != 0)); then
		echo "not root"
		return 1
	fi
	command -v ip >/dev/null || {
		echo "ip (iproute2) not installed"
		return 1
	}
	local probe=srdma-probe-$$
	if ! timeout 10 ip netns add "$probe" 2>/dev/null; then
		echo "ip netns add failed"
		return 1
	fi
	timeout 10 ip netns del "$probe" 2>/dev/null
	return 0
}

srdma_netns_setup() {
	local n=$(($$ % 250 + 1))
	NS_A=srdma-$$-a
	NS_B=srdma-$$-b
	ADDR_A=10.211.$n.1
	ADDR_B=10.211.$n.2
	# Interface names must stay within 15 characters.
	_SRDMA_VETH_A=srv$$a
	local veth_b=srv$$b
	# Mark first, so a failure half-way still gets cleaned up.
	_SRDMA_NETNS_UP=1
	ip netns add "$NS_A" || return 1
	ip netns add "$NS_B" || return 1
	ip link add "$_SRDMA_VETH_A" type veth peer name "$veth_b" || return 1
	ip link set "$_SRDMA_VETH_A" netns "$NS_A" || return 1
	ip link set "$veth_b" netns "$NS_B" || return 1
	ip -n "$NS_A" addr add "$ADDR_A/24" dev "$_SRDMA_VETH_A" || return 1
	ip -n "$NS_B" addr add "$ADDR_B/24" dev "$veth_b" || return 1
	ip -n "$NS_A" link set lo up || return 1
	ip -n "$NS_B" link set lo up || return 1
	ip -n "$NS_A" link set "$_SRDMA_VETH_A" up || return 1
	ip -n "$NS_B" link set "$veth_b" up || return 1
	# The veth carrier comes up asynchronously; wait (bounded) for it.
	local i
	for ((i = 0; i < 50; i++)); do
		if ip -n "$NS_B" -o link show "$veth_b" | grep -q LOWER_UP &&
			ip -n "$NS_A" -o link show "$_SRDMA_VETH_A" | grep -q LOWER_UP; then
			return 0
		fi
		sleep 0.1
	done
	echo "veth pair did not come up" >&2
	return 1
}

srdma_netns_teardown() {
	((_SRDMA_NETNS_UP)) || return 0
	_SRDMA_NETNS_UP=0
	local ns
	for ns in "$NS_A" "$NS_B"; do
		[[ -n $ns ]] && timeout 10 ip netns del "$ns" 2>/dev/null
	done
	# Only left on the host if setup failed before moving it.
	if [[ -n $_SRDMA_VETH_A ]] && ip link show "$_SRDMA_VETH_A" >/dev/null 2>&1; then
		timeout 10 ip link del "$_SRDMA_VETH_A" 2>/dev/null
	fi
}

# ---------------------------------------------------------------------------
# Cleanup: always kill what we started, then remove the namespaces (a
# namespace stays alive while a process is in it).

# Commands run by srdma_cleanup after the processes are gone (e.g. removing a
# private run directory); each is one word, a function or command name.
SRDMA_CLEANUP_HOOKS=()

srdma_cleanup() {
	local pid hook
	for pid in "${SRDMA_PIDS[@]}"; do
		srdma_kill "$pid"
	done
	SRDMA_PIDS=()
	srdma_netns_teardown
	for hook in "${SRDMA_CLEANUP_HOOKS[@]}"; do
		"$hook"
	done
	SRDMA_CLEANUP_HOOKS=()
}

# srdma_devnode: UCX lists an IB device only when /dev/infiniband/<dev_name> is a character device
# (docs/compatibility.md, "UCX"). Makes it when missing (root only) and removes it at cleanup,
# also on a signal; one that was there already stays.
SRDMA_MADE_DEVNODE=0
srdma_devnode() {
	[[ -c /dev/infiniband/uverbs_softrdma0 ]] && return 0
	SRDMA_CLEANUP_HOOKS+=(_srdma_remove_devnode)
	"$SOFTRDMA_BIN" devnode || srdma_die "softrdma devnode failed"
	SRDMA_MADE_DEVNODE=1
}

_srdma_remove_devnode() {
	((SRDMA_MADE_DEVNODE)) && "$SOFTRDMA_BIN" devnode --remove
	SRDMA_MADE_DEVNODE=0
}

# srdma_private_rundir: give this run its own SOFTRDMA_RUNDIR (slots and CM
# listener registry) unless the caller set one, so that fixed ports (udaddy's
# 7174) and other runs on the machine never meet ours. Removed at cleanup.
SRDMA_PRIVATE_RUNDIR=
srdma_private_rundir() {
	[[ -n ${SOFTRDMA_RUNDIR:-} ]] && return 0
	local base=/dev/shm
	[[ -d $base && -w $base ]] || base=${TMPDIR:-/tmp}
	SRDMA_PRIVATE_RUNDIR=$(mktemp -d "$base/softrdma-test-$$-XXXXXX") || return 1
	chmod 01777 "$SRDMA_PRIVATE_RUNDIR"
	export SOFTRDMA_RUNDIR=$SRDMA_PRIVATE_RUNDIR
	SRDMA_CLEANUP_HOOKS+=(_srdma_remove_private_rundir)
}

_srdma_remove_private_rundir() {
	[[ -n $SRDMA_PRIVATE_RUNDIR && -d $SRDMA_PRIVATE_RUNDIR ]] && rm -rf -- "$SRDMA_PRIVATE_RUNDIR"
	SRDMA_PRIVATE_RUNDIR=
}

_srdma_on_signal() {
	local sig=$1
	trap - INT TERM HUP
	echo "interrupted by SIG$sig, cleaning up" >&2
	srdma_cleanup
	trap - EXIT
	case $sig in
	INT) exit 130 ;;
	HUP) exit 129 ;;
	*) exit 143 ;;
	esac
}

srdma_install_traps() {
	trap srdma_cleanup EXIT
	trap '_srdma_on_signal INT' INT
	trap '_srdma_on_signal TERM' TERM
	trap '_srdma_on_signal HUP' HUP
}

# ---------------------------------------------------------------------------
# srdma_usage: prints the calling script's header comment (its --help).
srdma_usage() {
	sed -n '2,/^$/p' "$0" | sed 's/^# \{0,1\}//'
}

# The command line the suites share (debian_tools.sh, rdmacm_tools.sh): sets
# NETNS, QUICK, FILTER, LIST and T_VERBOSE; --help prints the calling script's
# header comment.
# shellcheck disable=SC2034 # the variables are the calling suite's
srdma_parse_suite_args() {
	NETNS=0
	QUICK=0
	FILTER=
	LIST=0
	while [[ $# -gt 0 ]]; do
		case $1 in
		--netns) NETNS=1 ;;
		--quick) QUICK=1 ;;
		--filter)
			[[ $# -ge 2 ]] || srdma_die "--filter needs a regex"
			FILTER=$2
			shift
			;;
		--filter=*) FILTER=${1#--filter=} ;;
		-v | --verbose) T_VERBOSE=1 ;;
		--list) LIST=1 ;;
		-h | --help)
			srdma_usage
			exit 0
			;;
		*) srdma_die "unknown argument: $1 (see --help)" ;;
		esac
		shift
	done
}

# want NAME: should this case run (FILTER)? In --list mode print it instead,
# marked when it is on the expected-failure list.
want() {
	[[ -z $FILTER || $1 =~ $FILTER ]] || return 1
	if ((LIST)); then
		if srdma_is_xfail "$1"; then
			echo "$1 [XFAIL]"
		else
			echo "$1"
		fi
		return 1
	fi
	return 0
}
