// The lock of queue pairs and CQs (link/biased_mutex.h): biased to the thread that takes it over
// and over, revoked by any other. Its exclusion is invisible to ThreadSanitizer (that build uses
// std::mutex); where the kernel has no expedited membarrier it is never biased, and the tests of
// the bias skip.
#include "link/biased_mutex.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace {

using softrdma::link::BiasedMutex;
using softrdma::link::BiasSupported;

bool CanBias() {
  return !softrdma::kThreadSanitizer && BiasSupported();
}

void TakeTimes(BiasedMutex& m, uint32_t n) {
  for (uint32_t i = 0; i < n; ++i) {
    m.lock();
    m.unlock();
  }
}

// Whether another thread's try_lock succeeds now (it releases at once).
bool TryFromAnotherThread(BiasedMutex& m) {
  bool got = false;
  std::thread([&] {
    got = m.try_lock();
    if (got) m.unlock();
  }).join();
  return got;
}

// Adds one to a plain counter, reading it and writing it back a little later: under a lock that
// lets two threads in, updates get lost.
void AddOne(volatile uint64_t& counter) {
  uint64_t v = counter;
  for (int k = 0; k < 8; ++k) asm volatile("" ::: "memory");
  counter = v + 1;
}

// Registering for membarrier takes the kernel ~10 ms (12 here): the lock never does it itself, on
// the application's call that happens to take it the kBiasAfter-th time (the first QPs' connect
// took 10 ms longer, 1,000 QPs 14 -> 24 ms). Until the background registration is done, nothing is
// biased. (ctest runs each test in a process of its own; run with others, this one may find the
// registration done already.)
TEST(BiasedMutex, NotBiasedBeforeTheBackgroundRegistrationWhichItNeverWaitsFor) {
  if (softrdma::kThreadSanitizer) GTEST_SKIP() << "never biased under ThreadSanitizer";
  if (softrdma::link::BiasReady()) GTEST_SKIP() << "registered by an earlier test of this process";
  BiasedMutex m;
  TakeTimes(m, 2 * BiasedMutex::kBiasAfter);
  EXPECT_FALSE(m.BiasedToCaller());
  EXPECT_FALSE(softrdma::link::BiasReady()) << "taking the lock registered";
  softrdma::link::PrepareBiasInBackground();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!softrdma::link::BiasReady() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!softrdma::link::BiasReady()) GTEST_SKIP() << "no expedited membarrier here";
  TakeTimes(m, BiasedMutex::kBiasAfter);
  EXPECT_TRUE(m.BiasedToCaller());
}

TEST(BiasedMutex, BiasedToTheThreadThatTakesItOverAndOver) {
  if (!CanBias()) GTEST_SKIP() << "no expedited membarrier here: never biased";
  BiasedMutex m;
  TakeTimes(m, BiasedMutex::kBiasAfter - 1);
  EXPECT_FALSE(m.BiasedToCaller());
  TakeTimes(m, 1);
  EXPECT_TRUE(m.BiasedToCaller());
  EXPECT_EQ(m.biases_given(), 1u);
  // Held through the bias, it is still held for this thread's try_lock (not recursive).
  m.lock();
  EXPECT_FALSE(m.try_lock()) << "try_lock succeeded on a lock its caller holds";
  m.unlock();
}

// Another thread's try_lock while the owner is inside through its bias fails, and revokes the bias;
// once the owner leaves, it succeeds, and the owner no longer holds the bias.
TEST(BiasedMutex, AnotherThreadsTryLockFailsWhileTheOwnerIsInsideAndRevokes) {
  if (!CanBias()) GTEST_SKIP() << "no expedited membarrier here: never biased";
  BiasedMutex m;
  TakeTimes(m, BiasedMutex::kBiasAfter);
  ASSERT_TRUE(m.BiasedToCaller());
  m.lock();
  EXPECT_FALSE(TryFromAnotherThread(m)) << "two threads held the lock";
  EXPECT_FALSE(m.BiasedToCaller()) << "the bias outlived another thread's attempt";
  m.unlock();
  EXPECT_TRUE(TryFromAnotherThread(m));
}

