#include "link/process_maps.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "link/page_move_guard.h"

namespace softrdma::link {
namespace {

// struct procmap_query of <linux/fs.h> (Linux 6.11), which Debian 12's headers predate.
struct ProcmapQuery {
  uint64_t size;
  uint64_t query_flags;
  uint64_t query_addr;
  uint64_t vma_start;
  uint64_t vma_end;
  uint64_t vma_flags;
  uint64_t vma_page_size;
  uint64_t vma_offset;
  uint64_t inode;
  uint32_t dev_major;
  uint32_t dev_minor;
  uint32_t vma_name_size;
  uint32_t build_id_size;
  uint64_t vma_name_addr;
  uint64_t build_id_addr;
};
static_assert(sizeof(ProcmapQuery) == 104);
static_assert(offsetof(ProcmapQuery, vma_name_size) == 80);
constexpr unsigned long kProcmapQuery = _IOWR('f', 17, ProcmapQuery);
constexpr uint64_t kVmaReadable = 1, kVmaWritable = 2, kVmaExecutable = 4, kVmaShared = 8;

// 1: the kernel answers the query, 0: it does not, -1: not asked yet.
std::atomic<int> g_query_works{-1};

bool ParseMapping(const char* line, Mapping* m) {
  unsigned dev_major, dev_minor;
  int n = std::sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %4s %" SCNx64 " %x:%x %" SCNu64 " %255[^\n]",
                      &m->start, &m->end, m->perms, &m->offset, &dev_major, &dev_minor, &m->inode,
                      m->path);
  if (n < 7) return false;
  if (n == 7) m->path[0] = '\0';
  return true;
}

bool ForEachMappingInText(uintptr_t start, uintptr_t end,
                          const std::function<bool(const Mapping&)>& fn) {
  uintptr_t covered = start;
  bool ok = true;
  ForEveryMapping([&](const Mapping& m) {
    if (m.end <= covered) return true;
    if (m.start > covered) return ok = false;  // a hole
    ok = fn(m);
    covered = m.end;
    return ok && covered < end;
  });
  return ok && covered >= end;
}

enum class Query { kDone, kRefused, kUnsupported };

// The maps file the queries go to, opened once per process: opening it costs ~6 us, a query ~0.9. A
// descriptor from before fork() describes the parent's memory: a pthread_atfork handler makes the
// child open its own. Its copy of the parent's stays open (close-on-exec): the child may have
// closed that number already, and another file may have it now. (A child of a raw clone() system
// call runs no handlers; nothing of ours runs in one.) Holds fd + 1, 0: none.
std::atomic<int> g_query_fd{0};

int QueryFd() {
  if (const int held = g_query_fd.load(std::memory_order_acquire); held != 0) return held - 1;
  // A static's guard, not std::call_once: that sets thread-locals of libstdc++, whose first use
  // under ASan maps a page (its record of the thread's TLS blocks), and the first question about
  // the maps must not change them (ProcessMaps.TheQueryAndTheTextAgree: its hole was mapped).
  static const bool forgotten_in_children = [] {
    return pthread_atfork(nullptr, nullptr,
                          [] { g_query_fd.store(0, std::memory_order_relaxed); }) == 0;
  }();
  (void)forgotten_in_children;
  const int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  int held = 0;
  if (!g_query_fd.compare_exchange_strong(held, fd + 1, std::memory_order_acq_rel)) {
    close(fd);  // another thread's is in: `held` names it
    return held - 1;
  }
  return fd;
}

// Asked once the kernel answers (MapsQueryWorks): a failure other than a hole means the descriptor
// is no longer ours (the application may close every descriptor it did not open). It is dropped,
// not closed (its number may be another file's now), and one failing at the first question is
// opened again once. `names`: fill Mapping::path (the kernel then writes out the file's path: ~0.4
// us more for a file, as the query itself takes ~0.9).
Query ForEachMappingByQuery(uintptr_t start, uintptr_t end,
                            const std::function<bool(const Mapping&)>& fn, bool names = true) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    const int fd = QueryFd();
    if (fd < 0) return Query::kUnsupported;
    Query result = Query::kDone;
    bool stale = false;
    for (uintptr_t covered = start; covered < end;) {
      Mapping m{};
      ProcmapQuery q{};
      q.size = sizeof q;
      q.query_addr = covered;  // the mapping covering it, or ENOENT: a hole
      if (names) {
        q.vma_name_addr = reinterpret_cast<uintptr_t>(m.path);
        q.vma_name_size = sizeof m.path;
      }
      if (ioctl(fd, kProcmapQuery, &q) != 0) {
        result = errno == ENOENT ? Query::kRefused : Query::kUnsupported;
        if (result == Query::kUnsupported) {
          g_query_fd.store(0, std::memory_order_release);
          stale = covered == start;  // nothing was handed to `fn` yet: ask again
        }
        break;
      }
      m.start = q.vma_start;
      m.end = q.vma_end;
      m.perms[0] = (q.vma_flags & kVmaReadable) ? 'r' : '-';
      m.perms[1] = (q.vma_flags & kVmaWritable) ? 'w' : '-';
      m.perms[2] = (q.vma_flags & kVmaExecutable) ? 'x' : '-';
      m.perms[3] = (q.vma_flags & kVmaShared) ? 's' : 'p';
      m.offset = q.vma_offset;
      m.inode = q.inode;
      if (q.vma_name_size == 0) m.path[0] = '\0';
      if (!fn(m)) {
        result = Query::kRefused;
        break;
      }
      covered = m.end;
    }
    if (!stale) return result;
  }
  return Query::kUnsupported;
}

}  // namespace

