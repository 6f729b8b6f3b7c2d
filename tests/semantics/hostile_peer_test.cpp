// A hostile peer on the wire: the test itself plays a remote node with nothing but a TCP socket,
// against an RC QP and an MR of this process. It speaks the link protocol by hand (Hello, then
// LinkHeader + IB headers + payload, encoded here independently of src/link and src/core) and
// checks that:
//  (a) a stream the link cannot parse (bad hello, bad link header, truncated frames, IB headers
//      that do not match their opcode, garbage) costs the peer its connection, and the process
//      goes on serving the next one;
//  (b) well-formed requests that reach outside what the MR grants (wrong rkey, addresses before,
//      after, across the end, wrapping, huge lengths, misaligned atomics, missing rights) are
//      answered with a NAK and put the QP in ERR, and never touch a byte outside the region: the
//      MR sits between guard bytes of known value in the same allocation;
//  (c) correct requests land.
// Sockets connect to 127.0.0.1 only; every wait is bounded.
#include <infiniband/verbs.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "support/semantics_harness.h"

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <thread>
#include <vector>

namespace {

using Bytes = std::vector<uint8_t>;
using Clock = std::chrono::steady_clock;

constexpr int kIoTimeoutMs = 5000;  // any single expected reply or disconnect
constexpr size_t kGuard = 256;      // guard bytes on each side of the region
constexpr size_t kRegion = 4096;
constexpr uint8_t kGuardByte = 0xa5;
constexpr uint8_t kRegionByte = 0x00;
constexpr uint32_t kFakeRemoteQpn = 0x000123;  // slot 0: no process answers for it

// IBTA opcodes (RC).
constexpr uint8_t kSendOnly = 0x04, kWriteFirst = 0x06, kWriteOnly = 0x0a, kReadRequest = 0x0c,
                  kReadResponseOnly = 0x10, kAcknowledge = 0x11, kAtomicAck = 0x12,
                  kCompareSwap = 0x13, kFetchAdd = 0x14;
// AETH NAK syndromes: 0x60 | code.
constexpr uint8_t kNakInvalidRequest = 0x61, kNakRemoteAccess = 0x62;

// ---- Encoding, by hand ------------------------------------------------------------------------

void Put16(Bytes& b, uint16_t v) {
  b.push_back(static_cast<uint8_t>(v >> 8));
  b.push_back(static_cast<uint8_t>(v));
}
void Put24(Bytes& b, uint32_t v) {
  b.push_back(static_cast<uint8_t>(v >> 16));
  Put16(b, static_cast<uint16_t>(v));
}
void Put32(Bytes& b, uint32_t v) {
  Put16(b, static_cast<uint16_t>(v >> 16));
  Put16(b, static_cast<uint16_t>(v));
}
void Put64(Bytes& b, uint64_t v) {
  Put32(b, static_cast<uint32_t>(v >> 32));
  Put32(b, static_cast<uint32_t>(v));
}
uint32_t Get24(const uint8_t* p) {
  return uint32_t{p[0]} << 16 | uint32_t{p[1]} << 8 | p[2];
}
uint32_t Get32(const uint8_t* p) {
  return uint32_t{p[0]} << 24 | Get24(p + 1);
}
uint64_t Get64(const uint8_t* p) {
  return uint64_t{Get32(p)} << 32 | Get32(p + 4);
}

// The wire version these streams speak (link::kWireVersion; written out here, as a peer would).
constexpr uint8_t kVersion = 2;

Bytes Hello(uint8_t version = kVersion, const char* magic = "SRDM") {
  Bytes b(magic, magic + 4);
  b.push_back(version);
  b.insert(b.end(), 3, 0);
  for (int i = 0; i < 16; ++i) b.push_back(static_cast<uint8_t>(0xe0 + i));  // node id
  return b;
}

// LRH (local: no GRH) + BTH.
Bytes IbHeader(uint8_t opcode, uint32_t dest_qpn, uint32_t psn, uint8_t lnh = 2) {
  Bytes b;
  b.push_back(0);       // VL, LVer
  b.push_back(lnh);     // SL 0, LNH
  Put16(b, 1);          // DLID
  Put16(b, 0);          // packet length (unused on this link)
  Put16(b, 2);          // SLID
  b.push_back(opcode);  // BTH
  b.push_back(0x40);    // SE 0, MigReq, PadCnt 0, TVer 0
  Put16(b, 0xffff);     // P_Key
  b.push_back(0);
  Put24(b, dest_qpn);
  b.push_back(0x80);  // AckReq
  Put24(b, psn);
  return b;
}

void AddReth(Bytes& b, uint64_t va, uint32_t rkey, uint32_t len) {
  Put64(b, va);
  Put32(b, rkey);
  Put32(b, len);
}

void AddAtomicEth(Bytes& b, uint64_t va, uint32_t rkey, uint64_t swap_add, uint64_t compare) {
  Put64(b, va);
  Put32(b, rkey);
  Put64(b, swap_add);
  Put64(b, compare);
}

// LinkHeader {be32 frame_len, version, hdr_len, flags 0, 0} + headers + payload.
Bytes LinkFrame(const Bytes& ib, const Bytes& payload, uint8_t version = kVersion) {
  Bytes b;
  Put32(b, static_cast<uint32_t>(ib.size() + payload.size()));
  b.push_back(version);
  b.push_back(static_cast<uint8_t>(ib.size()));
  b.push_back(0);
  b.push_back(0);
  b.insert(b.end(), ib.begin(), ib.end());
  b.insert(b.end(), payload.begin(), payload.end());
  return b;
}

// A request with an ACK riding on it (link flag 0x04): the rider's 4 bytes follow the link header.
Bytes RiderFrame(const Bytes& ib, const Bytes& payload, const Bytes& rider) {
  Bytes b;
  Put32(b, static_cast<uint32_t>(rider.size() + ib.size() + payload.size()));
  b.push_back(kVersion);
  b.push_back(static_cast<uint8_t>(ib.size()));
  b.push_back(0x04);
  b.push_back(0);
  b.insert(b.end(), rider.begin(), rider.end());
  b.insert(b.end(), ib.begin(), ib.end());
  b.insert(b.end(), payload.begin(), payload.end());
  return b;
}

Bytes RawLinkHeader(uint32_t frame_len, uint8_t version, uint8_t hdr_len, uint8_t flags = 0) {
  Bytes b;
  Put32(b, frame_len);
  b.push_back(version);
  b.push_back(hdr_len);
  b.push_back(flags);
  b.push_back(0);
  return b;
}

// A credit frame (link flag 0x02): datagram bytes consumed so far.
Bytes Credit(uint64_t consumed) {
  Bytes b = RawLinkHeader(8, kVersion, 8, 0x02);
  Put64(b, consumed);
  return b;
}

Bytes Pattern(size_t n, uint8_t seed) {
  Bytes b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(seed + i * 7);
  return b;
}

// ---- A raw TCP peer -----------------------------------------------------------------------------

class Peer {
 public:
  ~Peer() { Close(); }

