// The lock of a queue pair and of a CQ, which one application thread takes over and over (its
// polls, posts and reposts): after kBiasAfter acquisitions in a row by one thread (more after each
// revocation: StreakFor), the lock is biased to it, and that thread then takes and releases it with
// plain stores — no locked instruction. ib_send_lat crosses four such locks per message one way;
// their eight locked instructions were a third of the time our code added to a cache line's
// crossing.
//
// Another thread that wants the lock revokes the bias: it takes the inner FutexMutex, clears the
// bias, has every thread of the process pass a full barrier (membarrier(2), expedited), and waits
// for the owner to leave. The barrier stands in for the one the owner's fast path leaves out: the
// owner either sees the bias cleared, or the revoker sees the owner inside. A lock is biased at
// most kEpochs times; each bias has its own "inside" flag, so the late store of an owner whose bias
// was revoked never touches a later owner's flag.
//
// Without membarrier (an old kernel, a seccomp filter, valgrind) or under ThreadSanitizer (which
// cannot follow the barrier) locks are never biased: they are FutexMutex.
#pragma once

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "link/fast_mutex.h"
#include "link/sanitizers.h"

namespace softrdma::link {

// Whether this process can revoke a bias (membarrier private expedited, registered). The first call
// registers, which takes the kernel ~10 ms (an RCU grace period): see PrepareBiasInBackground.
bool BiasSupported();
// Registers on a thread of its own (once per process), so that no application call waits for it;
// locks are biased once it is done (BiasReady).
void PrepareBiasInBackground();
bool BiasReady();
// A full memory barrier on every running thread of this process; false if the kernel refused.
bool BarrierOnAllThreads();

class BiasedMutex {
 public:
  static constexpr uint32_t kBiasAfter = 64;
  static constexpr uint32_t kEpochs = 16;
  // The run of acquisitions by one thread that gives bias number `epoch`: longer after each
  // revocation, so that a lock two threads share stops changing hands soon, while one that
  // another thread took only for a moment (a progress thread's burst at start-up) is biased again.
  static constexpr uint32_t StreakFor(uint32_t epoch) {
    return kBiasAfter << (epoch < 6 ? epoch : 6);
  }

  void lock() {
    if (TryFast() != kGot) LockSlow();
  }
  bool try_lock() {
    switch (TryFast()) {
      case kGot:
        return true;
      case kHeldBySelf:
        return false;  // without revoking the bias: the owner tried a lock it holds
      default:
        return TryLockSlow();
    }
  }
  void unlock() {
    if (fast_epoch_ != kNone) {
      const uint32_t e = fast_epoch_;
      fast_epoch_ = kNone;
      inside_[e].store(0, std::memory_order_release);
      // A revoker that waits says so before its barrier: this load then sees it, or the store
      // above is seen by the revoker before it sleeps (see RevokeLocked).
      if (revoker_waits_.load(std::memory_order_relaxed)) WakeRevoker(e);
      return;
    }
    mu_.unlock();
  }

  // Whether another thread holds the bias: taking the lock would revoke it.
  bool BiasedElsewhere() const {
    const uintptr_t b = bias_.load(std::memory_order_relaxed);
    return b != 0 && (b & ~kEpochMask) != Self();
  }
  // For tests: whether the calling thread holds the bias now, and how many biases were given.
  bool BiasedToCaller() const {
    const uintptr_t b = bias_.load(std::memory_order_relaxed);
    return b != 0 && (b & ~kEpochMask) == Self();
  }
  uint32_t biases_given() const { return next_epoch_; }

 private:
  static constexpr uint32_t kNone = ~0u;
  static constexpr uint32_t kSpinsBeforeSleep = 100;  // ~2 us of pauses, then a futex wait
  static constexpr uintptr_t kEpochMask = kEpochs - 1;
  static_assert((kEpochs & kEpochMask) == 0, "epochs fit the thread pointer's low bits");

  // The thread pointer: unique among live threads, read in one instruction (no TLS call).
  static uintptr_t Self() {
#if defined(__x86_64__)
    uintptr_t tp;
    asm("mov %%fs:0, %0" : "=r"(tp));
    return tp;
#else
    return 0;
#endif
  }

  enum Fast { kGot, kNotOwner, kHeldBySelf };
  Fast TryFast() {
    const uintptr_t b = bias_.load(std::memory_order_relaxed);
    if (b == 0 || (b & ~kEpochMask) != Self()) return kNotOwner;
    const uint32_t e = static_cast<uint32_t>(b & kEpochMask);
    // Only the owner writes its flag: set, it is this thread that is inside.
    if (inside_[e].load(std::memory_order_relaxed)) return kHeldBySelf;
    inside_[e].store(1, std::memory_order_relaxed);
    // Only the compiler's order: a revoker's membarrier supplies the hardware's.
    std::atomic_signal_fence(std::memory_order_seq_cst);
    if (bias_.load(std::memory_order_relaxed) != b) {
      inside_[e].store(0, std::memory_order_release);
      return kNotOwner;
    }
    fast_epoch_ = e;
    return kGot;
  }
  void LockSlow();
  bool TryLockSlow();
  // Under mu_: clears another thread's bias; with `wait`, waits for its owner to leave, else
  // reports whether it has. A revoked owner still inside is remembered (revoked_inside_).
  bool RevokeLocked(bool wait);
  bool OwnerLeftLocked(bool wait);
  void NoteAcquiredLocked();
  void WakeRevoker(uint32_t epoch);

  std::atomic<uintptr_t> bias_{0};              // owner's thread pointer | epoch, or 0
  std::atomic<uint32_t> inside_[kEpochs] = {};  // futex words: a revoker sleeps on them
  std::atomic<uint32_t> revoker_waits_{0};      // from a revocation until its owner is seen out
  uint32_t fast_epoch_ = kNone;                 // the holder's: how it holds the lock
  FutexMutex mu_;
  // Under mu_.
  uintptr_t last_holder_ = 0;
  uint32_t streak_ = 0;
  uint32_t next_epoch_ = 0;
  uint32_t revoked_inside_ = kNone;  // an epoch whose owner may still be inside
};

#if defined(__x86_64__)
using QueueMutex = std::conditional_t<kThreadSanitizer, std::mutex, BiasedMutex>;
#else
using QueueMutex = FastMutex;
#endif

// Whether another thread holds `m`'s bias (never, for a lock that is not biased).
template <typename Mutex>
bool BiasedElsewhere(const Mutex& m) {
  if constexpr (std::is_same_v<Mutex, BiasedMutex>)
    return m.BiasedElsewhere();
  else
    return false;
}

}  // namespace softrdma::link
