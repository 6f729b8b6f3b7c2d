// A stream of requests on the TCP link leaves in few sends (link::OutFrame::deferrable): requests
// sent while others of their QP are in flight wait in the connection's queue for the next EPOLLOUT,
// which the progress thread serves, and leave together; so do the answers to requests that were
// read together (READ responses, atomic ACKs), and small datagrams posted back to back. Before,
// each was a send(2) of its own, and on loopback a send costs its sender the receiver's TCP work
// too (ib_write_bw 64 B: 0.06-0.08 M messages/s). Run on the TCP link in fresh processes
// (TcpStreamOnTcp); in the suite's own process the shared-memory link is used and the tests have
// nothing to look at.
#include <infiniband/verbs.h>

#include <dirent.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <gtest/gtest.h>

#include "support/fresh_process.h"
#include "support/semantics_harness.h"
#include "support/thread_stopper.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

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

// Runs `test` of this binary in a fresh process on the TCP link; returns the failed runs.
int FailedOnTcp(const char* test) {
  return FailedFreshRuns(test, 1, std::chrono::seconds(60), {"SOFTRDMA_LINK=tcp"});
}

class TcpStream : public VerbsTest {
 protected:
  // StartAndConnect, then takes the address and key of the peer's buffer.
  void ConnectTo(ForkedPeer& peer, const ForkedPeer::Body& body, Qp* a, const QpOpts& o) {
    ASSERT_NO_FATAL_FAILURE(StartAndConnect(v, peer, body, a, o));
    ASSERT_TRUE(peer.Recv(&raddr_));
    ASSERT_TRUE(peer.Recv(&rkey_));
  }
  // Stops this process's progress thread while `stopper` lives; says why it could not (ptrace
  // refused: a reason to skip). No such thread fails the test.
  static std::string StopProgressThread(ThreadStopper& stopper) {
    const pid_t progress = ProgressThread();
    if (progress == 0) {
      ADD_FAILURE() << "no thread named " << softrdma::link::kProgressThreadName;
      return "no progress thread";
    }
    return stopper.Stop(progress);
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

  ThreadStopper stopper;
  if (std::string why = StopProgressThread(stopper); !why.empty()) GTEST_SKIP() << why;
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
  EXPECT_EQ(FailedOnTcp("TcpStream.RequestsInFlightLeaveTogetherAndWithoutTheApplicationsHelp"), 0);
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
  ThreadStopper stopper;
  if (std::string why = StopProgressThread(stopper); !why.empty()) GTEST_SKIP() << why;
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
  EXPECT_EQ(FailedOnTcp("TcpStream.AnswersToRequestsReadTogetherLeaveTogether"), 0);
}

// The receiver of a datagram stream: kWrites + 1 receives posted, its address to the parent; at 'c'
// it takes completions for up to 5 s and tells the parent how many came.
int DatagramReceiver(ChildPipe p) {
  Verbs v;
  if (!v.Open()) return 10;
  QpOpts o;
  o.type = IBV_QPT_UD;
  Qp* q = v.NewQp(o);
  Buffer* b = v.NewBuffer((kWrites + 1) * 256);
  if (!q || !b || BringUp(q->qp, o, Remote{})) return 11;
  for (int i = 0; i <= kWrites; ++i)
    if (PostRecv(q->qp, *b, i * 256, 256, i)) return 12;
  if (!p.Send(v.RemoteOf(q))) return 13;
  char go;
  if (!p.Recv(&go)) return 14;
  const auto wcs = PollN(q->rcq, kWrites + 1, std::chrono::milliseconds(5000));
  uint64_t good = 0;
  for (const ibv_wc& wc : wcs) good += wc.status == IBV_WC_SUCCESS;
  if (!p.Send(good)) return 15;
  char done;
  p.Recv(&done);
  return 0;
}

// Datagrams posted back to back are a stream too, though each completes at once (none is ever in
// flight): with the progress thread stopped, those after the first wait in the queue, sent in no
// segment, and it writes them once it runs. Before, each was a send(2) of its own (ib_send_bw -c UD
// 64 B: 0.13-0.18 M messages/s, against 1.2-1.7 since).
TEST_F(TcpStream, DatagramsPostedBackToBackLeaveTogether) {
  const char* link = getenv("SOFTRDMA_LINK");
  if (!link || std::strcmp(link, "tcp") != 0) GTEST_SKIP() << "looks at the TCP link only";
  QpOpts o;
  o.type = IBV_QPT_UD;
  Qp* a = v.NewQp(o);
  Buffer* b = Buf(kPiece);
  ASSERT_TRUE(a && b);
  ASSERT_EQ(BringUp(a->qp, o, Remote{}), 0);
  ForkedPeer peer;
  ASSERT_TRUE(peer.Start([](int up, int down) { return DatagramReceiver(ChildPipe{up, down}); }));
  Remote r;
  ASSERT_TRUE(peer.Recv(&r));
  ibv_ah* ah = v.AhTo(r, true);
  ASSERT_NE(ah, nullptr);
  auto post = [&](uint64_t id) {
    SendArgs s;
    s.wr_id = id;
    s.sges = {b->Sge(0, kPiece)};
    s.ah = ah;
    s.remote_qpn = r.qpn;
    s.remote_qkey = o.qkey;
    return Post(a->qp, s);
  };
  // The connection opens with a first datagram.
  ASSERT_EQ(post(0), 0);
  ibv_wc wc;
  ASSERT_TRUE(PollOne(a->scq, &wc));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS);

