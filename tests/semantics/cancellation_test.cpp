// The data-path verbs are not cancellation points (pthreads(7)): on a NIC, ibv_post_send and
// ibv_poll_cq make no system call, so a thread's pending cancellation acts only at the
// application's own cancellation points. Ours reach the link's system calls (send, recv,
// epoll_wait, ...), whose glibc wrappers are cancellation points: a thread cancelled inside one
// died with the endpoint's progress mutex locked, and no thread of the process made progress
// again. The tests run on the link that reaches the child, and in fresh processes on the TCP
// link (the one whose empty polls make system calls).
#include <infiniband/verbs.h>
#include <pthread.h>

#include <gtest/gtest.h>

#include "link/plain_syscall.h"
#include "support/fresh_process.h"
#include "support/semantics_harness.h"

#include <atomic>
#include <thread>

namespace {

using namespace semantics;

struct Window {
  uint64_t addr;
  uint32_t rkey;
};

// A child's side: a connected QP and a 64-byte window it offers the parent, until 'x'.
int Target(ChildPipe p, QpOpts o) {
  ChildQp c;
  if (int e = c.Connect(p, o, 64)) return e;
  if (!p.Send(Window{c.b->addr(), c.b->rkey()})) return 14;
  char done;
  p.Recv(&done);
  return 0;
}

// Polls `cq` for one completion without calling anything that is a cancellation point (the
// harness's PollOne may sleep).
bool SpinForCompletion(ibv_cq* cq, ibv_wc* wc) {
  const auto until = Clock::now() + std::chrono::seconds(5);
  while (Clock::now() < until) {
    int n = ibv_poll_cq(cq, 1, wc);
    if (n != 0) return n == 1;
  }
  return false;
}

struct Work {
  Qp* q = nullptr;
  Buffer* b = nullptr;
  Window w{};
  std::atomic<int> writes{0};       // WRITEs posted and completed successfully
  std::atomic<bool> inside{false};  // in ibv_poll_cq now
};

constexpr int kWrites = 50;

// Posts kWrites WRITEs, each waited for, with a cancellation pending from the start: it must act
// at the pthread_testcancel that follows, not inside a verb.
void* WriterWithCancelPending(void* arg) {
  auto* w = static_cast<Work*>(arg);
  int old;
  pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old);
  pthread_cancel(pthread_self());
  pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, &old);
  for (int i = 0; i < kWrites; ++i) {
    if (PostRdma(w->q->qp, IBV_WR_RDMA_WRITE, *w->b, 0, 8, w->w.addr, w->w.rkey, i)) break;
    ibv_wc wc;
    if (!SpinForCompletion(w->q->scq, &wc) || wc.status != IBV_WC_SUCCESS) break;
    w->writes.fetch_add(1);
  }
  pthread_testcancel();
  return nullptr;
}

// Polls an empty CQ until cancelled, at its own cancellation point between polls.
void* Poller(void* arg) {
  auto* w = static_cast<Work*>(arg);
  for (;;) {
    w->inside.store(true);
    ibv_wc wc;
    ibv_poll_cq(w->q->scq, 1, &wc);
    w->inside.store(false);
    pthread_testcancel();
  }
  return nullptr;
}

class Cancellation : public VerbsTest {
 protected:
  void SetUp() override {
    if (!softrdma::sys::kPlain)
      GTEST_SKIP() << "this build keeps the C library's cancellable wrappers (ThreadSanitizer)";
    VerbsTest::SetUp();
  }

  // A QP connected to a Target child, and the child's window.
  bool Connect(ForkedPeer& child, Work* w) {
    w->q = v.NewQp(QpOpts{});
    w->b = Buf(64);
    if (!w->q || !w->b) return false;
    if (!child.Start([](int up, int down) { return Target(ChildPipe{up, down}, {}); }))
      return false;
    Remote theirs;
    if (!child.Recv(&theirs) || !child.Send(v.RemoteOf(w->q))) return false;
    if (BringUp(w->q->qp, QpOpts{}, theirs) != 0) return false;
    return child.Recv(&w->w);
  }
};

TEST_F(Cancellation, APendingCancelActsAfterPostsAndPollsNotInsideThem) {
  ForkedPeer child;
  Work w;
  ASSERT_TRUE(Connect(child, &w));
  pthread_t t;
  ASSERT_EQ(pthread_create(&t, nullptr, WriterWithCancelPending, &w), 0);
  void* ret = nullptr;
  ASSERT_EQ(pthread_join(t, &ret), 0);
  EXPECT_EQ(ret, PTHREAD_CANCELED);
  EXPECT_EQ(w.writes.load(), kWrites) << "the thread was cancelled inside a verb";
  EXPECT_TRUE(child.Send('x'));
  EXPECT_EQ(child.Wait(), 0);
}

TEST_F(Cancellation, AThreadCancelledWhilePollingLeavesTheOthersMakingProgress) {
  ForkedPeer child;
  Work w;
  ASSERT_TRUE(Connect(child, &w));
  pthread_t t;
  ASSERT_EQ(pthread_create(&t, nullptr, Poller, &w), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_EQ(pthread_cancel(t), 0);
  void* ret = nullptr;
  ASSERT_EQ(pthread_join(t, &ret), 0);
  EXPECT_EQ(ret, PTHREAD_CANCELED);
  EXPECT_FALSE(w.inside.load()) << "the poller was cancelled inside ibv_poll_cq";
  // This thread's WRITE needs the progress the cancelled one may have left locked.
  ASSERT_EQ(PostRdma(w.q->qp, IBV_WR_RDMA_WRITE, *w.b, 0, 8, w.w.addr, w.w.rkey, 7), 0);
  ibv_wc wc;
  ASSERT_TRUE(SpinForCompletion(w.q->scq, &wc)) << "no progress after the cancellation";
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_TRUE(child.Send('x'));
  EXPECT_EQ(child.Wait(), 0);
}

TEST(CancellationOnTcp, APendingCancelActsAfterPostsAndPollsNotInsideThem) {
  if (kFreshRunsSkipped) GTEST_SKIP() << "see kFreshRunsSkipped";
  EXPECT_EQ(FailedFreshRuns("Cancellation.APendingCancelActsAfterPostsAndPollsNotInsideThem", 2,
                            std::chrono::seconds(30), {"SOFTRDMA_LINK=tcp"}),
            0);
}

TEST(CancellationOnTcp, AThreadCancelledWhilePollingLeavesTheOthersMakingProgress) {
  if (kFreshRunsSkipped) GTEST_SKIP() << "see kFreshRunsSkipped";
  EXPECT_EQ(
      FailedFreshRuns("Cancellation.AThreadCancelledWhilePollingLeavesTheOthersMakingProgress", 2,
                      std::chrono::seconds(30), {"SOFTRDMA_LINK=tcp"}),
      0);
}

}  // namespace
