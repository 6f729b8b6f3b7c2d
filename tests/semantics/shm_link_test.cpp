// The same-host link between two processes: a forked peer (same user, same network namespace) is
// reached through shared memory, large messages whose buffers start and end mid-page arrive
// intact (whole pages by reference from the sender's arena, the partial pages inline), and a
// process blocked waiting for a completion uses no CPU.
#include <infiniband/verbs.h>

#include <dirent.h>
#include <poll.h>

#include <gtest/gtest.h>

#include "support/fresh_process.h"
#include "support/sanitized.h"
#include "support/semantics_harness.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace semantics;

constexpr size_t kBuf = 8 << 20;
// The parent's buffer: WRITE source, READ destination and SEND source do not overlap (a READ
// response landing in a SEND's source would race with it, as on hardware).
constexpr size_t kWriteFrom = 77, kWriteLen = (3u << 20) + 123, kWriteTo = 1000;
constexpr size_t kReadInto = (4u << 20) + 5, kReadLen = 2u << 20, kReadFrom = 333;
constexpr size_t kSendFrom = (6u << 20) + 500, kSendLen = 1u << 20, kRecvAt = 3;

uint8_t ChildByte(size_t i) {
  return static_cast<uint8_t>(i * 13 + 5);
}
uint8_t ParentByte(size_t i) {
  return static_cast<uint8_t>(i * 7 + 1);
}

bool MapsMention(const char* what) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find(what) != std::string::npos) return true;
  return false;
}

struct Window {
  uint64_t addr;
  uint32_t rkey;
};

// The peer: exposes a patterned buffer, takes one SEND, checks what the parent wrote and sent,
// and reports 'K' (or a letter naming what was wrong).
int Peer(ChildPipe p, QpOpts o) {
  Verbs v;
  if (!v.Open()) return 10;
  Qp* q = v.NewQp(o);
  Buffer* b = v.NewBuffer(kBuf);
  Buffer* rx = v.NewBuffer(kBuf);
  if (!q || !b || !rx) return 11;
  for (size_t i = 0; i < kBuf; ++i) b->data()[i] = ChildByte(i);
  Remote mine = v.RemoteOf(q), theirs;
  Window w{b->addr(), b->rkey()};
  if (!p.Send(mine) || !p.Send(w) || !p.Recv(&theirs)) return 12;
  if (BringUp(q->qp, o, theirs)) return 13;
  if (PostRecv(q->qp, *rx, kRecvAt, kSendLen, 1)) return 14;
  if (!p.Send('R')) return 15;
  ibv_wc wc;
  if (!PollOne(q->rcq, &wc) || wc.status != IBV_WC_SUCCESS || wc.byte_len != kSendLen) return 16;
  char result = 'K';  // K, or W (write damaged), S (send damaged), B (both)
  for (size_t i = 0; i < kWriteLen; ++i)
    if (b->data()[kWriteTo + i] != ParentByte(kWriteFrom + i)) result = 'W';
  for (size_t i = 0; i < kSendLen; ++i)
    if (rx->data()[kRecvAt + i] != ParentByte(kSendFrom + i)) result = result == 'W' ? 'B' : 'S';
  if (!p.Send(result)) return 17;
  char done;
  p.Recv(&done);
  return 0;
}

class ShmLink : public VerbsTest {
 protected:
  // Polls `cq` (empty) between rounds of in-process traffic, whose timers wake the progress thread
  // meanwhile: it then waits out the poller's lease instead of being parked (parked, it asks the
  // producers to ring).
  void PollBesideInProcessTraffic(ibv_cq* cq) {
    Qp *x, *y;
    Pair(QpOpts{}, &x, &y);
    Buffer* xb = Buf(64);
    ibv_wc wc;
    for (int i = 0; i < 20; ++i) {
      ASSERT_EQ(PostRecv(y->qp, *xb, 0, 8, 1), 0);
      ASSERT_EQ(PostSendMsg(x->qp, *xb, 8, 8, 2), 0);
      ASSERT_TRUE(PollOne(x->scq, &wc));
      ASSERT_TRUE(PollOne(y->rcq, &wc));
      for (int j = 0; j < 50; ++j) ASSERT_EQ(ibv_poll_cq(cq, 1, &wc), 0);
    }
  }
};

