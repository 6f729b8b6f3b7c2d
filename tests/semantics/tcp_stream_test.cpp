// A stream of requests on the TCP link leaves in few sends (link::OutFrame::deferrable): requests
// sent while others of their QP are in flight wait in the connection's queue for the next EPOLLOUT,
// which the progress thread serves, and leave together; so do the answers to requests that were
// read together (READ responses, atomic ACKs). Before, each was a send(2) of its own, and on
// loopback a send costs its sender the receiver's TCP work too (ib_write_bw 64 B: 0.06-0.08 M
// messages/s). Run on the TCP link in fresh processes (TcpStreamOnTcp); in the suite's own process
// the shared-memory link is used and the tests have nothing to look at.
#include <infiniband/verbs.h>

#include <dirent.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <gtest/gtest.h>

#include "support/fresh_process.h"
#include "support/semantics_harness.h"
#include "support/thread_stopper.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace {

using namespace semantics;

constexpr int kWrites = 48;  // below the queue's own limit (link's kDeferFrames)
constexpr uint32_t kPiece = 64;

// Segments with data this process's TCP connections have sent so far (TCP_INFO of every socket).
uint64_t TcpDataSegmentsSent() {
  uint64_t n = 0;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return 0;
  while (dirent* e = readdir(d)) {
    const int fd = atoi(e->d_name);
    tcp_info info{};
    socklen_t len = sizeof info;
    if (e->d_name[0] != '.' && fd > 2 && getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) == 0 &&
        len >= offsetof(tcp_info, tcpi_data_segs_out) + sizeof info.tcpi_data_segs_out)
      n += info.tcpi_data_segs_out;
  }
  closedir(d);
  return n;
}

// The target: tells its buffer's address and key, then, told to look ('c'), watches it (no verb
// called: the bytes come by the progress thread alone) until every WRITE's bytes are there.
int Target(ChildPipe p) {
  ChildQp c;
  if (int e = c.Connect(p, QpOpts{}, (kWrites + 1) * kPiece)) return e;
  c.b->Fill(0);
  if (!p.Send(c.b->addr()) || !p.Send(c.b->rkey())) return 14;
  char go;
  if (!p.Recv(&go)) return 15;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (;;) {
    int missing = 0;
    for (int i = 0; i < kWrites; ++i)
      for (uint32_t k = 0; k < kPiece; ++k)
        if (Peek(c.b->data() + (i + 1) * kPiece + k) != i + 1) ++missing;
    if (missing == 0) break;
    if (std::chrono::steady_clock::now() > until) return 16;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!p.Send('d')) return 17;
  char done;
  p.Recv(&done);
  return 0;
}

// The responder of a stream of READs: tells its buffer's address and key; counts the data segments
// it sends from 'b' (before) to 'c' (the READs completed) and tells the parent.
int ReadTarget(ChildPipe p) {
  ChildQp c;
  if (int e = c.Connect(p, QpOpts{}, (kWrites + 1) * kPiece)) return e;
  for (int i = 0; i <= kWrites; ++i) std::memset(c.b->data() + i * kPiece, i + 1, kPiece);
  if (!p.Send(c.b->addr()) || !p.Send(c.b->rkey())) return 14;
  char step;
  if (!p.Recv(&step)) return 15;
  const uint64_t before = TcpDataSegmentsSent();
  if (!p.Send('b') || !p.Recv(&step)) return 16;
  if (!p.Send(TcpDataSegmentsSent() - before)) return 17;
  char done;
  p.Recv(&done);
  return 0;
}

class TcpStream : public VerbsTest {
 protected:
  // StartAndConnect, then takes the address and key of the peer's buffer.
  void ConnectTo(ForkedPeer& peer, const ForkedPeer::Body& body, Qp* a, const QpOpts& o) {
    ASSERT_NO_FATAL_FAILURE(StartAndConnect(v, peer, body, a, o));
    ASSERT_TRUE(peer.Recv(&raddr_));
    ASSERT_TRUE(peer.Recv(&rkey_));
  }
  uint64_t raddr_ = 0;
  uint32_t rkey_ = 0;
};

