#!/usr/bin/python3
"""Runs rdma-core's own test suite (pyverbs' tests, shipped by Debian's python3-pyverbs) on one
device and prints one line per test, for pyverbs.sh.

Usage: pyverbs_suite.py SUITE_DIR DEVICE [TEST ...]
  SUITE_DIR  a directory holding the suite as the package `tests` (its files uncompressed)
  TEST       names as unittest takes them (tests.test_mr, tests.test_mr.MRTest...); all if none

Output: "PASS id", "FAIL id (the error's line)", "SKIP id (reason)", and for the expected
failures below "XFAIL id (reason)" or, passing, "XPASS id"; then "N passed, M failed, K skipped"
(expected failures count as skipped). Exits 0 iff nothing failed unexpectedly.
"""
import importlib.machinery
import os
import sys
import unittest

# Tests whose expectation softrdma does not meet on purpose, each with its reason.
EXPECTED_FAILURES = {
    "tests.test_addr.AHTest.test_create_ah_roce":
        "the Ethernet port takes AHs without a GRH: its LID names a process on the host, so the "
        "pingpongs and qperf run without -g (docs/compatibility.md)",
}


def error_line(text):
    """The exception's own line: the last of its traceback."""
    lines = [l for l in text.strip().splitlines() if l.strip()]
    return lines[-1].strip() if lines else "?"


class LineResult(unittest.TestResult):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.counts = {"passed": 0, "failed": 0, "skipped": 0}

    def _say(self, verdict, test, why=None):
        print(f"{verdict} {test.id()}" + (f" ({why})" if why else ""), flush=True)

    def addSuccess(self, test):
        super().addSuccess(test)
        # A listed test that passes counts as passed, as in lib.sh: a hint that its entry may go.
        self._say("XPASS" if test.id() in EXPECTED_FAILURES else "PASS", test)
        self.counts["passed"] += 1

    def _bad(self, test, err):
        why = error_line(self._exc_info_to_string(err, test))
        if test.id() in EXPECTED_FAILURES:
            self._say("XFAIL", test, EXPECTED_FAILURES[test.id()])
            self.counts["skipped"] += 1
        else:
            self._say("FAIL", test, why)
            self.counts["failed"] += 1

    def addError(self, test, err):
        super().addError(test, err)
        self._bad(test, err)

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._bad(test, err)

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._say("SKIP", test, reason)
        self.counts["skipped"] += 1

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            self._bad(subtest, err)


def main():
    suite_dir, device, names = sys.argv[1], sys.argv[2], sys.argv[3:]
    # The package `tests` lives in suite_dir; its own modules import args_parser from beside it.
    sys.path[:0] = [suite_dir, os.path.join(suite_dir, "tests")]
    # The suite reads its device from its own argument parser, as its run_tests.py does.
    sys.argv = [sys.argv[0], "--dev", device]
    from args_parser import parser  # noqa: E402 (the suite's module)
    parser.parse_args()
    init = os.path.join(suite_dir, "tests", "__init__.py")
    tests = importlib.machinery.SourceFileLoader("tests", init).load_module()
    loader = unittest.TestLoader()
    suite = (loader.loadTestsFromNames(names) if names else loader.loadTestsFromModule(tests))
    result = LineResult()
    suite.run(result)
    c = result.counts
    print(f"{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped", flush=True)
    return 0 if c["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
