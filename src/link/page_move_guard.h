// Moving registered pages (shared_memory.cpp) copies them, then maps the copy in their place: a
// write by another thread between the two would land in the old page and be lost. While a move is
// on, its pages are read-only; a thread that writes into them faults, waits in our SIGSEGV handler
// until the move is over, and returns to its write, which then lands in the pages' new home. Every
// other fault goes to the handler that was there before ours (the default one: the process dies).
//
// The kernel does not fault for the application: a system call writing into those pages meanwhile
// (read(2) into a neighbouring heap object) fails with EFAULT instead of losing its bytes.
#pragma once

#include <cstddef>
#include <cstdint>

namespace softrdma::link {

class PageMoveGuard {
 public:
  // Makes [start, start+len) read-only for a move, one at a time (callers serialise moves). False
  // when it could not: move nothing.
  static bool Begin(uintptr_t start, size_t len);
  // The move is over: the pages are writable in their new home. `restore`: the move failed, the
  // old pages stay and are made writable again.
  static void End(bool restore);
};

}  // namespace softrdma::link
