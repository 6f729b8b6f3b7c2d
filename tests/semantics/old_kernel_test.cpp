// Kernels before 5.11 have no epoll_pwait2 (ENOSYS), and container seccomp profiles older than the
// call refuse it (EPERM): many CI runners and container hosts are such. The library must work
// there as well, and where a profile refuses membarrier. Each test here runs tests of this binary
// in fresh processes where the call fails so, through a seccomp filter that the test's forked
// peers inherit too.
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstddef>

#include "support/fresh_process.h"

namespace {

using semantics::FailedFreshRuns;
using semantics::kFreshRunsSkipped;

// Makes system call `Nr` fail with `Errno` in this process and all it starts.
template <long Nr, int Errno>
bool Refuse() {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, Nr, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | Errno),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog program{static_cast<unsigned short>(sizeof filter / sizeof filter[0]), filter};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) == 0;
}

constexpr auto kBound = std::chrono::seconds(30);

// The failed wait read as "nothing happened": the progress thread spun a core, and records that
// only its wake-up would serve waited (ib_write_lat: t_avg 1,084 us instead of 0.4, t_max 0.5 s).
TEST(OldKernel, AProcessBlockedOnACompletionChannelUsesNoCpu) {
  if (kFreshRunsSkipped) GTEST_SKIP() << "see kFreshRunsSkipped";
  const char* test = "ShmLink.AProcessBlockedOnACompletionChannelUsesNoCpu";
  EXPECT_EQ(FailedFreshRuns(test, 1, kBound, {}, Refuse<SYS_epoll_pwait2, ENOSYS>), 0);
  EXPECT_EQ(FailedFreshRuns(test, 1, kBound, {}, Refuse<SYS_epoll_pwait2, EPERM>), 0);
}

// ib_write_lat's pattern: an application spinning on memory, a WRITE that lands in it.
TEST(OldKernel, AWriteLandsForAnApplicationSpinningOnMemory) {
  if (kFreshRunsSkipped) GTEST_SKIP() << "see kFreshRunsSkipped";
  const char* test = "SocketLease.AWriteLandsForAPollerThatTurnedToSpinningOnMemory";
  EXPECT_EQ(FailedFreshRuns(test, 1, kBound, {}, Refuse<SYS_epoll_pwait2, ENOSYS>), 0);
  EXPECT_EQ(
      FailedFreshRuns(test, 1, kBound, {"SOFTRDMA_LINK=tcp"}, Refuse<SYS_epoll_pwait2, ENOSYS>), 0);
}

// A seccomp profile that refuses the call with EPERM, as Docker's did before it knew it.
TEST(OldKernel, ABlockedProcessIsWokenByTheNextMessageWhereTheCallIsRefused) {
  if (kFreshRunsSkipped) GTEST_SKIP() << "see kFreshRunsSkipped";
  EXPECT_EQ(FailedFreshRuns("ShmLink.AProcessThatPolledAndThenBlocksIsWokenByTheNextMessage", 1,
                            kBound, {}, Refuse<SYS_epoll_pwait2, EPERM>),
            0);
}

// A profile that refuses membarrier (EPERM): QPs' and CQs' locks are never biased
// (link/biased_mutex.h), and same-host SENDs, the withdrawals that wait for their senders and WQEs
// taken back for frames work as anywhere else.
TEST(OldKernel, DirectSendsWorkWhereMembarrierIsRefused) {
  if (kFreshRunsSkipped) GTEST_SKIP() << "see kFreshRunsSkipped";
  EXPECT_EQ(
      FailedFreshRuns("DirectSend.DirectAndFramedSendsCompleteInReceiveQueueOrder:"
                      "DirectSend.AWqeTheResponderTookBackHoldsUpNoWithdrawal:"
                      "DirectSend.ABufferDeregisteredAfterAMessageWentIntoItIsNeverWrittenBy*:"
                      "DirectSend.AStreamThatOutrunsThePublishedWqesArrivesWholeAndInOrder",
                      1, kBound, {}, Refuse<SYS_membarrier, EPERM>),
      0);
}

}  // namespace