TEST_F(ShmLink, LargeUnalignedMessagesCrossIntactInBothDirections) {
  if (ShmLinkOff()) GTEST_SKIP() << kShmLinkOff;
  QpOpts o;
  Qp* a = v.NewQp(o);
  Buffer* buf = Buf(kBuf);
  ASSERT_TRUE(a && buf);
  for (size_t i = 0; i < kBuf; ++i) buf->data()[i] = ParentByte(i);
  ForkedPeer child;
  ASSERT_TRUE(child.Start([o](int up, int down) { return Peer(ChildPipe{up, down}, o); }));
  Remote theirs;
  Window w;
  ASSERT_TRUE(child.Recv(&theirs));
  ASSERT_TRUE(child.Recv(&w));
  ASSERT_TRUE(child.Send(v.RemoteOf(a)));
  ASSERT_EQ(BringUp(a->qp, o, theirs), 0);
  char c = 0;
  ASSERT_TRUE(child.Recv(&c));
  ASSERT_EQ(c, 'R');
  EXPECT_TRUE(MapsMention("memfd:softrdma-link")) << "the peer was not reached by shared memory";

  ASSERT_EQ(
      PostRdma(a->qp, IBV_WR_RDMA_WRITE, *buf, kWriteFrom, kWriteLen, w.addr + kWriteTo, w.rkey, 1),
      0);
  ASSERT_EQ(
      PostRdma(a->qp, IBV_WR_RDMA_READ, *buf, kReadInto, kReadLen, w.addr + kReadFrom, w.rkey, 2),
      0);
  ASSERT_EQ(PostSendMsg(a->qp, *buf, kSendFrom, kSendLen, 3), 0);
  for (int i = 0; i < 3; ++i) {
    ibv_wc wc;
    ASSERT_TRUE(PollOne(a->scq, &wc));
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
  }
  ASSERT_TRUE(child.Recv(&c, std::chrono::milliseconds(20000)));
  EXPECT_EQ(c, 'K') << "W: the RDMA WRITE, S: the SEND, B: both arrived damaged";
  size_t bad = 0;
  // The READ follows the WRITE on one QP, so it sees the written bytes from kWriteTo on.
  for (size_t i = 0; i < kReadLen; ++i) {
    size_t src = kReadFrom + i;
    uint8_t want = src >= kWriteTo ? ParentByte(kWriteFrom + src - kWriteTo) : ChildByte(src);
    bad += buf->data()[kReadInto + i] != want;
  }
  EXPECT_EQ(bad, 0u) << "the RDMA READ brought other bytes";
  EXPECT_EQ(buf->data()[kReadInto - 1], ParentByte(kReadInto - 1));
  EXPECT_EQ(buf->data()[kReadInto + kReadLen], ParentByte(kReadInto + kReadLen));
  child.Send('x');
}

// The peer only connects and waits; the parent blocks on a completion channel.
int QuietPeer(ChildPipe p, QpOpts o) {
  Verbs v;
  if (!v.Open()) return 10;
  Qp* q = v.NewQp(o);
  if (!q) return 11;
  Remote mine = v.RemoteOf(q), theirs;
  if (!p.Send(mine) || !p.Recv(&theirs)) return 12;
  if (BringUp(q->qp, o, theirs)) return 13;
  Buffer* b = v.NewBuffer(64);
  if (!b || PostRecv(q->qp, *b, 0, 64, 1)) return 14;
  if (!p.Send('R')) return 15;
  char done;
  p.Recv(&done);
  return 0;
}

TEST_F(ShmLink, AProcessBlockedOnACompletionChannelUsesNoCpu) {
  ibv_comp_channel* ch = v.NewChannel();
  ASSERT_NE(ch, nullptr);
  ibv_cq* cq = v.NewCq(16, ch);
  ASSERT_NE(cq, nullptr);
  QpOpts o;
  o.send_cq = cq;
  o.recv_cq = cq;
  Qp* a = v.NewQp(o);
  ASSERT_NE(a, nullptr);
  ForkedPeer child;
  ASSERT_TRUE(child.Start([](int up, int down) { return QuietPeer(ChildPipe{up, down}, {}); }));
  Remote theirs;
  ASSERT_TRUE(child.Recv(&theirs));
  ASSERT_TRUE(child.Send(v.RemoteOf(a)));
  ASSERT_EQ(BringUp(a->qp, o, theirs), 0);
  char c = 0;
  ASSERT_TRUE(child.Recv(&c));
  Buffer* b = Buf(64);
  ASSERT_EQ(PostSendMsg(a->qp, *b, 0, 8, 1), 0);  // traffic: the shared-memory channel is open
  ibv_wc wc;
  ASSERT_TRUE(PollOne(cq, &wc));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
  ASSERT_EQ(ibv_req_notify_cq(cq, 0), 0);

  const long before = ProcessCpuUs();
  pollfd p{ch->fd, POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 1000), 0) << "no completion was due";  // blocked, as in ibv_get_cq_event
  const long cpu_us = ProcessCpuUs() - before;
  EXPECT_LT(cpu_us, 50000) << "the process used " << cpu_us << " us of CPU in 1 s of waiting";
  child.Send('x');
}

