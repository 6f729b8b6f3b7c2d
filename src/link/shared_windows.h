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
// the count to drop (bounded: a peer that died inside an access cannot block it forever). A peer
// placing a SEND counts nothing: it takes a WQE of the receive queue by compare-and-swap from a
// value read before its checks, and a withdrawal seals every open receive queue (the swaps of
// senders between their checks and their take fail) and waits for the WQEs already taken to be
// done (DirectRecvQueue).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

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
  // Counts the publications in this slot: a peer's memo of an entry (PeerWindows::Memo) holds
  // while key and publication are unchanged (ibv_rereg_mr(3) publishes the same key anew).
  std::atomic<uint32_t> publication;
};
static_assert(sizeof(WindowEntry) == 64);
static_assert(offsetof(WindowEntry, publication) == 40);

struct EndpointEntry {
  std::atomic<uint32_t> id;  // 0: none
  uint32_t domain;
  std::atomic<uint32_t> rights;  // 0 while closed
  uint32_t reserved;
};
static_assert(sizeof(EndpointEntry) == 16);

// The right a window grants, and an endpoint takes, for a peer's SEND to land in it directly:
// the window's region is writable locally (receive buffers), the endpoint's receive queue is
// published below. Not an ibv_access_flags bit.
constexpr uint32_t kRecvRight = 1u << 30;

// The head of an endpoint's receive queue, published for the peer's SENDs (docs/architecture.md
// §12, "Direct SENDs"). The owner publishes receive WQEs (at most kDirectRecvSlots ahead of the
// completions it has collected) by setting their slots' state to posted; the one that takes a
// WQE — the sender, or the owner's own responder for a SEND that came as a frame — advances
// `taken` by compare-and-swap, so a WQE is taken once. A sender that placed the message marks
// the slot done and counts it in WindowTable::recvs_done; the owner turns done slots into
// completions, in order. The header line is the sender's: the owner writes it only to open,
// close, seal, or take WQEs back, so that it stays in the sender's cache from message to message.
//
// `taken` holds the count of WQEs taken (low half) and a seal (high half). A sender reads it
// before it checks the endpoint and the windows of the WQE's pieces, and takes the WQE by
// compare-and-swap from what it read. To close the queue or withdraw a window, the owner first
// revokes (the endpoint's right, the window's key), then seals: it raises the seal, so that the
// swap of a sender that checked before the revocation fails, and waits (bounded) until every WQE
// taken before is done. A sender that read `taken` after the seal sees the revocation. So no
// sender counts itself in or out: that was two locked instructions on every message's path.
constexpr uint32_t kDirectRecvSlots = 8;
// Published WQEs at or below which the owner refills at once, even where its application waits.
constexpr uint32_t kDirectRecvLow = 2;
constexpr uint32_t kDirectRecvSges = 3;
// A slot's state: what (bits 0-7), flags (8-15) and the low 16 bits of the WQE's count (16-31),
// so that a state left from the slot's previous use never reads as current: neither side clears
// a slot after use (a store to a line the other side just wrote costs a transfer on the path).
namespace direct_recv {
constexpr uint32_t kPosted = 1;  // owner: the WQE's scatter list is in the slot
constexpr uint32_t kDone = 2;    // sender: the message is placed; byte_len, imm and flags are set
constexpr uint32_t kTakenBack = 3;  // owner: it took the WQE itself (a frame's SEND, a close)
constexpr uint32_t kWithImm = 1;    // slot flags
constexpr uint32_t kSolicited = 2;  // slot flags
constexpr uint32_t kRdma = 4;  // slot flags: an RDMA WRITE with immediate (the WQE got no bytes)
// Slot flags: the message's bytes are in the slot, over its scatter list, for the owner to copy
// into the WQE's buffers when it collects it. A small SEND so costs the receiver one line, where
// placing it in the buffers moved their line to the sender and back once the application read it.
constexpr uint32_t kInSlot = 8;
constexpr uint32_t kInSlotBytes = 48;  // the scatter list's bytes (static_assert below)
constexpr uint32_t State(uint32_t what, uint32_t index, uint32_t flags = 0) {
  return what | (flags << 8) | (index << 16);
}
constexpr bool Is(uint32_t state, uint32_t what, uint32_t index) {
  return (state & 0xff) == what && (state >> 16) == (index & 0xffff);
}
// DirectRecvQueue::taken: the count and the seal.
constexpr uint64_t kSealStep = uint64_t{1} << 32;
constexpr uint32_t TakenCount(uint64_t taken) {
  return static_cast<uint32_t>(taken);
}
constexpr uint64_t WithCount(uint64_t taken, uint32_t count) {
  return (taken & ~uint64_t{0xffffffff}) | count;
}
// What a poller watches: the slot of the next WQE to complete and the count it is done for, in one
// word (a user-space address is below 2^48), so that a lock-free look reads both at once. 0: none.
inline uint64_t Watch(const std::atomic<uint32_t>* state, uint32_t index) {
  return reinterpret_cast<uint64_t>(state) | uint64_t{index & 0xffff} << 48;
}
// Whether the watched slot is done. The slot may have gone stale since (a collection moved on,
// the queue closed): that costs the caller one collection that finds nothing, never a fault, as
// the table is never unmapped.
inline bool WatchSeesDone(uint64_t watch) {
  if (!watch) return false;
  auto* s = reinterpret_cast<const std::atomic<uint32_t>*>(watch & ((uint64_t{1} << 48) - 1));
  return Is(s->load(std::memory_order_acquire), kDone, static_cast<uint32_t>(watch >> 48));
}
}  // namespace direct_recv

