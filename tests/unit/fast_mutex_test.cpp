// The lock of queue pairs and CQs (link/fast_mutex.h). Its exclusion is invisible to
// ThreadSanitizer: the tests of contention skip there (that build uses std::mutex instead).
#include "link/fast_mutex.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

namespace {

using softrdma::link::FutexMutex;

// The build uses std::mutex for FastMutex under ThreadSanitizer (link/fast_mutex.h).
constexpr bool kUnderTsan = softrdma::kThreadSanitizer;

TEST(FutexMutex, TryLockFailsWhileHeldAndSucceedsAfter) {
  FutexMutex m;
  ASSERT_TRUE(m.try_lock());
  EXPECT_FALSE(m.try_lock());
  m.unlock();
  EXPECT_TRUE(m.try_lock());
  m.unlock();
}

// Four threads add to one plain counter under the lock, reading it and writing it back a little
// later: a lost update means two were inside.
TEST(FutexMutex, OneThreadAtATimeUnderContention) {
  if (kUnderTsan) GTEST_SKIP() << "ThreadSanitizer does not see a futex's exclusion";
  FutexMutex m;
  volatile uint64_t counter = 0;  // not atomic: the lock is what keeps it whole
  std::atomic<bool> go{false};
  constexpr int kThreads = 4, kRounds = 200000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&] {
      while (!go.load()) {
      }
      for (int i = 0; i < kRounds; ++i) {
        std::lock_guard g(m);
        uint64_t v = counter;
        for (int k = 0; k < 16; ++k) asm volatile("" ::: "memory");
        counter = v + 1;
      }
    });
  go.store(true);
  for (auto& t : threads) t.join();
  EXPECT_EQ(counter, uint64_t{kThreads} * kRounds);
}

// A thread asleep in lock() is woken by unlock(), not left waiting. (A waiter that is never woken
// is left behind, detached, with the state it holds.)
TEST(FutexMutex, AWaiterIsWokenByTheUnlock) {
  if (kUnderTsan) GTEST_SKIP() << "ThreadSanitizer does not see a futex's exclusion";
  struct State {
    FutexMutex m;
    std::atomic<bool> got{false};
  };
  auto s = std::make_shared<State>();
  s->m.lock();
  std::thread waiter([s] {
    s->m.lock();
    s->got.store(true);
    s->m.unlock();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // long enough to fall asleep
  EXPECT_FALSE(s->got.load()) << "the waiter took a held lock";
  s->m.unlock();
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!s->got.load() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_TRUE(s->got.load()) << "the waiter was not woken";
  if (s->got.load())
    waiter.join();
  else
    waiter.detach();
}

}  // namespace