// The peer sends one message a while after it is told to.
int LateSender(ChildPipe p, QpOpts o) {
  ChildQp c;
  if (int e = c.Connect(p, o, 64)) return e;
  char go;
  if (!p.Recv(&go)) return 14;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the parent is blocked by now
  if (PostSendMsg(c.q->qp, *c.b, 0, 8, 1)) return 15;
  ibv_wc wc;
  if (!PollOne(c.q->scq, &wc) || wc.status != IBV_WC_SUCCESS) return 16;
  p.Recv(&go);
  return 0;
}

// Polling an empty CQ tells the peer's producers not to ring (the poller reads the rings); a
// process that then blocks must still be woken by the next message. It was not: the flag stayed
// cleared, and the message waited in the ring until the peer's retransmissions gave up.
TEST_F(ShmLink, AProcessThatPolledAndThenBlocksIsWokenByTheNextMessage) {
  ibv_comp_channel* ch = v.NewChannel();
  ASSERT_NE(ch, nullptr);
  ibv_cq* cq = v.NewCq(16, ch);
  QpOpts o;
  o.send_cq = cq;
  o.recv_cq = cq;
  Qp* a = v.NewQp(o);
  Buffer* b = Buf(64);
  ASSERT_TRUE(a && b);
  ForkedPeer child;
  ASSERT_TRUE(child.Start([](int up, int down) { return LateSender(ChildPipe{up, down}, {}); }));
  Remote theirs;
  ASSERT_TRUE(child.Recv(&theirs));
  ASSERT_TRUE(child.Send(v.RemoteOf(a)));
  ASSERT_EQ(BringUp(a->qp, o, theirs), 0);
  ASSERT_EQ(PostRecv(a->qp, *b, 0, 64, 7), 0);
  ASSERT_TRUE(child.Send('g'));
  ibv_wc wc;
  for (int i = 0; i < 100; ++i) ASSERT_EQ(ibv_poll_cq(cq, 1, &wc), 0);  // busy, then blocked
  ASSERT_EQ(ibv_req_notify_cq(cq, 0), 0);
  pollfd p{ch->fd, POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 3000), 1) << "the message never woke this process";
  ASSERT_TRUE(PollOne(cq, &wc));
  EXPECT_EQ(wc.wr_id, 7u);
  void* ctx;
  ibv_cq* got;
  if (p.revents & POLLIN) {
    ASSERT_EQ(ibv_get_cq_event(ch, &got, &ctx), 0);
    ibv_ack_cq_events(got, 1);
  }
  EXPECT_TRUE(child.Send('x'));
  EXPECT_EQ(child.Wait(), 0) << "the sender's own completion went wrong";
}

