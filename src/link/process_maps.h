// What this process has mapped where, as /proc/self/maps tells it. Since Linux 6.11 the mapping at
// an address can be asked for directly (the PROCMAP_QUERY ioctl), so looking at a range costs the
// mappings it covers; before, every line up to the range is read — with one mapping per shared
// region, deregistering N regions read O(N²) lines (2,000 regions of 16 KiB: 1.6 s).
#pragma once

#include <cstdint>
#include <functional>

namespace softrdma::link {

struct Mapping {
  uintptr_t start, end;
  char perms[5];  // "rw-p"
  uint64_t offset;
  uint64_t inode;
  char path[256];  // "" for anonymous memory
};

enum class MapsSource {
  kBest,   // the query where the kernel has it, else the text
  kQuery,  // the query alone (false when the kernel lacks it)
  kText,   // the text alone
};

// Calls `fn` for each mapping overlapping [start, end), in address order; false if `fn` refuses one
// or a hole leaves part of the range unmapped.
bool ForEachMapping(uintptr_t start, uintptr_t end, const std::function<bool(const Mapping&)>& fn,
                    MapsSource source = MapsSource::kBest);
// Calls `fn` for every mapping of the process, in address order, until it returns false.
void ForEveryMapping(const std::function<bool(const Mapping&)>& fn);
// Whether the kernel answers PROCMAP_QUERY.
bool MapsQueryWorks();
// Whether every page of [addr, addr+length) is mapped, by one system call that touches none of
// them (msync says ENOMEM for a hole): what the kernel's pinning answers with EFAULT.
bool IsMapped(const void* addr, uint64_t length);
// madvise(2) advice of Linux 5.14 that Debian 12's headers predate: fault the pages in.
constexpr int kMadvPopulateRead = 22, kMadvPopulateWrite = 23;
// Whether every page of [addr, addr+length) may be read (`write`: written): false for a hole or a
// mapping without that protection. Asked of the mappings (PROCMAP_QUERY, Linux 6.11), else by
// faulting the pages in as the kernel's pinning does (MADV_POPULATE_READ/WRITE, Linux 5.14, which
// also refuses a page past the end of its file); older kernels answer IsMapped's question only.
// `source` kText: without the query; kQuery: without faulting pages in.
bool CanAccess(const void* addr, uint64_t length, bool write,
               MapsSource source = MapsSource::kBest);

}  // namespace softrdma::link
