#include "link/placement_guard.h"

#include <fcntl.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdint>

#include "link/plain_syscall.h"
#include "link/shared_memory.h"

#if defined(__x86_64__)
// link/guarded_copy_x86_64.S: the range of its accesses, and where a fault in it resumes.
extern "C" const char softrdma_guarded_begin[], softrdma_guarded_end[],
    softrdma_guarded_fault_exit[];
#endif

namespace softrdma::link {
namespace {

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

bool ResumeFaultedPlacement(const siginfo_t* info, void* context) {
#if defined(__x86_64__)
  // Not only protections: pages the application unmapped while registered (SEGV_MAPERR), or whose
  // file it truncated (SIGBUS), where an HCA would write the pages the registration pinned. Arena
  // pages are still ours to write; private pages and the file's are gone.
  const bool unmapped = info->si_signo == SIGSEGV && info->si_code == SEGV_MAPERR;
  const bool truncated = info->si_signo == SIGBUS && info->si_code == BUS_ADRERR;
  const bool protected_page = info->si_signo == SIGSEGV && info->si_code == SEGV_ACCERR;
  if (!unmapped && !truncated && !protected_page) return false;
  greg_t& ip = static_cast<ucontext_t*>(context)->uc_mcontext.gregs[REG_RIP];
  const auto at = static_cast<uintptr_t>(ip);
  if (at < reinterpret_cast<uintptr_t>(softrdma_guarded_begin) ||
      at >= reinterpret_cast<uintptr_t>(softrdma_guarded_end))
    return false;
  ip = static_cast<greg_t>(reinterpret_cast<uintptr_t>(softrdma_guarded_fault_exit));
  return true;
#else
  (void)info, (void)context;
  return false;
#endif
}

bool WriteIgnoringProtection(void* to, const void* from, size_t n) {
  return PastProtection(reinterpret_cast<uintptr_t>(to),
                        const_cast<uint8_t*>(static_cast<const uint8_t*>(from)), n, true);
}

bool ReadIgnoringProtection(void* to, const void* from, size_t n) {
  return PastProtection(reinterpret_cast<uintptr_t>(from), static_cast<uint8_t*>(to), n, false);
}

}  // namespace softrdma::link