  bool Connect(uint16_t port) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) return false;
    int one = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    if (connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return false;
    return fcntl(fd_, F_SETFL, fcntl(fd_, F_GETFL) | O_NONBLOCK) == 0;
  }

  // Connects and exchanges hellos: reads the node's and checks it.
  bool Open(uint16_t port) {
    if (!Connect(port)) return false;
    uint8_t h[24];
    if (!Read(h, sizeof h)) return false;
    if (std::memcmp(h, "SRDM", 4) != 0 || h[4] != kVersion) return false;
    return Send(Hello());
  }

  bool Send(const Bytes& b) {
    size_t done = 0;
    auto deadline = Clock::now() + std::chrono::milliseconds(kIoTimeoutMs);
    while (done < b.size()) {
      ssize_t w = send(fd_, b.data() + done, b.size() - done, MSG_NOSIGNAL);
      if (w > 0) {
        done += static_cast<size_t>(w);
        continue;
      }
      if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
      if (!Wait(POLLOUT, deadline)) return false;
    }
    return true;
  }

  void ShutdownWrite() { shutdown(fd_, SHUT_WR); }

  bool Read(void* p, size_t n) {
    auto deadline = Clock::now() + std::chrono::milliseconds(kIoTimeoutMs);
    auto* out = static_cast<uint8_t*>(p);
    size_t got = 0;
    while (got < n) {
      ssize_t r = recv(fd_, out + got, n - got, 0);
      if (r > 0) {
        got += static_cast<size_t>(r);
        continue;
      }
      if (r == 0) return false;
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
      if (!Wait(POLLIN, deadline)) return false;
    }
    return true;
  }

  struct Reply {
    uint8_t opcode;
    uint32_t dest_qpn;
    uint32_t psn;
    uint8_t syndrome;  // AETH, when the opcode carries one
    uint64_t atomic_orig;
    Bytes payload;
  };

  // The next frame the node sends, or nullopt after kIoTimeoutMs or on a closed connection.
  std::optional<Reply> ReadReply() {
    uint8_t lh[8];
    if (!Read(lh, sizeof lh)) return std::nullopt;
    uint32_t frame_len = Get32(lh);
    uint8_t hdr_len = lh[5];
    if (lh[4] != kVersion || hdr_len < 20 || frame_len < hdr_len || frame_len > (1u << 24))
      return std::nullopt;
    Bytes f(frame_len);
    if (!Read(f.data(), f.size())) return std::nullopt;
    size_t bth = (f[1] & 3) == 3 ? 48 : 8;
    if (hdr_len < bth + 12) return std::nullopt;
    Reply r{};
    r.opcode = f[bth];
    r.dest_qpn = Get24(&f[bth + 5]);
    r.psn = Get24(&f[bth + 9]);
    size_t ext = bth + 12;
    if (r.opcode >= kReadResponseOnly - 3 && r.opcode <= kAtomicAck && r.opcode != 0x0e &&
        hdr_len >= ext + 4)
      r.syndrome = f[ext];
    if (r.opcode == kAtomicAck && hdr_len >= ext + 12) r.atomic_orig = Get64(&f[ext + 4]);
    r.payload.assign(f.begin() + hdr_len, f.end());
    return r;
  }

  // True when the node closes the connection (EOF or reset) within the bound. Whatever it still
  // sends before closing is read and dropped.
  bool WaitClosed(int timeout_ms = kIoTimeoutMs) {
    auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    uint8_t sink[4096];
    for (;;) {
      ssize_t r = recv(fd_, sink, sizeof sink, 0);
      if (r == 0) return true;
      if (r < 0 && (errno == ECONNRESET || errno == EPIPE)) return true;
      if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
      if (r < 0 && !Wait(POLLIN, deadline)) return false;
    }
  }

  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  bool Wait(short events, Clock::time_point deadline) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd_, events, 0};
    int r = poll(&p, 1, static_cast<int>(left.count()));
    return r > 0 || (r < 0 && errno == EINTR);
  }

  int fd_ = -1;
};

// ---- The node under attack ----------------------------------------------------------------------