// A thread that blocks in lock() while the owner is inside through its bias gets the lock when the
// owner leaves, not before.
TEST(BiasedMutex, AnotherThreadsLockWaitsForTheOwnerToLeave) {
  if (!CanBias()) GTEST_SKIP() << "no expedited membarrier here: never biased";
  BiasedMutex m;
  TakeTimes(m, BiasedMutex::kBiasAfter);
  ASSERT_TRUE(m.BiasedToCaller());
  m.lock();
  std::atomic<bool> got{false};
  std::thread other([&] {
    m.lock();
    got.store(true);
    m.unlock();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(got.load()) << "the other thread took a lock held through its bias";
  m.unlock();
  other.join();
  EXPECT_TRUE(got.load());
}

// Each thread that takes the lock over and over gets the bias from the one before, kEpochs times;
// then it stays a plain lock.
TEST(BiasedMutex, BiasedAtMostKEpochsTimesThenPlain) {
  if (!CanBias()) GTEST_SKIP() << "no expedited membarrier here: never biased";
  BiasedMutex m;
  // All alive until the end, taking turns: a thread that has exited leaves its thread pointer to
  // the next one created, which the lock then takes for the same thread.
  constexpr uint32_t kThreads = BiasedMutex::kEpochs + 2;
  std::atomic<uint32_t> turn{0};
  bool biased[kThreads] = {};
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      while (turn.load() != t) std::this_thread::yield();
      TakeTimes(m, BiasedMutex::StreakFor(t));
      biased[t] = m.BiasedToCaller();
      turn.store(t + 1);
      while (turn.load() != kThreads) std::this_thread::yield();
    });
  for (auto& t : threads) t.join();
  for (uint32_t t = 0; t < kThreads; ++t)
    EXPECT_EQ(biased[t], t < BiasedMutex::kEpochs) << "thread " << t;
  EXPECT_EQ(m.biases_given(), BiasedMutex::kEpochs);
  EXPECT_TRUE(TryFromAnotherThread(m));
}

// In a fork() child, the lock biased to a thread of the parent (which the child does not have) is
// taken by the child's thread: the revocation's barrier works there too.
TEST(BiasedMutex, AForkChildTakesALockBiasedToAThreadOfItsParent) {
  if (!CanBias()) GTEST_SKIP() << "no expedited membarrier here: never biased";
  BiasedMutex m;
  std::atomic<bool> done{false}, biased{false};
  std::thread owner([&] {
    TakeTimes(m, BiasedMutex::kBiasAfter);
    biased.store(m.BiasedToCaller());
    while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  while (!biased.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const pid_t child = fork();
  if (child == 0) {
    m.lock();
    m.unlock();
    _exit(m.try_lock() ? 0 : 1);
  }
  done.store(true);
  owner.join();
  ASSERT_GT(child, 0);
  int status = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  pid_t r = 0;
  while ((r = waitpid(child, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (r == 0) {
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
    FAIL() << "the child hung taking the lock";
  }
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// Threads taking turns in long runs each get the bias and lose it to the next: at most kEpochs
// biases, and never two threads inside (a plain counter read and written back later by each: a
// lost update means two were inside).
TEST(BiasedMutex, OneThreadAtATimeAcrossBiasesAndRevocations) {
  if (softrdma::kThreadSanitizer) GTEST_SKIP() << "ThreadSanitizer does not see this exclusion";
  BiasedMutex m;
  volatile uint64_t counter = 0;  // not atomic: the lock is what keeps it whole
  constexpr int kThreads = 3, kRuns = 40, kRunLength = 3 * BiasedMutex::kBiasAfter;
  std::atomic<int> turn{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      while (!go.load()) {
      }
      for (int run = 0; run < kRuns; ++run) {
        // Runs of one thread at a time (bias), with the others hammering between runs.
        const bool mine = (run + t) % kThreads == 0;
        for (int i = 0; i < (mine ? kRunLength : kRunLength / 8); ++i) {
          std::lock_guard g(m);
          AddOne(counter);
        }
        turn.fetch_add(1);
      }
    });
  go.store(true);
  for (auto& t : threads) t.join();
  uint64_t expected = 0;
  for (int t = 0; t < kThreads; ++t)
    for (int run = 0; run < kRuns; ++run)
      expected += (run + t) % kThreads == 0 ? kRunLength : kRunLength / 8;
  EXPECT_EQ(counter, expected);
  EXPECT_LE(m.biases_given(), BiasedMutex::kEpochs);
}

// The owner and another thread alternating at once: the owner's fast path and the other's
// revocation race on every round; counted as above.
TEST(BiasedMutex, OwnerAndRevokerRacingKeepTheCountWhole) {
  if (softrdma::kThreadSanitizer) GTEST_SKIP() << "ThreadSanitizer does not see this exclusion";
  BiasedMutex m;
  volatile uint64_t counter = 0;
  TakeTimes(m, BiasedMutex::kBiasAfter);
  constexpr int kRounds = 20000;
  std::atomic<bool> go{false};
  std::atomic<uint64_t> tried_ok{0};
  std::thread other([&] {
    while (!go.load()) {
    }
    for (int i = 0; i < kRounds; ++i) {
      if (!m.try_lock()) continue;
      AddOne(counter);
      m.unlock();
      tried_ok.fetch_add(1);
    }
  });
  go.store(true);
  for (int i = 0; i < kRounds; ++i) {
    std::lock_guard g(m);
    AddOne(counter);
  }
  other.join();
  EXPECT_EQ(counter, kRounds + tried_ok.load());
}

}  // namespace
