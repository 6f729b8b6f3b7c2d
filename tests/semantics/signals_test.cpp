// The library's threads take none of the program's signals: rdma-core starts no thread, so a
// process-directed signal must reach a thread of the program's, or stay pending until one takes
// it. Run in fresh processes (below): the suite's own process may have threads of other tests'.
#include <infiniband/verbs.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>

#include "support/fresh_process.h"
#include "support/semantics_harness.h"

namespace {

using namespace semantics;

class Signals : public VerbsTest {};

// The device is open, so the progress thread runs; it started while this thread still took
// SIGUSR1. The program then blocks SIGUSR1 where it runs and waits for it with sigtimedwait, the
// sigwait() pattern: the signal must stay pending for it. A library thread that took it died of it
// (SIGUSR1's default action), and the process with it.
TEST_F(Signals, AProcessDirectedSignalWaitsForTheProgramsThread) {
  if (!getenv("SOFTRDMA_TEST_FRESH")) GTEST_SKIP() << "runs in a fresh process (SignalsFresh.*)";
  Qp* q = v.NewQp(QpOpts{});
  ASSERT_NE(q, nullptr);
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &usr1, nullptr), 0);
  ASSERT_EQ(kill(getpid(), SIGUSR1), 0);
  timespec wait{5, 0};
  EXPECT_EQ(sigtimedwait(&usr1, nullptr, &wait), SIGUSR1);
}

TEST(SignalsFresh, AProcessDirectedSignalWaitsForTheProgramsThread) {
  if (kFreshRunsSkipped) GTEST_SKIP() << "see kFreshRunsSkipped";
  EXPECT_EQ(FailedFreshRuns("Signals.AProcessDirectedSignalWaitsForTheProgramsThread", 3,
                            std::chrono::seconds(30), {"SOFTRDMA_TEST_FRESH=1"}),
            0);
}

}  // namespace