class HostilePeer : public ::testing::Test {
 protected:
  void SetUp() override {
    ctx_ = semantics::OpenFirstDevice();
    ASSERT_NE(ctx_, nullptr);
    // The endpoint's TCP port, from GID 0: fe80::<ipv4:4><port:2><slot:2>.
    ibv_gid gid;
    ASSERT_EQ(ibv_query_gid(ctx_, 1, 0, &gid), 0);
    port_ = static_cast<uint16_t>(gid.raw[12] << 8 | gid.raw[13]);
    ASSERT_NE(port_, 0);
    // Async events are drained without blocking.
    ASSERT_EQ(fcntl(ctx_->async_fd, F_SETFL, fcntl(ctx_->async_fd, F_GETFL) | O_NONBLOCK), 0);

    pd_ = ibv_alloc_pd(ctx_);
    ASSERT_NE(pd_, nullptr);
    cq_ = ibv_create_cq(ctx_, 256, nullptr, nullptr, 0);
    ASSERT_NE(cq_, nullptr);
    // [guard][region][guard] in one allocation; only the region is registered.
    alloc_ = static_cast<uint8_t*>(aligned_alloc(64, kGuard + kRegion + kGuard));
    ASSERT_NE(alloc_, nullptr);
    std::memset(alloc_, kGuardByte, kGuard + kRegion + kGuard);
    region_ = alloc_ + kGuard;
    std::memset(region_, kRegionByte, kRegion);
    mr_ = ibv_reg_mr(pd_, region_, kRegion,
                     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                         IBV_ACCESS_REMOTE_ATOMIC);
    ASSERT_NE(mr_, nullptr);
    // A region that grants remote read only, in its own guarded allocation.
    ro_alloc_ = static_cast<uint8_t*>(aligned_alloc(64, 3 * 64));
    ASSERT_NE(ro_alloc_, nullptr);
    std::memset(ro_alloc_, kGuardByte, 3 * 64);
    ro_ = ro_alloc_ + 64;
    std::memset(ro_, 0x3c, 64);
    ro_mr_ = ibv_reg_mr(pd_, ro_, 64, int{IBV_ACCESS_REMOTE_READ});
    ASSERT_NE(ro_mr_, nullptr);

    ibv_qp_init_attr qa{};
    qa.send_cq = cq_;
    qa.recv_cq = cq_;
    qa.qp_type = IBV_QPT_RC;
    qa.cap.max_send_wr = 16;
    qa.cap.max_recv_wr = 16;
    qa.cap.max_send_sge = 1;
    qa.cap.max_recv_sge = 1;
    qp_ = ibv_create_qp(pd_, &qa);
    ASSERT_NE(qp_, nullptr);
    ASSERT_NO_FATAL_FAILURE(Connect());
    ASSERT_TRUE(peer_.Open(port_));
  }

  void TearDown() override {
    peer_.Close();
    if (qp_) {
      EXPECT_EQ(ibv_destroy_qp(qp_), 0);
    }
    DrainAsync();
    if (ro_mr_) {
      EXPECT_EQ(ibv_dereg_mr(ro_mr_), 0);
    }
    if (mr_) {
      EXPECT_EQ(ibv_dereg_mr(mr_), 0);
    }
    if (cq_) {
      EXPECT_EQ(ibv_destroy_cq(cq_), 0);
    }
    if (pd_) {
      EXPECT_EQ(ibv_dealloc_pd(pd_), 0);
    }
    if (ctx_) {
      EXPECT_EQ(ibv_close_device(ctx_), 0);
    }
    free(alloc_);
    free(ro_alloc_);
  }

