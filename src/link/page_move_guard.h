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

// Installs our SIGSEGV handler, which also serves placements into pages the application made
// read-only or unmapped (link/placement_guard.h), and our SIGBUS handler, which serves only
// placements (pages of a truncated file): once, at the first registration; a move installs them
// again if the application replaced them since.
void InstallFaultHandler();

// One move, one guard on the mover's stack: it makes [start, start+len) read-only (one move at a
// time: callers serialise moves), and its end wakes the writers that wait. A move not confirmed by
// Moved() failed: the old pages stay and are made writable again.
class PageMoveGuard {
 public:
  PageMoveGuard(uintptr_t start, size_t len);
  ~PageMoveGuard();
  PageMoveGuard(const PageMoveGuard&) = delete;
  PageMoveGuard& operator=(const PageMoveGuard&) = delete;

  // False: the pages could not be made read-only; move nothing (the destructor does nothing).
  bool ok() const { return on_; }
  // The pages are in their new home, writable there.
  void Moved() { moved_ = true; }
  // Waits for the move on, if any (a system call refused its read-only pages); false when none was
  // on or ended just before.
  static bool AwaitMoveOver();

 private:
  bool on_;
  bool moved_ = false;
};

}  // namespace softrdma::link
