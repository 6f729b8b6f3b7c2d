// Registered memory that same-host peers read directly. The whole pages of a large region are
// moved, in place, onto one process-wide memfd (the arena): same addresses, same contents, now
// MAP_SHARED. A peer given the arena's descriptor maps it read-only and copies payloads straight
// out of it, so a message costs one copy instead of two (into a ring and out again). Each
// process only ever writes its own memory: the receiver of a SEND or WRITE copies from the
// sender's arena, the requester of a READ from the responder's.
//
// Only private anonymous memory (heap, anonymous mmap) is moved; other mappings (files, shared
// memory of the application, stacks) stay as they are and travel inline. Deregistering moves the
// pages back to private anonymous memory (when they are still the arena's) and frees the arena
// space. A fork()ed child gets private copies, as fork() gives of any private memory.
//
// Moving pages copies them first; meanwhile they are read-only, and a thread writing into them
// waits for the move's end (link/page_move_guard.h) instead of losing its write.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <new>
#include <shared_mutex>
#include <vector>

namespace softrdma::link {

class SharedMemory {
 public:
  // Regions spanning fewer whole pages than this stay private: their payloads are small enough to
  // travel inline, and moving them would cost more than it saves.
  static constexpr size_t kMinShareBytes = 8 * 1024;

  static SharedMemory& Get();

  // Registers [addr, addr+len) (every registered region is, whatever its size) and, best effort,
  // moves its whole pages onto the arena. Returns the id to give Unshare.
  // - A registration holds every shared range its bytes touch, so what Find reports shared inside
  //   it (and peers were told of) stays the arena's until it is released: a region that outgrows
  //   an earlier one (a registration cache merging neighbours) keeps the earlier one's pages in
  //   the arena after that one is deregistered.
  // - Pages move only when no other registration touches them: a registered buffer may be taken
  //   by I/O at any moment (a peer's WRITE, a READ response placed by the progress thread), and a
  //   write landing between the copy and the remap would be lost. A registration cache rounds
  //   regions out to whole pages, so a new region often covers part of another one.
  // - Once the application has unmapped a registered buffer, a new one at the same addresses goes
  //   into a range of its own.
  uint64_t Share(const void* addr, size_t len);
  void Unshare(uint64_t id, const void* addr);  // addr: as given to Share

  struct Piece {
    bool shared;  // [p, p+len) is in the arena at `offset`
    uint64_t offset;
    size_t len;  // bytes from p that are all shared, or all not shared (≤ n)
  };
  Piece Find(const void* p, size_t n) const;
  // Copies into or out of the arena at `offset` through a mapping of its own, read-write whatever
  // the application made of the pages where it registered them (link/placement_guard.h). False
  // when the arena cannot be mapped.
  bool CopyIntoArena(uint64_t offset, const void* from, size_t n);
  bool CopyOutOfArena(uint64_t offset, void* to, size_t n);

  // A read-only descriptor of the arena for peers, -1 while nothing is shared.
  int PeerFd();
  // The arena's read-write descriptor (made, empty, if need be) for peers' direct access.
  int ArenaFd();
  // Around fork(): the fork waits for a move in progress on another thread (the child would get
  // its lock held and its pages read-only, with nobody to finish it), and no move starts until the
  // copy is made. The child starts with a fresh lock: glibc's rwlock knows its writer by thread
  // id, which differs in the child, and unlocking there left it locked.
  void HoldForFork() { mu_.lock(); }
  void ResumeAfterFork() { mu_.unlock(); }
  void ResumeInForkChild() { new (&mu_) std::shared_mutex(); }
  // In a fork()ed child: every shared range becomes private memory with the same contents, and
  // the child starts without an arena.
  void AfterForkInChild();

 private:
  struct Range {
    size_t len;
    uint64_t offset;
    int refs;
    uint64_t id;
  };
  static bool WholePages(const void* addr, size_t len, uintptr_t* start, uintptr_t* end);
  bool MovedOntoArena(uintptr_t start, size_t len, uint64_t* offset);
  bool EnsureArenaLocked();
  bool MoveToPrivate(uintptr_t start, size_t len);  // false: the pages stay the arena's
  uint64_t Allocate(size_t len);
  void Free(uint64_t offset, size_t len);

  mutable std::shared_mutex mu_;
  // Whether the pages of `start`'s range are still the arena's at its offset (the application may
  // have unmapped them, and something else may live there now).
  bool ArenaMapsLocked(uintptr_t start, const Range& r) const;
  // A range whose pages are no longer the arena's leaves `ranges_` (Find no longer reports it) for
  // `stale_`, where it keeps its arena space until its last registration is released.
  void RetireLocked(std::map<uintptr_t, Range>::iterator it);
  // Frees the range's arena space; `maybe_mapped`: unless some mapping still shows its pages.
  void ReleaseLocked(const Range& r, bool maybe_mapped);
  bool ArenaOffsetsMappedLocked(uint64_t offset, size_t len) const;
  // Drops one reference to the range `id` that began at `start`.
  void DropLocked(uintptr_t start, uint64_t id);
  struct Held {
    uintptr_t start;
    uint64_t id;
  };
  struct Registration {
    uintptr_t hi;  // the end of the pages its bytes touch
    std::vector<Held> held;
  };
  // Whether a live registration touches a page of [start, end).
  bool RegisteredElsewhereLocked(uintptr_t start, uintptr_t end) const;
  std::map<uintptr_t, Range> ranges_;  // by start address; page-aligned, disjoint
  std::map<uint64_t, Range> stale_;    // by id
  // By the start of the pages their bytes touch, and id: one node each, however many there are.
  std::map<std::pair<uintptr_t, uint64_t>, Registration> registrations_;
  uintptr_t widest_span_ = 0;  // bounds the search of registrations_ to the left
  uint64_t next_id_ = 1;
  std::map<uint64_t, uint64_t> holes_;  // free arena space: offset → length
  uint64_t arena_bytes_ = 0;
  int fd_ = -1;
  int peer_fd_ = -1;
};

}  // namespace softrdma::link
