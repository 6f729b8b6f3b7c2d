#include "link/biased_mutex.h"

#include <linux/futex.h>
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>
#include <mutex>
#include <thread>
#include <type_traits>

#include "link/running_thread.h"
#include "link/spin_pause.h"

namespace softrdma::link {
namespace {

long Membarrier(int cmd) {
  return syscall(SYS_membarrier, cmd, 0, 0);
}

bool Register() {
  const long cmds = Membarrier(MEMBARRIER_CMD_QUERY);
  if (cmds < 0 || !(cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED)) return false;
  return Membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
}

std::atomic<bool> g_bias_ready{false};

}  // namespace

bool BiasSupported() {
  static const bool supported = [] {
    const bool ok = Register();
    g_bias_ready.store(ok, std::memory_order_release);
    return ok;
  }();
  return supported;
}

void PrepareBiasInBackground() {
  if (!std::is_same_v<QueueMutex, BiasedMutex>) return;  // never biased here
  static std::once_flag once;
  // Started as the progress thread is: it takes none of the program's signals, and a fork() never
  // catches it inside its start-up.
  std::call_once(once, [] { StartRunningThread([] { BiasSupported(); }).detach(); });
}

bool BiasReady() {
  return g_bias_ready.load(std::memory_order_acquire);
}

bool BarrierOnAllThreads() {
  if (Membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return true;
  // A fork() child may have to register again (the registration belongs to the address space).
  return errno == EPERM && Register() && Membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0;
}

void BiasedMutex::LockSlow() {
  mu_.lock();
  RevokeLocked(true);
  NoteAcquiredLocked();
}

bool BiasedMutex::TryLockSlow() {
  if (!mu_.try_lock()) return false;
  if (!RevokeLocked(false)) {
    mu_.unlock();
    return false;
  }
  NoteAcquiredLocked();
  return true;
}

bool BiasedMutex::RevokeLocked(bool wait) {
  const uintptr_t b = bias_.load(std::memory_order_relaxed);
  if (b != 0) {
    bias_.store(0, std::memory_order_relaxed);
    revoked_inside_ = static_cast<uint32_t>(b & kEpochMask);
    // Before the barrier: an owner that leaves after it sees this and wakes whoever waits; one
    // that left before it has its flag's store seen by then.
    revoker_waits_.store(1, std::memory_order_relaxed);
    if (!BarrierOnAllThreads()) {
      // Cannot happen where BiasSupported() held, short of a kernel that changed its mind. A store
      // waits in a store buffer for nanoseconds, not for this long: wait, then trust the flag.
      const timespec pause{0, 100'000};
      nanosleep(&pause, nullptr);
    }
  }
  return OwnerLeftLocked(wait);
}

bool BiasedMutex::OwnerLeftLocked(bool wait) {
  if (revoked_inside_ == kNone) return true;
  std::atomic<uint32_t>& inside = inside_[revoked_inside_];
  for (uint32_t i = 0; inside.load(std::memory_order_acquire); ++i) {
    if (!wait) return false;
    if (i < kSpinsBeforeSleep) {
      SpinPause();
      continue;
    }
    // The owner holds the lock for long (a modify that sets up a connection): sleep until its
    // unlock wakes us, as on a futex lock. The timeout only bounds a wake-up that went astray.
    const timespec limit{0, 1'000'000};
    syscall(SYS_futex, &inside, FUTEX_WAIT_PRIVATE, 1, &limit, nullptr, 0);
  }
  revoked_inside_ = kNone;
  revoker_waits_.store(0, std::memory_order_relaxed);
  return true;
}

void BiasedMutex::WakeRevoker(uint32_t epoch) {
  syscall(SYS_futex, &inside_[epoch], FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
}

// A thread that took the lock StreakFor(next_epoch_) times in a row gets it biased to it.
void BiasedMutex::NoteAcquiredLocked() {
  const uintptr_t self = Self();
  if (self != last_holder_) {
    last_holder_ = self;
    streak_ = 0;
  }
  if (next_epoch_ == kEpochs || ++streak_ < StreakFor(next_epoch_) || self == 0 ||
      (self & kEpochMask) || !BiasReady())
    return;
  bias_.store(self | next_epoch_, std::memory_order_relaxed);
  ++next_epoch_;
  streak_ = 0;
}

}  // namespace softrdma::link
