// The socket lease (architecture §4): an application thread polling an empty CQ reads the TCP
// link's sockets itself and keeps the progress thread off them until it stops polling. Frames
// must still be served when it stops: by the progress thread when the lease runs out, at once
// when it arms a CQ to block. Run on the TCP link in fresh processes (SocketLeaseOnTcp below);
// in the suite's own process they run on whatever link reaches the child.
#include <infiniband/verbs.h>

#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "support/fresh_process.h"
#include "support/semantics_harness.h"

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace {

using namespace semantics;

struct Window {
  uint64_t addr;
  uint32_t rkey;
};

// A writer child's side: a connected QP, a buffer of `bytes` whose first 64 are 0x5a and the
// parent's window, once the parent says 'g'. Returns 0 or the child's exit code for what failed.
struct Writer {
  ChildQp c;
  Window w{};
  int Start(ChildPipe& p, QpOpts o, size_t bytes = 64) {
    if (int e = c.Connect(p, o, bytes)) return e;
    std::memset(c.b->data(), 0x5a, 64);
    char go;
    return p.Recv(&w) && p.Recv(&go) ? 0 : 14;
  }
  // One WRITE of 8 bytes to the window's start, waited for.
  int Write(uint64_t wr_id) {
    if (PostRdma(c.q->qp, IBV_WR_RDMA_WRITE, *c.b, 0, 8, w.addr, w.rkey, wr_id)) return 15;
    ibv_wc wc;
    return PollOne(c.q->scq, &wc) && wc.status == IBV_WC_SUCCESS ? 0 : 16;
  }
};

// Writes 8 bytes of 0x5a into the parent's window 300 ms after 'g' (the parent has stopped
// polling by then), and waits for 'x'.
int LateWriter(ChildPipe p, QpOpts o) {
  Writer wr;
  if (int e = wr.Start(p, o)) return e;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  if (int e = wr.Write(1)) return e;
  char done;
  p.Recv(&done);
  return 0;
}

// After 'g', RDMA WRITEs 8 bytes into the parent's window back to back for 1.5 s (each waits
// for its completion), then says 'd' and waits for 'x'.
int BusyWriter(ChildPipe p, QpOpts o) {
  Writer wr;
  if (int e = wr.Start(p, o)) return e;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
  for (uint64_t i = 0; std::chrono::steady_clock::now() < until; ++i)
    if (int e = wr.Write(i)) return e;
  if (!p.Send('d')) return 17;
  char done;
  p.Recv(&done);
  return 0;
}

// More than a loopback socket takes at once (its send buffer grows to 4 MiB at most).
constexpr size_t kMoreThanASocketTakes = 32 << 20;
constexpr uint8_t kLastWrite = 0x78;  // the bytes of the parent's last WRITE

// After 'g', WRITEs 8 bytes of 0x11 at the window's start (the connections then exist). After
// 'h': with `at_once`, 8 bytes of 0x22 at offset 16 at once; then, 300 ms later, 8 bytes of 0x5a
// at offset 32. Then tells its own buffer's window (kMoreThanASocketTakes, for the parent's
// WRITEs). On 'c', spins up to 10 s on its buffer's last byte and says whether it read kLastWrite
// there; on 'x', ends.
int WriterAfterH(ChildPipe p, QpOpts o, bool at_once) {
  Writer wr;
  if (int e = wr.Start(p, o, kMoreThanASocketTakes)) return e;
  const uint64_t start = wr.w.addr;
  auto write = [&](uint8_t value, uint64_t offset) {
    std::memset(wr.c.b->data(), value, 8);
    wr.w.addr = start + offset;
    return wr.Write(value);
  };
  if (int e = write(0x11, 0)) return e;
  char h;
  if (!p.Recv(&h)) return 18;
  if (int e = at_once ? write(0x22, 16) : 0) return e;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  if (int e = write(0x5a, 32)) return e;
  if (!p.Send(Window{wr.c.b->addr(), wr.c.b->rkey()})) return 19;
  char step;
  while (p.Recv(&step) && step == 'c') {
    const uint8_t* last = wr.c.b->data() + kMoreThanASocketTakes - 1;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (Peek(last) != kLastWrite && std::chrono::steady_clock::now() < until) {
    }
    if (!p.Send(Peek(last) == kLastWrite)) return 20;
  }
  return 0;
}

constexpr int kOneByOneMessages = 400;

// After 'g', SENDs kOneByOneMessages messages of 8 bytes, each after the last one's completion
// (at most 2 s each); then says 'd' and waits for 'x'. Its QP never retransmits (timeout 0): only
// the receiver's ACK completes a SEND.
int OneByOneSender(ChildPipe p, QpOpts o) {
  o.timeout = 0;
  ChildQp c;
  if (int e = c.Connect(p, o, 64)) return e;
  char go;
  if (!p.Recv(&go)) return 14;
  for (int i = 0; i < kOneByOneMessages; ++i) {
    if (PostSendMsg(c.q->qp, *c.b, 0, 8, i)) return 15;
    ibv_wc wc;
    if (!PollOne(c.q->scq, &wc, std::chrono::seconds(2)) || wc.status != IBV_WC_SUCCESS) return 16;
  }
  if (!p.Send('d')) return 17;
  char done;
  p.Recv(&done);
  return 0;
}

// From now on epoll_ctl(EPOLL_CTL_ADD) fails with ENOSPC in every thread of this process, as when
// the user's epoll watches (fs.epoll.max_user_watches) run out.
bool RefuseEpollAdds() {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_epoll_ctl, 0, 3),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, args[1])),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, EPOLL_CTL_ADD, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSPC),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog program{static_cast<unsigned short>(sizeof filter / sizeof filter[0]), filter};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &program) == 0;
}

