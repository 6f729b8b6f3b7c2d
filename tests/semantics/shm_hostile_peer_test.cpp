// A hostile peer on the same-host link: the test plays a process of the same user that opens a
// shared-memory channel to this process by hand (Unix socket, memfd, eventfds) and writes records
// the link must refuse. Each one costs the peer its channel (the process closes the socket), and
// the process goes on accepting the next channel. Every wait is bounded.
#include <infiniband/verbs.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "link/link.h"
#include "link/shm_ring.h"
#include "support/semantics_harness.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

namespace {

using namespace softrdma::link;
using Clock = std::chrono::steady_clock;

constexpr int kIoTimeoutMs = 5000;
constexpr size_t kControlBytes = 4096;
constexpr size_t kSegmentBytes = kControlBytes + 2 * size_t{kShmRingBytes};

constexpr uint8_t kSetupVersion = 5;  // link/shm_channel.cpp's kShmVersion

struct SetupMsg {
  char magic[4];
  uint8_t version;
  uint8_t reserved[3];
  uint32_t ring_bytes;
  uint32_t reserved2;
};

class FakeShmPeer {
 public:
  ~FakeShmPeer() { Close(); }

  // Opens a channel to the endpoint on `port`; `seal` and `size` let a test break the setup. When
  // it cannot (no shared-memory link, e.g. under SOFTRDMA_LINK=tcp), the rings are private memory:
  // the test then fails on what never arrives instead of crashing the binary on an unmapped ring.
  bool Open(uint16_t port, bool seal = true, size_t size = kSegmentBytes) {
    bool ok = OpenChannel(port, seal, size);
    if (!map_) {
      void* m = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (m != MAP_FAILED) {
        map_ = static_cast<uint8_t*>(m);
        map_len_ = size;
      }
    }
    return ok;
  }
  bool OpenChannel(uint16_t port, bool seal, size_t size) {
    sock_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    int n = std::snprintf(a.sun_path + 1, sizeof a.sun_path - 1, "softrdma-link-%u", port);
    auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
    if (sock_ < 0 || connect(sock_, reinterpret_cast<sockaddr*>(&a), len) != 0) return false;
    memfd_ = memfd_create("fake-peer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (memfd_ < 0 || ftruncate(memfd_, static_cast<off_t>(size)) != 0) return false;
    if (seal && fcntl(memfd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) return false;
    void* m = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd_, 0);
    if (m == MAP_FAILED) return false;
    map_ = static_cast<uint8_t*>(m);
    map_len_ = size;
    their_bell_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    our_bell_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    int fds[3] = {memfd_, their_bell_, our_bell_};
    return SendMessage(SetupMsg{{'S', 'R', 'S', 'M'}, kSetupVersion, {}, kShmRingBytes, 0}, fds, 3);
  }

  ShmRingControl* control(int i) { return reinterpret_cast<ShmRingControl*>(map_) + i; }
  uint8_t* ring(int i) { return map_ + kControlBytes + size_t(i) * kShmRingBytes; }

  // Appends raw bytes as the next record(s) of our ring and rings the doorbell.
  void Put(const void* rec, size_t n, bool ring_bell = true) {
    std::memcpy(ring(0) + tail_, rec, n);
    tail_ += n;
    control(0)->tail.store(tail_, std::memory_order_release);
    if (ring_bell) Ring();
  }
  void PutRecord(ShmRecordHeader h, size_t total = 0) {
    std::vector<uint8_t> b(total ? total : ShmAlign(h.bytes ? h.bytes : 64, 64), 0);
    std::memcpy(b.data(), &h, sizeof h);
    Put(b.data(), b.size());
  }
  void Hello() {
    ShmRecordHeader h{64, shm_record::kHello, 0, 0, 0, 0, kNodeIdBytes};
    PutRecord(h);
  }
  void Ring() {
    uint64_t one = 1;
    ssize_t w = write(their_bell_, &one, sizeof one);
    (void)w;
  }

  // True when the process wrote its hello into our inbound ring within the bound.
  bool GotHello() {
    auto deadline = Clock::now() + std::chrono::milliseconds(kIoTimeoutMs);
    while (Clock::now() < deadline) {
      if (control(1)->tail.load(std::memory_order_acquire) > 0) {
        ShmRecordHeader h;
        std::memcpy(&h, ring(1), sizeof h);
        return h.kind == shm_record::kHello && h.data_len == kNodeIdBytes;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  }

  // True when the process closes the channel's socket within the bound.
  bool WaitClosed() {
    auto deadline = Clock::now() + std::chrono::milliseconds(kIoTimeoutMs);
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return false;
      pollfd p{sock_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char b[64];
      ssize_t r = recv(sock_, b, sizeof b, MSG_DONTWAIT);
      if (r == 0 || (r < 0 && errno == ECONNRESET)) return true;
    }
  }

  // A later message on the socket (kind 1: our arena; kind 2: our window table and arena).
  bool SendControl(uint8_t kind, const int* fds, int nfds) {
    return SendMessage(SetupMsg{{'S', 'R', 'S', 'M'}, kSetupVersion, {kind, 0, 0}, 0, 0}, fds,
                       nfds);
  }

  int sock() const { return sock_; }

  void Close() {
    if (map_) munmap(map_, map_len_);
    map_ = nullptr;
    for (int* fd : {&sock_, &memfd_, &their_bell_, &our_bell_}) {
      if (*fd >= 0) close(*fd);
      *fd = -1;
    }
  }

 private:
  bool SendMessage(SetupMsg s, const int* fds, int nfds) {
    char cbuf[CMSG_SPACE(3 * sizeof(int))] = {};
    iovec iov{&s, sizeof s};
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
    return sendmsg(sock_, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof s);
  }

  int sock_ = -1, memfd_ = -1, their_bell_ = -1, our_bell_ = -1;
  uint8_t* map_ = nullptr;
  size_t map_len_ = 0;
  uint64_t tail_ = 0;
};

class ShmHostilePeer : public ::testing::Test {
 protected:
  void SetUp() override {
    if (semantics::ShmLinkOff()) GTEST_SKIP() << semantics::kShmLinkOff;
    ctx_ = semantics::OpenFirstDevice();
    ASSERT_NE(ctx_, nullptr);
    ibv_gid gid;
    ASSERT_EQ(ibv_query_gid(ctx_, 1, 0, &gid), 0);
    port_ = static_cast<uint16_t>(gid.raw[12] << 8 | gid.raw[13]);
  }
  void TearDown() override {
    if (ctx_) ibv_close_device(ctx_);
  }

  // A good channel still opens: the process answers with its hello.
  void ExpectServing() {
    FakeShmPeer ok;
    ASSERT_TRUE(ok.Open(port_));
    EXPECT_TRUE(ok.GotHello()) << "the process stopped accepting shared-memory channels";
  }

  ibv_context* ctx_ = nullptr;
  uint16_t port_ = 0;
};

TEST_F(ShmHostilePeer, AGoodSetupIsAnsweredWithTheProcessHello) {
  FakeShmPeer p;
  ASSERT_TRUE(p.Open(port_));
  EXPECT_TRUE(p.GotHello());
}

TEST_F(ShmHostilePeer, AnUnsealedOrWronglySizedSegmentIsRefused) {
  {
    FakeShmPeer p;
    ASSERT_TRUE(p.Open(port_, /*seal=*/false));
    EXPECT_TRUE(p.WaitClosed()) << "an unsealed memfd could shrink under the reader";
  }
  {
    FakeShmPeer p;
    ASSERT_TRUE(p.Open(port_, true, kSegmentBytes / 2));
    EXPECT_TRUE(p.WaitClosed());
  }
  ExpectServing();
}

TEST_F(ShmHostilePeer, MalformedRecordsCostThePeerItsChannel) {
  struct Case {
    const char* what;
    std::function<void(FakeShmPeer&)> attack;
  };
  const Case cases[] = {
      {"a frame before the hello",
       [](FakeShmPeer& p) {
         p.PutRecord({64, shm_record::kFrame, 20, 0, 0, 0, 0});
       }},
      {"a record size that is not a multiple of 64",
       [](FakeShmPeer& p) {
         p.Hello();
         p.PutRecord({100, shm_record::kFrame, 20, 0, 0, 0, 0}, 128);
       }},
      {"a record larger than what was published",
       [](FakeShmPeer& p) {
         p.Hello();
         p.PutRecord({4096, shm_record::kFrame, 20, 0, 0, 0, 0}, 64);
       }},
      {"a frame without IB headers",
       [](FakeShmPeer& p) {
         p.Hello();
         p.PutRecord({64, shm_record::kFrame, 0, 0, 0, 0, 0});
       }},
      {"a frame with headers longer than any opcode has",
       [](FakeShmPeer& p) {
         p.Hello();
         p.PutRecord({256, shm_record::kFrame, 200, 0, 0, 0, 0});
       }},
      {"a frame naming a segment never shared",
       [](FakeShmPeer& p) {
         p.Hello();
         p.PutRecord({128, shm_record::kFrame, 20, 1, 0, 24, 0});
       }},
      {"inline data longer than the record",
       [](FakeShmPeer& p) {
         p.Hello();
         p.PutRecord({64, shm_record::kFrame, 20, 0, 0, 4096, 4096});
       }},
      {"a payload beyond the largest message",
       [](FakeShmPeer& p) {
         p.Hello();
         p.PutRecord({64, shm_record::kFrame, 20, 0, 0, 0x80000001u, 0});
       }},
      {"a chunk outside any frame",
       [](FakeShmPeer& p) {
         p.Hello();
         p.PutRecord({64, shm_record::kChunk, 0, 0, 0, 0, 8});
       }},
      {"an unknown record kind",
       [](FakeShmPeer& p) {
         p.Hello();
         p.PutRecord({64, 9, 0, 0, 0, 0, 0});
       }},
      {"a tail moved beyond the ring",
       [](FakeShmPeer& p) {
         p.control(0)->tail.store(uint64_t{kShmRingBytes} * 3, std::memory_order_release);
         p.Ring();
       }},
      {"bytes on the socket after the setup",
       [](FakeShmPeer& p) {
         p.Hello();
         ssize_t w = send(p.sock(), "junk", 4, MSG_NOSIGNAL);
         (void)w;
       }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    FakeShmPeer p;
    ASSERT_TRUE(p.Open(port_));
    ASSERT_TRUE(p.GotHello());
    c.attack(p);
    EXPECT_TRUE(p.WaitClosed()) << "the channel stayed open after " << c.what;
  }
  ExpectServing();
}

// A memfd sealed against shrinking, `bytes` long, each byte its offset's low bits plus `salt`.
int SealedPattern(size_t bytes, uint8_t salt) {
  int fd = memfd_create("fake-peer-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) return -1;
  std::vector<uint8_t> b(bytes);
  for (size_t i = 0; i < bytes; ++i) b[i] = static_cast<uint8_t>(i * 7 + salt);
  if (pwrite(fd, b.data(), bytes, 0) != static_cast<ssize_t>(bytes) ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0)
    return -1;
  return fd;
}

// The process under test, in a child: a UD QP with one receive posted, polled without pause.
// Reports its channel port and QPN, then whether the datagram arrived intact ('K').
int PolledUdReceiver(semantics::ChildPipe p, uint32_t qkey, uint32_t payload,
                     uint64_t pattern_offset, uint8_t salt) {
  ibv_context* ctx = semantics::OpenFirstDevice();
  if (!ctx) return 10;
  ibv_gid gid;
  if (ibv_query_gid(ctx, 1, 0, &gid) != 0) return 11;
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ibv_cq* cq = ibv_create_cq(ctx, 4, nullptr, nullptr, 0);
  if (!pd || !cq) return 12;
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_UD;
  ia.cap = {1, 1, 1, 1, 0};
  ibv_qp* qp = ibv_create_qp(pd, &ia);
  if (!qp) return 13;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qkey = qkey;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
    return 14;
  a.qp_state = IBV_QPS_RTR;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE)) return 15;
  std::vector<uint8_t> buf(40 + payload, 0);
  ibv_mr* mr = ibv_reg_mr(pd, buf.data(), buf.size(), int{IBV_ACCESS_LOCAL_WRITE});
  if (!mr) return 16;
  ibv_sge sge{reinterpret_cast<uintptr_t>(buf.data()), static_cast<uint32_t>(buf.size()), mr->lkey};
  ibv_recv_wr rwr{}, *bad = nullptr;
  rwr.sg_list = &sge;
  rwr.num_sge = 1;
  if (ibv_post_recv(qp, &rwr, &bad)) return 17;
  uint16_t port = static_cast<uint16_t>(gid.raw[12] << 8 | gid.raw[13]);
  if (!p.Send(port) || !p.Send(qp->qp_num)) return 18;
  ibv_wc wc{};
  int got = 0;
  auto deadline = Clock::now() + std::chrono::milliseconds(kIoTimeoutMs);
  while (got == 0 && Clock::now() < deadline) got = ibv_poll_cq(cq, 1, &wc);
  char verdict = 'K';
  if (got != 1) {
    verdict = 'T';  // nothing arrived: the channel was dropped
  } else if (wc.status != IBV_WC_SUCCESS || wc.byte_len != 40 + payload) {
    verdict = 'S';
  } else {
    for (uint32_t i = 0; i < payload; ++i)
      if (buf[40 + i] != static_cast<uint8_t>((pattern_offset + i) * 7 + salt)) verdict = 'D';
  }
  return p.Send(verdict) ? 0 : 19;
}

// A well-behaved peer sends its setup, its window table and its arena on the socket, and soon
// after its first payload by reference. Everything can be queued before the process gets to run:
// the setup is read, and the rings are served before the socket is asked again, so the record is
// met while both other messages still wait. Reading only the first of them (the window table) made
// the arena look missing and cost the peer its channel (ibv_rc_pingpong -s 65536 over shared
// memory: retry exceeded in about 1 run in 6). Stopping the process while the peer writes makes
// that order certain.
TEST(ShmPeerSetup, AFirstRecordByReferenceFindsTheArenaQueuedBehindTheWindowTable) {
  if (semantics::ShmLinkOff()) GTEST_SKIP() << semantics::kShmLinkOff;
  constexpr uint32_t kQkey = 0x11111111, kPayload = 4096, kArenaOffset = 4096;
  constexpr uint8_t kSalt = 3;
  semantics::ForkedPeer child;
  ASSERT_TRUE(child.Start([&](int up, int down) {
    return PolledUdReceiver(semantics::ChildPipe{up, down}, kQkey, kPayload, kArenaOffset, kSalt);
  }));
  uint16_t port = 0;
  uint32_t qpn = 0;
  ASSERT_TRUE(child.Recv(&port) && child.Recv(&qpn));
  ASSERT_EQ(kill(child.pid(), SIGSTOP), 0);
  int st = 0;
  ASSERT_EQ(waitpid(child.pid(), &st, WUNTRACED), child.pid());
  ASSERT_TRUE(WIFSTOPPED(st));

  FakeShmPeer p;
  bool queued = p.Open(port);
  p.Hello();
  // LRH (a GRH follows) + GRH + BTH (UD SEND only) + DETH, then one reference into the arena.
  std::vector<uint8_t> hdr(8 + 40 + 12 + 8, 0);
  hdr[1] = 3;
  hdr[48] = 0x64;
  hdr[49] = 0x40;
  hdr[50] = hdr[51] = 0xff;
  for (int i = 0; i < 3; ++i) hdr[53 + i] = static_cast<uint8_t>(qpn >> (16 - 8 * i));
  for (int i = 0; i < 4; ++i) hdr[60 + i] = static_cast<uint8_t>(kQkey >> (24 - 8 * i));
  hdr[67] = 0x42;  // source QP
  const auto hdr_len = static_cast<uint32_t>(hdr.size());
  const uint32_t fixed = sizeof(ShmRecordHeader) + ShmAlign(hdr_len, 8);
  const uint32_t bytes = ShmAlign(fixed + sizeof(ShmPayloadRef), kShmRecordAlign);
  std::vector<uint8_t> rec(bytes, 0);
  ShmRecordHeader h{bytes, shm_record::kFrame, static_cast<uint8_t>(hdr_len), 1, 0, kPayload, 0};
  ShmPayloadRef ref{kShmArenaSegment, 0, kArenaOffset, kPayload};
  std::memcpy(rec.data(), &h, sizeof h);
  std::memcpy(rec.data() + sizeof h, hdr.data(), hdr_len);
  std::memcpy(rec.data() + fixed, &ref, sizeof ref);
  p.Put(rec.data(), rec.size());
  int table = SealedPattern(64, 0), table_arena = SealedPattern(64, 0);
  int arena = SealedPattern(2 * kArenaOffset, kSalt);
  int direct[2] = {table, table_arena};  // not a real table: refused, one-sided ops go the long way
  queued = queued && table >= 0 && table_arena >= 0 && arena >= 0 && p.SendControl(2, direct, 2) &&
           p.SendControl(1, &arena, 1);
  for (int fd : {table, table_arena, arena})
    if (fd >= 0) close(fd);
  ASSERT_EQ(kill(child.pid(), SIGCONT), 0);
  ASSERT_TRUE(queued);

  char verdict = '?';
  ASSERT_TRUE(child.Recv(&verdict, std::chrono::milliseconds(2 * kIoTimeoutMs)));
  EXPECT_EQ(verdict, 'K') << "T: the datagram never arrived (the channel was dropped); S: bad "
                             "completion; D: wrong bytes";
  EXPECT_EQ(child.Wait(), 0);
}

// Not an attack: the peer's view of a consumer that serves a long batch. The producer rings a
// consumer whose application has not looked at the ring for kShmConsumerIdleNs; serving records is
// looking. Before, only an application's poll said so, and a batch served for longer than that
// drew a doorbell per few frames (ib_send_bw 2 B: 0.5-0.7 M messages/s, the progress threads
// woken tens of thousands of times a second). Nothing here polls a CQ: only the serving can tell.
using ShmFakePeer = ShmHostilePeer;
TEST_F(ShmFakePeer, ServingALongBatchTellsTheProducerTheRingIsWatched) {
  FakeShmPeer p;
  ASSERT_TRUE(p.Open(port_));
  ASSERT_TRUE(p.GotHello());
  p.Hello();
  const int64_t before = NowNs();
  constexpr int kRecords = 256;
  // Each record published whole, as a producer does: a consumer that met a header whose record
  // was not all published yet took it for a broken one and closed the channel (seen once under
  // ThreadSanitizer, whose slowness widened the window between the two halves).
  for (int i = 0; i < kRecords; ++i) {
    uint8_t record[64] = {};
    const ShmRecordHeader pad{64, shm_record::kPad, 0, 0, 0, 0, 0};
    std::memcpy(record, &pad, sizeof pad);
    p.Put(record, sizeof record, false);
  }
  p.Ring();
  const uint64_t end = p.control(0)->tail.load();
  auto deadline = Clock::now() + std::chrono::milliseconds(kIoTimeoutMs);
  while (p.control(0)->head.load() != end && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(p.control(0)->head.load(), end) << "the records were not served";
  EXPECT_GE(p.control(0)->consumer_seen_ns.load(), before)
      << "a consumer serving a batch of " << kRecords << " records looked idle to its producer";
}

}  // namespace