  // RESET -> INIT -> RTR -> RTS against the fake remote QP; the responder expects PSN 0 next.
  void Connect() {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RESET;
    ASSERT_EQ(ibv_modify_qp(qp_, &a, IBV_QP_STATE), 0);
    a = ibv_qp_attr{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                        IBV_ACCESS_REMOTE_ATOMIC;
    ASSERT_EQ(ibv_modify_qp(qp_, &a,
                            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
              0);
    a = ibv_qp_attr{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_4096;
    a.dest_qp_num = kFakeRemoteQpn;
    a.rq_psn = 0;
    a.max_dest_rd_atomic = 16;
    a.min_rnr_timer = 1;
    a.ah_attr.port_num = 1;
    ASSERT_EQ(ibv_modify_qp(qp_, &a,
                            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
              0);
    a = ibv_qp_attr{};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 16;
    ASSERT_EQ(ibv_modify_qp(qp_, &a,
                            IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC),
              0);
    psn_ = 0;
  }

  ibv_qp_state QpState() {
    ibv_qp_attr a{};
    ibv_qp_init_attr init{};
    EXPECT_EQ(ibv_query_qp(qp_, &a, IBV_QP_STATE, &init), 0);
    return a.qp_state;
  }

  uint64_t Va(size_t offset) const { return reinterpret_cast<uintptr_t>(region_) + offset; }
  uint64_t Va(int64_t offset) const { return reinterpret_cast<uintptr_t>(region_) + offset; }

  Bytes Write(uint64_t va, uint32_t rkey, const Bytes& payload, uint32_t reth_len) {
    Bytes h = IbHeader(kWriteOnly, qp_->qp_num, psn_);
    AddReth(h, va, rkey, reth_len);
    return LinkFrame(h, payload);
  }
  Bytes Write(uint64_t va, uint32_t rkey, const Bytes& payload) {
    return Write(va, rkey, payload, static_cast<uint32_t>(payload.size()));
  }
  Bytes Read(uint64_t va, uint32_t rkey, uint32_t len) {
    Bytes h = IbHeader(kReadRequest, qp_->qp_num, psn_);
    AddReth(h, va, rkey, len);
    return LinkFrame(h, {});
  }
  Bytes Atomic(uint8_t opcode, uint64_t va, uint32_t rkey, uint64_t swap_add, uint64_t compare) {
    Bytes h = IbHeader(opcode, qp_->qp_num, psn_);
    AddAtomicEth(h, va, rkey, swap_add, compare);
    return LinkFrame(h, {});
  }

  // Every byte outside the region still holds its guard value.
  ::testing::AssertionResult GuardsIntact() const {
    for (size_t i = 0; i < kGuard; ++i) {
      if (alloc_[i] != kGuardByte)
        return ::testing::AssertionFailure()
               << "guard byte " << i << " before the region is " << int(alloc_[i]);
      if (region_[kRegion + i] != kGuardByte)
        return ::testing::AssertionFailure()
               << "guard byte " << i << " after the region is " << int(region_[kRegion + i]);
    }
    for (size_t i = 0; i < 64; ++i) {
      if (ro_alloc_[i] != kGuardByte || ro_alloc_[128 + i] != kGuardByte)
        return ::testing::AssertionFailure() << "guard of the read-only region changed";
      if (ro_[i] != 0x3c) return ::testing::AssertionFailure() << "read-only region changed";
    }
    return ::testing::AssertionSuccess();
  }

  ::testing::AssertionResult RegionUntouched() const {
    for (size_t i = 0; i < kRegion; ++i)
      if (region_[i] != kRegionByte)
        return ::testing::AssertionFailure() << "region byte " << i << " changed";
    return ::testing::AssertionSuccess();
  }

  // Sends `frame` (a request at psn_) and expects a NAK with one of `codes` for it, then the QP in
  // ERR, and nothing outside (or, for a refused request, inside) the region changed. Leaves the QP
  // reconnected for the next case.
  // Then reconnects the QP, unless told not to (a reset takes the QP's unpolled completions).
  void ExpectNak(const Bytes& frame, std::initializer_list<uint8_t> codes, const char* what,
                 bool reconnect = true) {
    SCOPED_TRACE(what);
    ASSERT_TRUE(peer_.Send(frame));
    auto r = peer_.ReadReply();
    ASSERT_TRUE(r.has_value()) << "no reply within " << kIoTimeoutMs << " ms";
    EXPECT_EQ(r->opcode, kAcknowledge);
    EXPECT_EQ(r->psn, psn_);
    EXPECT_EQ(r->dest_qpn, kFakeRemoteQpn);
    bool expected = false;
    for (uint8_t c : codes) expected = expected || r->syndrome == c;
    EXPECT_TRUE(expected) << "syndrome 0x" << std::hex << int(r->syndrome);
    EXPECT_EQ(QpState(), IBV_QPS_ERR);
    EXPECT_TRUE(GuardsIntact());
    EXPECT_TRUE(RegionUntouched());
    if (reconnect) {
      ASSERT_NO_FATAL_FAILURE(Connect());
    }
  }

  // One completion, waiting up to ~5 s: an RC receive completion is delivered just after its
  // ACK leaves, so the peer may read the ACK first.
  int PollOne(ibv_wc* wc) {
    int n = ibv_poll_cq(cq_, 1, wc);
    if (n == 0) usleep(5000);
    return n;
  }

  std::vector<ibv_event_type> DrainAsync() {
    std::vector<ibv_event_type> out;
    ibv_async_event e;
    for (int i = 0; i < 1000 && ibv_get_async_event(ctx_, &e) == 0; ++i) {
      out.push_back(e.event_type);
      ibv_ack_async_event(&e);
    }
    return out;
  }

  ibv_context* ctx_ = nullptr;
  uint16_t port_ = 0;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  uint8_t* alloc_ = nullptr;
  uint8_t* region_ = nullptr;
  ibv_mr* mr_ = nullptr;
  uint8_t* ro_alloc_ = nullptr;
  uint8_t* ro_ = nullptr;
  ibv_mr* ro_mr_ = nullptr;
  ibv_qp* qp_ = nullptr;
  uint32_t psn_ = 0;
  Peer peer_;
};

// ---- (c) what a correct peer does lands
// ----------------------------------------------------------

TEST_F(HostilePeer, CorrectWriteReadAndAtomicsLand) {
  Bytes data = Pattern(64, 11);
  ASSERT_TRUE(peer_.Send(Write(Va(size_t{100}), mr_->rkey, data)));
  auto r = peer_.ReadReply();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->opcode, kAcknowledge);
  EXPECT_EQ(r->syndrome & 0xe0, 0) << "not an ACK: 0x" << std::hex << int(r->syndrome);
  EXPECT_EQ(r->psn, 0u);
  EXPECT_EQ(r->dest_qpn, kFakeRemoteQpn);
  EXPECT_EQ(std::memcmp(region_ + 100, data.data(), data.size()), 0);

  // The last byte of the region, exactly.
  ++psn_;
  ASSERT_TRUE(peer_.Send(Write(Va(kRegion - 1), mr_->rkey, Bytes{0x77})));
  r = peer_.ReadReply();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->opcode, kAcknowledge);
  EXPECT_EQ(r->syndrome & 0xe0, 0);
  EXPECT_EQ(region_[kRegion - 1], 0x77);

  ++psn_;
  ASSERT_TRUE(peer_.Send(Read(Va(size_t{100}), mr_->rkey, 64)));
  r = peer_.ReadReply();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->opcode, kReadResponseOnly);
  EXPECT_EQ(r->psn, psn_);
  EXPECT_EQ(r->payload, data);

  ++psn_;
  std::memset(region_ + 512, 0, 8);
  region_[512 + 7] = 5;  // host order on little-endian: 5 << 56
  uint64_t before;
  std::memcpy(&before, region_ + 512, 8);
  ASSERT_TRUE(peer_.Send(Atomic(kFetchAdd, Va(size_t{512}), mr_->rkey, 3, 0)));
  r = peer_.ReadReply();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->opcode, kAtomicAck);
  EXPECT_EQ(r->psn, psn_);
  EXPECT_EQ(r->atomic_orig, before);
  uint64_t after;
  std::memcpy(&after, region_ + 512, 8);
  EXPECT_EQ(after, before + 3);

  ++psn_;
  ASSERT_TRUE(peer_.Send(Atomic(kCompareSwap, Va(size_t{512}), mr_->rkey, 42, before + 3)));
  r = peer_.ReadReply();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->opcode, kAtomicAck);
  EXPECT_EQ(r->atomic_orig, before + 3);
  std::memcpy(&after, region_ + 512, 8);
  EXPECT_EQ(after, 42u);

  // A read of the read-only region is allowed.
  ++psn_;
  ASSERT_TRUE(peer_.Send(Read(reinterpret_cast<uintptr_t>(ro_), ro_mr_->rkey, 64)));
  r = peer_.ReadReply();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->opcode, kReadResponseOnly);
  EXPECT_EQ(r->payload, Bytes(64, 0x3c));

  EXPECT_EQ(QpState(), IBV_QPS_RTS);
  EXPECT_TRUE(GuardsIntact());
}

// ---- (b) well-formed requests outside what the MR grants
// -----------------------------------------

TEST_F(HostilePeer, WriteWithWrongRkeyIsNakedAndTouchesNothing) {
  Bytes data = Pattern(32, 1);
  ExpectNak(Write(Va(size_t{0}), mr_->rkey ^ 0x1, data), {kNakRemoteAccess}, "rkey ^ 1");
  ExpectNak(Write(Va(size_t{0}), 0, data), {kNakRemoteAccess}, "rkey 0");
  ExpectNak(Write(Va(size_t{0}), ~mr_->rkey, data), {kNakRemoteAccess}, "~rkey");
  // Another MR's key does not cover this MR's addresses.
  ExpectNak(Write(Va(size_t{0}), ro_mr_->rkey, data), {kNakRemoteAccess}, "other MR's rkey");
  bool saw_access_err = false;
  for (ibv_event_type t : DrainAsync())
    saw_access_err = saw_access_err || t == IBV_EVENT_QP_ACCESS_ERR;
  EXPECT_TRUE(saw_access_err) << "IBV_EVENT_QP_ACCESS_ERR not raised";
}

