// The TCP link's paths (architecture §4): a connected QP's connection opens at its first frame,
// and a peer that answers a connection we opened answers on it, so two processes exchanging
// messages share one connection. With one per direction, every message cost a bare TCP ACK
// (~3 us of the receiver's read on one host). Run on the TCP link in a fresh process
// (TcpPathOnTcp); in the suite's own process the shared-memory link is used.
#include <infiniband/verbs.h>

#include <dirent.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <linux/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "link/socket_tuning.h"
#include "support/fresh_process.h"
#include "support/sanitized.h"
#include "support/semantics_harness.h"

#include <cstring>
#include <string>
#include <vector>

namespace {

using namespace semantics;

// Calls `fn` with every file descriptor this process has open (the listing's own included).
template <typename Fn>
void ForEachOpenFd(Fn fn) {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') fn(atoi(e->d_name));
  closedir(d);
}

int SocketsOpen() {
  int n = 0;
  ForEachOpenFd([&](int fd) {
    char target[64] = {};
    const std::string path = "/proc/self/fd/" + std::to_string(fd);
    if (readlink(path.c_str(), target, sizeof target - 1) > 0 &&
        std::strncmp(target, "socket:", 7) == 0)
      ++n;
  });
  return n;
}

// Takes one SEND and answers it with one.
int Echo(ChildPipe p, QpOpts o) {
  ChildQp c;
  if (int e = c.Connect(p, o, 64)) return e;
  Qp* q = c.q;
  Buffer* b = c.b;
  if (PostRecv(q->qp, *b, 0, 64, 1)) return 14;
  if (!p.Send('R')) return 15;
  ibv_wc wc;
  if (!PollOne(q->rcq, &wc) || wc.status != IBV_WC_SUCCESS) return 16;
  if (PostSendMsg(q->qp, *b, 0, 8, 2)) return 17;
  if (!PollOne(q->scq, &wc) || wc.status != IBV_WC_SUCCESS) return 18;
  char done;
  p.Recv(&done);
  return 0;
}

// Bytes the kernel received on this process's TCP connections so far (TCP_INFO of every socket).
uint64_t TcpBytesReceived() {
  uint64_t n = 0;
  ForEachOpenFd([&](int fd) {
    tcp_info info{};
    socklen_t len = sizeof info;
    if (fd > 2 && getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) == 0 &&
        len >= offsetof(tcp_info, tcpi_bytes_received) + sizeof info.tcpi_bytes_received)
      n += info.tcpi_bytes_received;
  });
  return n;
}

// This process's established TCP connections that stay on loopback (link::StaysOnLoopback), and
// how many of them run a congestion control other than `cc`.
constexpr uint8_t kTcpEstablished = 1;  // tcp_info::tcpi_state (the kernel's tcp_states.h)
struct LoopbackConnections {
  int seen = 0, other_cc = 0;
};
LoopbackConnections LoopbackConnectionsNotRunning(const char* cc) {
  LoopbackConnections r;
  ForEachOpenFd([&](int fd) {
    tcp_info info{};
    socklen_t len = sizeof info;
    sockaddr_in self{}, peer{};
    socklen_t self_len = sizeof self, peer_len = sizeof peer;
    if (fd <= 2 || getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0 ||
        info.tcpi_state != kTcpEstablished ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&self), &self_len) != 0 ||
        getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0 ||
        peer.sin_family != AF_INET ||
        !softrdma::link::StaysOnLoopback(ntohl(self.sin_addr.s_addr), ntohl(peer.sin_addr.s_addr)))
      return;
    char name[16] = {};  // the kernel's TCP_CA_NAME_MAX
    socklen_t name_len = sizeof name;
    ++r.seen;
    if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &name_len) != 0 ||
        std::strcmp(name, cc) != 0)
      ++r.other_cc;
  });
  return r;
}

