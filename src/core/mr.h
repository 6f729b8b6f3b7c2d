// Memory regions and the process-wide key table. Every byte the device reads or writes on behalf of
// a work request or a remote peer goes through Resolve(), which checks key, PD, bounds and rights.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <unordered_map>

namespace softrdma::core {

struct Pd {
  uint32_t handle;
};

struct Mr {
  const Pd* pd;
  uint8_t* addr;  // host address of the first byte
  uint64_t length;
  uint64_t iova;              // the address remote peers use for the first byte
  int access;                 // ibv_access_flags
  uint32_t key;               // lkey == rkey
  uint64_t registration = 0;  // its link::SharedMemory registration id (never 0 once registered)
  // Host bytes [reach_begin, reach_end) are in its window: same-host peers write them directly.
  uintptr_t reach_begin = 0, reach_end = 0;
  // Registered over device memory (ibv_reg_dm_mr(3)): zero-based for local pieces too, which name
  // offsets, not host addresses.
  bool device_memory = false;
};

// A memory window: remote access to part of a region, under its own key. The key's upper 24 bits
// name the window for its whole life; a bind changes the low 8 (ibv_inc_rkey(3)).
struct Mw {
  const Pd* pd;
  int type;  // 1, or 2 (bound by a work request, to a queue pair)
  uint32_t rkey;
  bool bound = false;
  uint32_t mr_key = 0;  // the region it is bound to
  uint64_t base = 0;    // remote address of the window's first byte (0 when zero-based)
  uint64_t offset = 0;  // where the window starts in the region, in bytes
  uint64_t length = 0;
  int access = 0;    // the remote rights the bind granted
  uint32_t qpn = 0;  // type 2: the only QP through which it may be reached
};

// The host address `offset` bytes into `m`. By integer: an implicit region on demand starts at
// address 0, and arithmetic on a null pointer is undefined.
inline uint8_t* HostAt(const Mr& m, uint64_t offset) {
  return reinterpret_cast<uint8_t*>(reinterpret_cast<uintptr_t>(m.addr) + offset);
}

enum class KeyCheck { kOk, kBadKey, kBadPd, kBadRange, kBadAccess };

class MrTable {
 public:
  MrTable();

  // A caller's memory of the regions it looked up (a QP's, used under the QP's lock): a lookup it
  // answers costs no lock, and holds while the table has not changed since (a read lock and a hash
  // lookup were a fifth of the library's time per direct atomic).
  class Cache {
    friend class MrTable;
    static constexpr uint32_t kWays = 4;  // direct-mapped by key: a work request's keys coexist
    struct Entry {
      uint64_t table = 0;
      uint64_t generation = 0;
      Mr mr{};
    } entries_[kWays];
  };
  // Assigns a fresh unpredictable key and publishes the region.
  uint32_t Insert(const Mr& mr);
  // False when there is no such region, or (with *busy set) while windows are bound to it:
  // ibv_dereg_mr(3) fails then.
  bool Remove(uint32_t key, bool* busy = nullptr);
  bool Update(uint32_t key, const Mr& mr);  // rereg: same key, new attributes
  bool Get(uint32_t key, Mr* out) const;
  size_t size() const;

  // Translates [va, va+len) under `key` into host memory, checking that the key exists, belongs to
  // `pd`, covers the range, and grants every bit of `access`. `local` selects address space:
  // local SGEs address host memory directly, remote requests address the region's iova.
  // A remote key may also name a bound window; `qpn` is the QP the request came through.
  // `iova`, when given, receives the address remote peers use for `va` (a region's key only).
  // `cache`, when given, answers a region's key while the table has not changed.
  uint8_t* Resolve(uint32_t key, const Pd* pd, uint64_t va, uint64_t len, int access, bool local,
                   KeyCheck* why, uint32_t qpn = 0, uint64_t* iova = nullptr,
                   Cache* cache = nullptr) const;

  // Whether same-host peers reach the local piece [va, va+len) of `key` directly (its window
  // covers it). False too when there is no such region.
  bool Reachable(uint32_t key, uint64_t va, uint64_t len, Cache* cache) const {
    Mr m;
    return Lookup(key, &m, cache) && Reaches(m, va, len);
  }

  // Resolve of a local piece when `cache` answers it, nullptr otherwise (then Resolve says why).
  // Inline, for the direct paths: through Resolve the cache's answer cost a sixth of the time
  // per direct atomic.
  uint8_t* ResolveLocalCached(uint32_t key, const Pd* pd, uint64_t va, uint64_t len, int access,
                              const Cache& cache) const {
    const Mr* m = Cached(key, cache);
    if (!m || !CoversLocal(*m, pd, va, len, access)) return nullptr;
    return m->addr + (va - reinterpret_cast<uint64_t>(m->addr));
  }