TEST_F(HostilePeer, WriteOutsideTheRegionIsNaked) {
  Bytes data = Pattern(16, 2);
  const std::initializer_list<uint8_t> kAccess = {kNakRemoteAccess};
  ExpectNak(Write(Va(int64_t{-16}), mr_->rkey, data), kAccess, "entirely before");
  ExpectNak(Write(Va(int64_t{-8}), mr_->rkey, data), kAccess, "straddling the start");
  ExpectNak(Write(Va(int64_t{-1}), mr_->rkey, Bytes{1}), kAccess, "one byte before");
  ExpectNak(Write(Va(kRegion), mr_->rkey, Bytes{1}), kAccess, "one byte after");
  ExpectNak(Write(Va(kRegion + 64), mr_->rkey, data), kAccess, "entirely after");
  ExpectNak(Write(Va(kRegion - 8), mr_->rkey, data), kAccess, "overlapping the end");
  ExpectNak(Write(Va(size_t{0}), mr_->rkey, Pattern(kRegion + 1, 3)), kAccess, "one byte too long");
  ExpectNak(Write(~uint64_t{0} - 7, mr_->rkey, data), kAccess, "wrapping the address space");
  ExpectNak(Write(0, mr_->rkey, data), kAccess, "address 0");
  // A large payload aimed past the region: refused, and the link drains it without placing it.
  ExpectNak(Write(Va(kRegion - 4096 + 8), mr_->rkey, Pattern(1 << 20, 4)), kAccess,
            "1 MiB from inside across the end");
  // RETH lengths that disagree with the payload: a malformed request, or an access error.
  const std::initializer_list<uint8_t> kEither = {kNakInvalidRequest, kNakRemoteAccess};
  ExpectNak(Write(Va(size_t{0}), mr_->rkey, data, 0xffffffffu), kEither, "RETH length 4 GiB - 1");
  ExpectNak(Write(Va(size_t{0}), mr_->rkey, data, 0x80000000u), kEither, "RETH length 2 GiB");
  ExpectNak(Write(Va(size_t{8}), mr_->rkey, data, 0xfffffff8u), kEither, "RETH length wraps");
  ExpectNak(Write(Va(size_t{0}), mr_->rkey, data, 8), kEither, "RETH shorter than payload");
  // A region registered without remote write.
  ExpectNak(Write(reinterpret_cast<uintptr_t>(ro_), ro_mr_->rkey, data), kAccess,
            "region without REMOTE_WRITE");
}

TEST_F(HostilePeer, ReadOutsideTheRegionIsNaked) {
  const std::initializer_list<uint8_t> kAccess = {kNakRemoteAccess};
  ExpectNak(Read(Va(size_t{0}), mr_->rkey ^ 0x80, 8), kAccess, "wrong rkey");
  ExpectNak(Read(Va(int64_t{-8}), mr_->rkey, 16), kAccess, "straddling the start");
  ExpectNak(Read(Va(kRegion - 8), mr_->rkey, 16), kAccess, "beyond the end");
  ExpectNak(Read(Va(kRegion), mr_->rkey, 1), kAccess, "one byte after");
  ExpectNak(Read(~uint64_t{0} - 3, mr_->rkey, 8), kAccess, "wrapping the address space");
  ExpectNak(Read(Va(size_t{8}), mr_->rkey, 0xfffffff8u), {kNakInvalidRequest, kNakRemoteAccess},
            "length wraps");
  ExpectNak(Read(Va(size_t{0}), mr_->rkey, 0x80000000u), {kNakInvalidRequest, kNakRemoteAccess},
            "2 GiB");
}

TEST_F(HostilePeer, AtomicsMisalignedOrOutsideAreNaked) {
  const std::initializer_list<uint8_t> kEither = {kNakInvalidRequest, kNakRemoteAccess};
  for (uint8_t op : {kFetchAdd, kCompareSwap}) {
    SCOPED_TRACE(op == kFetchAdd ? "FETCH_ADD" : "COMPARE_SWAP");
    ExpectNak(Atomic(op, Va(size_t{4}), mr_->rkey, 1, 0), {kNakInvalidRequest}, "misaligned");
    ExpectNak(Atomic(op, Va(kRegion - 4), mr_->rkey, 1, 0), kEither, "misaligned across the end");
    ExpectNak(Atomic(op, Va(kRegion), mr_->rkey, 1, 0), {kNakRemoteAccess}, "just after");
    ExpectNak(Atomic(op, Va(int64_t{-8}), mr_->rkey, 1, 0), {kNakRemoteAccess}, "just before");
    ExpectNak(Atomic(op, ~uint64_t{0} - 7, mr_->rkey, 1, 0), {kNakRemoteAccess}, "wrapping");
    ExpectNak(Atomic(op, Va(size_t{0}), mr_->rkey + 1, 1, 0), {kNakRemoteAccess}, "wrong rkey");
    ExpectNak(Atomic(op, reinterpret_cast<uintptr_t>(ro_), ro_mr_->rkey, 1, 0), {kNakRemoteAccess},
              "region without REMOTE_ATOMIC");
  }
}

TEST_F(HostilePeer, SendLargerThanTheReceiveBufferStopsAtTheBuffer) {
  // The receive buffer is the last 16 bytes of the region; 64 bytes arrive.
  ibv_sge sge{Va(kRegion - 16), 16, mr_->lkey};
  ibv_recv_wr wr{};
  wr.wr_id = 77;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_recv(qp_, &wr, &bad), 0);
  ExpectNak(LinkFrame(IbHeader(kSendOnly, qp_->qp_num, psn_), Pattern(64, 9)), {kNakInvalidRequest},
            "64-byte SEND into 16 bytes", /*reconnect=*/false);
  ibv_wc wc{};
  int n = 0;
  for (int i = 0; i < 1000 && n == 0; ++i) n = PollOne(&wc);
  ASSERT_EQ(n, 1);
  EXPECT_EQ(wc.wr_id, 77u);
  EXPECT_EQ(wc.status, IBV_WC_LOC_LEN_ERR);
  ASSERT_NO_FATAL_FAILURE(Connect());
}