bool MapsQueryWorks() {
  int works = g_query_works.load(std::memory_order_relaxed);
  if (works < 0) {
    // The first page of the stack is mapped in every process: a kernel with the query answers.
    int probe = 0;
    ProcmapQuery q{};
    q.size = sizeof q;
    q.query_addr = reinterpret_cast<uintptr_t>(&probe);
    const int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    works = fd >= 0 && ioctl(fd, kProcmapQuery, &q) == 0;
    if (fd >= 0) close(fd);
    g_query_works.store(works, std::memory_order_relaxed);
  }
  return works == 1;
}

bool ForEachMapping(uintptr_t start, uintptr_t end, const std::function<bool(const Mapping&)>& fn,
                    MapsSource source) {
  if (source != MapsSource::kText && MapsQueryWorks()) {
    // A failure past the first mapping (not a hole) reads as a refusal: the callers' answers are
    // then the cautious ones (not the arena's, not private memory).
    return ForEachMappingByQuery(start, end, fn) == Query::kDone;
  }
  if (source == MapsSource::kQuery) return false;
  return ForEachMappingInText(start, end, fn);
}

void ForEveryMapping(const std::function<bool(const Mapping&)>& fn) {
  FILE* f = std::fopen("/proc/self/maps", "re");
  if (!f) return;
  char line[512];
  Mapping m{};
  while (std::fgets(line, sizeof line, f))
    if (ParseMapping(line, &m) && !fn(m)) break;
  std::fclose(f);
}

namespace {

uintptr_t PageSize() {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  return page;
}

// [start, end): the pages of [addr, addr+length) from the first one's start; false when the range
// wraps the address space.
bool PagesOf(const void* addr, uint64_t length, uintptr_t* start, uintptr_t* end) {
  *start = reinterpret_cast<uintptr_t>(addr) & ~(PageSize() - 1);
  *end = reinterpret_cast<uintptr_t>(addr) + length;
  return *end >= *start;
}

}  // namespace

bool IsMapped(const void* addr, uint64_t length) {
  uintptr_t start, end;
  if (!PagesOf(addr, length, &start, &end)) return false;
  return msync(reinterpret_cast<void*>(start), end - start, MS_ASYNC) == 0 || errno != ENOMEM;
}

namespace {

bool PopulateWorks() {
  static const bool works = [] {
    int probe = 0;
    const uintptr_t at = reinterpret_cast<uintptr_t>(&probe) & ~(PageSize() - 1);
    return madvise(reinterpret_cast<void*>(at), PageSize(), kMadvPopulateRead) == 0;
  }();
  return works;
}

// By the mappings' protections (PROCMAP_QUERY): one question per mapping, whatever its size.
enum class Answer { kYes, kNo, kCannotTell };

Answer AccessibleByQuery(uintptr_t start, uintptr_t end, bool write) {
  const Query r = ForEachMappingByQuery(
      start, end, [write](const Mapping& m) { return m.perms[write ? 1 : 0] != '-'; }, false);
  return r == Query::kDone      ? Answer::kYes
         : r == Query::kRefused ? Answer::kNo
                                : Answer::kCannotTell;
}

// By faulting the pages in, as the kernel's pinning does: ~0.25 us a page.
bool AccessibleByPopulate(uintptr_t start, uintptr_t end, bool write) {
  int r;
  do {
    r = madvise(reinterpret_cast<void*>(start), end - start,
                write ? kMadvPopulateWrite : kMadvPopulateRead);
  } while (r != 0 && errno == EINTR);
  return r == 0;
}

// Protections unknown on kernels with neither: whether the pages are mapped at all.
bool AccessibleNow(uintptr_t start, uintptr_t end, bool write, MapsSource source) {
  if (source != MapsSource::kText && MapsQueryWorks()) {
    const Answer a = AccessibleByQuery(start, end, write);
    if (a != Answer::kCannotTell) return a == Answer::kYes;
  }
  if (source != MapsSource::kQuery && PopulateWorks())
    return AccessibleByPopulate(start, end, write);
  return IsMapped(reinterpret_cast<const void*>(start), end - start);
}

}  // namespace

bool CanAccess(const void* addr, uint64_t length, bool write, MapsSource source) {
  if (length == 0) return true;
  uintptr_t start, end;
  if (!PagesOf(addr, length, &start, &end)) return false;
  for (int tries = 0; tries < 2; ++tries) {
    if (AccessibleNow(start, end, write, source)) return true;
    // Pages another thread is moving onto shared memory are read-only meanwhile (PageMoveGuard).
    if (!write || !PageMoveGuard::AwaitMoveOver()) return false;
  }
  return false;
}

}  // namespace softrdma::link
