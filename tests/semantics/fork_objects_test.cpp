// A fork child that goes on using its parent's verbs objects (which rdma-core leaves undefined)
// gets nothing from them, and does not crash: the fork abandoned the HCA they belong to.
#include <infiniband/verbs.h>

#include <poll.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "support/fresh_process.h"
#include "support/semantics_harness.h"

namespace {

using namespace semantics;

using ForkObjects = VerbsTest;

// It crashed: polling an empty CQ ran progress on the abandoned HCA's endpoint, which is null.
TEST_F(ForkObjects, AChildPollingItsParentsCqFindsNothing) {
  QpOpts o;
  o.use_gid = true;
  Qp* parent = v.NewQp(o);
  ASSERT_NE(parent, nullptr);
  Remote mine = v.RemoteOf(parent);
  ibv_cq* cq = parent->scq;
  ibv_pd* pd = v.pd;
  ForkedPeer child;
  ASSERT_TRUE(child.Start([cq, pd, o, mine](int, int) {
    ibv_wc wc;
    for (int i = 0; i < 100; ++i)
      if (ibv_poll_cq(cq, 1, &wc) != 0) return 1;
    // A QP built on the parent's PD and CQ, brought up towards the parent's QP.
    ibv_qp_init_attr ia{};
    ia.send_cq = cq;
    ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = ia.cap.max_recv_wr = 4;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    ibv_qp* qp = ibv_create_qp(pd, &ia);
    if (qp) {
      ToInit(qp, o);
      ToRtr(qp, o, mine);
      ibv_destroy_qp(qp);
    }
    return 0;
  }));
  int st = child.Wait();
  ASSERT_TRUE(WIFEXITED(st)) << "the child died of signal " << WTERMSIG(st);
  EXPECT_EQ(WEXITSTATUS(st), 0) << "the child found a completion that was never its own";
}

constexpr uint32_t kWriteBytes = 64 * 1024;

// `count` RDMA WRITEs between two QPs of one device, the last one's completion awaited through a
// completion channel, so that the progress thread (not this one) moves the frames; `posted` runs
// once they are all posted. False when they do not complete.
bool WriteThroughTheProgressThread(Qp* a, Buffer* src, Buffer* dst, ibv_comp_channel* ch,
                                   uint64_t id, int count = 1,
                                   const std::function<void()>& posted = {}) {
  if (ibv_req_notify_cq(a->scq, 0)) return false;
  for (int i = 0; i < count; ++i) {
    unsigned flags = i == count - 1 ? IBV_SEND_SIGNALED : 0;
    if (PostRdma(a->qp, IBV_WR_RDMA_WRITE, *src, 0, kWriteBytes, dst->addr(0), dst->mr->rkey, id,
                 flags))
      return false;
  }
  if (posted) posted();
  // The event first, and nothing polled meanwhile: a poll would move the frames itself.
  pollfd pfd{ch->fd, POLLIN, 0};
  if (poll(&pfd, 1, 5000) != 1) return false;
  ibv_cq* cq = nullptr;
  void* ctx = nullptr;
  if (ibv_get_cq_event(ch, &cq, &ctx)) return false;
  ibv_ack_cq_events(cq, 1);
  ibv_wc wc{};
  return ibv_poll_cq(a->scq, 1, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == id;
}

bool ChannelPair(Verbs& v, Qp** a, Buffer** src, Buffer** dst, ibv_comp_channel** ch) {
  *ch = v.NewChannel();
  QpOpts o;
  o.send_cq = *ch ? v.NewCq(64, *ch) : nullptr;
  Qp* b = nullptr;
  *src = v.NewBuffer(kWriteBytes);
  *dst = v.NewBuffer(kWriteBytes);
  return o.send_cq && *src && *dst && v.NewPair(o, QpOpts{}, a, &b);
}

// A child that opens the device and writes through its own progress thread: 0 when it worked.
int ChildWritesThroughItsProgressThread() {
  alarm(10);
  Verbs cv;
  Qp* ca = nullptr;
  Buffer *src = nullptr, *dst = nullptr;
  ibv_comp_channel* ch = nullptr;
  if (!cv.Open() || !ChannelPair(cv, &ca, &src, &dst, &ch)) return 2;
  return WriteThroughTheProgressThread(ca, src, dst, ch, 1) ? 0 : 1;
}

// A fork while the parent's progress thread was busy (allocating) left the allocator's lock held
// in the child wherever the allocator does not guard fork() itself (the sanitizers' do not): the
// child's own progress thread blocked for good, and its messages were never served.
TEST_F(ForkObjects, AForkWhileTheParentsProgressThreadWorksLeavesTheChildAWorkingOne) {
  Qp* a = nullptr;
  Buffer *src = nullptr, *dst = nullptr;
  ibv_comp_channel* ch = nullptr;
  ASSERT_TRUE(ChannelPair(v, &a, &src, &dst, &ch));
  // Each fork happens while the progress thread carries a fresh batch of writes and the thread
  // that posted them stands still (its own allocations are the application's business).
  std::mutex mu;
  std::condition_variable cv;
  bool hold = false, held = false, stop = false;
  std::atomic<bool> traffic_ok{true};
  std::thread traffic([&] {
    auto park = [&] {
      std::unique_lock<std::mutex> lk(mu);
      if (!hold) return;
      held = true;
      cv.notify_all();
      cv.wait(lk, [&] { return !hold; });
      held = false;
    };
    for (uint64_t i = 0; i < 100'000; ++i) {
      {
        std::lock_guard<std::mutex> lk(mu);
        if (stop) return;
      }
      if (!WriteThroughTheProgressThread(a, src, dst, ch, i, 32, park)) {
        traffic_ok = false;
        std::lock_guard<std::mutex> lk(mu);
        held = true;  // never block the forking thread
        cv.notify_all();
        return;
      }
    }
  });
  constexpr int kForks = 40;
  int stuck = 0;
  for (int i = 0; i < kForks; ++i) {
    std::unique_lock<std::mutex> lk(mu);
    hold = true;
    if (!cv.wait_for(lk, std::chrono::seconds(10), [&] { return held; })) break;
    ForkedPeer child;
    bool started = child.Start([](int, int) { return ChildWritesThroughItsProgressThread(); });
    hold = false;
    cv.notify_all();
    lk.unlock();
    ASSERT_TRUE(started);
    int st = child.Wait(std::chrono::seconds(15));
    if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) ++stuck;
  }
  {
    std::lock_guard<std::mutex> lk(mu);
    stop = true;
    hold = false;
  }
  cv.notify_all();
  traffic.join();
  EXPECT_TRUE(traffic_ok);
  EXPECT_EQ(stuck, 0) << "children whose own progress thread never moved a frame, of " << kForks;
}

// A fork while another thread registers (or deregisters) a large buffer, i.e. moves its pages:
// the child got the move's lock held and the pages read-only, and waited for a move nobody would
// finish (its fork handler took that lock). The fork now waits for the move to end.
TEST(ForkDuringAMove, TheChildFindsTheBufferWritableAndItsForkHandlerDone) {
  Verbs v;
  ASSERT_TRUE(v.Open());
  constexpr size_t kLen = 32 << 20;  // a move of ~50 ms here
  void* m = mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                 -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  auto* bytes = static_cast<volatile uint8_t*>(m);
  std::atomic<bool> stop{false};
  std::atomic<int> moves{0};
  std::thread mover([&] {
    while (!stop.load() && moves.load() < 200) {
      ibv_mr* mr = ibv_reg_mr(v.pd, m, kLen, int{IBV_ACCESS_LOCAL_WRITE});
      if (!mr) break;
      ibv_dereg_mr(mr);
      moves += 2;
    }
  });
  constexpr int kForks = 12;
  int stuck = 0;
  for (int i = 0; i < kForks; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(9));
    ForkedPeer child;
    ASSERT_TRUE(child.Start([bytes](int, int) {
      bytes[0] = 1;  // faulted for good while the pages were read-only for the parent's move
      bytes[kLen - 1] = 1;
      return 0;
    }));
    // As long as the other fork tests wait: a stuck child never ends, and a loaded sanitizer run
    // once took longer than 5 s (its fork handler copies the 32 MiB the parent registered).
    int st = child.Wait(std::chrono::seconds(15));
    if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) ++stuck;
  }
  stop = true;
  mover.join();
  EXPECT_GT(moves.load(), 0);
  EXPECT_EQ(stuck, 0) << "children that never finished, of " << kForks;
  munmap(m, kLen);
}

