#include "link/shm_channel.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/log.h"
#include "link/frame_codec.h"
#include "link/own_socket.h"
#include "link/plain_syscall.h"
#include "link/shared_memory.h"

namespace softrdma::link {
namespace {

constexpr int kFramesPerWakeup = 256;
constexpr int kFramesPerSeen = 16;
constexpr char kSetupMagic[4] = {'S', 'R', 'S', 'M'};
// 2: receive-queue blocks without `posted` (link/shared_windows.h); a peer of version 1 reads
// them differently, so the two meet over TCP. 3: window entries count their publications; a peer
// of version 2 would not, and ours would keep using a region it re-registered. 4: receive-queue
// blocks are sealed instead of counting their senders (`taken` is 64 bits at offset 8); a peer of
// version 3 would take WQEs through a sealed block. 5: a small SEND's bytes may come in its slot
// (direct_recv::kInSlot); a peer of version 4 would complete it without them.
constexpr uint8_t kShmVersion = 5;
constexpr size_t kControlBytes = 4096;  // both rings' control blocks, then the two rings
static_assert(2 * sizeof(ShmRingControl) <= kControlBytes);
constexpr size_t kSegmentBytes = kControlBytes + 2 * size_t{kShmRingBytes};

// Payloads at least this large travel by reference when their memory is in the arena.
constexpr uint32_t kRefMinBytes = 4096;

// Messages on the Unix socket. kSetup comes first, with three descriptors: the rings' memfd, the
// accepting side's doorbell and the connecting side's. kArena carries a read-only descriptor of
// the sender's arena, sent before the first record that refers to it.
constexpr uint8_t kSetup = 0;
constexpr uint8_t kArena = 1;
constexpr uint8_t kDirect = 2;  // our window table and our arena, read-write (shared_windows.h)
constexpr int kDirectWaitMs = 20;
constexpr int kControlMessages = 2;  // after kSetup: kDirect and kArena, once each
struct ShmSetup {
  char magic[4];
  uint8_t version;
  uint8_t kind;
  uint8_t reserved[2];
  uint32_t ring_bytes;
  uint32_t reserved2;
};
static_assert(sizeof(ShmSetup) == 16);

bool SendWithFds(int sock, const ShmSetup& s, const int* fds, int nfds) {
  char cbuf[CMSG_SPACE(3 * sizeof(int))] = {};
  iovec iov{const_cast<ShmSetup*>(&s), sizeof s};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = cbuf;
  msg.msg_controllen = CMSG_SPACE(sizeof(int) * static_cast<size_t>(nfds));
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * static_cast<size_t>(nfds));
  std::memcpy(CMSG_DATA(c), fds, sizeof(int) * static_cast<size_t>(nfds));
  return sendmsg(sock, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof s);
}

// Receives one message and up to three descriptors (more are closed). Returns what recvmsg
// returned, or -2 for a message that is not ours (wrong size, truncated, bad magic or version).
ssize_t ReceiveWithFds(int sock, ShmSetup* s, int* fds, int* nfds) {
  char cbuf[CMSG_SPACE(4 * sizeof(int))] = {};
  iovec iov{s, sizeof *s};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = cbuf;
  msg.msg_controllen = sizeof cbuf;
  ssize_t r = sys::RecvMsg(sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  *nfds = 0;
  if (r >= 0) {
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < n; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + sizeof(int) * i, sizeof fd);
        if (*nfds < 3) {
          fds[(*nfds)++] = fd;
        } else {
          sys::Close(fd);
        }
      }
    }
  }
  if (r <= 0) return r;
  if (r != static_cast<ssize_t>(sizeof *s) || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) ||
      std::memcmp(s->magic, kSetupMagic, 4) != 0 || s->version != kShmVersion)
    return -2;
  return r;
}

bool SealedAgainstShrinking(int fd, size_t* size) {
  struct stat st {};
  int seals = fcntl(fd, F_GET_SEALS);
  if (fstat(fd, &st) != 0 || seals < 0 || !(seals & F_SEAL_SHRINK)) return false;
  *size = static_cast<size_t>(st.st_size);
  return true;
}

sockaddr_un AbstractName(uint16_t port, socklen_t* len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  int n = std::snprintf(a.sun_path + 1, sizeof a.sun_path - 1, "softrdma-link-%u", port);
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return a;
}