// Echo, then checks the connection it answered on (accepted) runs `cc`.
int EchoOnCongestionControl(ChildPipe p, const char* cc) {
  if (int e = Echo(p, {})) return e;
  const LoopbackConnections r = LoopbackConnectionsNotRunning(cc);
  if (r.seen == 0) return 20;
  return r.other_cc == 0 ? 0 : 21;
}

constexpr int kPingPongRounds = 200;

// Answers each of kPingPongRounds SENDs with one, at once.
int EchoRounds(ChildPipe p, QpOpts o) {
  ChildQp c;
  if (int e = c.Connect(p, o, 64)) return e;
  Qp* q = c.q;
  if (PostRecv(q->qp, *c.b, 0, 64, 1)) return 14;
  if (!p.Send('R')) return 15;
  for (int i = 0; i < kPingPongRounds; ++i) {
    ibv_wc wc;
    if (!SpinPollOne(q->rcq, &wc) || wc.status != IBV_WC_SUCCESS) return 16;
    if (PostRecv(q->qp, *c.b, 0, 64, 1)) return 17;
    if (PostSendMsg(q->qp, *c.b, 0, 8, 2)) return 18;
    if (!SpinPollOne(q->scq, &wc) || wc.status != IBV_WC_SUCCESS) return 19;
  }
  char done;
  p.Recv(&done);
  return 0;
}