TEST_F(HostilePeer, SplitMessagesAndUnknownQpsAreHandled) {
  // softrdma sends every message as one frame: a FIRST packet is not part of its protocol.
  Bytes h = IbHeader(kWriteFirst, qp_->qp_num, psn_);
  AddReth(h, Va(size_t{0}), mr_->rkey, 8192);
  ExpectNak(LinkFrame(h, Pattern(16, 5)), {kNakInvalidRequest}, "RDMA_WRITE_FIRST");

  // A frame for a QP nobody has vanishes; the connection and the QP carry on.
  Bytes stray = IbHeader(kWriteOnly, 0xabcdef, 0);
  AddReth(stray, Va(size_t{0}), mr_->rkey, 8);
  ASSERT_TRUE(peer_.Send(LinkFrame(stray, Pattern(8, 6))));
  ASSERT_TRUE(peer_.Send(Write(Va(size_t{40}), mr_->rkey, Pattern(8, 7))));
  auto r = peer_.ReadReply();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->opcode, kAcknowledge);
  EXPECT_EQ(r->syndrome & 0xe0, 0);
  EXPECT_EQ(r->psn, 0u);
  EXPECT_EQ(std::memcmp(region_ + 40, Pattern(8, 7).data(), 8), 0);
  EXPECT_EQ(region_[0], kRegionByte);
  EXPECT_TRUE(GuardsIntact());
}

// ---- (a) streams the link cannot parse
// ------------------------------------------------------------

struct BadStream {
  const char* name;
  Bytes bytes;
  bool hello = true;        // send a valid Hello first
  bool half_close = false;  // then end the stream (truncation)
};

TEST_F(HostilePeer, MalformedStreamsDropTheConnectionAndTheNextIsServed) {
  peer_.Close();
  const uint32_t qpn = qp_->qp_num;
  auto write_hdr = [&](uint32_t len) {
    Bytes h = IbHeader(kWriteOnly, qpn, 0);
    AddReth(h, Va(size_t{0}), mr_->rkey, len);
    return h;
  };
  std::mt19937 rng(20240611);
  Bytes garbage(512);
  for (uint8_t& b : garbage) b = static_cast<uint8_t>(rng());
  garbage[4] = 0x7f;  // whatever the rest says, the link version is wrong

  std::vector<BadStream> cases;
  cases.push_back({"HTTP instead of a hello",
                   Bytes{'G', 'E', 'T',  ' ',  '/',  ' ',  'H', 'T', 'T', 'P', '/', '1',
                         '.', '1', '\r', '\n', '\r', '\n', 0,   0,   0,   0,   0,   0},
                   false});
  cases.push_back({"hello version 1", Hello(1), false});
  cases.push_back({"hello version 3", Hello(3), false});
  cases.push_back({"hello magic", Hello(kVersion, "SRDX"), false});
  {
    Bytes h = Hello();
    h.resize(10);
    cases.push_back({"truncated hello", h, false, true});
  }
  cases.push_back({"link version 0", RawLinkHeader(40, 0, 20)});
  cases.push_back({"link version 1", LinkFrame(write_hdr(0), {}, 1)});
  cases.push_back({"unknown link flag", RawLinkHeader(40, kVersion, 20, 0x08)});
  cases.push_back({"rider ACK on a datagram", RawLinkHeader(44, kVersion, 20, 0x05)});
  cases.push_back({"rider ACK longer than the frame", RawLinkHeader(22, kVersion, 20, 0x04)});
  cases.push_back({"rider ACK with its top byte set",
                   RiderFrame(write_hdr(4), Pattern(4, 5), Bytes{1, 0, 0, 0})});
  cases.push_back({"rider ACK on an ACK", RiderFrame(
                                              [&] {
                                                Bytes h = IbHeader(kAcknowledge, qpn, 0);
                                                Put32(h, 0);
                                                return h;
                                              }(),
                                              {}, Bytes{0, 0, 0, 0})});
  cases.push_back({"rider ACK on a UC request", RiderFrame(IbHeader(0x20 | kSendOnly, qpn, 0),
                                                           Pattern(4, 6), Bytes{0, 0, 0, 0})});
  cases.push_back({"credit with 4 bytes", RawLinkHeader(4, kVersion, 4, 0x02)});
  cases.push_back({"credit with a payload", RawLinkHeader(12, kVersion, 8, 0x02)});
  cases.push_back({"credit that is also a datagram", RawLinkHeader(8, kVersion, 8, 0x03)});
  // Nothing was sent to this peer as a datagram: a credit for any byte is a lie.
  cases.push_back({"credit for datagrams never sent", Credit(1)});
  cases.push_back({"hdr_len 0", RawLinkHeader(40, kVersion, 0)});
  cases.push_back({"hdr_len 129", RawLinkHeader(200, kVersion, 129)});
  cases.push_back({"hdr_len 255", RawLinkHeader(255, kVersion, 255)});
  cases.push_back({"frame_len < hdr_len", RawLinkHeader(10, kVersion, 20)});
  cases.push_back({"frame_len 0", RawLinkHeader(0, kVersion, 20)});
  cases.push_back({"payload > 2 GiB", RawLinkHeader(0xffffffffu, kVersion, 36)});
  cases.push_back({"garbage after the hello", garbage});
  cases.push_back({"truncated link header", RawLinkHeader(40, kVersion, 20), true, true});
  {
    Bytes b = RawLinkHeader(40, kVersion, 20);
    b.resize(4);
    cases.push_back({"half a link header", b, true, true});
  }
  {
    Bytes f = LinkFrame(write_hdr(100), Pattern(100, 8));
    f.resize(8 + 10);  // header cut short
    cases.push_back({"truncated IB headers", f, true, true});
  }
  {
    Bytes f = LinkFrame(write_hdr(100), Pattern(100, 8));
    f.resize(f.size() - 90);  // payload cut short
    cases.push_back({"truncated payload", f, true, true});
  }
  // Link framing fine, IB headers wrong for their opcode.
  {
    Bytes h = IbHeader(kWriteOnly, qpn, 0);
    h.resize(12);
    cases.push_back({"IB headers shorter than LRH+BTH", LinkFrame(h, {})});
  }
  cases.push_back({"reserved opcode", LinkFrame(IbHeader(0x1f, qpn, 0), {})});
  cases.push_back({"opcode of no transport", LinkFrame(IbHeader(0xc4, qpn, 0), {})});
  cases.push_back({"RDMA_WRITE_ONLY without its RETH",
                   LinkFrame(IbHeader(kWriteOnly, qpn, 0), Pattern(16, 1))});
  {
    Bytes h = write_hdr(0);
    h.insert(h.end(), 4, 0);  // an extra header the opcode does not have
    cases.push_back({"RDMA_WRITE_ONLY with 4 extra header bytes", LinkFrame(h, {})});
  }
  {
    Bytes h = IbHeader(kReadRequest, qpn, 0);
    AddReth(h, Va(size_t{0}), mr_->rkey, 8);
    cases.push_back({"READ request carrying a payload", LinkFrame(h, Pattern(8, 2))});
  }
  cases.push_back({"ACK carrying a payload", LinkFrame(
                                                 [&] {
                                                   Bytes h = IbHeader(kAcknowledge, qpn, 0);
                                                   Put32(h, 0);
                                                   return h;
                                                 }(),
                                                 Pattern(8, 3))});
  cases.push_back({"LNH says GRH, none follows",
                   LinkFrame(IbHeader(kSendOnly, qpn, 0, /*lnh=*/3), Pattern(4, 4))});

  {
    // Control: a well-formed stream is not dropped, so WaitClosed below tells the cases apart.
    Peer p;
    ASSERT_TRUE(p.Open(port_));
    ASSERT_TRUE(p.Send(LinkFrame(write_hdr(4), Pattern(4, 1))));
    auto r = p.ReadReply();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->opcode, kAcknowledge);
    EXPECT_FALSE(p.WaitClosed(200));
  }
  ASSERT_NO_FATAL_FAILURE(Connect());

  for (const BadStream& c : cases) {
    SCOPED_TRACE(c.name);
    Peer p;
    ASSERT_TRUE(p.Connect(port_));
    uint8_t their_hello[24];
    ASSERT_TRUE(p.Read(their_hello, sizeof their_hello));
    if (c.hello) {
      ASSERT_TRUE(p.Send(Hello()));
    }
    // A send may fail once the node has already hung up: that is the point.
    (void)p.Send(c.bytes);
    if (c.half_close) p.ShutdownWrite();
    EXPECT_TRUE(p.WaitClosed()) << "the connection stayed open";
    EXPECT_TRUE(GuardsIntact());
  }

  // The process is alive and serves the next connection: a correct write lands and is ACKed.
  ASSERT_NO_FATAL_FAILURE(Connect());
  Peer good;
  ASSERT_TRUE(good.Open(port_));
  Bytes data = Pattern(48, 42);
  ASSERT_TRUE(good.Send(Write(Va(size_t{1000}), mr_->rkey, data)));
  auto r = good.ReadReply();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->opcode, kAcknowledge);
  EXPECT_EQ(r->syndrome & 0xe0, 0);
  EXPECT_EQ(std::memcmp(region_ + 1000, data.data(), data.size()), 0);
  EXPECT_TRUE(GuardsIntact());
}