// The verbs idiom: arm, poll once more (a completion may have slipped in), then block. That last
// poll also asks the sockets (it comes more than kSocketPollIntervalNs after the one before), and
// did so claiming the progress loop, which told the producers again not to ring and renewed the
// poll lease: the message waited for the lease's end (udpong: replies ~1 ms late in about 1 of
// 20,000 exchanges; here, with the lease stretched, never woke the process).
TEST_F(ShmLink, AProcessThatArmsAndPollsOnceMoreIsWokenByTheNextMessage) {
  ibv_comp_channel* ch = v.NewChannel();
  ASSERT_NE(ch, nullptr);
  ibv_cq* cq = v.NewCq(16, ch);
  QpOpts o;
  o.send_cq = cq;
  o.recv_cq = cq;
  Qp* a = v.NewQp(o);
  Buffer* b = Buf(64);
  ASSERT_TRUE(a && b);
  ForkedPeer child;
  ASSERT_TRUE(child.Start([](int up, int down) { return LateSender(ChildPipe{up, down}, {}); }));
  Remote theirs;
  ASSERT_TRUE(child.Recv(&theirs));
  ASSERT_TRUE(child.Send(v.RemoteOf(a)));
  ASSERT_EQ(BringUp(a->qp, o, theirs), 0);
  ASSERT_EQ(PostRecv(a->qp, *b, 0, 64, 7), 0);
  ASSERT_TRUE(child.Send('g'));
  ASSERT_NO_FATAL_FAILURE(PollBesideInProcessTraffic(cq));  // busy
  ibv_wc wc;
  ASSERT_EQ(ibv_req_notify_cq(cq, 0), 0);
  std::this_thread::sleep_for(std::chrono::microseconds(100));
  ASSERT_EQ(ibv_poll_cq(cq, 1, &wc), 0);  // the look after the arm; then blocked
  pollfd p{ch->fd, POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 3000), 1) << "the message never woke this process";
  ASSERT_TRUE(PollOne(cq, &wc));
  EXPECT_EQ(wc.wr_id, 7u);
  void* ctx;
  ibv_cq* got;
  if (p.revents & POLLIN) {
    ASSERT_EQ(ibv_get_cq_event(ch, &got, &ctx), 0);
    ibv_ack_cq_events(got, 1);
  }
  EXPECT_TRUE(child.Send('x'));
  EXPECT_EQ(child.Wait(), 0) << "the sender's own completion went wrong";
}

// The peer writes 8 bytes (round r: 0x10 * r + i) into the parent's window whenever told to, and
// waits for each completion.
int LateWriter(ChildPipe p, QpOpts o) {
  ChildQp c;
  if (int e = c.Connect(p, o, 64)) return e;
  Window w;
  if (!p.Recv(&w)) return 14;
  char go;
  for (uint8_t round = 1; p.Recv(&go) && go == 'g'; ++round) {
    for (int i = 0; i < 8; ++i) c.b->data()[i] = static_cast<uint8_t>(0x10 * round + i);
    if (PostRdma(c.q->qp, IBV_WR_RDMA_WRITE, *c.b, 0, 8, w.addr, w.rkey, round)) return 16;
    ibv_wc wc;
    if (!PollOne(c.q->scq, &wc) || wc.status != IBV_WC_SUCCESS) return 17;
  }
  return 0;
}

// Waits up to 3 s, spinning, for the last byte of round `round` of LateWriter.
bool SpinFor(const std::vector<uint64_t>& target, uint8_t round) {
  const uint8_t* last = reinterpret_cast<const uint8_t*>(target.data()) + 7;
  const uint8_t want = static_cast<uint8_t>(0x10 * round + 7);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (Peek(last) != want && std::chrono::steady_clock::now() < until) {
  }
  return Peek(last) == want;
}

// An application that polls its CQ and then waits on memory (ib_write_lat) is still polling as far
// as the peer's producers know: a WRITE that comes by frames (here into a region on demand, which
// peers do not reach directly) rings no doorbell, and reached this process when its progress thread
// next woke: at the end of the poll lease or at a timer, 0.1-100 ms later (ib_write_lat --odp:
// 100-500 us per message). The writer, which polls for its completion, now rings for what is left
// untaken (ShmRing.RecordsLeftUntakenAfterTheLastPollAreRungForByTheProducer); here the WRITE must
// arrive at all, under the sanitizers too.
TEST_F(ShmLink, AProcessThatPolledAndThenWaitsOnMemoryGetsTheWriteByFrames) {
  if (ShmLinkOff()) GTEST_SKIP() << kShmLinkOff;
  QpOpts o;
  Qp* a = v.NewQp(o);
  ASSERT_NE(a, nullptr);
  std::vector<uint64_t> target(8, 0);
  const int access = kAllAccess | IBV_ACCESS_ON_DEMAND;
  ibv_mr* mr = ibv_reg_mr(v.pd, target.data(), 64, access);
  ASSERT_NE(mr, nullptr) << strerror(errno);
  ForkedPeer child;
  ASSERT_TRUE(child.Start([o](int up, int down) { return LateWriter(ChildPipe{up, down}, o); }));
  Remote theirs;
  ASSERT_TRUE(child.Recv(&theirs));
  ASSERT_TRUE(child.Send(v.RemoteOf(a)));
  ASSERT_EQ(BringUp(a->qp, o, theirs), 0);
  ASSERT_TRUE(child.Send(Window{reinterpret_cast<uintptr_t>(target.data()), mr->rkey}));
  // The first WRITE opens the channel (a new channel's first record always rings).
  ASSERT_TRUE(child.Send('g'));
  ASSERT_TRUE(SpinFor(target, 1)) << "the first WRITE did not arrive";
  ASSERT_NO_FATAL_FAILURE(PollBesideInProcessTraffic(a->rcq));  // polling; then waiting on memory
  ASSERT_TRUE(child.Send('g'));
  EXPECT_TRUE(SpinFor(target, 2)) << "the WRITE did not arrive while this process waited on memory";
  EXPECT_TRUE(child.Send('x'));
  EXPECT_EQ(child.Wait(), 0) << "the writer's own completion went wrong";
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
}

