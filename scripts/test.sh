#!/usr/bin/env bash
# The whole test suite: a release build with every test (unit, semantics, Debian tools on one host
# and across network namespaces), an ASan+UBSan build of the suites with bounded fuzzing, and a
# ThreadSanitizer build of the suites.
# Ends with one line "N passed, M failed" summing both runs.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
jobs=$(nproc)
passed=0
failed=0

run_ctest() {  # name build-dir [ctest args...]
  local name=$1 dir=$2
  shift 2
  echo "=== ctest: $name"
  local log="$dir/ctest-$name.log"
  # One test per CPU: most tests wait on their forked peers more than they compute (the
  # ThreadSanitizer run took 8 minutes one at a time). The integration cases run alone (RUN_SERIAL).
  ctest --test-dir "$dir" --output-on-failure -j"$jobs" "$@" 2>&1 | tee "$log"
  # "100% tests passed, 0 tests failed out of 42"
  local line total bad
  line=$(grep -E 'tests passed, [0-9]+ tests failed out of [0-9]+' "$log" | tail -1)
  if [ -z "$line" ]; then
    failed=$((failed + 1))
    echo "ctest $name produced no summary"
    return
  fi
  bad=$(sed -E 's/.*tests passed, ([0-9]+) tests failed out of ([0-9]+).*/\1/' <<<"$line")
  total=$(sed -E 's/.*tests passed, ([0-9]+) tests failed out of ([0-9]+).*/\2/' <<<"$line")
  passed=$((passed + total - bad))
  failed=$((failed + bad))
}

build() {  # dir cmake-args...
  local dir=$1
  shift
  cmake -B "$dir" "$@" >/dev/null && cmake --build "$dir" -j"$jobs" 2>&1 | tail -3
}

echo "=== clang-format"
if bash .ci/format-check.sh; then passed=$((passed + 1)); else failed=$((failed + 1)); fi

if build build -DCMAKE_BUILD_TYPE=RelWithDebInfo; then
  run_ctest release build
else
  echo "release build failed"
  failed=$((failed + 1))
fi

# clang: the frame-decoder fuzzer (libFuzzer) is built and run, bounded in time, in this build.
if build build-asan -DCMAKE_BUILD_TYPE=Debug -DSOFTRDMA_SANITIZE=ON -DSOFTRDMA_FUZZ=ON \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++; then
  # The sanitizer run covers our own suites; the Debian tools are uninstrumented programs.
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    run_ctest asan build-asan -LE integration
else
  echo "sanitizer build failed"
  failed=$((failed + 1))
fi

# ThreadSanitizer over the concurrent core (progress thread vs. application threads). Forked
# peers start threads after fork(), which TSan refuses unless told to carry on.
if build build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSOFTRDMA_TSAN=ON; then
  TSAN_OPTIONS=halt_on_error=1:die_after_fork=0 run_ctest tsan build-tsan -LE 'integration|fuzz'
else
  echo "tsan build failed"
  failed=$((failed + 1))
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
