// Direct access for same-host peers: the windows (registered regions) and endpoints (queue pairs)
// of this process, published in a shared table, so that a peer executes one-sided operations
// (RDMA WRITE, READ, atomics) itself, on our arena, without waiting for us to wake up. The link
// does not know what the rights and domains mean; the core publishes its regions and QPs with
// their access flags and protection domains, and checks a peer's table before every access:
//   endpoint: the id names an open endpoint whose rights include what is asked;
//   window:   the key exists, belongs to the endpoint's domain, grants the rights and contains
//             the range, which lies in the arena.
// A window being withdrawn (deregistration) waits until no peer is inside an access: a peer
// counts itself in (users), then re-checks the key; the owner invalidates the key, then waits for
// the count to drop (bounded: a peer that died inside an access cannot block it forever).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>

namespace softrdma::link {

constexpr uint32_t kWindowSlots = 1u << 16;
constexpr uint32_t kEndpointSlots = 8192;
constexpr uint32_t kWindowTombstone = 0xffffffffu;

struct alignas(64) WindowEntry {
  std::atomic<uint32_t> key;  // 0: never used; kWindowTombstone: withdrawn
  uint32_t domain;
  uint64_t base;  // the address peers name for the first byte
  uint64_t len;
  uint64_t arena_offset;
  uint32_t rights;
  std::atomic<uint32_t> users;  // peers inside an access
};
static_assert(sizeof(WindowEntry) == 64);

struct EndpointEntry {
  std::atomic<uint32_t> id;  // 0: none
  uint32_t domain;
  std::atomic<uint32_t> rights;  // 0 while closed
  uint32_t reserved;
};
static_assert(sizeof(EndpointEntry) == 16);

struct WindowTable {
  WindowEntry windows[kWindowSlots];
  EndpointEntry endpoints[kEndpointSlots];
};

// This process's table (owner side).
class SharedWindows {
 public:
  static SharedWindows& Get();
  // The table's descriptor (read-write: peers count themselves in), -1 if it could not be made.
  int fd();
  // Publishes [addr, addr+len) under `key` when all of it lies in the arena.
  void Publish(uint32_t key, uint32_t domain, uint64_t base, const void* addr, uint64_t len,
               uint32_t rights);
  // Withdraws `key`; returns once no peer is inside an access to it.
  void Withdraw(uint32_t key);
  // Endpoint `id` (its low bits pick the slot) takes these rights; 0 closes it.
  void SetEndpoint(uint32_t id, uint32_t domain, uint32_t rights);
  void AfterForkInChild();

 private:
  bool EnsureLocked();
  std::mutex mu_;  // owners: one writer at a time
  WindowTable* table_ = nullptr;
  int fd_ = -1;
};

// A peer's table and arena, mapped read-write. Safe against a hostile owner: every access is
// bounded by what we mapped.
class PeerWindows {
 public:
  // Takes both descriptors. nullptr when they cannot be mapped.
  static PeerWindows* Map(int table_fd, int arena_fd);
  ~PeerWindows();

  enum class Access { kDone, kRefused };
  // Runs fn(pointer) on [addr, addr+len) of window `key`, reached through endpoint `endpoint`,
  // when every check passes; kRefused otherwise (the caller then goes the long way, where the
  // peer answers with the proper error).
  template <typename Fn>
  Access With(uint32_t key, uint32_t endpoint, uint64_t addr, uint64_t len, uint32_t rights,
              Fn fn) {
    WindowEntry* w = nullptr;
    uint8_t* p = Enter(key, endpoint, addr, len, rights, &w);
    if (!p) return Access::kRefused;
    fn(p);
    w->users.fetch_sub(1, std::memory_order_release);
    return Access::kDone;
  }

 private:
  PeerWindows() = default;
  // The host address of the range, with the peer counted in on `*w`; nullptr when refused.
  uint8_t* Enter(uint32_t key, uint32_t endpoint, uint64_t addr, uint64_t len, uint32_t rights,
                 WindowEntry** w);
  bool ArenaCovers(uint64_t end);

  WindowTable* table_ = nullptr;
  uint8_t* arena_ = nullptr;
  size_t arena_reserved_ = 0;            // virtual size of the arena mapping
  std::atomic<uint64_t> arena_size_{0};  // file size seen (never shrinks: sealed)
  int table_fd_ = -1, arena_fd_ = -1;
};

}  // namespace softrdma::link