// A WRITE ping-pong between regions on demand (ib_write_lat --odp), which peers do not reach
// directly: every WRITE goes by frames. Byte 7 of each WRITE names its round (1-254, cycling);
// kStopRound ends the peer's side.
constexpr int kWarmUpRounds = 20, kBatchRounds = 30, kMaxBatches = 40;
constexpr uint8_t kStopRound = 0xff;
uint8_t RoundByte(int r) {
  return static_cast<uint8_t>(1 + (r - 1) % 254);
}

// Waits up to 3 s, spinning, for byte 7 of `target` to change from `last`; returns it (`last`
// when it did not change).
uint8_t SpinForNextRound(const std::vector<uint64_t>& target, uint8_t last) {
  const uint8_t* at = reinterpret_cast<const uint8_t*>(target.data()) + 7;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (Peek(at) == last && std::chrono::steady_clock::now() < until) {
  }
  return Peek(at);
}

// A WRITE of `round` from `b` into `theirs`, spinning for its completion.
bool WriteRound(Qp* q, Buffer* b, const Window& theirs, uint8_t round) {
  b->data()[7] = round;
  if (PostRdma(q->qp, IBV_WR_RDMA_WRITE, *b, 0, 8, theirs.addr, theirs.rkey, round)) return false;
  ibv_wc wc;
  return SpinPollOne(q->scq, &wc) && wc.status == IBV_WC_SUCCESS;
}

// The peer's side: each round waits in memory (its window is a region on demand) for the
// parent's WRITE and answers with a WRITE of the same round.
int WriteEcho(ChildPipe p, QpOpts o) {
  ChildQp c;
  if (int e = c.Connect(p, o, 64)) return e;
  std::vector<uint64_t> target(8, 0);
  ibv_mr* mr = ibv_reg_mr(c.v.pd, target.data(), 64, kAllAccess | IBV_ACCESS_ON_DEMAND);
  if (!mr) return 14;
  Window theirs;
  if (!p.Send(Window{reinterpret_cast<uintptr_t>(target.data()), mr->rkey}) || !p.Recv(&theirs))
    return 15;
  for (uint8_t last = 0;;) {
    const uint8_t round = SpinForNextRound(target, last);
    if (round == last) return 16;
    if (round == kStopRound) break;
    if (!WriteRound(c.q, c.b, theirs, round)) return 17;
    last = round;
  }
  char done;
  p.Recv(&done);
  return ibv_dereg_mr(mr) == 0 ? 0 : 18;
}

// Times this process's threads gave up their CPU (each wake-up of the progress thread ends in one).
uint64_t VoluntarySwitches() {
  uint64_t n = 0;
  DIR* d = opendir("/proc/self/task");
  if (!d) return 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream status(std::string("/proc/self/task/") + e->d_name + "/status");
    std::string line;
    while (std::getline(status, line))
      if (line.rfind("voluntary_ctxt_switches:", 0) == 0) n += std::stoull(line.substr(24));
  }
  closedir(d);
  return n;
}

