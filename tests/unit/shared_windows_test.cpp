// The direct-access table as a peer sees it: a window is reached through an endpoint that grants
// the right, and a withdrawal waits until no peer can still write into the window, including a
// sender that took a WQE of a receive queue (whose SENDs' pieces are not counted per window).
#include "link/shared_windows.h"

#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "link/shared_memory.h"

namespace softrdma::link {
namespace {

constexpr size_t kLen = 64 * 1024;
// Far from what this process's QPs and MRs use (endpoint ids are QP numbers, low index first).
constexpr uint32_t kEndpoint = kEndpointSlots - 1;
constexpr uint32_t kKey = 0x5eed0001;
constexpr uint32_t kDomain = 77;

struct Fixture {
  Fixture() {
    void* m = mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    base = static_cast<uint8_t*>(m);
    shared = SharedMemory::Get().Share(base, kLen);
    SharedWindows& w = SharedWindows::Get();
    w.Publish(kKey, kDomain, reinterpret_cast<uintptr_t>(base), base, kLen, kRecvRight);
    w.SetEndpoint(kEndpoint, kDomain, kRecvRight);
    own_queue = w.ClaimRecvQueue(kEndpoint);
    // This process's own table and arena, mapped as a peer maps them.
    peer = PeerWindows::Map(dup(w.fd()), dup(SharedMemory::Get().ArenaFd()));
  }
  ~Fixture() {
    SharedWindows& w = SharedWindows::Get();
    w.SetEndpoint(kEndpoint, kDomain, 0);
    w.ReleaseRecvQueue(own_queue);
    w.Withdraw(kKey);
    delete peer;
    SharedMemory::Get().Unshare(shared, base);
    munmap(base, kLen);
  }
  // The owner publishes WQE 0; the peer opens the queue, reading its `taken` into *taken.
  DirectRecvQueue* OpenWithOneWqe(uint64_t* taken) {
    if (!own_queue || !peer) return nullptr;
    own_queue->slots[0].state.store(direct_recv::State(direct_recv::kPosted, 0));
    return peer->OpenRecvQueue(kEndpoint, taken);
  }
  uint8_t* base;
  uint64_t shared;
  DirectRecvQueue* own_queue;
  PeerWindows* peer;
};

namespace dr = direct_recv;

// A sender that took a WQE (compare-and-swap of `taken` from what it read before its checks) may
// write into the windows its checks passed until it marks the slot done: a withdrawal waits.
TEST(SharedWindows, AWithdrawalWaitsForASenderThatTookAWqe) {
  Fixture f;
  const uint64_t addr = reinterpret_cast<uintptr_t>(f.base) + 4096;
  uint64_t taken = 0;
  DirectRecvQueue* q = f.OpenWithOneWqe(&taken);
  ASSERT_NE(q, nullptr);
  ASSERT_EQ(dr::TakenCount(taken), 0u);
  uint8_t* p = f.peer->Reach(kKey, kEndpoint, addr, 64, kRecvRight);
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(q->taken.compare_exchange_strong(taken, dr::WithCount(taken, 1)));

  using Clock = std::chrono::steady_clock;
  constexpr auto kInside = std::chrono::milliseconds(60);
  Clock::duration took{};
  std::thread dereg([&] {
    auto t0 = Clock::now();
    SharedWindows::Get().Withdraw(kKey);
    took = Clock::now() - t0;
  });
  std::this_thread::sleep_for(kInside);
  p[0] = 1;  // the sender's write, before it marks the slot done: the region must still be there
  q->slots[0].state.store(dr::State(dr::kDone, 0));
  dereg.join();
  EXPECT_GE(took, kInside - std::chrono::milliseconds(10))
      << "the withdrawal returned while a sender could still write into the window";
  EXPECT_EQ(f.peer->Reach(kKey, kEndpoint, addr, 64, kRecvRight), nullptr);
}

// A sender that passed its checks but had not taken a WQE when the window was withdrawn cannot take
// one from what it read: its compare-and-swap fails, and its checks, made again, refuse.
TEST(SharedWindows, AWithdrawalFailsTheTakeOfASenderThatCheckedBeforeIt) {
  Fixture f;
  const uint64_t addr = reinterpret_cast<uintptr_t>(f.base);
  uint64_t taken = 0;
  DirectRecvQueue* q = f.OpenWithOneWqe(&taken);
  ASSERT_NE(q, nullptr);
  ASSERT_NE(f.peer->Reach(kKey, kEndpoint, addr, 64, kRecvRight), nullptr);
  SharedWindows::Get().Withdraw(kKey);  // nothing taken: it does not wait
  uint64_t expected = taken;
  EXPECT_FALSE(q->taken.compare_exchange_strong(expected, dr::WithCount(taken, 1)))
      << "a sender took a WQE with checks made before the withdrawal";
  EXPECT_EQ(dr::TakenCount(q->taken.load()), 0u);
  EXPECT_EQ(f.peer->Reach(kKey, kEndpoint, addr, 64, kRecvRight), nullptr);
}

// Closing the endpoint (its kRecvRight revoked, then the queue sealed) fails the take of a sender
// that opened the queue before; one that opens it after is refused.
TEST(SharedWindows, ASealedQueueRefusesTheTakeOfASenderThatOpenedItBefore) {
  Fixture f;
  uint64_t taken = 0;
  DirectRecvQueue* q = f.OpenWithOneWqe(&taken);
  ASSERT_NE(q, nullptr);
  SharedWindows::Get().SetEndpoint(kEndpoint, kDomain, 0);
  SharedWindows::SealRecvQueue(f.own_queue);
  uint64_t expected = taken;
  EXPECT_FALSE(q->taken.compare_exchange_strong(expected, dr::WithCount(taken, 1)));
  uint64_t again = 0;
  EXPECT_EQ(f.peer->OpenRecvQueue(kEndpoint, &again), nullptr);
}

TEST(SharedWindows, APieceIsReachedOnlyThroughAnEndpointGrantingTheRightAndInsideTheWindow) {
  Fixture f;
  ASSERT_NE(f.peer, nullptr);
  const uint64_t addr = reinterpret_cast<uintptr_t>(f.base);
  EXPECT_NE(f.peer->Reach(kKey, kEndpoint, addr, kLen, kRecvRight), nullptr);
  EXPECT_EQ(f.peer->Reach(kKey, kEndpoint, addr, kLen + 1, kRecvRight), nullptr);
  EXPECT_EQ(f.peer->Reach(kKey, kEndpoint, addr + kLen - 8, 16, kRecvRight), nullptr);
  EXPECT_EQ(f.peer->Reach(kKey + 1, kEndpoint, addr, 8, kRecvRight), nullptr);
  EXPECT_EQ(f.peer->Reach(kKey, kEndpoint - 1, addr, 8, kRecvRight), nullptr);
  EXPECT_EQ(f.peer->Reach(kKey, kEndpoint, addr, 8, kRecvRight | 1), nullptr);
  SharedWindows::Get().SetEndpoint(kEndpoint, kDomain + 1, kRecvRight);  // another domain
  EXPECT_EQ(f.peer->Reach(kKey, kEndpoint, addr, 8, kRecvRight), nullptr);
}

}  // namespace
}  // namespace softrdma::link
