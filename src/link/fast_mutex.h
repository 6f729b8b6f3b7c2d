// The locks every message takes (a queue pair's, a CQ's, a connection's send side, the
// endpoint's progress mutex): lock and unlock are inline, one compare-and-swap and one exchange
// when nobody waits, a futex wait when somebody holds it. std::mutex took two library calls that
// also keep an owner and a user count: 8 ns of the ~100 per direct atomic in ib_atomic_bw, and
// ~160 instructions of an answered TCP ib_write_lat message. Under ThreadSanitizer it is
// std::mutex, which TSan follows.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <type_traits>

#include "link/sanitizers.h"

namespace softrdma::link {

class FutexMutex {
 public:
  void lock() {
    int free = 0;
    if (!state_.compare_exchange_strong(free, kLocked, std::memory_order_acquire)) LockContended();
  }
  bool try_lock() {
    int free = 0;
    return state_.compare_exchange_strong(free, kLocked, std::memory_order_acquire);
  }
  void unlock() {
    if (state_.exchange(0, std::memory_order_release) == kWaited) Wake();
  }

 private:
  static constexpr int kLocked = 1;
  static constexpr int kWaited = 2;  // locked, and somebody may sleep on it
  void LockContended() {
    while (state_.exchange(kWaited, std::memory_order_acquire) != 0)
      syscall(SYS_futex, &state_, FUTEX_WAIT_PRIVATE, kWaited, nullptr, nullptr, 0);
  }
  void Wake() { syscall(SYS_futex, &state_, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0); }
  std::atomic<int> state_{0};
};
static_assert(sizeof(std::atomic<int>) == sizeof(int));

using FastMutex = std::conditional_t<kThreadSanitizer, std::mutex, FutexMutex>;

}  // namespace softrdma::link