class SocketLease : public VerbsTest {
 protected:
  // Connects to a WriterAfterH child and polls for its first WRITE, then makes epoll refuse adds
  // (RefuseEpollAdds) and says 'h'; with `at_once`, polls for the second WRITE as well. Then polls
  // 1,000 times and spins on memory: the last WRITE comes after the lease ran out. Last, WRITEs a
  // stream to the child, whose requests the TCP link holds for an EPOLLOUT (TcpChannel::
  // DeferLocked) that a socket out of the epoll set never reports: they must leave all the same.
  // Then WRITEs larger than the socket takes at once: the rest waits for room, which that
  // socket's EPOLLOUT never reports either. The first is polled for (the poller reads the socket);
  // for the second the application calls nothing until the child has it all (the progress thread
  // reads the socket). This QP never retransmits (timeout 0), which would send them too.
  void WriteLandsWhereEpollAddsFail(bool at_once) {
    QpOpts o;
    o.timeout = 0;
    Qp* a = v.NewQp(o);
    Buffer* b = Buf(64);
    ASSERT_TRUE(a && b);
    ForkedPeer child;
    ASSERT_TRUE(child.Start([at_once](int up, int down) {
      return WriterAfterH(ChildPipe{up, down}, {}, at_once);
    }));
    Remote theirs;
    ASSERT_TRUE(child.Recv(&theirs));
    ASSERT_TRUE(child.Send(v.RemoteOf(a)));
    ASSERT_TRUE(child.Send(Window{b->addr(), b->rkey()}));
    ASSERT_EQ(BringUp(a->qp, o, theirs), 0);
    ibv_wc wc;
    // Polls until the byte at `offset` reads `value`, for at most 3 s.
    auto poll_until = [&](size_t offset, uint8_t value) {
      const auto until = Clock::now() + std::chrono::seconds(3);
      while (Peek(b->data() + offset) != value && Clock::now() < until)
        if (ibv_poll_cq(a->scq, 1, &wc) != 0) return false;
      return Peek(b->data() + offset) == value;
    };
    ASSERT_TRUE(child.Send('g'));
    ASSERT_TRUE(poll_until(7, 0x11)) << "the first WRITE never landed";
    ASSERT_TRUE(RefuseEpollAdds());
    ASSERT_TRUE(child.Send('h'));
    if (at_once) {
      ASSERT_TRUE(poll_until(16 + 7, 0x22)) << "the second WRITE never landed";
    }
    for (int i = 0; i < 1000; ++i) ASSERT_EQ(ibv_poll_cq(a->scq, 1, &wc), 0);
    const uint8_t* last = b->data() + 32 + 7;
    const auto until = Clock::now() + std::chrono::seconds(3);
    while (Peek(last) != 0x5a && Clock::now() < until) {
    }
    EXPECT_EQ(Peek(last), 0x5a) << "the last WRITE never landed";
    Window child_buffer{};
    ASSERT_TRUE(child.Recv(&child_buffer));
    constexpr uint64_t kStream = 8;
    for (uint64_t i = 0; i < kStream; ++i)
      ASSERT_EQ(PostRdma(a->qp, IBV_WR_RDMA_WRITE, *b, 0, 8, child_buffer.addr + 8 * i,
                         child_buffer.rkey, i, i + 1 == kStream ? IBV_SEND_SIGNALED : 0),
                0);
    ASSERT_TRUE(PollOne(a->scq, &wc, std::chrono::seconds(3))) << "a stream's WRITEs never left";
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    Buffer* big = Buf(kMoreThanASocketTakes);
    ASSERT_NE(big, nullptr);
    std::memset(big->data(), kLastWrite - 1, kMoreThanASocketTakes);
    ASSERT_EQ(PostRdma(a->qp, IBV_WR_RDMA_WRITE, *big, 0, kMoreThanASocketTakes, child_buffer.addr,
                       child_buffer.rkey, kStream),
              0);
    ASSERT_TRUE(PollOne(a->scq, &wc, std::chrono::seconds(10)))
        << "the rest of a WRITE the socket did not take at once never left";
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    std::memset(big->data(), kLastWrite, kMoreThanASocketTakes);
    ASSERT_EQ(PostRdma(a->qp, IBV_WR_RDMA_WRITE, *big, 0, kMoreThanASocketTakes, child_buffer.addr,
                       child_buffer.rkey, kStream + 1),
              0);
    ASSERT_TRUE(child.Send('c'));
    bool arrived = false;
    ASSERT_TRUE(child.Recv(&arrived, std::chrono::seconds(20)));
    EXPECT_TRUE(arrived) << "with nobody polling, the rest of a WRITE the socket did not take at "
                            "once never left";
    ASSERT_TRUE(PollOne(a->scq, &wc, std::chrono::seconds(10)));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_TRUE(child.Send('x'));
    EXPECT_EQ(child.Wait(), 0) << "the writer's own completions went wrong";
  }
};