  // A local, writable piece of a receive WQE that same-host peers may be handed: its host address,
  // the iova peers name it by and whether their window covers it (as Reachable). nullptr when
  // Resolve would refuse it.
  // One lookup, inline when `cache` answers it: the refill of every message's receive WQE ran
  // Resolve and Reachable, two lookups that each copied the region.
  uint8_t* ResolveRecvPiece(uint32_t key, const Pd* pd, uint64_t va, uint64_t len, uint64_t* iova,
                            bool* reachable, Cache* cache) const {
    Mr found;
    const Mr* m = Cached(key, *cache);
    if (!m && LookupInTable(key, &found, cache)) m = &found;
    if (!m || !CoversLocal(*m, pd, va, len, IBV_ACCESS_LOCAL_WRITE)) return nullptr;
    const uint64_t offset = va - reinterpret_cast<uint64_t>(m->addr);
    *iova = m->iova + offset;
    *reachable = Reaches(*m, va, len);
    return m->addr + offset;
  }

  // Changes whenever a region is removed or changed: an address resolved before holds while it
  // has not.
  uint64_t generation() const { return generation_.load(std::memory_order_acquire); }

  // Memory windows. Alloc returns the first key, whose upper 24 bits name the window.
  uint32_t AllocMw(const Pd* pd, int type);
  void FreeMw(uint32_t rkey);
  struct Bind {
    uint32_t mw_rkey;   // the window's current key (its upper bits name it)
    uint32_t new_rkey;  // what it is reached by afterwards
    const Pd* pd;       // the binding QP's
    uint32_t qpn;
    uint32_t mr_key;  // 0 with length 0: unbind (type 1)
    uint64_t addr, length;
    int access;
    bool type1;  // through ibv_bind_mw, not a work request
  };
  // IBV_WC_SUCCESS, or the status the bind's completion carries.
  ibv_wc_status BindMw(const Bind& b);
  // Invalidates the type 2 window reached by `rkey` (LOCAL_INV, or SEND_WITH_INV when `qpn`).
  bool InvalidateMw(uint32_t rkey, const Pd* pd, uint32_t qpn);

 private:
  uint8_t* ResolveWindowLocked(uint32_t key, const Pd* pd, uint64_t va, uint64_t len, int access,
                               KeyCheck* why, uint32_t qpn) const;
  // The region of `key`, from `cache` when it holds the key for this table as it is now, else from
  // the table (and then remembered in `cache`). False: no region has that key. Inline: a hit is
  // on the path of every direct operation.
  bool Lookup(uint32_t key, Mr* out, Cache* cache) const {
    if (const Mr* m = cache ? Cached(key, *cache) : nullptr) {
      *out = *m;
      return true;
    }
    return LookupInTable(key, out, cache);
  }
  // The region `cache` remembers for `key`, when it does for this table as it is now.
  const Mr* Cached(uint32_t key, const Cache& cache) const {
    const Cache::Entry& c = cache.entries_[key % Cache::kWays];
    return c.table == id_ && c.generation == generation_.load(std::memory_order_acquire) &&
                   c.mr.key == key && key != 0
               ? &c.mr
               : nullptr;
  }
  bool LookupInTable(uint32_t key, Mr* out, Cache* cache) const;
  // Resolve's checks of a local piece: `m` is `pd`'s, holds [va, va+len) (overflow-safe), grants
  // `access`. A region on demand or over device memory is never answered here: Resolve checks
  // that the pages are mapped, or addresses the device memory from 0.
  static bool CoversLocal(const Mr& m, const Pd* pd, uint64_t va, uint64_t len, int access) {
    const uint64_t base = reinterpret_cast<uint64_t>(m.addr);
    return m.pd == pd && !(m.access & IBV_ACCESS_ON_DEMAND) && !m.device_memory && va >= base &&
           va - base <= m.length && len <= m.length - (va - base) && (m.access & access) == access;
  }
  // Whether same-host peers reach host bytes [va, va+len) of `m` directly.
  static bool Reaches(const Mr& m, uint64_t va, uint64_t len) {
    return va >= m.reach_begin && va <= m.reach_end && len <= m.reach_end - va;
  }
  // Distinguishes tables in caches, and changes whenever a region is removed or changed (under
  // mu_, written).
  const uint64_t id_;
  std::atomic<uint64_t> generation_{1};
  mutable std::shared_mutex mu_;
  std::unordered_map<uint32_t, Mr> by_key_;
  std::unordered_map<uint32_t, Mw> mws_;  // by key >> 8
};

}  // namespace softrdma::core