// A process opens the device and forks at once; the child writes through its own progress thread.
TEST(ForkAtStartUp, AChildForkedRightAfterTheDeviceOpensHasAWorkingProgressThread) {
  Verbs v;
  ASSERT_TRUE(v.Open());
  ForkedPeer child;
  ASSERT_TRUE(child.Start([](int, int) { return ChildWritesThroughItsProgressThread(); }));
  int st = child.Wait(std::chrono::seconds(15));
  ASSERT_TRUE(st != -1 && WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0);
}

// The same as the first thing of fresh processes, where the new progress thread may still be
// starting when the fork comes (the sanitizer's runtime allocates then): memory_window_test's
// child hung so.
TEST(ForkAtStartUp, AForkRightAfterTheDeviceOpensLeavesTheChildAWorkingProgressThread) {
  if (kFreshRunsSkipped) GTEST_SKIP() << "see kFreshRunsSkipped";
  constexpr int kRounds = 20;
  EXPECT_EQ(
      FailedFreshRuns("ForkAtStartUp.AChildForkedRightAfterTheDeviceOpensHasAWorkingProgressThread",
                      kRounds, std::chrono::seconds(30)),
      0)
      << "of " << kRounds;
}

// Memory keys are the only check on a remote access: a fork child drew the very keys its parent
// drew next (the generator's state was copied), so an rkey the parent handed out could open the
// child's region. Parent and child now draw from generators seeded apart.
TEST_F(ForkObjects, AChildDrawsOtherMemoryKeysThanItsParent) {
  std::vector<uint8_t> mem(4096);
  ibv_mr* before = ibv_reg_mr(v.pd, mem.data(), mem.size(), kAllAccess);  // seeds the generator
  ASSERT_NE(before, nullptr);
  ForkedPeer child;
  ASSERT_TRUE(child.Start([&mem](int up, int) {
    Verbs cv;
    if (!cv.Open()) return 2;
    uint32_t keys[4];
    for (uint32_t& k : keys) {
      ibv_mr* mr = ibv_reg_mr(cv.pd, mem.data(), mem.size(), kAllAccess);
      if (!mr) return 3;
      k = mr->rkey;
    }
    return WriteAll(up, keys, sizeof keys) ? 0 : 4;
  }));
  uint32_t theirs[4];
  ASSERT_TRUE(child.Recv(&theirs));
  ASSERT_EQ(WEXITSTATUS(child.Wait()), 0);
  int same = 0;
  for (uint32_t k : theirs) {
    ibv_mr* mr = ibv_reg_mr(v.pd, mem.data(), mem.size(), kAllAccess);
    ASSERT_NE(mr, nullptr);
    same += mr->rkey == k;
    EXPECT_EQ(ibv_dereg_mr(mr), 0);
  }
  EXPECT_EQ(same, 0) << "the child's keys repeat the parent's";
  EXPECT_EQ(ibv_dereg_mr(before), 0);
}

}  // namespace