class TcpPath : public VerbsTest {
 protected:
  // Connects `a` to the child running Echo, whose QP is `theirs`, and takes its answer to one SEND.
  void ExchangeWithEcho(Qp* a, Buffer* b, ForkedPeer& child, const Remote& theirs) {
    ASSERT_TRUE(child.Send(v.RemoteOf(a)));
    ASSERT_EQ(BringUp(a->qp, QpOpts{}, theirs), 0);
    ASSERT_EQ(PostRecv(a->qp, *b, 0, 64, 7), 0);
    char ready;
    ASSERT_TRUE(child.Recv(&ready));
    ASSERT_EQ(PostSendMsg(a->qp, *b, 8, 8, 8), 0);
    ibv_wc wc;
    ASSERT_TRUE(PollOne(a->scq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    ASSERT_TRUE(PollOne(a->rcq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc.wr_id, 7u);
  }
};

// How many of `rounds` fresh runs of the TcpPath test `test`, on the TCP link, failed.
int FailedRunsOnTcp(const std::string& test, int rounds, std::chrono::seconds bound) {
  return FailedFreshRuns(test, rounds, bound, {"SOFTRDMA_LINK=tcp"});
}

TEST_F(TcpPath, AnAnswerTravelsOnTheConnectionTheRequestCameOn) {
  if (!ShmLinkOff()) GTEST_SKIP() << "TCP only: see TcpPathOnTcp";
  Qp* a = v.NewQp(QpOpts{});
  Buffer* b = Buf(64);
  ASSERT_TRUE(a && b);
  ForkedPeer child;
  ASSERT_TRUE(child.Start([](int up, int down) { return Echo(ChildPipe{up, down}, {}); }));
  Remote theirs;
  ASSERT_TRUE(child.Recv(&theirs));
  const int before = SocketsOpen();
  ASSERT_NO_FATAL_FAILURE(ExchangeWithEcho(a, b, child, theirs));
  // Ours, opened by the first SEND; the answer came on it (a second would be the peer's own).
  EXPECT_LE(SocketsOpen() - before, 1) << "the peer answered on a connection of its own";
  EXPECT_TRUE(child.Send('x'));
  EXPECT_EQ(child.Wait(), 0) << "the peer's side went wrong";
}

// Nothing is lost or queued on loopback for a congestion controller to react to, yet its hooks run
// on every segment, inside the socket lock the receiver waits for: the link's connections there
// run the cheapest (link::kLoopbackCongestionControl), whatever the system's default. The child
// checks the side it accepted after answering; its exit status says which check failed.
TEST_F(TcpPath, ConnectionsOnLoopbackRunTheCheapestCongestionControl) {
  if (!ShmLinkOff()) GTEST_SKIP() << "TCP only: see TcpPathOnTcp";
  Qp* a = v.NewQp(QpOpts{});
  Buffer* b = Buf(64);
  ASSERT_TRUE(a && b);
  ForkedPeer child;
  ASSERT_TRUE(child.Start([](int up, int down) {
    return EchoOnCongestionControl(ChildPipe{up, down}, softrdma::link::kLoopbackCongestionControl);
  }));
  Remote theirs;
  ASSERT_TRUE(child.Recv(&theirs));
  ASSERT_NO_FATAL_FAILURE(ExchangeWithEcho(a, b, child, theirs));
  const LoopbackConnections mine =
      LoopbackConnectionsNotRunning(softrdma::link::kLoopbackCongestionControl);
  EXPECT_GE(mine.seen, 1) << "no connection to the peer";
  EXPECT_EQ(mine.other_cc, 0) << "the connection opened here";
  EXPECT_TRUE(child.Send('x'));
  EXPECT_EQ(child.Wait(), 0) << "the peer's side (20: no connection, 21: the one it accepted)";
}

TEST(TcpPathOnTcp, ConnectionsOnLoopbackRunTheCheapestCongestionControl) {
  if (kFreshRunsSkipped) GTEST_SKIP() << "see kFreshRunsSkipped";
  EXPECT_EQ(FailedRunsOnTcp("TcpPath.ConnectionsOnLoopbackRunTheCheapestCongestionControl", 1,
                            std::chrono::seconds(30)),
            0);
}

TEST(SocketTuning, AConnectionStaysOnLoopbackToA127AddressOrToItsOwnAddress) {
  using softrdma::link::StaysOnLoopback;
  EXPECT_TRUE(StaysOnLoopback(0x7f000001, 0x7f000001));
  EXPECT_TRUE(StaysOnLoopback(0xc0000202, 0x7f000105));  // 127/8 from any address
  EXPECT_TRUE(StaysOnLoopback(0xc0000202, 0xc0000202));  // to its own address
  EXPECT_FALSE(StaysOnLoopback(0xc0000202, 0xc0000203));
  EXPECT_FALSE(StaysOnLoopback(0x0a000001, 0x0b000001));
}

struct Target {
  uint64_t addr;
  uint32_t rkey;
};

constexpr uint32_t kLargest = (4u << 20) + 123;

// Publishes a buffer for the parent's WRITEs and READs, and waits for the end (without polling:
// its progress thread receives, woken by epoll).
int TargetBuffer(ChildPipe p, QpOpts o) {
  ChildQp c;
  if (int e = c.Connect(p, o, kLargest)) return e;
  if (!p.Send(Target{c.b->addr(0), c.b->mr->rkey})) return 14;
  char done;
  p.Recv(&done);
  return 0;
}

// Small frames leave in one piece, gathered, and larger ones as a vector (WriteNowLocked): every
// size on both sides of the limit, in requests (WRITE) and responses (READ), arrives whole, and
// so do payloads of megabytes, with small frames after them.
TEST_F(TcpPath, FramesOfEverySizeAroundTheOnePieceLimitArriveWhole) {
  if (!ShmLinkOff()) GTEST_SKIP() << "TCP only: see TcpPathOnTcp";
  Qp* a = v.NewQp(QpOpts{});
  Buffer* out = Buf(kLargest);
  Buffer* back = Buf(kLargest);
  ASSERT_TRUE(a && out && back);
  ForkedPeer child;
  ASSERT_TRUE(child.Start([](int up, int down) { return TargetBuffer(ChildPipe{up, down}, {}); }));
  Remote theirs;
  ASSERT_TRUE(child.Recv(&theirs));
  ASSERT_TRUE(child.Send(v.RemoteOf(a)));
  ASSERT_EQ(BringUp(a->qp, QpOpts{}, theirs), 0);
  Target t{};
  ASSERT_TRUE(child.Recv(&t));
  std::vector<uint32_t> sizes{1, 2, 7, 64, 300 * 1024, (1u << 20) + 7, kLargest, 1000, 4096};
  for (uint32_t n = 400; n <= 620; ++n) sizes.push_back(n);
  uint64_t id = 1;
  for (uint32_t n : sizes) {
    for (uint32_t i = 0; i < n; ++i) out->data()[i] = static_cast<char>(n * 31 + i);
    std::memset(back->data(), 0, n);
    ibv_wc wc{};
    ASSERT_EQ(PostRdma(a->qp, IBV_WR_RDMA_WRITE, *out, 0, n, t.addr, t.rkey, id++), 0);
    ASSERT_TRUE(PollOne(a->scq, &wc));
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << n << " bytes: " << WcStr(wc);
    ASSERT_EQ(PostRdma(a->qp, IBV_WR_RDMA_READ, *back, 0, n, t.addr, t.rkey, id++), 0);
    ASSERT_TRUE(PollOne(a->scq, &wc));
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << n << " bytes: " << WcStr(wc);
    ASSERT_EQ(std::memcmp(out->data(), back->data(), n), 0) << n << " bytes came back changed";
  }
  EXPECT_TRUE(child.Send('x'));
  EXPECT_EQ(child.Wait(), 0) << "the peer's side went wrong";
}

TEST(TcpPathOnTcp, FramesOfEverySizeArriveWhole) {
  if (kFreshRunsSkipped) GTEST_SKIP() << "see kFreshRunsSkipped";
  EXPECT_EQ(FailedRunsOnTcp("TcpPath.FramesOfEverySizeAroundTheOnePieceLimitArriveWhole", 1,
                            std::chrono::seconds(60)),
            0);
}

// Takes one SEND, then destroys its QP while the connection stays (the process keeps others).
int TakeOneThenDestroy(ChildPipe p, QpOpts o) {
  ChildQp c;
  if (int e = c.Connect(p, o, 64)) return e;
  Qp* keep = c.v.NewQp(o);  // holds the process's endpoint and connection open meanwhile
  if (!keep || PostRecv(c.q->qp, *c.b, 0, 64, 1) || !p.Send('R')) return 14;
  ibv_wc wc;
  if (!PollOne(c.q->rcq, &wc) || wc.status != IBV_WC_SUCCESS) return 15;
  if (ibv_destroy_qp(c.q->qp)) return 16;
  c.q->qp = nullptr;
  if (!p.Send('D')) return 17;
  char done;
  p.Recv(&done);
  return 0;
}

// A connection remembers which QP its last frame went to (Hca::FindQpFor); once that QP is
// destroyed, frames for it vanish as for any unknown QP, and the sender's retries run out.
TEST_F(TcpPath, FramesForADestroyedQpVanishOnTheConnectionThatFedIt) {
  if (!ShmLinkOff()) GTEST_SKIP() << "TCP only: see TcpPathOnTcp";
  QpOpts o;
  o.timeout = 8;  // ~1 ms
  o.retry_cnt = 1;
  Qp* a = v.NewQp(o);
  Buffer* b = Buf(64);
  ASSERT_TRUE(a && b);
  ForkedPeer child;
  ASSERT_TRUE(child.Start([o](int up, int down) { return TakeOneThenDestroy({up, down}, o); }));
  Remote theirs;
  ASSERT_TRUE(child.Recv(&theirs));
  ASSERT_TRUE(child.Send(v.RemoteOf(a)));
  ASSERT_EQ(BringUp(a->qp, o, theirs), 0);
  char step;
  ASSERT_TRUE(child.Recv(&step));
  ibv_wc wc;
  ASSERT_EQ(PostSendMsg(a->qp, *b, 0, 8, 1), 0);
  ASSERT_TRUE(PollOne(a->scq, &wc));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
  ASSERT_TRUE(child.Recv(&step));
  ASSERT_EQ(step, 'D');
  ASSERT_EQ(PostSendMsg(a->qp, *b, 0, 8, 2), 0);
  ASSERT_TRUE(PollOne(a->scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_RETRY_EXC_ERR) << WcStr(wc);
  EXPECT_TRUE(child.Send('x'));
  EXPECT_EQ(child.Wait(), 0) << "the peer's side went wrong";
}

TEST(TcpPathOnTcp, FramesForADestroyedQpVanish) {
  if (kFreshRunsSkipped) GTEST_SKIP() << "see kFreshRunsSkipped";
  EXPECT_EQ(FailedRunsOnTcp("TcpPath.FramesForADestroyedQpVanishOnTheConnectionThatFedIt", 1,
                            std::chrono::seconds(60)),
            0);
}

// In ping-pong traffic the ACK a QP owes rides on its answer (link::kLinkFlagAck): 4 bytes more
// on the answer instead of an ACK frame of 32 (a SEND of 8 bytes: 40 bytes a round, 68 with ACK
// frames). ACK deferral is timed (30 us), so a round that answered late may still bring a frame;
// most must not. Under a sanitizer an answer takes longer than that: no ACK waits for it.
TEST_F(TcpPath, AnAckOwedRidesOnTheAnswer) {
  if (!ShmLinkOff()) GTEST_SKIP() << "TCP only: see TcpPathOnTcp";
  if (kSanitized) GTEST_SKIP() << "answers come later than ACK deferral waits";
  Qp* a = v.NewQp(QpOpts{});
  Buffer* b = Buf(64);
  ASSERT_TRUE(a && b);
  ForkedPeer child;
  ASSERT_TRUE(child.Start([](int up, int down) { return EchoRounds(ChildPipe{up, down}, {}); }));
  Remote theirs;
  ASSERT_TRUE(child.Recv(&theirs));
  ASSERT_TRUE(child.Send(v.RemoteOf(a)));
  ASSERT_EQ(BringUp(a->qp, QpOpts{}, theirs), 0);
  char ready;
  ASSERT_TRUE(child.Recv(&ready));
  ibv_wc wc;
  // The first rounds open the connection and start the deferral; then count.
  constexpr int kWarmUp = 20;
  uint64_t before = 0;
  for (int i = 0; i < kPingPongRounds; ++i) {
    if (i == kWarmUp) before = TcpBytesReceived();
    ASSERT_EQ(PostRecv(a->qp, *b, 0, 64, 7), 0);
    ASSERT_EQ(PostSendMsg(a->qp, *b, 8, 8, 8), 0);
    ASSERT_TRUE(SpinPollOne(a->rcq, &wc)) << "round " << i;
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
    ASSERT_TRUE(SpinPollOne(a->scq, &wc)) << "round " << i;
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
  }
  const uint64_t per_round = (TcpBytesReceived() - before) / (kPingPongRounds - kWarmUp);
  EXPECT_LT(per_round, 54u) << "ACKs came as frames of their own";
  EXPECT_TRUE(child.Send('x'));
  EXPECT_EQ(child.Wait(), 0) << "the peer's side went wrong";
}

TEST(TcpPathOnTcp, AnAckOwedRidesOnTheAnswer) {
  if (kFreshRunsSkipped) GTEST_SKIP() << "see kFreshRunsSkipped";
  EXPECT_EQ(FailedRunsOnTcp("TcpPath.AnAckOwedRidesOnTheAnswer", 1, std::chrono::seconds(60)), 0);
}

TEST(TcpPathOnTcp, OneConnectionCarriesBothDirections) {
  if (kFreshRunsSkipped) GTEST_SKIP() << "see kFreshRunsSkipped";
  EXPECT_EQ(FailedRunsOnTcp("TcpPath.AnAnswerTravelsOnTheConnectionTheRequestCameOn", 2,
                            std::chrono::seconds(30)),
            0);
}

}  // namespace