// With the progress thread stopped, nothing writes the queue: the requests after the fourth wait
// there, sent in no segment. Once it runs again it writes them, with this thread calling nothing
// (the application may be spinning on memory the peer is to answer in).
TEST_F(TcpStream, RequestsInFlightLeaveTogetherAndWithoutTheApplicationsHelp) {
  const char* link = getenv("SOFTRDMA_LINK");
  if (!link || std::strcmp(link, "tcp") != 0) GTEST_SKIP() << "looks at the TCP link only";
  // No retransmission (timeout 0), which would write the queue too: only the link's flush may.
  QpOpts o;
  o.timeout = 0;
  Qp* a = v.NewQp(o);
  Buffer* b = Buf((kWrites + 1) * kPiece);
  ASSERT_TRUE(a && b);
  for (int i = 0; i < kWrites; ++i) std::memset(b->data() + (i + 1) * kPiece, i + 1, kPiece);
  ForkedPeer peer;
  ASSERT_NO_FATAL_FAILURE(ConnectTo(
      peer,
      [](int up, int down) {
        return Target(ChildPipe{up, down});
      },
      a, o));
  const uint64_t raddr = raddr_;
  const uint32_t rkey = rkey_;
  // The connection opens with a first WRITE, answered.
  ASSERT_EQ(PostRdma(a->qp, IBV_WR_RDMA_WRITE, *b, 0, kPiece, raddr, rkey, 0), 0);
  ibv_wc wc;
  ASSERT_TRUE(PollOne(a->scq, &wc));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS);

  const pid_t progress = ProgressThread();
  ASSERT_NE(progress, 0) << "no thread named " << softrdma::link::kProgressThreadName;
  ThreadStopper stopper;
  if (std::string why = stopper.Stop(progress); !why.empty()) GTEST_SKIP() << why;
  const uint64_t before = TcpDataSegmentsSent();
  for (int i = 0; i < kWrites; ++i)
    ASSERT_EQ(
        PostRdma(a->qp, IBV_WR_RDMA_WRITE, *b, (i + 1) * kPiece, kPiece, raddr + (i + 1) * kPiece,
                 rkey, i + 1, i + 1 == kWrites ? IBV_SEND_SIGNALED : 0),
        0);
  const uint64_t sent = TcpDataSegmentsSent() - before;
  // Four go at once (fewer in flight before them); one WRITE a segment would be kWrites.
  EXPECT_LE(sent, 8u) << "segments for " << kWrites << " WRITEs";
  stopper.Release();

  ASSERT_TRUE(peer.Send('c'));
  char seen = 0;
  EXPECT_TRUE(peer.Recv(&seen)) << "the peer did not get every WRITE";
  ASSERT_TRUE(PollOne(a->scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.wr_id, static_cast<uint64_t>(kWrites));
  EXPECT_TRUE(peer.Send('x'));
  EXPECT_EQ(peer.Wait(), 0);
}

TEST(TcpStreamOnTcp, RequestsInFlightLeaveTogetherAndWithoutTheApplicationsHelp) {
  if (kFreshRunsSkipped) GTEST_SKIP() << "fresh processes are slow to start under TSan";
  EXPECT_EQ(FailedFreshRuns("TcpStream.RequestsInFlightLeaveTogetherAndWithoutTheApplicationsHelp",
                            1, std::chrono::seconds(60), {"SOFTRDMA_LINK=tcp"}),
            0);
}

// The answers to READs that arrive together leave together (RxTarget::inbound_follows): one
// segment per READ before, and as many system calls.
TEST_F(TcpStream, AnswersToRequestsReadTogetherLeaveTogether) {
  const char* link = getenv("SOFTRDMA_LINK");
  if (!link || std::strcmp(link, "tcp") != 0) GTEST_SKIP() << "looks at the TCP link only";
  Qp* a = v.NewQp(QpOpts{});
  Buffer* b = Buf((kWrites + 1) * kPiece);
  ASSERT_TRUE(a && b);
  ForkedPeer peer;
  ASSERT_NO_FATAL_FAILURE(ConnectTo(
      peer,
      [](int up, int down) {
        return ReadTarget(ChildPipe{up, down});
      },
      a, QpOpts{}));
  const uint64_t raddr = raddr_;
  const uint32_t rkey = rkey_;
  ibv_wc wc;
  ASSERT_EQ(PostRdma(a->qp, IBV_WR_RDMA_READ, *b, 0, kPiece, raddr, rkey, 0), 0);
  ASSERT_TRUE(PollOne(a->scq, &wc));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
  char ready;
  ASSERT_TRUE(peer.Send('b'));
  ASSERT_TRUE(peer.Recv(&ready));

  // This side's progress thread stopped, the READs after the fourth leave in one write (the test
  // above), so that the peer reads them together whatever the timing.
  const pid_t progress = ProgressThread();
  ASSERT_NE(progress, 0) << "no thread named " << softrdma::link::kProgressThreadName;
  ThreadStopper stopper;
  if (std::string why = stopper.Stop(progress); !why.empty()) GTEST_SKIP() << why;
  for (int i = 0; i < kWrites; ++i)
    ASSERT_EQ(PostRdma(a->qp, IBV_WR_RDMA_READ, *b, (i + 1) * kPiece, kPiece,
                       raddr + (i + 1) * kPiece, rkey, i + 1),
              0);
  stopper.Release();
  for (int i = 0; i < kWrites; ++i) {
    ASSERT_TRUE(PollOne(a->scq, &wc)) << "READ " << i;
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
  }
  for (int i = 0; i < kWrites; ++i) ASSERT_EQ(b->data()[(i + 1) * kPiece], i + 2) << "READ " << i;
  uint64_t sent = 0;
  ASSERT_TRUE(peer.Send('c'));
  ASSERT_TRUE(peer.Recv(&sent));
  // The four READs sent at once are answered one by one, the rest together (6-9 segments here;
  // one a READ without).
  EXPECT_LE(sent, 24u) << "segments for the answers to " << kWrites << " READs";
  EXPECT_TRUE(peer.Send('x'));
  EXPECT_EQ(peer.Wait(), 0);
}

TEST(TcpStreamOnTcp, AnswersToRequestsReadTogetherLeaveTogether) {
  if (kFreshRunsSkipped) GTEST_SKIP() << "fresh processes are slow to start under TSan";
  EXPECT_EQ(FailedFreshRuns("TcpStream.AnswersToRequestsReadTogetherLeaveTogether", 1,
                            std::chrono::seconds(60), {"SOFTRDMA_LINK=tcp"}),
            0);
}

}  // namespace
