// The TCP link's paths (architecture §4): a connected QP's connection opens at its first frame,
// and a peer that answers a connection we opened answers on it, so two processes exchanging
// messages share one connection. With one per direction, every message cost a bare TCP ACK
// (~3 us of the receiver's read on one host). Run on the TCP link in a fresh process
// (TcpPathOnTcp); in the suite's own process the shared-memory link is used.
#include <infiniband/verbs.h>

#include <dirent.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "support/fresh_process.h"
#include "support/semantics_harness.h"

#include <cstdlib>
#include <cstring>
#include <string>

namespace {

using namespace semantics;

int SocketsOpen() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  while (dirent* e = readdir(d)) {
    char target[64] = {};
    std::string path = std::string("/proc/self/fd/") + e->d_name;
    if (readlink(path.c_str(), target, sizeof target - 1) > 0 &&
        std::strncmp(target, "socket:", 7) == 0)
      ++n;
  }
  closedir(d);
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

class TcpPath : public VerbsTest {};

TEST_F(TcpPath, AnAnswerTravelsOnTheConnectionTheRequestCameOn) {
  const char* link = getenv("SOFTRDMA_LINK");
  if (!link || std::strcmp(link, "tcp") != 0) GTEST_SKIP() << "TCP only: see TcpPathOnTcp";
  Qp* a = v.NewQp(QpOpts{});
  Buffer* b = Buf(64);
  ASSERT_TRUE(a && b);
  ForkedPeer child;
  ASSERT_TRUE(child.Start([](int up, int down) { return Echo(ChildPipe{up, down}, {}); }));
  Remote theirs;
  ASSERT_TRUE(child.Recv(&theirs));
  const int before = SocketsOpen();
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
  // Ours, opened by the first SEND; the answer came on it (a second would be the peer's own).
  EXPECT_LE(SocketsOpen() - before, 1) << "the peer answered on a connection of its own";
  EXPECT_TRUE(child.Send('x'));
  EXPECT_EQ(child.Wait(), 0) << "the peer's side went wrong";
}

TEST(TcpPathOnTcp, OneConnectionCarriesBothDirections) {
  if (kFreshRunsSkipped) GTEST_SKIP() << "see kFreshRunsSkipped";
  EXPECT_EQ(FailedFreshRuns("TcpPath.AnAnswerTravelsOnTheConnectionTheRequestCameOn", 2,
                            std::chrono::seconds(30), {"SOFTRDMA_LINK=tcp"}),
            0);
}

}  // namespace