  ThreadStopper stopper;
  if (std::string why = StopProgressThread(stopper); !why.empty()) GTEST_SKIP() << why;
  const uint64_t before = TcpDataSegmentsSent();
  std::vector<std::chrono::steady_clock::duration> took;
  for (int i = 1; i <= kWrites; ++i) {
    const auto start = std::chrono::steady_clock::now();
    ASSERT_EQ(post(i), 0);
    took.push_back(std::chrono::steady_clock::now() - start);
  }
  const uint64_t sent = TcpDataSegmentsSent() - before;
  // A stream is posts closer than the link's kDatagramStreamGapNs (4 us): a post takes 0.4-0.7 us
  // in the release build (the first and a few others 10-140 us); the unoptimized sanitizer
  // build's take longer than the gap, and each datagram leaves alone.
  std::nth_element(took.begin(), took.begin() + kWrites / 2, took.end());
  const int64_t median_ns = std::chrono::nanoseconds(took[kWrites / 2]).count();
  if (median_ns > 2000) GTEST_SKIP() << "a post took " << median_ns << " ns: too slow for a stream";
  // The first goes at once (none came just before it); one datagram a segment would be kWrites.
  // A post delayed past the stream's gap (link's kDatagramStreamGapNs) starts it again: 5-6 here,
  // with posts now and then 15-19 us apart.
  EXPECT_LE(sent, 16u) << "segments for " << kWrites << " datagrams";
  // Each completed as the link took it, held or not: the held ones are no backlog that the next
  // must wait behind (for room that only the stopped thread's flush would make).
  ibv_wc wcs[kWrites];
  const int completed = ibv_poll_cq(a->scq, kWrites, wcs);
  EXPECT_EQ(completed, kWrites) << "datagrams waited behind the stream's own held ones";
  stopper.Release();
  for (int i = std::max(completed, 0); i < kWrites; ++i)
    ASSERT_TRUE(PollOne(a->scq, &wcs[i])) << "datagram " << i;
  for (const ibv_wc& c : wcs) EXPECT_EQ(c.status, IBV_WC_SUCCESS);
  ASSERT_TRUE(peer.Send('c'));
  uint64_t received = 0;
  ASSERT_TRUE(peer.Recv(&received));
  EXPECT_EQ(received, static_cast<uint64_t>(kWrites + 1)) << "datagrams were lost";
  EXPECT_TRUE(peer.Send('x'));
  EXPECT_EQ(peer.Wait(), 0);
}

TEST(TcpStreamOnTcp, DatagramsPostedBackToBackLeaveTogether) {
  if (kFreshRunsSkipped) GTEST_SKIP() << "fresh processes are slow to start under TSan";
  EXPECT_EQ(FailedOnTcp("TcpStream.DatagramsPostedBackToBackLeaveTogether"), 0);
}

}  // namespace