// The node says in its hello that it reads ACKs riding on requests; a rider that acknowledges
// nothing the node sent is ignored, as such an ACK frame is, and the request under it is served.
TEST_F(HostilePeer, ARiderAckOfNothingLeavesItsWriteServed) {
  peer_.Close();
  Peer p;
  ASSERT_TRUE(p.Connect(port_));
  uint8_t their_hello[24];
  ASSERT_TRUE(p.Read(their_hello, sizeof their_hello));
  EXPECT_EQ(their_hello[5] & 0x01, 0x01) << "the hello does not offer rider ACKs";
  ASSERT_TRUE(p.Send(Hello()));
  Bytes data = Pattern(24, 9);
  Bytes h = IbHeader(kWriteOnly, qp_->qp_num, 0);
  AddReth(h, Va(size_t{200}), mr_->rkey, static_cast<uint32_t>(data.size()));
  ASSERT_TRUE(p.Send(RiderFrame(h, data, Bytes{0, 0x12, 0x34, 0x56})));
  auto r = p.ReadReply();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->opcode, kAcknowledge);
  EXPECT_EQ(r->syndrome & 0xe0, 0);
  EXPECT_EQ(std::memcmp(region_ + 200, data.data(), data.size()), 0);
  EXPECT_FALSE(p.WaitClosed(200));
  EXPECT_TRUE(GuardsIntact());
}

TEST_F(HostilePeer, AConnectionDroppedMidWriteLeavesOthersWorking) {
  // A valid frame, then a bad one on the same connection: the first is answered, then the node
  // hangs up; the truncated write wrote (at most) inside the region.
  ASSERT_TRUE(peer_.Send(Write(Va(size_t{0}), mr_->rkey, Pattern(8, 1))));
  auto r = peer_.ReadReply();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->opcode, kAcknowledge);
  ++psn_;
  Bytes f = Write(Va(kRegion - 100), mr_->rkey, Pattern(100, 2));
  f.resize(f.size() - 50);
  ASSERT_TRUE(peer_.Send(f));
  peer_.ShutdownWrite();
  EXPECT_TRUE(peer_.WaitClosed());
  EXPECT_TRUE(GuardsIntact());

  // The QP itself is still usable from a new connection (the responder still expects psn_, since
  // the truncated write never completed).
  Peer again;
  ASSERT_TRUE(again.Open(port_));
  ASSERT_TRUE(again.Send(Write(Va(size_t{64}), mr_->rkey, Pattern(8, 3))));
  r = again.ReadReply();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->opcode, kAcknowledge);
  EXPECT_EQ(r->syndrome & 0xe0, 0);
  EXPECT_EQ(r->psn, psn_);
  EXPECT_EQ(std::memcmp(region_ + 64, Pattern(8, 3).data(), 8), 0);
  EXPECT_TRUE(GuardsIntact());
}

