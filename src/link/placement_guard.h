// Placing bytes into registered memory that the application has made read-only (mprotect) since
// it registered it. An HCA writes such pages all the same: they are pinned, and its DMA does not
// go through the process's page tables. We write through them, and the write faults; the fault
// handler (link/page_move_guard.cpp) brings the placing thread back here, and the bytes go past the
// protection: through /proc/self/mem, as a debugger's writes go into read-only pages, or for pages
// moved onto the arena (a shared mapping, which /proc/self/mem leaves alone) through a mapping of
// the arena of their own.
//
// Only placements armed here are brought back: the application's own faults go on to its handler
// or end the process, as without us. Not under ThreadSanitizer, whose runtime is left holding a
// lock when a handler it called leaves by siglongjmp (the next lock hung): there a placement into
// such a page faults as before.
#pragma once

#include <setjmp.h>
#include <signal.h>

#include <atomic>
#include <cstddef>

#include "link/place.h"
#include "link/sanitizers.h"

namespace softrdma::link {

struct FaultRecovery {
  sigjmp_buf resume;
  bool armed = false;
};

// This thread's record (the first call in a thread makes it known to the fault handler).
FaultRecovery& ThisThreadsRecovery();

// For the fault handler: a protection fault of an armed placement of this thread resumes it (and
// does not return); anything else returns.
void ResumeFaultedPlacement(const siginfo_t* info);

// In a fork child: the parent's other threads are gone without their records' destructors, and a
// new thread may get one's descriptor (its pthread_t).
void ForgetOtherPlacingThreads();

// Back from a fault: the handler's mask (SIGSEGV blocked) is still on; lifts it.
void UnblockFaults();

// Reads and writes past the pages' protections (see above): false when refused.
bool ReadIgnoringProtection(void* to, const void* from, size_t n);
bool WriteIgnoringProtection(void* to, const void* from, size_t n);

// Runs `op`, a write into application memory, armed: false when it faulted, and then it may have
// done part of its work (the caller goes past the protection). The signal fences keep the compiler
// from moving op's stores (volatile ones among them) out of the armed stretch.
template <typename Op>
inline bool RunGuarded(Op op) {
  if constexpr (kThreadSanitizer) {
    op();
    return true;
  }
  FaultRecovery& r = ThisThreadsRecovery();
  // No signal mask saved: that would be a system call per placement.
  if (sigsetjmp(r.resume, 0) != 0) {
    UnblockFaults();
    return false;
  }
  r.armed = true;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  op();
  std::atomic_signal_fence(std::memory_order_seq_cst);
  r.armed = false;
  return true;
}

// PlaceBytes that survives a destination the application made read-only. False when the bytes
// could not be written at all (no /proc/self/mem, say): the caller fails the access.
inline bool PlaceGuarded(void* dst, const void* src, size_t n) {
  return RunGuarded([&] { PlaceBytes(dst, src, n); }) || WriteIgnoringProtection(dst, src, n);
}

}  // namespace softrdma::link
