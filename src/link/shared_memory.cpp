#include "link/shared_memory.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "link/page_move_guard.h"
#include "link/place.h"
#include "link/process_maps.h"
#include "link/sanitizers.h"

namespace softrdma::link {
namespace {

size_t PageBytes() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

bool PrivateAnonymous(uintptr_t start, uintptr_t end) {
  return ForEachMapping(start, end, [](const Mapping& m) {
    return std::strcmp(m.perms, "rw-p") == 0 && m.inode == 0 &&
           (m.path[0] == '\0' || std::strcmp(m.path, "[heap]") == 0);
  });
}

}  // namespace

SharedMemory& SharedMemory::Get() {
  static SharedMemory* instance = new SharedMemory();  // never destroyed: the arena outlives exit
  return *instance;
}

int SharedMemory::PeerFd() {
  std::unique_lock<std::shared_mutex> g(mu_);
  if (fd_ < 0) return -1;
  if (peer_fd_ < 0) {
    // Reopened read-only: a peer can map and read the arena, never write into it.
    char path[64];
    std::snprintf(path, sizeof path, "/proc/self/fd/%d", fd_);
    peer_fd_ = open(path, O_RDONLY | O_CLOEXEC);
  }
  return peer_fd_;
}

uint64_t SharedMemory::Allocate(size_t len) {
  for (auto it = holes_.begin(); it != holes_.end(); ++it) {
    if (it->second < len) continue;
    uint64_t off = it->first;
    uint64_t rest = it->second - len;
    holes_.erase(it);
    if (rest) holes_[off + len] = rest;
    return off;
  }
  uint64_t off = arena_bytes_;
  arena_bytes_ += len;
  return off;
}

void SharedMemory::Free(uint64_t offset, size_t len) {
  auto [it, _] = holes_.emplace(offset, len);
  auto next = std::next(it);
  if (next != holes_.end() && it->first + it->second == next->first) {
    it->second += next->second;
    holes_.erase(next);
  }
  if (it != holes_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      holes_.erase(it);
    }
  }
}

bool SharedMemory::EnsureArenaLocked() {
  if (fd_ >= 0) return true;
  fd_ = memfd_create("softrdma-mem", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd_ < 0) return false;
  // Peers map the arena; it may grow but never shrink under them.
  fcntl(fd_, F_ADD_SEALS, F_SEAL_SHRINK);
  return true;
}

int SharedMemory::ArenaFd() {
  std::unique_lock<std::shared_mutex> g(mu_);
  return EnsureArenaLocked() ? fd_ : -1;
}

namespace {

// Moving pages changes nothing the application can see: same addresses, same contents. But memory
// hook libraries (UCX's UCM patches mmap, munmap and mremap in every loaded library) take an
// mmap(MAP_FIXED) or mremap over a buffer for its unmapping, and drop what they cached for it:
// the memory region just registered for it, among others. MPI over UCX then registered (and so
// moved) its rendezvous buffer anew for every message. The moves therefore go to the kernel
// directly, past such hooks — except under a sanitizer, whose interceptors of these calls keep
// its shadow memory right (the hook test is not built there).
constexpr bool kPastHooks = !kThreadSanitizer && !kAddressSanitizer;

void* MapDirect(void* addr, size_t len, int prot, int flags, int fd, off_t offset) {
  if constexpr (!kPastHooks) return mmap(addr, len, prot, flags, fd, offset);
  return reinterpret_cast<void*>(syscall(SYS_mmap, addr, len, prot, flags, fd, offset));
}

void* RemapDirect(void* from, size_t len, void* to) {
  if constexpr (!kPastHooks) return mremap(from, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, to);
  return reinterpret_cast<void*>(
      syscall(SYS_mremap, from, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, to));
}

void UnmapDirect(void* addr, size_t len) {
  if constexpr (!kPastHooks) {
    munmap(addr, len);
    return;
  }
  syscall(SYS_munmap, addr, len);
}

}  // namespace