// The node's UDP socket (same port number) takes one frame per datagram, no hello. It carries UD
// traffic only: malformed datagrams are dropped, and RC requests arriving on it, even well-formed
// ones, neither touch memory nor change the QP (a stranger who can reach the port cannot fail it).
TEST_F(HostilePeer, UdpDatagramsOutsideTheRegionTouchNothing) {
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port_);
  auto send_dgram = [&](const Bytes& b) {
    return sendto(fd, b.data(), b.size(), 0, reinterpret_cast<sockaddr*>(&a), sizeof a) ==
           static_cast<ssize_t>(b.size());
  };
  // The datagrams are handled within this bound; the QP must still be in RTS after it.
  auto settle = [] { usleep(200 * 1000); };
  Bytes data = Pattern(16, 9);
  // Malformed datagrams: length disagreeing with the link header, bad version, bad IB headers,
  // garbage, empty.
  Bytes longer = Write(Va(size_t{0}), mr_->rkey, data);
  longer.push_back(0);
  Bytes shorter = Write(Va(size_t{0}), mr_->rkey, data);
  shorter.pop_back();
  Bytes bad_version = Write(Va(size_t{0}), mr_->rkey, data);
  bad_version[4] = 9;
  Bytes no_reth = LinkFrame(IbHeader(kWriteOnly, qp_->qp_num, psn_), data);
  std::mt19937 rng(7);
  Bytes garbage(300);
  for (uint8_t& b : garbage) b = static_cast<uint8_t>(rng());
  for (const Bytes& b : {longer, shorter, bad_version, no_reth, garbage, Bytes{}, Bytes{1, 2, 3}})
    EXPECT_TRUE(send_dgram(b));
  // RC requests on the datagram link: out of range, wrong rkey, and even a correct one.
  ASSERT_TRUE(send_dgram(Write(Va(kRegion - 8), mr_->rkey, data)));
  ASSERT_TRUE(send_dgram(Write(Va(size_t{0}), mr_->rkey ^ 4, data)));
  ASSERT_TRUE(send_dgram(Write(Va(size_t{0}), mr_->rkey, data)));
  settle();
  EXPECT_EQ(QpState(), IBV_QPS_RTS);
  EXPECT_TRUE(GuardsIntact());
  EXPECT_TRUE(RegionUntouched());
  close(fd);
  // TCP peers are still served.
  ASSERT_NO_FATAL_FAILURE(Connect());
  ASSERT_TRUE(peer_.Send(Write(Va(size_t{8}), mr_->rkey, data)));
  auto r = peer_.ReadReply();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->opcode, kAcknowledge);
  EXPECT_EQ(r->syndrome & 0xe0, 0);
  EXPECT_EQ(std::memcmp(region_ + 8, data.data(), data.size()), 0);
}

TEST_F(HostilePeer, AConnectionDroppedMidSendKeepsItsReceive) {
  ibv_sge sge{Va(size_t{256}), 64, mr_->lkey};
  ibv_recv_wr wr{};
  wr.wr_id = 5;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_recv(qp_, &wr, &bad), 0);
  Bytes data = Pattern(48, 21);
  Bytes f = LinkFrame(IbHeader(kSendOnly, qp_->qp_num, psn_), data);
  Bytes cut(f.begin(), f.end() - 20);
  ASSERT_TRUE(peer_.Send(cut));
  peer_.ShutdownWrite();
  EXPECT_TRUE(peer_.WaitClosed());
  ibv_wc wc{};
  EXPECT_EQ(ibv_poll_cq(cq_, 1, &wc), 0) << "a message that never arrived completed";
  EXPECT_NE(QpState(), IBV_QPS_ERR);

  // Sent again whole, on a new connection, it takes the same receive and completes.
  Peer again;
  ASSERT_TRUE(again.Open(port_));
  ASSERT_TRUE(again.Send(f));
  auto r = again.ReadReply();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->opcode, kAcknowledge);
  EXPECT_EQ(r->syndrome & 0xe0, 0);
  EXPECT_EQ(r->psn, psn_);
  int n = 0;
  for (int i = 0; i < 1000 && n == 0; ++i) n = PollOne(&wc);
  ASSERT_EQ(n, 1);
  EXPECT_EQ(wc.wr_id, 5u);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.byte_len, data.size());
  EXPECT_EQ(std::memcmp(region_ + 256, data.data(), data.size()), 0);
  EXPECT_TRUE(GuardsIntact());
}

}  // namespace

// A burst that arrives in one piece: 1000 small writes written to the socket at once are all
// read into the link's buffer by the first few reads, and the link handles at most 256 frames per
// wake-up. The rest must still be handled although the socket then has nothing more to report
// (they sat in the buffer until the next byte arrived, which for UD traffic may be never).
TEST_F(HostilePeer, ABurstReadInOnePieceIsHandledWhole) {
  constexpr uint32_t kWrites = 1000;
  Bytes burst;
  for (uint32_t i = 0; i < kWrites; ++i) {
    Bytes ib = IbHeader(kWriteOnly, qp_->qp_num, psn_ + i);
    AddReth(ib, Va(size_t{i} * 4), mr_->rkey, 4);
    Bytes value;
    Put32(value, i + 1);
    Bytes f = LinkFrame(ib, value);
    burst.insert(burst.end(), f.begin(), f.end());
  }
  ASSERT_TRUE(peer_.Send(burst));
  // The ACK of the last write says everything landed (reading it from the socket also orders the
  // test's reads of the region after the progress thread's writes, for TSan). Without the fix the
  // node never gets to the last writes, so no such ACK comes and ReadReply times out.
  const uint32_t last = (psn_ + kWrites - 1) & 0xffffff;
  bool acked = false;
  for (uint32_t replies = 0; !acked && replies < kWrites; ++replies) {
    auto r = peer_.ReadReply();
    ASSERT_TRUE(r.has_value()) << "no ACK for the end of the burst";
    acked = r->opcode == kAcknowledge && (r->syndrome & 0xe0) == 0 && r->psn == last;
  }
  auto landed = [&] {
    for (uint32_t i = 0; i < kWrites; ++i)
      if (Get32(region_ + i * 4) != i + 1) return false;
    return true;
  };
  EXPECT_TRUE(acked);
  EXPECT_TRUE(landed()) << "part of a burst stayed in the link's buffer";
  EXPECT_NE(QpState(), IBV_QPS_ERR);
  EXPECT_TRUE(GuardsIntact());
}
