#include "link/shared_windows.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>

#include "link/frame_codec.h"
#include "link/shared_memory.h"

namespace softrdma::link {
namespace {

constexpr size_t kArenaReserve = size_t{64} << 30;  // virtual: the arena may grow this far
constexpr int64_t kWithdrawWaitNs = 200'000'000;

// Waits while `busy()` says a peer is inside an access: bounded, since a peer that died inside
// cannot block its owner forever.
template <typename Busy>
void WaitWhile(Busy busy) {
  auto start = std::chrono::steady_clock::now();
  while (busy() &&
         std::chrono::steady_clock::now() - start < std::chrono::nanoseconds(kWithdrawWaitNs))
    sched_yield();
}

// Until no peer counts itself in `users`.
void WaitUntilUnused(const std::atomic<uint32_t>& users) {
  WaitWhile([&] { return users.load(std::memory_order_seq_cst) != 0; });
}

uint32_t Hash(uint32_t key) {
  return (key * 2654435761u) >> 16;  // 16 bits: kWindowSlots
}

}  // namespace

bool SharedWindows::EnsureLocked() {
  if (TableLocked()) return true;
  int fd = memfd_create("softrdma-windows", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return false;
  if (ftruncate(fd, sizeof(WindowTable)) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
    close(fd);
    return false;
  }
  void* m = mmap(nullptr, sizeof(WindowTable), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) {
    close(fd);
    return false;
  }
  table_.store(static_cast<WindowTable*>(m), std::memory_order_release);  // zero-filled: empty
  fd_ = fd;
  return true;
}

int SharedWindows::fd() {
  std::lock_guard<std::mutex> g(mu_);
  return EnsureLocked() ? fd_ : -1;
}

bool SharedWindows::ReachablePart(const void* addr, uint64_t len, uint64_t* skip,
                                  uint64_t* part_len, uint64_t* arena_offset) {
  // What peers ask beyond the part goes by frames, where the responder checks the whole region.
  SharedMemory::Piece piece = SharedMemory::Get().Find(addr, len);
  *skip = 0;
  if (!piece.shared) {
    *skip = piece.len;               // private bytes before the first shared one
    if (*skip >= len) return false;  // none of it in the arena: frames only
    piece = SharedMemory::Get().Find(static_cast<const uint8_t*>(addr) + *skip, len - *skip);
    if (!piece.shared) return false;
  }
  *part_len = piece.len;
  *arena_offset = piece.offset;
  return true;
}

void SharedWindows::Publish(uint32_t key, uint32_t domain, uint64_t base, const void* addr,
                            uint64_t len, uint32_t rights) {
  if (key == 0 || key == kWindowTombstone || len == 0) return;
  uint64_t skip, offset;
  if (!ReachablePart(addr, len, &skip, &len, &offset)) return;
  base += skip;
  std::lock_guard<std::mutex> g(mu_);
  if (!EnsureLocked()) return;
  for (uint32_t i = 0, h = Hash(key); i < kWindowSlots; ++i) {
    WindowEntry& e = TableLocked()->windows[(h + i) % kWindowSlots];
    uint32_t k = e.key.load(std::memory_order_relaxed);
    if (k != 0 && k != kWindowTombstone) continue;
    if (k == kWindowTombstone && e.users.load(std::memory_order_acquire) != 0) continue;
    e.domain = domain;
    e.base = base;
    e.len = len;
    e.arena_offset = offset;
    e.rights = rights;
    e.publication.store(e.publication.load(std::memory_order_relaxed) + 1,
                        std::memory_order_relaxed);
    e.key.store(key, std::memory_order_release);  // last: the entry is whole when it appears
    return;
  }
}

void SharedWindows::Withdraw(uint32_t key) {
  std::lock_guard<std::mutex> g(mu_);
  WindowTable* t = TableLocked();
  if (!t || key == 0 || key == kWindowTombstone) return;
  for (uint32_t i = 0, h = Hash(key); i < kWindowSlots; ++i) {
    WindowEntry& e = t->windows[(h + i) % kWindowSlots];
    uint32_t k = e.key.load(std::memory_order_relaxed);
    if (k == 0) return;  // the end of its probe chain: never published
    if (k != key) continue;
    e.key.store(kWindowTombstone, std::memory_order_seq_cst);
    WaitUntilUnused(e.users);
    // A sender placing a SEND counts itself nowhere: it took a WQE after its checks.
    for (DirectRecvQueue* q : claimed_) SealRecvQueue(q);
    return;
  }
}

void SharedWindows::SetEndpoint(uint32_t id, uint32_t domain, uint32_t rights) {
  std::lock_guard<std::mutex> g(mu_);
  if (!EnsureLocked()) return;
  EndpointEntry& e = TableLocked()->endpoints[id % kEndpointSlots];
  e.rights.store(0, std::memory_order_seq_cst);
  e.id.store(id, std::memory_order_relaxed);
  e.domain = domain;
  e.rights.store(rights, std::memory_order_release);
}

DirectRecvQueue* SharedWindows::ClaimRecvQueue(uint32_t id) {
  std::lock_guard<std::mutex> g(mu_);
  if (id == 0 || !EnsureLocked()) return nullptr;
  DirectRecvQueue& q = TableLocked()->recvs[id % kEndpointSlots];
  uint32_t free = 0;
  if (!q.owner.compare_exchange_strong(free, id, std::memory_order_acq_rel) && free != id)
    return nullptr;
  // No sender can be inside: the endpoint did not grant kRecvRight since the block was released.
  // A new seal all the same: a sender that read `taken` before then must not take at count 0.
  for (DirectRecvSlot& s : q.slots) s.state.store(0, std::memory_order_relaxed);
  const uint64_t t = q.taken.load(std::memory_order_relaxed);
  q.taken.store(direct_recv::WithCount(t + direct_recv::kSealStep, 0), std::memory_order_release);
  if (free == 0) claimed_.push_back(&q);
  return &q;
}

void SharedWindows::ReleaseRecvQueue(DirectRecvQueue* q) {
  if (!q) return;
  std::lock_guard<std::mutex> g(mu_);
  std::erase(claimed_, q);
  q->owner.store(0, std::memory_order_release);
}

void SharedWindows::SealRecvQueue(DirectRecvQueue* q) {
  namespace dr = direct_recv;
  const uint32_t count =
      dr::TakenCount(q->taken.fetch_add(dr::kSealStep, std::memory_order_seq_cst));
  // Taken WQEs are among the last kDirectRecvSlots (none is published further ahead of the
  // owner's collection); one still posted under its own count is being placed.
  WaitWhile([&] {
    for (uint32_t i = count - kDirectRecvSlots; i != count; ++i)
      if (dr::Is(q->slots[i % kDirectRecvSlots].state.load(std::memory_order_acquire), dr::kPosted,
                 i))
        return true;
    return false;
  });
}

void SharedWindows::AfterForkInChild() {
  // The child's regions and QPs are its own: a fresh table when it first needs one. The parent's
  // stays mapped (and leaked) here.
  table_.store(nullptr, std::memory_order_relaxed);
  recvs_seen_.store(0, std::memory_order_relaxed);
  claimed_.clear();
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  new (&mu_) std::mutex();
}

PeerWindows* PeerWindows::Map(int table_fd, int arena_fd) {
  struct stat st {};
  int seals = fcntl(table_fd, F_GET_SEALS);
  if (fstat(table_fd, &st) != 0 || static_cast<size_t>(st.st_size) != sizeof(WindowTable) ||
      seals < 0 || !(seals & F_SEAL_SHRINK))
    return nullptr;
  seals = fcntl(arena_fd, F_GET_SEALS);
  if (seals < 0 || !(seals & F_SEAL_SHRINK)) return nullptr;
  void* t = mmap(nullptr, sizeof(WindowTable), PROT_READ | PROT_WRITE, MAP_SHARED, table_fd, 0);
  if (t == MAP_FAILED) return nullptr;
  void* a =
      mmap(nullptr, kArenaReserve, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, arena_fd, 0);
  if (a == MAP_FAILED) {
    munmap(t, sizeof(WindowTable));
    return nullptr;
  }
  static std::atomic<uint64_t> next_id{1};
  auto* p = new PeerWindows();
  p->id_ = next_id.fetch_add(1, std::memory_order_relaxed);
  p->table_ = static_cast<WindowTable*>(t);
  p->arena_ = static_cast<uint8_t*>(a);
  p->arena_reserved_ = kArenaReserve;
  p->table_fd_ = table_fd;
  p->arena_fd_ = arena_fd;
  return p;
}

PeerWindows::~PeerWindows() {
  munmap(table_, sizeof(WindowTable));
  munmap(arena_, arena_reserved_);
  close(table_fd_);
  close(arena_fd_);
}

DirectRecvQueue* PeerWindows::OpenRecvQueue(uint32_t endpoint, uint64_t* taken) {
  const EndpointEntry& ep = table_->endpoints[endpoint % kEndpointSlots];
  DirectRecvQueue& q = table_->recvs[endpoint % kEndpointSlots];
  // `taken` first, then the checks: an owner that revoked and sealed either fails our take or
  // is seen revoked.
  *taken = q.taken.load(std::memory_order_seq_cst);
  if (!(ep.rights.load(std::memory_order_seq_cst) & kRecvRight) ||
      ep.id.load(std::memory_order_seq_cst) != endpoint ||
      q.owner.load(std::memory_order_seq_cst) != endpoint)
    return nullptr;
  return &q;
}

// Whether [0, end) of the arena exists in the file: beyond its size the mapping would fault.
bool PeerWindows::ArenaCovers(uint64_t end) {
  if (end <= arena_size_.load(std::memory_order_relaxed)) return true;
  struct stat st {};
  if (fstat(arena_fd_, &st) != 0) return false;
  uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > arena_reserved_) size = arena_reserved_;
  arena_size_.store(size, std::memory_order_relaxed);
  return end <= size;
}

WindowEntry* PeerWindows::Find(uint32_t key, uint32_t endpoint, uint64_t len, uint32_t rights,
                               uint32_t* domain) {
  if (key == 0 || key == kWindowTombstone || len == 0 || len > kMaxFramePayload) return nullptr;
  const EndpointEntry& ep = table_->endpoints[endpoint % kEndpointSlots];
  uint32_t ep_rights = ep.rights.load(std::memory_order_acquire);
  if (ep.id.load(std::memory_order_relaxed) != endpoint || (ep_rights & rights) != rights)
    return nullptr;
  *domain = ep.domain;
  for (uint32_t i = 0, h = Hash(key); i < kWindowSlots; ++i) {
    WindowEntry& e = table_->windows[(h + i) % kWindowSlots];
    uint32_t k = e.key.load(std::memory_order_acquire);
    if (k == 0) return nullptr;
    if (k == key) return &e;
  }
  return nullptr;
}

uint8_t* PeerWindows::Check(WindowEntry& e, uint32_t key, uint32_t domain, uint64_t addr,
                            uint64_t len, uint32_t rights, Memo* memo) {
  // The key first: the fields read after it are of the publication that wrote it, which cannot be
  // withdrawn while we are counted in.
  if (e.key.load(std::memory_order_seq_cst) != key) return nullptr;
  uint32_t publication = e.publication.load(std::memory_order_relaxed);
  uint64_t base = e.base, wlen = e.len, off = e.arena_offset;
  uint32_t granted = e.rights;
  bool ok = e.domain == domain && (granted & rights) == rights && addr >= base &&
            addr - base <= wlen && len <= wlen - (addr - base) && off <= UINT64_MAX - wlen &&
            ArenaCovers(off + (addr - base) + len);
  if (!ok) return nullptr;
  if (memo) *memo = Memo{id_, &e, key, 0, domain, granted, publication, base, wlen, off};
  return arena_ + off + (addr - base);
}

uint8_t* PeerWindows::EnterByLookup(uint32_t key, uint32_t endpoint, uint64_t addr, uint64_t len,
                                    uint32_t rights, WindowEntry** out, Memo* memo) {
  uint32_t domain;
  WindowEntry* e = Find(key, endpoint, len, rights, &domain);
  if (!e) return nullptr;
  e->users.fetch_add(1, std::memory_order_seq_cst);
  // Counted in first, then checked: a withdrawal either sees us or we see it.
  uint8_t* p = Check(*e, key, domain, addr, len, rights, memo);
  if (!p) {
    e->users.fetch_sub(1, std::memory_order_release);
    return nullptr;
  }
  if (memo) memo->endpoint = endpoint;
  *out = e;
  return p;
}

uint8_t* PeerWindows::ReachByLookup(uint32_t key, uint32_t endpoint, uint64_t addr, uint64_t len,
                                    uint32_t rights, Memo* memo) {
  uint32_t domain;
  WindowEntry* e = Find(key, endpoint, len, rights, &domain);
  uint8_t* p = e ? Check(*e, key, domain, addr, len, rights, memo) : nullptr;
  if (p && memo) memo->endpoint = endpoint;
  return p;
}

}  // namespace softrdma::link