bool SharedMemory::MovedOntoArena(uintptr_t start, size_t len, uint64_t* offset) {
  if (!PrivateAnonymous(start, start + len)) return false;
  if (!EnsureArenaLocked()) return false;
  uint64_t off = Allocate(len);
  struct stat st {};
  if (fstat(fd_, &st) != 0 || (static_cast<uint64_t>(st.st_size) < off + len &&
                               ftruncate(fd_, static_cast<off_t>(off + len)) != 0)) {
    Free(off, len);
    return false;
  }
  void* at = reinterpret_cast<void*>(start);
  // Read-only from the copy to the remap: another thread's write meanwhile waits for the remap
  // instead of landing in a page about to be dropped.
  PageMoveGuard guard(start, len);
  if (!guard.ok() || pwrite(fd_, at, len, static_cast<off_t>(off)) != static_cast<ssize_t>(len) ||
      MapDirect(at, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_POPULATE, fd_,
                static_cast<off_t>(off)) == MAP_FAILED) {
    Free(off, len);
    return false;
  }
  guard.Moved();
  *offset = off;
  return true;
}

// Puts private anonymous pages with the same contents in place of the arena's at [start, len):
// copied aside, then moved over in one mremap, so the range is never unmapped.
bool SharedMemory::MoveToPrivate(uintptr_t start, size_t len) {
  void* fresh = MapDirect(nullptr, len, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (fresh == MAP_FAILED) return false;  // the pages stay shared: still correct, only not freed
  void* at = reinterpret_cast<void*>(start);
  PageMoveGuard guard(start, len);  // as in MovedOntoArena
  if (guard.ok()) {
    std::memcpy(fresh, at, len);
    if (RemapDirect(fresh, len, at) != MAP_FAILED) {
      guard.Moved();
      return true;
    }
  }
  UnmapDirect(fresh, len);
  return false;
}

// The whole pages of [addr, addr+len), when they are enough to share.
bool SharedMemory::WholePages(const void* addr, size_t len, uintptr_t* start, uintptr_t* end) {
  const size_t page = PageBytes();
  uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  *start = (a + page - 1) & ~(page - 1);
  *end = (a + len) & ~(page - 1);
  return a + len >= a && *end > *start && *end - *start >= kMinShareBytes;
}

bool SharedMemory::ArenaMapsLocked(uintptr_t start, const Range& r) const {
  struct stat st {};
  if (fstat(fd_, &st) != 0) return false;
  const uintptr_t end = start + r.len;
  uint64_t expect = r.offset;  // the arena offset the next address must map
  return ForEachMapping(start, end, [&](const Mapping& m) {
    uintptr_t from = std::max(m.start, start);
    bool match = m.inode == st.st_ino && m.offset + (from - m.start) == expect;
    expect += std::min(m.end, end) - from;
    return match;
  });
}

void SharedMemory::RetireLocked(std::map<uintptr_t, Range>::iterator it) {
  stale_[it->second.id] = it->second;
  ranges_.erase(it);
}

bool SharedMemory::ArenaOffsetsMappedLocked(uint64_t offset, size_t len) const {
  struct stat st {};
  if (fstat(fd_, &st) != 0) return true;  // cannot tell: keep the pages
  bool mapped = false;
  ForEveryMapping([&](const Mapping& m) {
    mapped |=
        m.inode == st.st_ino && m.offset < offset + len && offset < m.offset + (m.end - m.start);
    return !mapped;
  });
  return mapped;
}

void SharedMemory::ReleaseLocked(const Range& r, bool maybe_mapped) {
  // Pages the application moved elsewhere (mremap, as realloc does) are still its memory: punching
  // them would zero it. They stay the arena's for good.
  if (maybe_mapped && ArenaOffsetsMappedLocked(r.offset, r.len)) return;
  fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(r.offset),
            static_cast<off_t>(r.len));
  Free(r.offset, r.len);
}

bool SharedMemory::RegisteredElsewhereLocked(uintptr_t start, uintptr_t end) const {
  auto it = registrations_.lower_bound({start > widest_span_ ? start - widest_span_ : 0, 0});
  for (; it != registrations_.end() && it->first.first < end; ++it)
    if (it->second.hi > start) return true;
  return false;
}

