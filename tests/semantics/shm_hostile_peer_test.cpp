// A hostile peer on the same-host link: the test plays a process of the same user that opens a
// shared-memory channel to this process by hand (Unix socket, memfd, eventfds) and writes records
// the link must refuse. Each one costs the peer its channel (the process closes the socket), and
// the process goes on accepting the next channel. Every wait is bounded.
#include <infiniband/verbs.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
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

namespace {

using namespace softrdma::link;
using Clock = std::chrono::steady_clock;

constexpr int kIoTimeoutMs = 5000;
constexpr size_t kControlBytes = 4096;
constexpr size_t kSegmentBytes = kControlBytes + 2 * size_t{kShmRingBytes};

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

  // Opens a channel to the endpoint on `port`; `seal` and `size` let a test break the setup.
  bool Open(uint16_t port, bool seal = true, size_t size = kSegmentBytes) {
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
    SetupMsg s{{'S', 'R', 'S', 'M'}, 1, {}, kShmRingBytes, 0};
    int fds[3] = {memfd_, their_bell_, our_bell_};
    char cbuf[CMSG_SPACE(sizeof fds)] = {};
    iovec iov{&s, sizeof s};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf;
    msg.msg_controllen = sizeof cbuf;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof fds);
    std::memcpy(CMSG_DATA(c), fds, sizeof fds);
    return sendmsg(sock_, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof s);
  }

  ShmRingControl* control(int i) { return reinterpret_cast<ShmRingControl*>(map_) + i; }
  uint8_t* ring(int i) { return map_ + kControlBytes + size_t(i) * kShmRingBytes; }

  // Appends raw bytes as the next record(s) of our ring and rings the doorbell.
  void Put(const void* rec, size_t n) {
    std::memcpy(ring(0) + tail_, rec, n);
    tail_ += n;
    control(0)->tail.store(tail_, std::memory_order_release);
    Ring();
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
  int sock_ = -1, memfd_ = -1, their_bell_ = -1, our_bell_ = -1;
  uint8_t* map_ = nullptr;
  size_t map_len_ = 0;
  uint64_t tail_ = 0;
};

class ShmHostilePeer : public ::testing::Test {
 protected:
  void SetUp() override {
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

}  // namespace
