// A program that destroys an id and its event channel while another of its threads waits in
// rdma_get_cm_event on that channel (rping's CM thread, when the main thread tears down after the
// last ping). With the kernel's descriptors that thread simply keeps waiting; it must never come
// back with an error (rping then exits 255), nor read a freed channel.
#include <rdma/rdma_cma.h>

#include <gtest/gtest.h>

#include "support/cm_harness.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace {

// 0: still waiting; 1: got an event; 2: an error.
struct Waiter {
  std::atomic<bool> started{false};
  std::atomic<int> result{0};
  std::atomic<int> err{0};
};

TEST(CmChannelDestroy, AThreadWaitingOnADestroyedChannelKeepsWaiting) {
  constexpr int kRounds = 40;
  for (int round = 0; round < kRounds; ++round) {
    rdma_event_channel* ch = rdma_create_event_channel();
    ASSERT_NE(ch, nullptr);
    // Leaked with the thread, which may wait for good; kept reachable so that LeakSanitizer does
    // not report the waiters whose thread did finish (it failed the ASan run so, now and then).
    auto* w = new Waiter;
    static auto* waiters = new std::vector<Waiter*>;
    waiters->push_back(w);
    std::thread([ch, w] {
      rdma_cm_event* e = nullptr;
      w->started.store(true);
      if (rdma_get_cm_event(ch, &e) == 0) {
        w->result.store(1);
        rdma_ack_cm_event(e);
      } else {
        w->err.store(errno);
        w->result.store(2);
      }
    }).detach();
    // The thread must be inside rdma_get_cm_event (a call that starts after the channel is gone
    // uses freed memory, with rdma-core too).
    for (int i = 0; i < 5000 && !w->started.load(); ++i)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    rdma_cm_id* id = nullptr;
    ASSERT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
    sockaddr_storage dst = cmtest::Ip("127.0.0.1", 4791);
    // ADDR_RESOLVED is queued at once and wakes the thread; the id and the channel go before it
    // can take the event.
    ASSERT_EQ(rdma_resolve_addr(id, nullptr, cmtest::Sa(&dst), 1000), 0);
    rdma_destroy_id(id);
    rdma_destroy_event_channel(ch);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ASSERT_NE(w->result.load(), 2)
        << "round " << round << ": rdma_get_cm_event failed: " << strerror(w->err.load());
  }
}

}  // namespace