uint64_t SharedMemory::Share(const void* addr, size_t len) {
  const size_t page = PageBytes();
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  if (len == 0 || a + len < a) return 0;
  const uintptr_t lo = a & ~(page - 1);
  Registration reg{(a + len + page - 1) & ~(page - 1), {}};
  std::unique_lock<std::shared_mutex> g(mu_);
  // The ranges its bytes touch: still the arena's, it holds each of them; replaced by the
  // application, they retire. Left in place, a buffer mapped where an unmapped one is still
  // registered read as the old buffer's arena pages (a registration cache such as UCX's may
  // release a region after its memory was freed and reused).
  auto it = ranges_.upper_bound(lo);
  if (it != ranges_.begin() && std::prev(it)->first + std::prev(it)->second.len > lo) --it;
  while (it != ranges_.end() && it->first < reg.hi) {
    if (!ArenaMapsLocked(it->first, it->second)) {
      auto next = std::next(it);
      RetireLocked(it);
      it = next;
      continue;
    }
    reg.held.push_back(Held{it->first, it->second.id});
    ++it;
  }
  uintptr_t start, end;
  uint64_t off;
  if (reg.held.empty() && WholePages(addr, len, &start, &end) &&
      !RegisteredElsewhereLocked(start, end) && MovedOntoArena(start, end - start, &off)) {
    const uint64_t range_id = next_id_++;
    ranges_[start] = Range{end - start, off, 0, range_id};
    reg.held.push_back(Held{start, range_id});
  }
  for (const Held& h : reg.held) ++ranges_[h.start].refs;
  widest_span_ = std::max(widest_span_, reg.hi - lo);
  const uint64_t id = next_id_++;
  registrations_.emplace(std::make_pair(lo, id), std::move(reg));
  return id;
}

void SharedMemory::DropLocked(uintptr_t start, uint64_t id) {
  if (auto it = ranges_.find(start); it != ranges_.end() && it->second.id == id) {
    Range& r = it->second;
    if (--r.refs > 0) return;
    // Only pages that are still the arena's go back: the application may have unmapped the buffer
    // before deregistering it, and something else may live at those addresses now.
    const bool moved_back = ArenaMapsLocked(start, r) && MoveToPrivate(start, r.len);
    ReleaseLocked(r, !moved_back);
    ranges_.erase(it);
    return;
  }
  if (auto s = stale_.find(id); s != stale_.end() && --s->second.refs == 0) {
    ReleaseLocked(s->second, true);
    stale_.erase(s);
  }
}

void SharedMemory::Unshare(uint64_t id, const void* addr) {
  if (id == 0) return;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(addr) & ~(PageBytes() - 1);
  std::unique_lock<std::shared_mutex> g(mu_);
  auto reg = registrations_.find({lo, id});
  if (reg == registrations_.end()) return;  // made before a fork(): the child has no arena
  for (const Held& h : reg->second.held) DropLocked(h.start, h.id);
  registrations_.erase(reg);
}

SharedMemory::Piece SharedMemory::Find(const void* p, size_t n) const {
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::shared_lock<std::shared_mutex> g(mu_);
  auto it = ranges_.upper_bound(a);
  if (it != ranges_.begin()) {
    auto prev = std::prev(it);
    if (a < prev->first + prev->second.len) {
      size_t in = prev->first + prev->second.len - a;
      return Piece{true, prev->second.offset + (a - prev->first), in < n ? in : n};
    }
  }
  size_t until = it == ranges_.end() ? n : it->first - a;
  return Piece{false, 0, until < n ? until : n};
}

namespace {

// Runs fn(pointer to the byte at `offset`) on a mapping of `n` bytes of the arena made for it.
template <typename Fn>
bool OnArenaMapping(int fd, uint64_t offset, size_t n, Fn fn) {
  if (fd < 0) return false;
  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t start = offset & ~(page - 1);
  const size_t len = static_cast<size_t>(offset - start) + n;
  void* m =
      MapDirect(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(start));
  if (m == MAP_FAILED) return false;
  fn(static_cast<uint8_t*>(m) + (offset - start));
  munmap(m, len);
  return true;
}

}  // namespace

bool SharedMemory::CopyIntoArena(uint64_t offset, const void* from, size_t n) {
  std::shared_lock<std::shared_mutex> g(mu_);
  return OnArenaMapping(fd_, offset, n, [&](uint8_t* p) { PlaceBytes(p, from, n); });
}

bool SharedMemory::CopyOutOfArena(uint64_t offset, void* to, size_t n) {
  std::shared_lock<std::shared_mutex> g(mu_);
  return OnArenaMapping(fd_, offset, n, [&](uint8_t* p) { std::memcpy(to, p, n); });
}

void SharedMemory::AfterForkInChild() {
  std::unique_lock<std::shared_mutex> g(mu_);
  // Only ranges still mapped where they were registered: the application may have unmapped a
  // buffer (or moved it with mremap) before deregistering it.
  for (auto& [start, r] : ranges_)
    if (ArenaMapsLocked(start, r)) MoveToPrivate(start, r.len);
  ranges_.clear();
  stale_.clear();
  registrations_.clear();
  holes_.clear();
  arena_bytes_ = 0;
  for (int* fd : {&fd_, &peer_fd_}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
}

}  // namespace softrdma::link