// Polls (taking the lease), then spins on memory for a WRITE, as ib_write_lat and riostream do.
// The lease must run out and the progress thread serve the frame; before the lease ended, nobody
// read the socket again.
TEST_F(SocketLease, AWriteLandsForAPollerThatTurnedToSpinningOnMemory) {
  Qp* a = v.NewQp(QpOpts{});
  Buffer* b = Buf(64);
  ASSERT_TRUE(a && b);
  ForkedPeer child;
  ASSERT_TRUE(child.Start([](int up, int down) { return LateWriter(ChildPipe{up, down}, {}); }));
  Remote theirs;
  ASSERT_TRUE(child.Recv(&theirs));
  ASSERT_TRUE(child.Send(v.RemoteOf(a)));
  ASSERT_TRUE(child.Send(Window{b->addr(), b->rkey()}));
  ASSERT_EQ(BringUp(a->qp, QpOpts{}, theirs), 0);
  ASSERT_TRUE(child.Send('g'));
  ibv_wc wc;
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(ibv_poll_cq(a->scq, 1, &wc), 0);
  const uint8_t* last = b->data() + 7;
  auto until = Clock::now() + std::chrono::seconds(3);
  while (Peek(last) != 0x5a && Clock::now() < until) {
  }
  EXPECT_EQ(Peek(last), 0x5a) << "the WRITE never landed";
  EXPECT_TRUE(child.Send('x'));
  EXPECT_EQ(child.Wait(), 0) << "the writer's own completion went wrong";
}

// The lease takes the sockets' epoll set out of the progress thread's; when it cannot be put back
// (no epoll watches left), the progress thread must still read the sockets. The connection the
// last WRITE comes on is not out of the sockets' set here: nothing came on it while the poller
// last asked epoll.
TEST_F(SocketLease, AWriteLandsWhenTheSocketsCannotBeWatchedAgain) {
  if (!getenv("SOFTRDMA_TEST_FRESH"))
    GTEST_SKIP() << "runs in a fresh process (SocketLeaseOnTcp.*)";
  WriteLandsWhereEpollAddsFail(false);
}