bool SameUser(int sock) {
  ucred cred{};
  socklen_t len = sizeof cred;
  return getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.uid == getuid();
}

// Copies `n` payload bytes starting at `offset` out of a frame's segments.
void Gather(const OutFrame& f, uint32_t offset, uint8_t* dst, uint32_t n) {
  for (int i = 0; i < f.nseg && n > 0; ++i) {
    size_t len = f.seg[i].iov_len;
    if (offset >= len) {
      offset -= static_cast<uint32_t>(len);
      continue;
    }
    size_t c = std::min<size_t>(len - offset, n);
    std::memcpy(dst, static_cast<const uint8_t*>(f.seg[i].iov_base) + offset, c);
    dst += c;
    n -= static_cast<uint32_t>(c);
    offset = 0;
  }
}

constexpr uint32_t FrameFixedBytes(uint32_t hdr_len) {
  return sizeof(ShmRecordHeader) + ShmAlign(hdr_len, 8);
}

}  // namespace

int64_t ShmTrustedPollNs(int64_t normal) {
  static const int64_t stretched = [] {
    const char* e = getenv("SOFTRDMA_SHM_TRUST_POLL_NS");
    return e ? strtoll(e, nullptr, 10) : int64_t{0};
  }();
  return stretched > 0 ? stretched : normal;
}

int64_t ShmUnrungCheckNs() {
  static const int64_t ns = [] {
    const char* e = getenv("SOFTRDMA_SHM_UNRUNG_CHECK_NS");
    const int64_t v = e ? strtoll(e, nullptr, 10) : int64_t{0};
    return v > 0 ? v : kShmUnrungCheckNs;
  }();
  return ns;
}

int ShmChannel::Listen(uint16_t port) {
  int fd = sys::OwnSocket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  socklen_t len;
  sockaddr_un a = AbstractName(port, &len);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), len) != 0 || listen(fd, 256) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

ShmChannel::ShmChannel(Endpoint::Impl& ep, int sock) : ep_(ep), sock_(sock) {}

ShmChannel::~ShmChannel() {
  if (map_) munmap(map_, map_len_);
  if (peer_arena_) munmap(const_cast<uint8_t*>(peer_arena_), peer_arena_len_);
  delete peer_windows_.load();
  for (int fd : {sock_, doorbell_in_, doorbell_out_, peer_arena_fd_})
    if (fd >= 0) close(fd);
}