struct DirectRecvSge {
  uint64_t addr;  // as the window of `key` names it (the region's iova)
  uint32_t key;
  uint32_t len;
};
static_assert(sizeof(DirectRecvSge) == 16);

struct alignas(64) DirectRecvSlot {
  DirectRecvSge sge[kDirectRecvSges];
  uint32_t num_sge;
  uint32_t byte_len;            // sender
  uint32_t imm;                 // sender: as the work request gave it (network order)
  std::atomic<uint32_t> state;  // direct_recv::State
};
static_assert(sizeof(DirectRecvSlot) == 64);
static_assert(sizeof(DirectRecvSlot::sge) == direct_recv::kInSlotBytes);

struct alignas(64) DirectRecvQueue {
  std::atomic<uint32_t> owner;  // the endpoint id using this block, 0: free
  // The owner finds done slots by WindowTable::recvs_done, which senders then count up; else it
  // watches the next slot itself.
  std::atomic<uint32_t> counted;
  // WQEs taken, by the sender or the owner (slot = count % slots), and the seal: see above.
  std::atomic<uint64_t> taken;
  char pad[48];
  DirectRecvSlot slots[kDirectRecvSlots];
};
static_assert(sizeof(DirectRecvQueue) == 64 + 64 * kDirectRecvSlots);
static_assert(offsetof(DirectRecvQueue, taken) == 8);
static_assert(offsetof(DirectRecvQueue, slots) == 64);

struct WindowTable {
  WindowEntry windows[kWindowSlots];
  EndpointEntry endpoints[kEndpointSlots];
  DirectRecvQueue recvs[kEndpointSlots];         // by endpoint id, like `endpoints`
  alignas(64) std::atomic<uint64_t> recvs_done;  // senders: slots they marked done, ever
};