// The same for the connection the leased poller reads (the hot socket), which leaves the sockets'
// set as the second WRITE arrives on it: the progress thread must read it itself.
TEST_F(SocketLease, AWriteLandsWhenTheHotSocketCannotBeWatchedAgain) {
  if (!getenv("SOFTRDMA_TEST_FRESH"))
    GTEST_SKIP() << "runs in a fresh process (SocketLeaseOnTcp.*)";
  WriteLandsWhereEpollAddsFail(true);
}

// A receive-only QP acknowledges at the end of the batch of frames that completed its receives
// (it answers nothing, so its ACKs are not deferred). The leased poller reads the hot socket on
// epoll's turn too (every 64th look); a batch read there must end like the others, or the ACK
// waits for the next frame, which a sender waiting for its completion never sends.
TEST_F(SocketLease, EverySendToAReceiveOnlyQpIsAcknowledged) {
  Qp* a = v.NewQp(QpOpts{});
  Buffer* b = Buf(8 * 128);
  ASSERT_TRUE(a && b);
  ForkedPeer child;
  ASSERT_TRUE(child.Start([](int up, int down) {
    return OneByOneSender(ChildPipe{up, down}, {});
  }));
  Remote theirs;
  ASSERT_TRUE(child.Recv(&theirs));
  ASSERT_TRUE(child.Send(v.RemoteOf(a)));
  ASSERT_EQ(BringUp(a->qp, QpOpts{}, theirs), 0);
  for (uint64_t i = 0; i < 128; ++i) ASSERT_EQ(PostRecv(a->qp, *b, 8 * i, 8, i), 0);
  ASSERT_TRUE(child.Send('g'));
  int received = 0;
  bool done = false;
  const auto until = Clock::now() + std::chrono::seconds(20);
  for (int i = 0; (!done || received < kOneByOneMessages) && Clock::now() < until; ++i) {
    ibv_wc wc;
    int n = ibv_poll_cq(a->rcq, 1, &wc);
    ASSERT_GE(n, 0);
    if (n == 1) {
      ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
      ++received;
      ASSERT_EQ(PostRecv(a->qp, *b, 8 * wc.wr_id, 8, wc.wr_id), 0);
    }
    char d;
    if (!done && i % 1024 == 0) done = child.Recv(&d, std::chrono::milliseconds(2));
  }
  EXPECT_TRUE(done) << "the sender did not finish: a SEND was never acknowledged";
  EXPECT_EQ(received, kOneByOneMessages);
  EXPECT_TRUE(child.Send('x'));
  EXPECT_EQ(child.Wait(), 0) << "the sender's side went wrong";
}

// A poller reads the one connection that keeps bringing frames without asking epoll each time;
// it must still ask now and then. Here a second peer's WRITE comes (on a connection of its own,
// which has to be accepted first) while the first peer keeps the poller busy.
TEST_F(SocketLease, AQuietPeerIsHeardWhileABusyOneKeepsThePollerReading) {
  Qp* busy = v.NewQp(QpOpts{});
  Qp* quiet = v.NewQp(QpOpts{});
  Buffer* b = Buf(64);
  ASSERT_TRUE(busy && quiet && b);
  ForkedPeer writer, late;
  ASSERT_TRUE(writer.Start([](int up, int down) { return BusyWriter(ChildPipe{up, down}, {}); }));
  ASSERT_TRUE(late.Start([](int up, int down) { return LateWriter(ChildPipe{up, down}, {}); }));
  Remote theirs;
  ASSERT_TRUE(writer.Recv(&theirs));
  ASSERT_TRUE(writer.Send(v.RemoteOf(busy)));
  ASSERT_TRUE(writer.Send(Window{b->addr(), b->rkey()}));
  ASSERT_EQ(BringUp(busy->qp, QpOpts{}, theirs), 0);
  ASSERT_TRUE(late.Recv(&theirs));
  ASSERT_TRUE(late.Send(v.RemoteOf(quiet)));
  ASSERT_TRUE(late.Send(Window{b->addr() + 32, b->rkey()}));
  ASSERT_EQ(BringUp(quiet->qp, QpOpts{}, theirs), 0);
  ASSERT_TRUE(writer.Send('g'));
  ASSERT_TRUE(late.Send('g'));  // its WRITE comes 300 ms later, while the busy one goes on
  // Polls until the busy writer is done (its WRITEs need us to read them), watching for the
  // quiet one's meanwhile.
  const uint8_t* last = b->data() + 32 + 7;
  bool heard_while_busy = false, busy_done = false;
  ibv_wc wc;
  const auto until = Clock::now() + std::chrono::seconds(10);
  for (int i = 0; !busy_done && Clock::now() < until; ++i) {
    ASSERT_EQ(ibv_poll_cq(busy->rcq, 1, &wc), 0);
    if (!heard_while_busy) heard_while_busy = Peek(last) == 0x5a;
    char d;
    if (i % 1024 == 0) busy_done = writer.Recv(&d, std::chrono::milliseconds(2));
  }
  EXPECT_TRUE(busy_done) << "the busy writer did not finish";
  EXPECT_TRUE(heard_while_busy) << "the quiet peer's WRITE was not read while the busy one went on";
  EXPECT_TRUE(writer.Send('x'));
  EXPECT_TRUE(late.Send('x'));
  EXPECT_EQ(writer.Wait(), 0) << "the busy writer's side went wrong";
  EXPECT_EQ(late.Wait(), 0) << "the late writer's own completion went wrong";
}

