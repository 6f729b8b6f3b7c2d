#include "link/biased_mutex.h"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>

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

}  // namespace

bool BiasSupported() {
  static const bool supported = Register();
  return supported;
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
  std::atomic<uint8_t>& inside = inside_[revoked_inside_];
  for (uint32_t i = 0; inside.load(std::memory_order_acquire); ++i) {
    if (!wait) return false;
    if (i < 1000) {
      SpinPause();
    } else {
      const timespec pause{0, 50'000};  // the owner was preempted inside: give it the core
      nanosleep(&pause, nullptr);
    }
  }
  revoked_inside_ = kNone;
  return true;
}

// A thread that took the lock kBiasAfter times in a row gets it biased to it.
void BiasedMutex::NoteAcquiredLocked() {
  const uintptr_t self = Self();
  if (self != last_holder_) {
    last_holder_ = self;
    streak_ = 0;
  }
  if (++streak_ < kBiasAfter || next_epoch_ == kEpochs || self == 0 || (self & kEpochMask) ||
      !BiasSupported())
    return;
  bias_.store(self | next_epoch_, std::memory_order_relaxed);
  ++next_epoch_;
  streak_ = 0;
}

}  // namespace softrdma::link