// This process's table (owner side).
class SharedWindows {
 public:
  // Inline: the direct paths ask for it several times per message (an out-of-line call with its
  // guard was a fifth of a direct receive's bookkeeping).
  static SharedWindows& Get() {
    static SharedWindows* instance = new SharedWindows();  // peers may map it until we exit
    return *instance;
  }
  // The table's descriptor (read-write: peers count themselves in), -1 if it could not be made.
  int fd();
  // The part of [addr, addr+len) a window of it covers, which peers reach directly: all of it, or
  // the whole pages inside it when its first or last page holds other data too (a buffer from
  // malloc). False when none of it lies in the arena. `*skip`: its bytes before that part.
  static bool ReachablePart(const void* addr, uint64_t len, uint64_t* skip, uint64_t* part_len,
                            uint64_t* arena_offset);
  // Publishes the part of [addr, addr+len) in the arena (ReachablePart) under `key`.
  void Publish(uint32_t key, uint32_t domain, uint64_t base, const void* addr, uint64_t len,
               uint32_t rights);
  // Withdraws `key`; returns once no peer is inside an access to it.
  void Withdraw(uint32_t key);
  // Endpoint `id` (its low bits pick the slot) takes these rights; 0 closes it.
  void SetEndpoint(uint32_t id, uint32_t domain, uint32_t rights);
  // The receive-queue block of endpoint `id`, claimed for it; nullptr when another endpoint holds
  // the block or there is no table. Release gives it back (no sender may be inside: close the
  // endpoint's kRecvRight and SealRecvQueue first). Withdraw seals every claimed block.
  DirectRecvQueue* ClaimRecvQueue(uint32_t id);
  void ReleaseRecvQueue(DirectRecvQueue* q);
  // Fails the take of every sender of `q` that checked its way in before a revocation the caller
  // made, then waits (bounded, as Withdraw) until every WQE taken before is done or was taken back
  // by the owner (whose slots say so: direct_recv::kTakenBack).
  static void SealRecvQueue(DirectRecvQueue* q);
  // Whether senders marked slots done since the last TakeRecvsDone (lock-free; a store-load fence
  // first, so that a consumer that just declared itself asleep sees what came before).
  bool RecvsPending() const {
    WindowTable* t = table_.load(std::memory_order_acquire);
    return t && t->recvs_done.load(std::memory_order_seq_cst) !=
                    recvs_seen_.load(std::memory_order_relaxed);
  }
  // Keeps RecvsPending true until the next TakeRecvsDone (a collection left some behind).
  void KeepRecvsPending() { recvs_seen_.fetch_sub(1, std::memory_order_relaxed); }
  // Notes that every slot done so far is being collected.
  void TakeRecvsDone() {
    WindowTable* t = table_.load(std::memory_order_acquire);
    if (t)
      recvs_seen_.store(t->recvs_done.load(std::memory_order_acquire), std::memory_order_relaxed);
  }
  // Whether `q` is a block of this process's table (not of the parent's, in a fork child).
  bool Owns(const DirectRecvQueue* q) const {
    WindowTable* t = table_.load(std::memory_order_relaxed);
    return t && q >= t->recvs && q < t->recvs + kEndpointSlots;
  }
  void AfterForkInChild();

 private:
  bool EnsureLocked();
  std::mutex mu_;  // owners: one writer at a time
  // Written under mu_; read without it by the lock-free checks (RecvsPending, Owns).
  std::atomic<WindowTable*> table_{nullptr};
  WindowTable* TableLocked() const { return table_.load(std::memory_order_relaxed); }
  std::atomic<uint64_t> recvs_seen_{0};
  std::vector<DirectRecvQueue*> claimed_;  // under mu_
  int fd_ = -1;
};

// A peer's table and arena, mapped read-write. Safe against a hostile owner: every access is
// bounded by what we mapped.
class PeerWindows {
 public:
  // Takes both descriptors. nullptr when they cannot be mapped.
  static PeerWindows* Map(int table_fd, int arena_fd);
  ~PeerWindows();

  // What an access found, so that the next one to the same window skips the lookup and most
  // checks (a queue pair's, used under its lock: a third of the library's time per direct atomic
  // went to them). It holds while the entry carries the same key and publication.
  struct Memo {
    uint64_t peer = 0;  // PeerWindows::id_: a mapping at a freed one's address is another
    WindowEntry* entry = nullptr;
    uint32_t key = 0, endpoint = 0, domain = 0, rights = 0, publication = 0;
    uint64_t base = 0, len = 0, arena_offset = 0;
  };

  enum class Access { kDone, kRefused };
  // Runs fn(pointer) on [addr, addr+len) of window `key`, reached through endpoint `endpoint`,
  // when every check passes; kRefused otherwise (the caller then goes the long way, where the
  // peer answers with the proper error).
  template <typename Fn>
  Access With(uint32_t key, uint32_t endpoint, uint64_t addr, uint64_t len, uint32_t rights, Fn fn,
              Memo* memo = nullptr) {
    WindowEntry* w = nullptr;
    uint8_t* p = Enter(key, endpoint, addr, len, rights, &w, memo);
    if (!p) return Access::kRefused;
    fn(p);
    Leave(w);
    return Access::kDone;
  }
  // The host address of the range, with the peer counted in on `*w` until Leave(*w); nullptr when
  // refused. `memo`, when given, answers first and remembers what the checks found.
  uint8_t* Enter(uint32_t key, uint32_t endpoint, uint64_t addr, uint64_t len, uint32_t rights,
                 WindowEntry** w, Memo* memo = nullptr) {
    if (memo && memo->entry) {
      if (uint8_t* p = EnterByMemo(*memo, key, endpoint, addr, len, rights)) {
        *w = memo->entry;
        return p;
      }
    }
    return EnterByLookup(key, endpoint, addr, len, rights, w, memo);
  }
  // The same checks, counting nothing: for a SEND's pieces, checked after OpenRecvQueue and
  // written only once a WQE was taken from what it returned (a withdrawal seals the queue).
  uint8_t* Reach(uint32_t key, uint32_t endpoint, uint64_t addr, uint64_t len, uint32_t rights,
                 Memo* memo = nullptr) {
    if (memo && memo->entry && MemoCovers(*memo, key, endpoint, addr, len, rights)) {
      const WindowEntry& e = *memo->entry;
      if (e.key.load(std::memory_order_seq_cst) == key &&
          e.publication.load(std::memory_order_relaxed) == memo->publication)
        return arena_ + memo->arena_offset + (addr - memo->base);
    }
    return ReachByLookup(key, endpoint, addr, len, rights, memo);
  }
  static void Leave(WindowEntry* w) { w->users.fetch_sub(1, std::memory_order_release); }