bool ShmChannel::MapRings(int memfd, bool connector) {
  void* m = mmap(nullptr, kSegmentBytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  if (m == MAP_FAILED) return false;
  map_ = m;
  map_len_ = kSegmentBytes;
  auto* base = static_cast<uint8_t*>(m);
  auto* ctl = reinterpret_cast<ShmRingControl*>(base);
  uint8_t* ring0 = base + kControlBytes;  // connector → acceptor
  uint8_t* ring1 = ring0 + kShmRingBytes;
  if (connector) {
    tx_ = ShmRingProducer(&ctl[0], ring0, ShmTrustedPollNs(kShmConsumerIdleNs), ShmUnrungCheckNs());
    rx_ = ShmRingConsumer(&ctl[1], ring1);
  } else {
    tx_ = ShmRingProducer(&ctl[1], ring1, ShmTrustedPollNs(kShmConsumerIdleNs), ShmUnrungCheckNs());
    rx_ = ShmRingConsumer(&ctl[0], ring0);
  }
  return true;
}

std::shared_ptr<ShmChannel> ShmChannel::Connect(Endpoint::Impl& ep, uint16_t port) {
  int sock = sys::OwnSocket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (sock < 0) return nullptr;
  socklen_t alen;
  sockaddr_un a = AbstractName(port, &alen);
  if (connect(sock, reinterpret_cast<sockaddr*>(&a), alen) != 0 || !SameUser(sock)) {
    close(sock);
    return nullptr;
  }
  auto ch = std::make_shared<ShmChannel>(ep, sock);
  int memfd = memfd_create("softrdma-link", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  int bell_peer = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ch->doorbell_in_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ch->doorbell_out_ = bell_peer;
  bool ok = memfd >= 0 && bell_peer >= 0 && ch->doorbell_in_ >= 0 &&
            ftruncate(memfd, static_cast<off_t>(kSegmentBytes)) == 0 &&
            // Sealed so the peer can trust the size it maps: a shrunk memfd would make its reads
            // fault (SIGBUS).
            fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0 &&
            ch->MapRings(memfd, true);
  if (ok) {
    auto* ctl = static_cast<ShmRingControl*>(ch->map_);
    ctl[0].consumer_asleep.store(1);  // the first record rings the doorbell
    ctl[1].consumer_asleep.store(1);
    ShmSetup s{};
    std::memcpy(s.magic, kSetupMagic, 4);
    s.version = kShmVersion;
    s.kind = kSetup;
    s.ring_bytes = kShmRingBytes;
    int fds[3] = {memfd, bell_peer, ch->doorbell_in_};
    ok = SendWithFds(sock, s, fds, 3);
  }
  if (memfd >= 0) close(memfd);
  if (!ok) return nullptr;  // the destructor closes the rest
  ch->Started();
  // The peer answers with its window table at once. Waiting briefly for it here, before any work
  // request can use the channel, lets the first one-sided operations go direct: a pipeline that
  // starts the long way stays full, and direct access needs nothing outstanding.
  pollfd p{sock, POLLIN, 0};
  if (poll(&p, 1, kDirectWaitMs) == 1) ch->ReadControl();
  return ch;
}

std::shared_ptr<ShmChannel> ShmChannel::Accept(Endpoint::Impl& ep, int fd) {
  if (!SameUser(fd)) {
    close(fd);
    return nullptr;
  }
  auto ch = std::make_shared<ShmChannel>(ep, fd);
  RegisterPollable(ep.epfd, fd, ch.get(), EPOLLIN | EPOLLRDHUP);
  return ch;
}

// Accepting side: the setup message with the rings and the doorbells.
bool ShmChannel::ReadSetup() {
  ShmSetup s{};
  int fds[3] = {-1, -1, -1};
  int nfds = 0;
  ssize_t r = ReceiveWithFds(sock_, &s, fds, &nfds);
  if (r == -1 && (errno == EAGAIN || errno == EINTR)) return true;  // not there yet
  size_t size = 0;
  bool ok = r > 0 && s.kind == kSetup && nfds == 3 && s.ring_bytes == kShmRingBytes &&
            SealedAgainstShrinking(fds[0], &size) && size == kSegmentBytes &&
            MapRings(fds[0], false);
  if (nfds > 0) close(fds[0]);
  if (!ok) {
    for (int i = 1; i < nfds; ++i) close(fds[i]);
    return false;
  }
  doorbell_in_ = fds[1];
  doorbell_out_ = fds[2];
  Started();
  return true;
}

// Later messages: the peer's window table and its arena, each sent once. All that are queued are
// read: the rings are served before the socket is asked again, so the first record that refers to
// the arena can come while both wait, and reading only the window table then cost the peer its
// channel (ibv_rc_pingpong -s 65536: retry exceeded in 1 of 6 runs). False when the peer broke
// the protocol.
bool ShmChannel::ReadControl() {
  for (int n = 0; n < kControlMessages; ++n) {
    ShmSetup s{};
    int fds[3] = {-1, -1, -1};
    int nfds = 0;
    ssize_t r = ReceiveWithFds(sock_, &s, fds, &nfds);
    if (r == -1 && errno == EINTR) continue;
    if (r == -1 && errno == EAGAIN) return true;
    if (r == 0 || r == -1) {
      peer_gone_ = true;
      return true;
    }
    if (r > 0 && s.kind == kDirect && nfds == 2 && !peer_windows_.load()) {
      PeerWindows* w = PeerWindows::Map(fds[0], fds[1]);  // takes the descriptors when it succeeds
      if (!w) {
        close(fds[0]);
        close(fds[1]);
      }
      peer_windows_.store(w, std::memory_order_release);
      continue;  // without it, one-sided operations take the long way
    }
    bool ok = r > 0 && s.kind == kArena && nfds == 1 && peer_arena_fd_ < 0;
    if (!ok) {
      for (int i = 0; i < nfds; ++i) close(fds[i]);
      return false;
    }
    peer_arena_fd_ = fds[0];
    if (!MapPeerArena(0)) return false;
  }
  return true;  // a peer that keeps sending is refused when a record needs what it did not send
}

// Maps the peer's arena, again if it grew; false when it does not reach `need` bytes or is not
// sealed against shrinking (a shrunk file would fault our reads).
bool ShmChannel::MapPeerArena(uint64_t need) {
  size_t size = 0;
  if (peer_arena_fd_ < 0 || !SealedAgainstShrinking(peer_arena_fd_, &size)) return false;
  if (size < need) return false;
  if (size <= peer_arena_len_) return true;
  if (peer_arena_) munmap(const_cast<uint8_t*>(peer_arena_), peer_arena_len_);
  peer_arena_ = nullptr;
  peer_arena_len_ = 0;
  void* m = mmap(nullptr, size, PROT_READ, MAP_SHARED, peer_arena_fd_, 0);
  if (m == MAP_FAILED) return false;
  peer_arena_ = static_cast<const uint8_t*>(m);
  peer_arena_len_ = size;
  return true;
}

// Both rings mapped: announce ourselves and start listening for the peer's records.
void ShmChannel::Started() {
  {
    std::lock_guard<std::mutex> g(tx_mu_);
    WriteHelloLocked();
    PublishLocked();
  }
  ready_.store(true, std::memory_order_release);
  RegisterPollable(ep_.epfd, doorbell_in_, &doorbell_, EPOLLIN);
  // Let the peer run one-sided operations on our memory itself.
  int fds[2] = {SharedWindows::Get().fd(), SharedMemory::Get().ArenaFd()};
  if (fds[0] >= 0 && fds[1] >= 0) {
    ShmSetup s{};
    std::memcpy(s.magic, kSetupMagic, 4);
    s.version = kShmVersion;
    s.kind = kDirect;
    std::lock_guard<std::mutex> g(tx_mu_);
    SendWithFds(sock_, s, fds, 2);
  }
}

bool ShmChannel::WriteHelloLocked() {
  uint32_t bytes = ShmAlign(sizeof(ShmRecordHeader) + kNodeIdBytes, kShmRecordAlign);
  uint8_t* p = tx_.Reserve(bytes);
  if (!p) return false;
  ShmRecordHeader h{bytes, shm_record::kHello, 0, 0, 0, 0, kNodeIdBytes};
  std::memcpy(p, &h, sizeof h);
  std::memcpy(p + sizeof h, ep_.self.bytes, kNodeIdBytes);
  tx_.Commit();
  hello_sent_ = true;
  return true;
}

void ShmChannel::Ring(int fd) {
  if (fd == doorbell_out_) rang_ns_.store(NowNs(), std::memory_order_relaxed);
  uint64_t one = 1;
  ssize_t r = sys::Write(fd, &one, sizeof one);
  (void)r;
}

void ShmChannel::PublishLocked() {
  if (tx_.Publish(NowNs, prompt_)) Ring(doorbell_out_);
  prompt_ = false;
}

void ShmChannel::RingIfUnrungStalled(int64_t now_ns) {
  std::unique_lock<std::mutex> g(tx_mu_, std::try_to_lock);
  if (!g.owns_lock() || !ready_.load(std::memory_order_relaxed) || closed()) return;
  if (tx_.UnrungStalled(now_ns)) Ring(doorbell_out_);
}

void ShmChannel::Send(OutFrame&& f) {
  std::lock_guard<std::mutex> g(tx_mu_);
  if (txq_.empty() && ready_.load(std::memory_order_relaxed) && !closed()) {
    // The usual case: straight into the ring, without queueing (a queue entry is an allocation).
    TxItem t{std::move(f), 0, false};
    bool whole = WriteLocked(t);
    if (whole) {
      PublishLocked();
      return;
    }
    txq_.push_back(std::move(t));
  } else {
    QueueLocked(std::move(f));
  }
  FlushLocked();
}

void ShmChannel::SendPair(OutFrame&& first, OutFrame&& second) {
  std::lock_guard<std::mutex> g(tx_mu_);
  QueueLocked(std::move(first));
  QueueLocked(std::move(second));
  FlushLocked();
}

void ShmChannel::QueueLocked(OutFrame&& f) {
  if (closed()) return;
  txq_.push_back(TxItem{std::move(f), 0, false});
}

// Writes as much of the queue as the ring takes; what stays queued gets the doorbell when the peer
// frees room, and keeps a private copy of the payload if it borrows it.
void ShmChannel::FlushLocked() {
  if (!ready_.load(std::memory_order_relaxed)) return;
  for (;;) {
    while (!txq_.empty() && WriteLocked(txq_.front())) txq_.pop_front();
    PublishLocked();
    if (txq_.empty()) return;
    if (tx_.WaitForRoom(kShmMaxRecordBytes)) break;
  }
  for (TxItem& t : txq_)
    if (!t.frame.payload_outlives_send) t.frame.OwnPayload();
}

// One frame into the ring: the frame record (headers and the first payload bytes), then chunks.
bool ShmChannel::WriteLocked(TxItem& t) {
  const OutFrame& f = t.frame;
  prompt_ = prompt_ || f.awaited_in_memory;
  if (!t.started && f.payload_outlives_send && f.payload_len >= kRefMinBytes) {
    RefWrite r = WriteByReferenceLocked(t);
    if (r != RefWrite::kInline) return r == RefWrite::kWritten;
  }
  if (!t.started) {
    uint32_t fixed = FrameFixedBytes(f.hdr_len);
    uint32_t data = std::min(f.payload_len, kShmMaxRecordBytes - fixed);
    uint32_t bytes = ShmAlign(fixed + data, kShmRecordAlign);
    uint8_t* p = tx_.Reserve(bytes);
    if (!p) return false;
    ShmRecordHeader h{bytes, shm_record::kFrame, f.hdr_len, 0, 0, f.payload_len, data};
    std::memcpy(p, &h, sizeof h);
    std::memcpy(p + sizeof h, f.hdr, f.hdr_len);
    Gather(f, 0, p + fixed, data);
    tx_.Commit();
    t.started = true;
    t.done = data;
  }
  while (t.done < f.payload_len) {
    uint32_t data = std::min(f.payload_len - t.done,
                             kShmMaxRecordBytes - static_cast<uint32_t>(sizeof(ShmRecordHeader)));
    uint32_t bytes = ShmAlign(sizeof(ShmRecordHeader) + data, kShmRecordAlign);
    uint8_t* p = tx_.Reserve(bytes);
    if (!p) return false;
    ShmRecordHeader h{bytes, shm_record::kChunk, 0, 0, 0, 0, data};
    std::memcpy(p, &h, sizeof h);
    Gather(f, t.done, p + sizeof h, data);
    tx_.Commit();
    t.done += data;
  }
  return true;
}

// A frame whose payload is (mostly) in our arena: one record naming where each piece is. The
// payload must stay as it is until the peer answers the frame, which payload_outlives_send
// promises (an RC request waits for its ACK; a read response comes from registered memory).
ShmChannel::RefWrite ShmChannel::WriteByReferenceLocked(TxItem& t) {
  const OutFrame& f = t.frame;
  ShmPayloadRef refs[kShmMaxRefs];
  int nref = 0;
  uint32_t inline_bytes = 0;
  bool any_shared = false;
  SharedMemory& mem = SharedMemory::Get();
  for (int i = 0; i < f.nseg; ++i) {
    const auto* p = static_cast<const uint8_t*>(f.seg[i].iov_base);
    size_t n = f.seg[i].iov_len;
    while (n > 0) {
      if (nref == kShmMaxRefs) return RefWrite::kInline;
      SharedMemory::Piece piece = mem.Find(p, n);
      if (piece.shared) {
        refs[nref++] = ShmPayloadRef{kShmArenaSegment, 0, piece.offset, piece.len};
        any_shared = true;
      } else {
        refs[nref++] = ShmPayloadRef{kShmInlineSegment, 0, 0, piece.len};
        inline_bytes += static_cast<uint32_t>(piece.len);
      }
      p += piece.len;
      n -= piece.len;
    }
  }
  uint32_t fixed = FrameFixedBytes(f.hdr_len) + static_cast<uint32_t>(nref * sizeof(ShmPayloadRef));
  if (!any_shared || uint64_t{fixed} + inline_bytes > kShmMaxRecordBytes) return RefWrite::kInline;
  if (!arena_sent_ && !SendArenaLocked()) return RefWrite::kInline;
  uint32_t bytes = ShmAlign(fixed + inline_bytes, kShmRecordAlign);
  uint8_t* rec = tx_.Reserve(bytes);
  if (!rec) return RefWrite::kNoRoom;
  ShmRecordHeader h{bytes, shm_record::kFrame, f.hdr_len,   static_cast<uint8_t>(nref),
                    0,     f.payload_len,      inline_bytes};
  std::memcpy(rec, &h, sizeof h);
  std::memcpy(rec + sizeof h, f.hdr, f.hdr_len);
  uint8_t* at = rec + FrameFixedBytes(f.hdr_len);
  std::memcpy(at, refs, static_cast<size_t>(nref) * sizeof(ShmPayloadRef));
  at += static_cast<size_t>(nref) * sizeof(ShmPayloadRef);
  uint32_t offset = 0;
  for (int i = 0; i < nref; ++i) {
    if (refs[i].segment == kShmInlineSegment) {
      Gather(f, offset, at, static_cast<uint32_t>(refs[i].len));
      at += refs[i].len;
    }
    offset += static_cast<uint32_t>(refs[i].len);
  }
  tx_.Commit();
  t.started = true;
  t.done = f.payload_len;
  return RefWrite::kWritten;
}

bool ShmChannel::SendArenaLocked() {
  int fd = SharedMemory::Get().PeerFd();
  if (fd < 0) return false;
  ShmSetup s{};
  std::memcpy(s.magic, kSetupMagic, 4);
  s.version = kShmVersion;
  s.kind = kArena;
  arena_sent_ = SendWithFds(sock_, s, &fd, 1);
  return arena_sent_;
}

bool ShmChannel::TxPending() {
  std::lock_guard<std::mutex> g(tx_mu_);
  return !txq_.empty() && !closed();
}

void ShmChannel::OwnQueuedPayloads() {
  std::lock_guard<std::mutex> g(tx_mu_);
  for (TxItem& t : txq_) t.frame.OwnPayload();
}

// A queue drains through the doorbell that FlushLocked asked for; the ring through the one this
// asks for.
bool ShmChannel::BackloggedLocked() {
  return !closed() && (!txq_.empty() || !ready_.load(std::memory_order_relaxed) ||
                       tx_.AskForRoom(kDatagramBacklogBytes));
}

bool ShmChannel::AwaitRoom() {
  std::lock_guard<std::mutex> g(tx_mu_);
  if (!BackloggedLocked()) return false;
  room_wanted_ = true;
  return true;
}

bool ShmChannel::RoomFreedLocked() {
  if (!room_wanted_ || BackloggedLocked()) return false;
  room_wanted_ = false;
  return true;
}

void ShmChannel::NudgeIfAsleep() {
  if (ready_.load(std::memory_order_acquire) && !closed() && tx_.TakeSleeper()) Ring(doorbell_out_);
}

void ShmChannel::OnDoorbell() {
  uint64_t v;
  ssize_t r = sys::Read(doorbell_in_, &v, sizeof v);
  (void)r;
  bool room, waited_for_room;
  {
    std::lock_guard<std::mutex> g(tx_mu_);
    waited_for_room = !txq_.empty();
    if (waited_for_room) FlushLocked();
    room = RoomFreedLocked();
  }
  if (room) ep_.sink.OnChannelRoom(*this);
  // Rung for records our polling application took before we came: see kShmQuietNs.
  if (app_took_ && !waited_for_room && !room && ep_.OnProgressThread() &&
      ready_.load(std::memory_order_acquire) && rx_.Empty())
    rx_.AskQuiet(NowNs() + kShmQuietNs);
  app_took_ = false;
  ServeBuffered();
}

void ShmChannel::OnEvents(uint32_t events) {
  if (closed()) return;
  if (!ready_.load(std::memory_order_acquire)) {
    if (!ReadSetup()) BrokeProtocol("its setup");
  } else if ((events & EPOLLIN) && !ReadControl()) {
    BrokeProtocol("a message on its socket");
  }
  if (events & (EPOLLHUP | EPOLLRDHUP | EPOLLERR)) peer_gone_ = true;
  if (peer_gone_ || dead_) {
    // Records the peer published before it went are delivered first: its last ACK, say.
    if (!dead_ && ready_.load(std::memory_order_acquire)) ServeBuffered();
    Close();
  }
}

// The channel is dropped; the peer's QPs learn it only when their retries run out, so the reason
// is logged here, where it is known.
void ShmChannel::BrokeProtocol(const char* what) {
  dead_ = true;
  SOFTRDMA_LOG("shm link: the peer broke the protocol (%s); channel dropped", what);
}

void ShmChannel::ServeBuffered() {
  if (!ready_.load(std::memory_order_acquire) || closed()) return;
  int frames = 0;
  while (!dead_ && (peer_gone_ || frames < kFramesPerWakeup)) {
    uint64_t avail = 0;
    const uint8_t* p = rx_.Peek(&avail);
    if (!p) break;
    uint32_t consumed = 0;
    if (!HandleRecord(p, avail, &consumed)) {
      BrokeProtocol("a record");
      break;
    }
    if (consumed == 0) break;  // the frame at the head waits (Hold)
    rx_.Consume(consumed);
    // A long batch looks at the ring all along: the producer must not take it for a consumer that
    // stopped polling and ring (ib_send_bw 2 B: 0.7-1.4 M messages/s without, 2.1-2.5 M with).
    if (++frames % kFramesPerSeen == 0) rx_.Seen(NowNs());
  }
  // Only until set (the next doorbell clears it): which thread this is costs a call and a TLS
  // lookup, which every batch an application served paid.
  if (frames > 0 && !app_took_ && !ep_.OnProgressThread()) app_took_ = true;
  if (rx_.ProducerWaiting()) Ring(doorbell_out_);
  if (!prompts_noted_ && rx_.ProducerPrompts()) {
    prompts_noted_ = true;
    ep_.shm_prompted.store(true, std::memory_order_relaxed);
  }
  if (dead_) return Close();
  if (frames >= kFramesPerWakeup && !rx_.Empty())
    ep_.RxPending(std::static_pointer_cast<ServedChannel>(shared_from_this()));
}

// Called by the sink from OnFrameHeader, on this channel's serving thread; the flag is set before
// the sink lets anyone Resume us, so a Resume is never lost.
bool ShmChannel::Hold() {
  if (peer_gone_) return false;  // what a departed peer left is delivered (or dropped) at once
  head_held_.store(true, std::memory_order_release);
  return true;
}

void ShmChannel::Resume() {
  if (!head_held_.exchange(false, std::memory_order_acq_rel)) return;
  ep_.Wake();  // the progress thread may sleep with the held frame counted as no work
}

void ShmChannel::ResumeHere() {
  if (!head_held_.exchange(false, std::memory_order_acq_rel)) return;
  ep_.ServeHereOrWake();
}

// Validates and handles one record the peer wrote. False: the peer broke the protocol.
bool ShmChannel::HandleRecord(const uint8_t* p, uint64_t avail, uint32_t* consumed) {
  if (avail < sizeof(ShmRecordHeader) || avail > kShmRingBytes) return false;
  ShmRecordHeader h;
  std::memcpy(&h, p, sizeof h);  // read once: the peer may be rewriting it
  if (h.bytes < sizeof h || h.bytes % kShmRecordAlign != 0 || h.bytes > avail) return false;
  *consumed = h.bytes;
  if (h.kind == shm_record::kPad) return true;
  if (h.data_len > h.bytes - sizeof h) return false;
  if (!hello_done_) {
    if (h.kind != shm_record::kHello || h.data_len != kNodeIdBytes) return false;
    std::memcpy(peer_id_.bytes, p + sizeof h, kNodeIdBytes);
    hello_done_ = true;
    return true;
  }
  if (h.kind == shm_record::kFrame) {
    if (in_frame_ || h.hdr_len == 0 || h.hdr_len > kMaxHeaderBytes || h.nref > kShmMaxRefs ||
        h.payload_len > kMaxFramePayload || h.data_len > h.payload_len)
      return false;
    uint32_t fixed = FrameFixedBytes(h.hdr_len);
    if (uint64_t{fixed} + h.nref * sizeof(ShmPayloadRef) + h.data_len > h.bytes) return false;
    if (h.nref > 0) return DeliverRefs(p, h, fixed, consumed);
    uint8_t hdr[kMaxHeaderBytes];
    std::memcpy(hdr, p + sizeof h, h.hdr_len);
    target_.Reset();
    cursor_ = RxCursor{};
    in_frame_ = true;
    remaining_ = h.payload_len;
    ep_.sink.OnFrameHeader(*this, hdr, h.hdr_len, h.payload_len, target_, kNoRiderAck);
    if (target_.wait) return KeepFrame(consumed);
    cursor_.Deliver(target_, p + fixed, h.data_len);
    remaining_ -= h.data_len;
  } else if (h.kind == shm_record::kChunk) {
    if (!in_frame_ || h.data_len == 0 || h.data_len > remaining_) return false;
    cursor_.Deliver(target_, p + sizeof h, h.data_len);
    remaining_ -= h.data_len;
  } else {
    return false;
  }
  if (remaining_ == 0) EndFrame();
  return true;
}

// A frame record with payload references: every piece is checked before the frame is handed to
// the sink, then copied straight from the peer's arena (or the record) into its destination.
bool ShmChannel::DeliverRefs(const uint8_t* p, const ShmRecordHeader& h, uint32_t fixed,
                             uint32_t* consumed) {
  ShmPayloadRef refs[kShmMaxRefs];
  std::memcpy(refs, p + fixed, h.nref * sizeof(ShmPayloadRef));
  uint64_t total = 0, inline_total = 0, arena_end = 0;
  for (int i = 0; i < h.nref; ++i) {
    const ShmPayloadRef& r = refs[i];
    if (r.len > kMaxFramePayload) return false;
    total += r.len;
    if (r.segment == kShmInlineSegment) {
      inline_total += r.len;
    } else if (r.segment == kShmArenaSegment) {
      if (r.offset > UINT64_MAX - r.len) return false;
      arena_end = std::max(arena_end, r.offset + r.len);
    } else {
      return false;
    }
  }
  if (total != h.payload_len || inline_total != h.data_len) return false;
  if (arena_end > peer_arena_len_) {
    // The arena's descriptor was sent before this record: read it now if it is still queued.
    if (peer_arena_fd_ < 0 && !ReadControl()) return false;
    if (!MapPeerArena(arena_end)) return false;
  }
  uint8_t hdr[kMaxHeaderBytes];
  std::memcpy(hdr, p + sizeof h, h.hdr_len);
  target_.Reset();
  cursor_ = RxCursor{};
  in_frame_ = true;
  remaining_ = 0;
  ep_.sink.OnFrameHeader(*this, hdr, h.hdr_len, h.payload_len, target_, kNoRiderAck);
  if (target_.wait) return KeepFrame(consumed);
  const uint8_t* data = p + fixed + h.nref * sizeof(ShmPayloadRef);
  for (int i = 0; i < h.nref; ++i) {
    if (refs[i].segment == kShmInlineSegment) {
      cursor_.Deliver(target_, data, refs[i].len);
      data += refs[i].len;
    } else {
      cursor_.Deliver(target_, peer_arena_ + refs[i].offset, refs[i].len);
    }
  }
  EndFrame();
  return true;
}

// The sink made the frame at the head wait: nothing of it was delivered, and it stays in the ring.
bool ShmChannel::KeepFrame(uint32_t* consumed) {
  in_frame_ = false;
  target_.Reset();
  *consumed = 0;
  return true;
}

void ShmChannel::EndFrame() {
  in_frame_ = false;
  ep_.sink.OnFrameEnd(*this, target_);
  target_.Reset();
}

void ShmChannel::Close() {
  {
    std::lock_guard<std::mutex> g(tx_mu_);
    if (closed_.load()) return;
    closed_.store(true, std::memory_order_release);
    epoll_ctl(ep_.epfd, EPOLL_CTL_DEL, sock_, nullptr);
    if (doorbell_in_ >= 0) epoll_ctl(ep_.epfd, EPOLL_CTL_DEL, doorbell_in_, nullptr);
    shutdown(sock_, SHUT_RDWR);
    txq_.clear();
  }
  if (in_frame_) {
    in_frame_ = false;
    ep_.sink.OnFrameAbort(*this, target_);
    target_.Reset();
  }
  ep_.sink.OnChannelClosed(*this);
  auto self = std::static_pointer_cast<ShmChannel>(shared_from_this());
  ep_.RemoveShm(this);
  ep_.Retire(self);
}

}  // namespace softrdma::link