// On the TCP link. The second stretches the lease to 10 s: only arming the CQ can end it there.
TEST(SocketLeaseOnTcp, ALeaseThatRunsOutLeavesTheSocketsToTheProgressThread) {
  if (kFreshRunsSkipped) GTEST_SKIP() << "see kFreshRunsSkipped";
  EXPECT_EQ(FailedFreshRuns("SocketLease.AWriteLandsForAPollerThatTurnedToSpinningOnMemory", 2,
                            std::chrono::seconds(30), {"SOFTRDMA_LINK=tcp"}),
            0);
}

// Each in a fresh process of its own: the seccomp filter stays with the process.
TEST(SocketLeaseOnTcp, TheSocketsAreReadWhenTheyCannotBeWatchedAgain) {
  if (kFreshRunsSkipped) GTEST_SKIP() << "see kFreshRunsSkipped";
  for (const char* test : {"SocketLease.AWriteLandsWhenTheSocketsCannotBeWatchedAgain",
                           "SocketLease.AWriteLandsWhenTheHotSocketCannotBeWatchedAgain"})
    EXPECT_EQ(FailedFreshRuns(test, 1, std::chrono::seconds(30),
                              {"SOFTRDMA_LINK=tcp", "SOFTRDMA_TEST_FRESH=1"}),
              0)
        << test;
}

TEST(SocketLeaseOnTcp, EverySendToAReceiveOnlyQpIsAcknowledged) {
  if (kFreshRunsSkipped) GTEST_SKIP() << "see kFreshRunsSkipped";
  EXPECT_EQ(FailedFreshRuns("SocketLease.EverySendToAReceiveOnlyQpIsAcknowledged", 1,
                            std::chrono::seconds(60), {"SOFTRDMA_LINK=tcp"}),
            0);
}

TEST(SocketLeaseOnTcp, ArmingACqEndsTheLease) {
  if (kFreshRunsSkipped) GTEST_SKIP() << "see kFreshRunsSkipped";
  EXPECT_EQ(FailedFreshRuns("ShmLink.AProcessThatPolledAndThenBlocksIsWokenByTheNextMessage", 2,
                            std::chrono::seconds(30),
                            {"SOFTRDMA_LINK=tcp", "SOFTRDMA_SHM_TRUST_POLL_NS=10000000000"}),
            0);
}

// The lease stretched to 10 s: only the poller can read the quiet peer's connection.
TEST(SocketLeaseOnTcp, APollerReadingOneConnectionStillHearsTheOthers) {
  if (kFreshRunsSkipped) GTEST_SKIP() << "see kFreshRunsSkipped";
  EXPECT_EQ(FailedFreshRuns("SocketLease.AQuietPeerIsHeardWhileABusyOneKeepsThePollerReading", 2,
                            std::chrono::seconds(30),
                            {"SOFTRDMA_LINK=tcp", "SOFTRDMA_SHM_TRUST_POLL_NS=10000000000"}),
            0);
}

}  // namespace