  // The receive queue of endpoint `endpoint` when the endpoint is open to direct SENDs (nullptr
  // otherwise), and in *taken its `taken`, read before that check: the value to take a WQE from.
  DirectRecvQueue* OpenRecvQueue(uint32_t endpoint, uint64_t* taken);
  // Counts a slot marked done (after its state), for the owner to collect.
  void NoteRecvDone() { table_->recvs_done.fetch_add(1, std::memory_order_seq_cst); }

 private:
  PeerWindows() = default;
  bool ArenaCovers(uint64_t end);
  // The entry of `key` that `endpoint` may use for `rights` (nullptr: none), and the endpoint's
  // domain.
  WindowEntry* Find(uint32_t key, uint32_t endpoint, uint64_t len, uint32_t rights,
                    uint32_t* domain);
  // The host address of [addr, addr+len) of `e` when it still holds `key` and grants the access;
  // `memo`, when given, receives what was checked.
  uint8_t* Check(WindowEntry& e, uint32_t key, uint32_t domain, uint64_t addr, uint64_t len,
                 uint32_t rights, Memo* memo = nullptr);
  // Enter through the table (Find, then Check), filling `memo` when given.
  uint8_t* EnterByLookup(uint32_t key, uint32_t endpoint, uint64_t addr, uint64_t len,
                         uint32_t rights, WindowEntry** w, Memo* memo);
  uint8_t* ReachByLookup(uint32_t key, uint32_t endpoint, uint64_t addr, uint64_t len,
                         uint32_t rights, Memo* memo);
  // Whether what `m` remembers answers this access, as far as the memo and the endpoint tell:
  // the entry's key and publication are the caller's to check.
  bool MemoCovers(const Memo& m, uint32_t key, uint32_t endpoint, uint64_t addr, uint64_t len,
                  uint32_t rights) const {
    if (len == 0 || m.peer != id_ || m.key != key || m.endpoint != endpoint ||
        (m.rights & rights) != rights || addr < m.base || addr - m.base > m.len ||
        len > m.len - (addr - m.base) ||
        m.arena_offset + (addr - m.base) + len > arena_size_.load(std::memory_order_relaxed))
      return false;
    // The endpoint is checked every time, as Find does: the peer closes it when its QP leaves RTS.
    const EndpointEntry& ep = table_->endpoints[endpoint % kEndpointSlots];
    return (ep.rights.load(std::memory_order_acquire) & rights) == rights &&
           ep.id.load(std::memory_order_relaxed) == endpoint && ep.domain == m.domain;
  }
  // Enter by `memo`: nullptr when it does not hold (then nothing is counted).
  uint8_t* EnterByMemo(const Memo& m, uint32_t key, uint32_t endpoint, uint64_t addr, uint64_t len,
                       uint32_t rights) {
    if (!MemoCovers(m, key, endpoint, addr, len, rights)) return nullptr;
    WindowEntry& e = *m.entry;
    e.users.fetch_add(1, std::memory_order_seq_cst);
    // Counted in first, then checked, as Enter: the same key and publication is the same window.
    if (e.key.load(std::memory_order_seq_cst) != key ||
        e.publication.load(std::memory_order_relaxed) != m.publication) {
      Leave(&e);
      return nullptr;
    }
    return arena_ + m.arena_offset + (addr - m.base);
  }

  uint64_t id_ = 0;  // unique in the process, never 0
  WindowTable* table_ = nullptr;
  uint8_t* arena_ = nullptr;
  size_t arena_reserved_ = 0;            // virtual size of the arena mapping
  std::atomic<uint64_t> arena_size_{0};  // file size seen (never shrinks: sealed)
  int table_fd_ = -1, arena_fd_ = -1;
};

}  // namespace softrdma::link
