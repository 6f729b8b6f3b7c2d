#include "link/placement_guard.h"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

#include "link/plain_syscall.h"
#include "link/shared_memory.h"

namespace softrdma::link {
namespace {

// The threads that armed a placement, found by the fault handler without touching thread-local
// storage: a library's TLS, first used in a thread inside a signal handler, may be allocated with
// malloc (a fault inside malloc would hang instead of ending the process). A thread beyond the
// table's size is not guarded: its fault ends the process, as without us.
constexpr int kPlacingThreads = 64;
struct PlacingThread {
  std::atomic<pthread_t> thread{};
  std::atomic<FaultRecovery*> recovery{nullptr};
};
PlacingThread g_placing[kPlacingThreads];

struct ThreadRecord {
  FaultRecovery recovery;
  PlacingThread* slot = nullptr;
  ThreadRecord() {
    const pthread_t self = pthread_self();
    for (int i = 0; !slot && i < kPlacingThreads; ++i) {
      pthread_t none{};
      if (g_placing[i].thread.compare_exchange_strong(none, self)) slot = &g_placing[i];
    }
    if (slot) slot->recovery.store(&recovery, std::memory_order_relaxed);
  }
  ~ThreadRecord() {
    if (!slot) return;
    slot->recovery.store(nullptr, std::memory_order_relaxed);
    slot->thread.store(pthread_t{}, std::memory_order_release);
  }
};
// The general TLS model, as every thread_local of the library (core/cq.cpp, t_poll_target).
thread_local ThreadRecord t_record;

// Opened per use: a descriptor kept would name the parent's memory in a fork child, and this
// way is taken only after a fault.
template <typename Io>
bool ThroughProcMem(Io io, size_t n) {
  int fd = open("/proc/self/mem", O_RDWR | O_CLOEXEC);
  if (fd < 0) return false;
  size_t done = 0;
  while (done < n) {
    ssize_t r = io(fd, done);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    done += static_cast<size_t>(r);
  }
  sys::Close(fd);
  return done == n;
}

// Moves `n` bytes between the application's memory at `app` and ours at `buf`, past the pages'
// protections. Pages moved onto the arena are a shared mapping, which /proc/self/mem does not write
// where it is read-only: those go through a mapping of the arena of their own.
bool PastProtection(uintptr_t app, uint8_t* buf, size_t n, bool write) {
  SharedMemory& shared = SharedMemory::Get();
  while (n > 0) {
    const SharedMemory::Piece piece = shared.Find(reinterpret_cast<const void*>(app), n);
    bool ok;
    if (piece.shared) {
      ok = write ? shared.CopyIntoArena(piece.offset, buf, piece.len)
                 : shared.CopyOutOfArena(piece.offset, buf, piece.len);
    } else {
      ok = ThroughProcMem(
          [&](int fd, size_t done) {
            const auto at = static_cast<off_t>(app + done);
            return write ? pwrite(fd, buf + done, piece.len - done, at)
                         : pread(fd, buf + done, piece.len - done, at);
          },
          piece.len);
    }
    if (!ok) return false;
    app += piece.len;
    buf += piece.len;
    n -= piece.len;
  }
  return true;
}

}  // namespace

FaultRecovery& ThisThreadsRecovery() {
  return t_record.recovery;
}

void ResumeFaultedPlacement(const siginfo_t* info) {
  if (info->si_code != SEGV_ACCERR) return;
  const pthread_t self = pthread_self();
  for (PlacingThread& p : g_placing) {
    if (p.thread.load(std::memory_order_acquire) != self) continue;
    FaultRecovery* r = p.recovery.load(std::memory_order_relaxed);
    if (!r || !r->armed) return;
    r->armed = false;
    siglongjmp(r->resume, 1);
  }
}

void ForgetOtherPlacingThreads() {
  const pthread_t self = pthread_self();
  for (PlacingThread& p : g_placing) {
    if (p.thread.load(std::memory_order_relaxed) == self) continue;
    p.recovery.store(nullptr, std::memory_order_relaxed);
    p.thread.store(pthread_t{}, std::memory_order_relaxed);
  }
}

void UnblockFaults() {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGSEGV);
  pthread_sigmask(SIG_UNBLOCK, &s, nullptr);
}

bool WriteIgnoringProtection(void* to, const void* from, size_t n) {
  return PastProtection(reinterpret_cast<uintptr_t>(to),
                        const_cast<uint8_t*>(static_cast<const uint8_t*>(from)), n, true);
}

bool ReadIgnoringProtection(void* to, const void* from, size_t n) {
  return PastProtection(reinterpret_cast<uintptr_t>(from), static_cast<uint8_t*>(to), n, false);
}

}  // namespace softrdma::link