// In a ping-pong of WRITEs by frames, each side's ACK waits for its answer and leaves with it, as
// on TCP: the peer, polling for its WRITE's completion, then takes the answer with the ACK and
// places it itself. The shared-memory link sent ACKs at once (frames are cheap there), so the
// answer came after the peer's poll had taken the ACK and left: every WRITE woke the progress
// thread (ib_write_lat --odp over shared memory 16-25 us one way, TCP 9-14; now 4-5).
TEST_F(ShmLink, AWriteByFramesInAPingPongCarriesTheAckItsSenderOwes) {
  if (ShmLinkOff()) GTEST_SKIP() << kShmLinkOff;
  if (kSanitized) GTEST_SKIP() << "answers come later than an owed ACK waits for them";
  QpOpts o;
  Qp* a = v.NewQp(o);
  Buffer* src = Buf(64);
  ASSERT_TRUE(a && src);
  std::vector<uint64_t> target(8, 0);
  ibv_mr* mr = ibv_reg_mr(v.pd, target.data(), 64, kAllAccess | IBV_ACCESS_ON_DEMAND);
  ASSERT_NE(mr, nullptr) << strerror(errno);
  ForkedPeer child;
  ASSERT_TRUE(child.Start([o](int up, int down) { return WriteEcho(ChildPipe{up, down}, o); }));
  Remote theirs;
  ASSERT_TRUE(child.Recv(&theirs));
  ASSERT_TRUE(child.Send(v.RemoteOf(a)));
  ASSERT_EQ(BringUp(a->qp, o, theirs), 0);
  Window w;
  ASSERT_TRUE(child.Recv(&w));
  ASSERT_TRUE(child.Send(Window{reinterpret_cast<uintptr_t>(target.data()), mr->rkey}));
  // The first rounds open the channel and teach both QPs the ping-pong; then batches of rounds
  // are counted until one switches in fewer than half its rounds. Where the host is busy (other
  // tests beside this one), a batch in which the peer lost its CPU for longer than an owed ACK
  // waits (the deferral is then unlearnt, and learnt again) says little; without the deferral
  // every round of every batch switched.
  auto round = [&](int r) {
    const uint8_t b = RoundByte(r);
    return WriteRound(a, src, w, b) && SpinForNextRound(target, RoundByte(r - 1)) == b;
  };
  int r = 1;
  for (; r <= kWarmUpRounds; ++r) ASSERT_TRUE(round(r)) << "round " << r;
  uint64_t fewest = UINT64_MAX;
  for (int batch = 0; batch < kMaxBatches && fewest >= kBatchRounds / 2; ++batch) {
    const uint64_t before = VoluntarySwitches();
    for (int i = 0; i < kBatchRounds; ++i, ++r) ASSERT_TRUE(round(r)) << "round " << r;
    fewest = std::min(fewest, VoluntarySwitches() - before);
  }
  EXPECT_LT(fewest, uint64_t{kBatchRounds} / 2)
      << "the answers woke the progress thread: the ACKs came ahead of them";
  src->data()[7] = kStopRound;
  EXPECT_EQ(PostRdma(a->qp, IBV_WR_RDMA_WRITE, *src, 0, 8, w.addr, w.rkey, 0), 0);
  ibv_wc wc;
  EXPECT_TRUE(SpinPollOne(a->scq, &wc));
  EXPECT_TRUE(child.Send('x'));
  EXPECT_EQ(child.Wait(), 0) << "the peer's side went wrong";
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
}

// The producer's own check of records left untaken (SOFTRDMA_SHM_UNRUNG_CHECK_NS) stretched as
// well: the doorbell must come from the arming.
const std::initializer_list<const char*> kArmingMustRing = {
    "SOFTRDMA_SHM_TRUST_POLL_NS=10000000000", "SOFTRDMA_SHM_UNRUNG_CHECK_NS=10000000000"};

// The same, with the sender trusting the last poll (and the progress thread leaving the rings to
// pollers) for 10 s instead of microseconds: arming the CQ must end that trust. It did not, and a
// message sent within kShmConsumerIdleNs of the last poll rang no doorbell and waited up to the
// poll lease (1 ms): udpong, which resends what is not answered within 1 ms and then takes the
// late answer for the next one's, hung in most full runs.
TEST(ShmLinkArming, ArmingACqEndsTheTrustInTheLastPoll) {
  if (kFreshRunsSkipped) GTEST_SKIP() << "see kFreshRunsSkipped";
  EXPECT_EQ(FailedFreshRuns("ShmLink.AProcessThatPolledAndThenBlocksIsWokenByTheNextMessage", 3,
                            std::chrono::seconds(30), kArmingMustRing),
            0);
}

TEST(ShmLinkArming, ThePollAfterAnArmKeepsTheProducersRinging) {
  if (kFreshRunsSkipped) GTEST_SKIP() << "see kFreshRunsSkipped";
  EXPECT_EQ(FailedFreshRuns("ShmLink.AProcessThatArmsAndPollsOnceMoreIsWokenByTheNextMessage", 3,
                            std::chrono::seconds(30), kArmingMustRing),
            0);
}

}  // namespace
