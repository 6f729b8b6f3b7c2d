#include "core/mr.h"

#include <infiniband/verbs.h>

#include <algorithm>
#include <mutex>

#include "core/unpredictable.h"
#include "link/page_move_guard.h"
#include "link/process_maps.h"
#include "link/shared_memory.h"
#include "link/shared_windows.h"

namespace softrdma::core {
namespace {

constexpr int kRemoteRights =
    IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

// Same-host peers reach a region's memory directly when it lies in the arena: for one-sided
// operations its remote rights allow, and to place SENDs in the receive buffers of a QP that
// published its receive queue (kRecvRight: the region is writable locally).
uint32_t WindowRights(const Mr& m) {
  uint32_t rights = static_cast<uint32_t>(m.access & kRemoteRights);
  if (m.access & IBV_ACCESS_LOCAL_WRITE) rights |= link::kRecvRight;
  return rights;
}

// On-demand regions (ibv_reg_mr(3), IBV_ACCESS_ON_DEMAND) stay where the application keeps them:
// their pages need not exist yet, the application may unmap and map them again, and an implicit
// one spans the whole address space. Peers reach them by frames, and every access checks that the
// pages are there (Resolve).
bool OnDemand(const Mr& m) {
  return (m.access & IBV_ACCESS_ON_DEMAND) != 0;
}

// Regions peers reach by frames only: on demand, or over device memory (which is small and
// addressed from 0 locally too; frames keep the direct paths to host addresses).
bool StaysPrivate(const Mr& m) {
  return OnDemand(m) || m.device_memory;
}

// Whether the `len` bytes at `host` of `m` may be touched for `access`: an on-demand page that is
// not mapped, or not writable for a write, faults on an HCA too, and the access fails. Every path
// to a region's bytes asks (Resolve, and windows bound to it).
bool PagesThere(const Mr& m, const uint8_t* host, uint64_t len, int access) {
  constexpr int kWrites =
      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
  return !OnDemand(m) || link::CanAccess(host, len, (access & kWrites) != 0);
}

void PublishWindow(const Mr& m) {
  if (StaysPrivate(m)) return;
  if (uint32_t rights = WindowRights(m))
    link::SharedWindows::Get().Publish(m.key, m.pd->handle, m.iova, m.addr, m.length, rights);
}

// Shares the region's pages (best effort) and notes the part its window will cover.
void Share(Mr* m) {
  link::InstallFaultHandler();  // for placements into pages made read-only later
  if (StaysPrivate(*m)) return;
  m->registration = link::SharedMemory::Get().Share(m->addr, m->length);
  uint64_t skip, len, offset;
  if (WindowRights(*m) &&
      link::SharedWindows::ReachablePart(m->addr, m->length, &skip, &len, &offset)) {
    m->reach_begin = reinterpret_cast<uintptr_t>(m->addr) + skip;
    m->reach_end = m->reach_begin + len;
  }
}

}  // namespace

MrTable::MrTable()
    : id_([] {
        static std::atomic<uint64_t> next{1};
        return next.fetch_add(1, std::memory_order_relaxed);
      }()) {}

uint32_t MrTable::Insert(const Mr& mr) {
  // Large regions become readable by same-host peers (outside the table's lock: it parses maps).
  Mr m = mr;
  Share(&m);
  {
    std::unique_lock<std::shared_mutex> g(mu_);
    for (;;) {
      uint32_t key = UnpredictableU32();
      if (key == 0 || key == link::kWindowTombstone || by_key_.count(key) || mws_.count(key >> 8))
        continue;  // 0 stays invalid so it never matches by chance; windows own their 24 bits
      m.key = key;
      by_key_.emplace(key, m);
      break;
    }
  }
  PublishWindow(m);
  return m.key;
}

bool MrTable::Remove(uint32_t key, bool* busy) {
  Mr old;
  {
    std::unique_lock<std::shared_mutex> g(mu_);
    auto it = by_key_.find(key);
    if (it == by_key_.end()) return false;
    if (std::any_of(mws_.begin(), mws_.end(),
                    [&](const auto& m) { return m.second.bound && m.second.mr_key == key; })) {
      if (busy) *busy = true;
      return false;
    }
    old = it->second;
    by_key_.erase(it);
    generation_.fetch_add(1, std::memory_order_release);
  }
  link::SharedWindows::Get().Withdraw(key);  // no peer inside it once this returns
  link::SharedMemory::Get().Unshare(old.registration, old.addr);
  return true;
}

bool MrTable::Update(uint32_t key, const Mr& mr) {
  Mr m = mr;
  m.key = key;
  Share(&m);
  Mr old;
  {
    std::unique_lock<std::shared_mutex> g(mu_);
    auto it = by_key_.find(key);
    if (it == by_key_.end()) {
      g.unlock();
      link::SharedMemory::Get().Unshare(m.registration, mr.addr);
      return false;
    }
    old = it->second;
    it->second = m;
    generation_.fetch_add(1, std::memory_order_release);
  }
  link::SharedWindows::Get().Withdraw(key);
  link::SharedMemory::Get().Unshare(old.registration, old.addr);
  PublishWindow(m);
  return true;
}

bool MrTable::Get(uint32_t key, Mr* out) const {
  std::shared_lock<std::shared_mutex> g(mu_);
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return false;
  *out = it->second;
  return true;
}

size_t MrTable::size() const {
  std::shared_lock<std::shared_mutex> g(mu_);
  return by_key_.size();
}

bool MrTable::LookupInTable(uint32_t key, Mr* out, Cache* cache) const {
  Cache::Entry* c = cache ? &cache->entries_[key % Cache::kWays] : nullptr;
  std::shared_lock<std::shared_mutex> g(mu_);
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return false;
  *out = it->second;
  if (c) *c = Cache::Entry{id_, generation_.load(std::memory_order_relaxed), it->second};
  return true;
}

uint8_t* MrTable::Resolve(uint32_t key, const Pd* pd, uint64_t va, uint64_t len, int access,
                          bool local, KeyCheck* why, uint32_t qpn, uint64_t* iova,
                          Cache* cache) const {
  Mr m;
  if (!Lookup(key, &m, cache)) {
    if (!local) {
      std::shared_lock<std::shared_mutex> g(mu_);
      return ResolveWindowLocked(key, pd, va, len, access, why, qpn);
    }
    *why = KeyCheck::kBadKey;  // a window's key is no local key
    return nullptr;
  }
  if (m.pd != pd) {
    *why = KeyCheck::kBadPd;
    return nullptr;
  }
  uint64_t base = local && !m.device_memory ? reinterpret_cast<uint64_t>(m.addr) : m.iova;
  // Overflow-safe containment: va >= base and va + len <= base + length.
  if (va < base || va - base > m.length || len > m.length - (va - base)) {
    *why = KeyCheck::kBadRange;
    return nullptr;
  }
  if ((m.access & access) != access) {
    *why = KeyCheck::kBadAccess;
    return nullptr;
  }
  uint8_t* host = HostAt(m, va - base);
  if (!PagesThere(m, host, len, access)) {
    *why = KeyCheck::kBadRange;
    return nullptr;
  }
  *why = KeyCheck::kOk;
  if (iova) *iova = m.iova + (va - base);
  return host;
}

namespace {

// Overflow-safe: [va, va+len) lies within [base, base+length).
bool Within(uint64_t va, uint64_t len, uint64_t base, uint64_t length) {
  return va >= base && va - base <= length && len <= length - (va - base);
}

constexpr uint32_t kMwIndexMask = 0xffffff;

}  // namespace

uint8_t* MrTable::ResolveWindowLocked(uint32_t key, const Pd* pd, uint64_t va, uint64_t len,
                                      int access, KeyCheck* why, uint32_t qpn) const {
  auto it = mws_.find(key >> 8);
  if (it == mws_.end() || !it->second.bound || it->second.rkey != key) {
    *why = KeyCheck::kBadKey;
    return nullptr;
  }
  const Mw& w = it->second;
  if (w.pd != pd) {
    *why = KeyCheck::kBadPd;
    return nullptr;
  }
  if (w.type == 2 && w.qpn != qpn) {  // IBTA o10-37: a type 2 window answers its own QP only
    *why = KeyCheck::kBadKey;
    return nullptr;
  }
  if (!Within(va, len, w.base, w.length)) {
    *why = KeyCheck::kBadRange;
    return nullptr;
  }
  if ((w.access & access) != access) {
    *why = KeyCheck::kBadAccess;
    return nullptr;
  }
  auto m = by_key_.find(w.mr_key);  // present: a region with bound windows is not deregistered
  if (m == by_key_.end()) {
    *why = KeyCheck::kBadKey;
    return nullptr;
  }
  uint8_t* host = HostAt(m->second, w.offset + (va - w.base));
  if (!PagesThere(m->second, host, len, access)) {
    *why = KeyCheck::kBadRange;
    return nullptr;
  }
  *why = KeyCheck::kOk;
  return host;
}

uint32_t MrTable::AllocMw(const Pd* pd, int type) {
  std::unique_lock<std::shared_mutex> g(mu_);
  for (;;) {
    uint32_t index = UnpredictableU32() & kMwIndexMask;
    // Index 0 would give key 0; the last index's last tag is the window table's tombstone.
    if (index == 0 || index == kMwIndexMask || mws_.count(index)) continue;
    bool taken = false;
    for (const auto& [key, mr] : by_key_) taken = taken || (key >> 8) == index;
    if (taken) continue;
    uint32_t rkey = index << 8 | (UnpredictableU32() & 0xff);
    mws_.emplace(index, Mw{pd, type, rkey});
    return rkey;
  }
}

void MrTable::FreeMw(uint32_t rkey) {
  std::unique_lock<std::shared_mutex> g(mu_);
  mws_.erase(rkey >> 8);
}

ibv_wc_status MrTable::BindMw(const Bind& b) {
  std::unique_lock<std::shared_mutex> g(mu_);
  auto it = mws_.find(b.mw_rkey >> 8);
  if (it == mws_.end()) return IBV_WC_MW_BIND_ERR;
  Mw& w = it->second;
  // Type 1 windows bind through ibv_bind_mw, type 2 through a work request, and a type 2 window
  // must be invalidated before it binds again, keeping its index in the new key.
  if (w.pd != b.pd || b.type1 != (w.type == 1)) return IBV_WC_MW_BIND_ERR;
  if (w.type == 2 && (w.bound || (b.new_rkey >> 8) != (w.rkey >> 8))) return IBV_WC_MW_BIND_ERR;
  if (w.type == 1 && b.length == 0) {  // ibv_alloc_mw(3): a zero-length bind invalidates
    w.bound = false;
    w.rkey = b.new_rkey;
    return IBV_WC_SUCCESS;
  }
  auto m = by_key_.find(b.mr_key);
  if (m == by_key_.end()) return IBV_WC_MW_BIND_ERR;
  const Mr& mr = m->second;
  if (mr.pd != w.pd || !(mr.access & IBV_ACCESS_MW_BIND)) return IBV_WC_MW_BIND_ERR;
  // Remote writes and atomics through the window need local write on the region (ibv_bind_mw(3)).
  if ((b.access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
      !(mr.access & IBV_ACCESS_LOCAL_WRITE))
    return IBV_WC_MW_BIND_ERR;
  if (!Within(b.addr, b.length, mr.iova, mr.length)) return IBV_WC_MW_BIND_ERR;
  w.bound = true;
  w.rkey = b.new_rkey;
  w.mr_key = b.mr_key;
  w.offset = b.addr - mr.iova;
  w.base = (b.access & IBV_ACCESS_ZERO_BASED) ? 0 : b.addr;
  w.length = b.length;
  w.access = b.access & kRemoteRights;
  w.qpn = b.qpn;
  return IBV_WC_SUCCESS;
}

bool MrTable::InvalidateMw(uint32_t rkey, const Pd* pd, uint32_t qpn) {
  std::unique_lock<std::shared_mutex> g(mu_);
  auto it = mws_.find(rkey >> 8);
  if (it == mws_.end()) return false;
  Mw& w = it->second;
  if (w.type != 2 || !w.bound || w.rkey != rkey || w.pd != pd) return false;
  if (qpn != 0 && w.qpn != qpn) return false;  // remote invalidation: through its own QP only
  w.bound = false;
  return true;
}

}  // namespace softrdma::core
