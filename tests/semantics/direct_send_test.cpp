// SENDs between same-host peers placed without frames (architecture §12, "Direct SENDs"): the
// receiver publishes the head of its receive queue, the sender places the message and completes at
// once, the receiver turns it into its completion. Everything a frame would have done must hold:
// completion fields, scatter lists, order with SENDs that still go as frames, errors, wake-ups,
// flushes. Each test runs against a forked peer on the shared-memory link; receive buffers are
// whole pages of anonymous memory (what the link shares), except where a test wants a frame.
#include <infiniband/verbs.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "link/shared_windows.h"
#include "support/semantics_harness.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace semantics;

using Region = ShareableRegion;
constexpr size_t kRegion = Region::kBytes;
// An int, not the enum: ibv_reg_mr's macro ORs it with another enum's value (clang warns).
constexpr int kLocalWrite = IBV_ACCESS_LOCAL_WRITE;

uint8_t Pattern(size_t i) {
  return static_cast<uint8_t>(i * 31 + 7);
}

int PostRecvSges(ibv_qp* qp, std::vector<ibv_sge> sges, uint64_t wr_id) {
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = sges.data();
  wr.num_sge = static_cast<int>(sges.size());
  ibv_recv_wr* bad = nullptr;
  return ibv_post_recv(qp, &wr, &bad);
}

// What the sending child is told to send, one message per order.
struct Order {
  uint32_t len;
  uint32_t imm;  // 0: a plain SEND
  uint8_t solicited;
  uint8_t inline_data;  // inline, from three pieces: 5 bytes, none (address 0), the rest
};

// The sending child: a connected QP and a region of Pattern bytes. For each Order ('s') it sends
// one message from the region's start and waits for its completion, reporting its status; for a
// Stream ('m') it sends that many messages back to back, each waited for, and reports the first
// status that is not a success (or success); 'x' ends.
struct Stream {
  uint32_t count, len;
};
int Sender(ChildPipe p, QpOpts o) {
  ChildQp c;
  if (int e = c.Connect(p, o, 64)) return e;
  Region r;
  if (!r.Make(c.v.pd)) return 20;
  for (size_t i = 0; i < kRegion; ++i) r.p[i] = Pattern(i);
  for (;;) {
    char kind;
    if (!p.Recv(&kind)) return 21;
    if (kind == 'x') return 0;
    if (kind == 'm') {
      Stream m;
      if (!p.Recv(&m)) return 25;
      int st = IBV_WC_SUCCESS;
      for (uint32_t i = 0; i < m.count && st == IBV_WC_SUCCESS; ++i) {
        SendArgs s;
        s.sges = {r.Sge(0, m.len)};
        if (Post(c.q->qp, s)) return 26;
        ibv_wc wc{};
        st = PollOne(c.q->scq, &wc, std::chrono::seconds(10)) ? wc.status : -1;
      }
      if (!p.Send(st)) return 27;
      continue;
    }
    Order ord;
    if (!p.Recv(&ord)) return 22;
    SendArgs s;
    s.opcode = ord.imm ? IBV_WR_SEND_WITH_IMM : IBV_WR_SEND;
    s.imm = ord.imm;
    s.flags = IBV_SEND_SIGNALED | (ord.solicited ? unsigned{IBV_SEND_SOLICITED} : 0u);
    if (ord.len) s.sges = {r.Sge(0, ord.len)};
    if (ord.inline_data) {
      s.flags |= IBV_SEND_INLINE;
      s.sges = {r.Sge(0, 5), ibv_sge{0, 0, 0}, r.Sge(5, ord.len - 5)};
      s.sges[0].lkey = s.sges[2].lkey = 0;  // inline pieces need no key
    }
    if (Post(c.q->qp, s)) return 23;
    ibv_wc wc{};
    int st = PollOne(c.q->scq, &wc, std::chrono::seconds(10)) ? wc.status : -1;
    if (!p.Send(st)) return 24;
  }
}

class DirectSend : public VerbsTest {
 protected:
  // A QP connected to a Sender child, and a shared region to receive into.
  void Connect(const QpOpts& o = {}) {
    opts = o;
    q = v.NewQp(o);
    ASSERT_NE(q, nullptr);
    ASSERT_TRUE(region.Make(v.pd));
    ASSERT_TRUE(child.Start([o](int up, int down) { return Sender(ChildPipe{up, down}, o); }));
    Remote theirs;
    ASSERT_TRUE(child.Recv(&theirs));
    ASSERT_TRUE(child.Send(v.RemoteOf(q)));
    ASSERT_EQ(BringUp(q->qp, o, theirs), 0);
    peer_qpn = theirs.qpn;
  }
  // Options whose receive CQ (of `depth`) reports to a new completion channel, `*ch`.
  void EventCqOpts(int depth, QpOpts* o, ibv_comp_channel** ch) {
    *ch = v.NewChannel();
    ASSERT_NE(*ch, nullptr);
    o->recv_cq = v.NewCq(depth, *ch);
    ASSERT_NE(o->recv_cq, nullptr);
  }
  // Has the child send one message; returns its send completion's status (-1: none came).
  int Send(uint32_t len, uint32_t imm = 0, bool solicited = false, bool inline_data = false) {
    Order ord{len, imm, static_cast<uint8_t>(solicited), static_cast<uint8_t>(inline_data)};
    int st = -1;
    if (!child.Send('s') || !child.Send(ord) || !child.Recv(&st, std::chrono::seconds(15)))
      return -1;
    return st;
  }
  void TearDown() override {
    child.Send('x');
    EXPECT_EQ(child.Wait(), 0) << "the sending child failed";
    region.Free();  // before the device closes
    VerbsTest::TearDown();
  }
  // Deregisters `region`, whose first 256 bytes the receive WQE `wr_id` names, and has the child
  // send `len` bytes: both sides fail (the long way), and neither the region nor one registered
  // after it, which may take the arena pages it left, is written.
  void ExpectASendIntoTheDeregisteredRegionFails(uint64_t wr_id, uint32_t len = 256) {
    ASSERT_EQ(ibv_dereg_mr(region.mr), 0);
    region.mr = nullptr;
    Region later;
    ASSERT_TRUE(later.Make(v.pd));
    std::memset(later.p, 0xee, kRegion);
    std::memset(region.p, 0xdd, 256);
    EXPECT_NE(Send(len), IBV_WC_SUCCESS);
    ibv_wc wc{};
    ASSERT_TRUE(PollOne(q->rcq, &wc));
    EXPECT_EQ(wc.wr_id, wr_id);
    EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR);
    for (size_t i = 0; i < kRegion; ++i) ASSERT_EQ(later.p[i], 0xee) << "byte " << i;
    for (size_t i = 0; i < 256; ++i) ASSERT_EQ(region.p[i], 0xdd) << "byte " << i;
  }
  bool Holds(size_t at, size_t len, size_t pattern_from = 0) const {
    for (size_t i = 0; i < len; ++i)
      if (region.p[at + i] != Pattern(pattern_from + i)) return false;
    return true;
  }

  QpOpts opts;
  Qp* q = nullptr;
  Region region;
  ForkedPeer child;
  uint32_t peer_qpn = 0;
};

// Once a thread has polled thousands of messages (each collected by its polls and its receive
// reposted), the QP's and the CQ's locks are biased to it where this kernel allows; the HCA then
// collects a slot that thread leaves done for a grace period, or at once for an armed CQ
// (Qp::CollectDirectRecvsKeepingBias).
class DirectSendAfterALongPoll : public DirectSend {
 protected:
  void PollAStream(const QpOpts& o) {
    Connect(o);
    constexpr int kDepth = 32;
    for (int i = 0; i < kDepth; ++i) ASSERT_EQ(PostRecvSges(q->qp, {region.Sge(0, 64)}, i), 0);
    const Stream m{4000, 64};
    ASSERT_TRUE(child.Send('m') && child.Send(m));
    for (uint32_t got = 0; got < m.count; ++got) {
      ibv_wc wc{};
      ASSERT_TRUE(PollOne(q->rcq, &wc, std::chrono::seconds(10))) << "message " << got;
      ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
      ASSERT_EQ(PostRecvSges(q->qp, {region.Sge(0, 64)}, wc.wr_id), 0);
    }
    int st = -1;
    ASSERT_TRUE(child.Recv(&st, std::chrono::seconds(15)));
    ASSERT_EQ(st, IBV_WC_SUCCESS);
  }
};

// Once the thread arms the CQ and blocks, the progress thread must collect what comes, bias or
// not, and raise the event.
TEST_F(DirectSendAfterALongPoll, AThreadThatThenBlocksGetsItsEvent) {
  ibv_comp_channel* ch = nullptr;
  QpOpts o;
  ASSERT_NO_FATAL_FAILURE(EventCqOpts(512, &o, &ch));
  ASSERT_NO_FATAL_FAILURE(PollAStream(o));
  ASSERT_EQ(ibv_req_notify_cq(q->rcq, 0), 0);
  ibv_wc wc{};
  ASSERT_EQ(ibv_poll_cq(q->rcq, 1, &wc), 0);  // nothing came between the last poll and the arm
  Order ord{64, 0, 0, 0};
  ASSERT_TRUE(child.Send('s') && child.Send(ord));
  pollfd p{ch->fd, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 10000), 1) << "no completion event for a message to a blocked poller";
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  ASSERT_EQ(ibv_get_cq_event(ch, &ev_cq, &ev_ctx), 0);
  EXPECT_EQ(ev_cq, q->rcq);
  ibv_ack_cq_events(ev_cq, 1);
  ASSERT_EQ(ibv_poll_cq(q->rcq, 1, &wc), 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  int st = -1;
  ASSERT_TRUE(child.Recv(&st, std::chrono::seconds(15)));
  EXPECT_EQ(st, IBV_WC_SUCCESS);
}

// A message that comes while the polling thread pauses is collected by the progress thread,
// which then sleeps, bias or not. Its first form left a biased QP to the polling thread and kept
// the peers' count pending for it, always: the progress thread never slept again, and at its
// real-time priority it took the core from the application (ib_send_lat -a over shared memory
// hung on two cores).
TEST_F(DirectSendAfterALongPoll, AMessageWhileThePollingThreadPausesIsCollectedAndTheHcaSleeps) {
  ASSERT_NO_FATAL_FAILURE(PollAStream({}));
  ASSERT_EQ(Send(64), IBV_WC_SUCCESS);  // the sender completes at once, placed or not
  const long before = ProcessCpuUs();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const long cpu_us = ProcessCpuUs() - before;
  // A spinning thread uses the whole second; a sleeping one a few wake-ups' worth.
  EXPECT_LT(cpu_us, 250000) << "the process used " << cpu_us << " us of CPU in 1 s of pause";
  ibv_wc wc{};
  ASSERT_TRUE(PollOne(q->rcq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.byte_len, 64u);
}

// Such a message completes when it arrives, not when the thread polls again: the HCA collects a
// slot its polling thread leaves for longer than a grace period (Qp::kOwnerGraceNs, 50 us). Read
// by the completion's wall-clock stamp, taken when a completion enters the CQ.
TEST_F(DirectSendAfterALongPoll, AMessageWhileThePollingThreadPausesCompletesWhenItArrives) {
  ibv_cq_ex* cqx =
      v.NewCqEx(IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK);
  ASSERT_NE(cqx, nullptr) << strerror(errno);
  QpOpts o;
  o.recv_cq = ibv_cq_ex_to_cq(cqx);
  ASSERT_NO_FATAL_FAILURE(PollAStream(o));
  // Past the thread's poll lease (at most a millisecond): the HCA sleeps when the message comes.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  timespec sent{};
  clock_gettime(CLOCK_REALTIME, &sent);
  ASSERT_EQ(Send(64), IBV_WC_SUCCESS);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  ibv_poll_cq_attr pa{};
  ASSERT_EQ(ibv_start_poll(cqx, &pa), 0);
  EXPECT_EQ(cqx->status, IBV_WC_SUCCESS);
  EXPECT_EQ(ibv_wc_read_byte_len(cqx), 64u);
  const int64_t completed = static_cast<int64_t>(ibv_wc_read_completion_wallclock_ns(cqx));
  ibv_end_poll(cqx);
  const int64_t after_send_ms = (completed - (sent.tv_sec * 1000000000L + sent.tv_nsec)) / 1000000;
  // Collected at the poll, a second after it came, it would say ~1,000 ms.
  EXPECT_LT(after_send_ms, 500) << "the completion entered the CQ " << after_send_ms
                                << " ms after the send, at the application's poll";
}

TEST_F(DirectSend, ACompletionCarriesWhatAFrameWouldHave) {
  Connect();
  ASSERT_EQ(PostRecvSges(q->qp, {region.Sge(100, 4096)}, 41), 0);
  ASSERT_EQ(PostRecvSges(q->qp, {region.Sge(8192, 4096)}, 42), 0);
  ASSERT_EQ(Send(1000), IBV_WC_SUCCESS);
  ASSERT_EQ(Send(12, 0xabcd1234u, true), IBV_WC_SUCCESS);
  auto wcs = PollN(q->rcq, 2);
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[0].wr_id, 41u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wcs[0].opcode, IBV_WC_RECV);
  EXPECT_EQ(wcs[0].byte_len, 1000u);
  EXPECT_EQ(wcs[0].wc_flags & IBV_WC_WITH_IMM, 0u);
  EXPECT_EQ(wcs[0].qp_num, q->qpn());
  EXPECT_EQ(wcs[0].src_qp, peer_qpn);
  EXPECT_EQ(wcs[1].wr_id, 42u);
  EXPECT_EQ(wcs[1].byte_len, 12u);
  EXPECT_TRUE(wcs[1].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(ntohl(wcs[1].imm_data), 0xabcd1234u);
  EXPECT_TRUE(Holds(100, 1000));
  EXPECT_TRUE(Holds(8192, 12));
  EXPECT_NE(region.p[8192 + 12], Pattern(12)) << "bytes beyond the message were written";
}

TEST_F(DirectSend, AMessageIsScatteredOverTheReceiveWqesPieces) {
  Connect();
  ASSERT_EQ(
      PostRecvSges(q->qp, {region.Sge(0, 10), region.Sge(4096, 3000), region.Sge(20000, 5000)}, 7),
      0);
  ASSERT_EQ(Send(6000), IBV_WC_SUCCESS);
  ibv_wc wc{};
  ASSERT_TRUE(PollOne(q->rcq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.byte_len, 6000u);
  EXPECT_TRUE(Holds(0, 10, 0));
  EXPECT_TRUE(Holds(4096, 3000, 10));
  EXPECT_TRUE(Holds(20000, 2990, 3010));
  EXPECT_EQ(region.p[20000 + 2990], 0) << "the third piece was written beyond the message";
}

// A message that fits its receive slot travels there, and the receiver copies it into the WQE's
// pieces (link::direct_recv::kInSlot): the same bytes, where a piece of no bytes is skipped, and
// nothing beyond them.
TEST_F(DirectSend, ASmallMessageIsScatteredOverTheReceiveWqesPiecesToo) {
  Connect();
  ASSERT_EQ(
      PostRecvSges(
          q->qp,
          {region.Sge(0, 5), region.Sge(2000, 0), region.Sge(4096, 30), region.Sge(8192, 100)}, 8),
      0);
  ASSERT_EQ(Send(48, 0x01020304u), IBV_WC_SUCCESS);
  ibv_wc wc{};
  ASSERT_TRUE(PollOne(q->rcq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.byte_len, 48u);
  EXPECT_TRUE(wc.wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(ntohl(wc.imm_data), 0x01020304u);
  EXPECT_TRUE(Holds(0, 5, 0));
  EXPECT_TRUE(Holds(4096, 30, 5));
  EXPECT_TRUE(Holds(8192, 13, 35));
  EXPECT_EQ(region.p[5], 0);
  EXPECT_EQ(region.p[2000], 0);
  EXPECT_EQ(region.p[8192 + 13], 0) << "the third piece was written beyond the message";
}

// Descriptors of the memfds named `name` this process holds: its own, and those its same-host peers
// passed it (PeerWindows keeps them open). Which number is whose says nothing: numbers are reused.
std::vector<int> Memfds(const char* name) {
  const std::string want = std::string("/memfd:") + name + " (deleted)";
  std::vector<int> fds;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return fds;
  while (dirent* e = readdir(d)) {
    char link[256];
    const std::string path = std::string("/proc/self/fd/") + e->d_name;
    const ssize_t n = readlink(path.c_str(), link, sizeof link - 1);
    if (n > 0 && std::string(link, static_cast<size_t>(n)) == want)
      fds.push_back(std::atoi(e->d_name));
  }
  closedir(d);
  return fds;
}

// This process's own table, mapped as a peer maps it: the one whose receive queue `qpn` publishes
// WQE `t` over `sge` (a peer's table may hold a queue of the same number).
std::unique_ptr<softrdma::link::PeerWindows> MapOwnTable(uint32_t qpn, const ibv_sge& sge) {
  namespace dr = softrdma::link::direct_recv;
  const std::vector<int> arenas = Memfds("softrdma-mem");
  if (arenas.empty()) return nullptr;
  for (int table : Memfds("softrdma-windows")) {
    std::unique_ptr<softrdma::link::PeerWindows> mapped(
        softrdma::link::PeerWindows::Map(dup(table), dup(arenas[0])));
    uint64_t taken = 0;
    softrdma::link::DirectRecvQueue* block = mapped ? mapped->OpenRecvQueue(qpn, &taken) : nullptr;
    if (!block) continue;
    const uint32_t t = dr::TakenCount(taken);
    const softrdma::link::DirectRecvSlot& s = block->slots[t % softrdma::link::kDirectRecvSlots];
    if (dr::Is(s.state.load(), dr::kPosted, t) && s.sge[0].key == sge.lkey &&
        s.sge[0].addr == sge.addr)
      return mapped;
  }
  return nullptr;
}

// An inline SEND is gathered from its pieces (an empty one without an address among them), into
// the slot or into the buffer.
TEST_F(DirectSend, AnInlineSendGathersItsPieces) {
  Connect();
  ASSERT_EQ(PostRecvSges(q->qp, {region.Sge(0, 64)}, 1), 0);
  ASSERT_EQ(PostRecvSges(q->qp, {region.Sge(4096, 64)}, 2), 0);
  ASSERT_EQ(Send(20, 0, false, true), IBV_WC_SUCCESS);
  ASSERT_EQ(Send(60, 0, false, true), IBV_WC_SUCCESS);
  auto wcs = PollN(q->rcq, 2);
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wcs[0].byte_len, 20u);
  EXPECT_EQ(wcs[1].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wcs[1].byte_len, 60u);
  EXPECT_TRUE(Holds(0, 20));
  EXPECT_TRUE(Holds(4096, 60));
  EXPECT_EQ(region.p[20], 0);
  EXPECT_EQ(region.p[4096 + 60], 0);
}

// A peer that says its message is in the slot and claims more bytes than the slot holds gets no
// more than the slot's 48 written, and nothing outside the WQE's buffer. The test is that peer:
// it maps this process's own table as a peer does and takes the published WQE itself.
TEST_F(DirectSend, AMessageInTheSlotClaimingMoreBytesThanItHoldsWritesNoMore) {
  namespace dr = softrdma::link::direct_recv;
  Connect();
  if (ShmLinkOff()) GTEST_SKIP() << kShmLinkOff;  // it maps the shared-memory link's table
  // A first message, from the child: the link is up and the queue open.
  ASSERT_EQ(PostRecvSges(q->qp, {region.Sge(4096, 256)}, 4), 0);
  ASSERT_EQ(Send(8), IBV_WC_SUCCESS);
  ibv_wc wc{};
  ASSERT_TRUE(PollOne(q->rcq, &wc));
  ASSERT_EQ(wc.wr_id, 4u);
  std::memset(region.p + 4096, 0, 8);
  ASSERT_EQ(PostRecvSges(q->qp, {region.Sge(0, 256)}, 5), 0);
  // The library's table (its own, not this binary's copy of the code).
  std::unique_ptr<softrdma::link::PeerWindows> peer = MapOwnTable(q->qpn(), region.Sge(0, 256));
  ASSERT_NE(peer, nullptr) << "the receive queue is not open to a same-host peer";
  uint64_t taken = 0;
  softrdma::link::DirectRecvQueue* block = peer->OpenRecvQueue(q->qpn(), &taken);
  ASSERT_NE(block, nullptr) << "the receive queue is not open to a same-host peer";
  const uint32_t t = dr::TakenCount(taken);
  softrdma::link::DirectRecvSlot& s = block->slots[t % softrdma::link::kDirectRecvSlots];
  ASSERT_TRUE(dr::Is(s.state.load(), dr::kPosted, t)) << "the WQE is not published";
  ASSERT_TRUE(block->taken.compare_exchange_strong(taken, dr::WithCount(taken, t + 1)));
  std::memset(s.sge, 0xab, sizeof s.sge);
  s.byte_len = 4000;
  s.state.store(dr::State(dr::kDone, t, dr::kInSlot));
  if (block->counted.load()) peer->NoteRecvDone();
  ASSERT_TRUE(PollOne(q->rcq, &wc));
  EXPECT_EQ(wc.wr_id, 5u);
  for (size_t i = 0; i < dr::kInSlotBytes; ++i) ASSERT_EQ(region.p[i], 0xab) << "byte " << i;
  for (size_t i = dr::kInSlotBytes; i < kRegion; ++i) ASSERT_EQ(region.p[i], 0) << "byte " << i;
}

// The receiving child: posts one 256-byte receive in a shared region, says 'r', and on 'c' waits
// for its completion and checks the bytes (Pattern); answers 'K' or what went wrong.
int Receiver(ChildPipe p, QpOpts o) {
  ChildQp c;
  if (int e = c.Connect(p, o, 64)) return e;
  Region r;
  if (!r.Make(c.v.pd)) return 20;
  if (PostRecvSges(c.q->qp, {r.Sge(0, 256)}, 77) || !p.Send('r')) return 21;
  char go;
  if (!p.Recv(&go)) return 22;
  ibv_wc wc{};
  char verdict = 'K';
  if (!PollOne(c.q->rcq, &wc, std::chrono::seconds(10)))
    verdict = 'n';
  else if (wc.status != IBV_WC_SUCCESS || wc.wr_id != 77 || wc.byte_len != 256)
    verdict = 'w';
  else
    for (size_t i = 0; i < 256; ++i)
      if (r.p[i] != Pattern(i)) verdict = 'd';
  return p.Send(verdict) ? 0 : 23;
}

// The direct way needs nothing of the receiving process: with it stopped, the sender's completion
// comes at once (a frame waits for the receiver's acknowledgement, and would fail once the
// retries ran out), and the receiver finds the message when it runs again.
// A QP connected to a receiving child that the test stops once its receives are published, and a
// region of Pattern bytes to send from.
class StoppedPeer : public ::testing::Test {
 protected:
  void Start(int (*receiver)(ChildPipe, QpOpts)) {
    if (ShmLinkOff()) GTEST_SKIP() << kShmLinkOff;
    ASSERT_TRUE(v.Open());
    QpOpts o;
    o.retry_cnt = 1;  // the long way would fail within a few hundred milliseconds
    q = v.NewQp(o);
    ASSERT_NE(q, nullptr);
    ASSERT_TRUE(region.Make(v.pd));
    for (size_t i = 0; i < kRegion; ++i) region.p[i] = Pattern(i);
    ASSERT_TRUE(child.Start([o, receiver](int up, int down) {
      return receiver(ChildPipe{up, down}, o);
    }));
    Remote theirs;
    ASSERT_TRUE(child.Recv(&theirs));
    ASSERT_TRUE(child.Send(v.RemoteOf(q)));
    ASSERT_EQ(BringUp(q->qp, o, theirs), 0);
    char ready;
    ASSERT_TRUE(child.Recv(&ready));
  }
  // Its receives published, the peer opens no more doors than it had: stop it.
  void Stop() { ASSERT_EQ(kill(child.pid(), SIGSTOP), 0); }
  void Resume() { ASSERT_EQ(kill(child.pid(), SIGCONT), 0); }
  // Lets the child check what it received; its verdict, 'K' when all is well.
  char Verdict() {
    char verdict = 0;
    EXPECT_TRUE(child.Send('c') && child.Recv(&verdict));
    EXPECT_EQ(child.Wait(), 0);
    return verdict;
  }

  Verbs v;
  Qp* q = nullptr;
  Region region;
  ForkedPeer child;
};

TEST_F(StoppedPeer, StillReceivesASendAndTheSenderCompletesAtOnce) {
  ASSERT_NO_FATAL_FAILURE(Start(Receiver));
  if (IsSkipped()) return;
  ASSERT_NO_FATAL_FAILURE(Stop());
  SendArgs s;
  s.sges = {region.Sge(0, 256)};
  ASSERT_EQ(Post(q->qp, s), 0);
  ibv_wc wc{};
  bool completed = PollOne(q->scq, &wc, std::chrono::seconds(2));
  ASSERT_NO_FATAL_FAILURE(Resume());
  ASSERT_TRUE(completed) << "no send completion while the receiver was stopped";
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
  EXPECT_EQ(Verdict(), 'K');
}

// The receiving child of SENDs into buffers its peer cannot reach directly (regions under 8 KiB
// stay private memory, and no window covers a partial page): a one-page region, received into by
// a WQE of two pieces (bytes [0, 100) and [1000, 4000)), and a region of 64 bytes inside a page
// of other data, received into whole. It checks the first two messages: 3,000 and 64 bytes of
// Pattern.
int SmallBufferReceiver(ChildPipe p, QpOpts o) {
  ChildQp c;
  if (int e = c.Connect(p, o, 64)) return e;
  auto* page = static_cast<uint8_t*>(aligned_alloc(4096, 4096));
  auto* bytes = static_cast<uint8_t*>(aligned_alloc(4096, 4096));
  ibv_mr* a = page ? ibv_reg_mr(c.v.pd, page, 4096, kLocalWrite) : nullptr;
  ibv_mr* b = bytes ? ibv_reg_mr(c.v.pd, bytes + 512, 64, kLocalWrite) : nullptr;
  if (!a || !b) return 20;
  std::memset(page, 0, 4096);
  const ibv_sge two[2] = {{reinterpret_cast<uintptr_t>(page), 100, a->lkey},
                          {reinterpret_cast<uintptr_t>(page) + 1000, 3000, a->lkey}};
  if (PostRecvSges(c.q->qp, {two[0], two[1]}, 80) ||
      PostRecvSges(c.q->qp, {{reinterpret_cast<uintptr_t>(bytes) + 512, 64, b->lkey}}, 81))
    return 21;
  // Enough more such WQEs that the QP makes its staging area (once 64 refills found one:
  // Qp::kStagingDemand); they receive nothing.
  for (uint64_t id = 100; id < 170; ++id)
    if (PostRecvSges(c.q->qp, {{reinterpret_cast<uintptr_t>(page) + 4000, 16, a->lkey}}, id))
      return 21;
  if (!p.Send('r')) return 21;
  char go;
  if (!p.Recv(&go)) return 22;
  char verdict = 'K';
  const uint32_t lens[2] = {3000, 64};
  for (int i = 0; i < 2 && verdict == 'K'; ++i) {
    ibv_wc wc{};
    if (!PollOne(c.q->rcq, &wc, std::chrono::seconds(10)))
      verdict = 'n';
    else if (wc.status != IBV_WC_SUCCESS || wc.wr_id != uint64_t(80 + i) ||
             wc.opcode != IBV_WC_RECV || wc.byte_len != lens[i])
      verdict = 'w';
  }
  for (size_t i = 0; i < 100 && verdict == 'K'; ++i)
    if (page[i] != Pattern(i)) verdict = 'd';
  for (size_t i = 100; i < 1000 && verdict == 'K'; ++i)
    if (page[i] != 0) verdict = 'o';  // between the pieces: untouched
  for (size_t i = 0; i < 2900 && verdict == 'K'; ++i)
    if (page[1000 + i] != Pattern(100 + i)) verdict = 'd';
  for (size_t i = 0; i < 64 && verdict == 'K'; ++i)
    if (bytes[512 + i] != Pattern(i)) verdict = 'd';
  ibv_dereg_mr(a);
  ibv_dereg_mr(b);
  free(page);
  free(bytes);
  return p.Send(verdict) ? 0 : 23;
}

// Receive buffers too small to share go the direct way too, staged (core/recv_staging.h): with
// the receiver stopped, both SENDs complete at once. Before, they went as frames, each waiting
// for the receiver's acknowledgement (ibv_rc_pingpong's 4 KiB buffer: 6.4-6.9 us per round trip
// against 2.5 staged, 3.1-3.3 against 1.05-1.12 in the other placement of the vCPUs).
TEST_F(StoppedPeer, ReceivesIntoBuffersTooSmallToShareAndTheSenderCompletesAtOnce) {
  ASSERT_NO_FATAL_FAILURE(Start(SmallBufferReceiver));
  if (IsSkipped()) return;
  ASSERT_NO_FATAL_FAILURE(Stop());
  bool completed = true;
  ibv_wc wc[2] = {};
  for (int i = 0; i < 2 && completed; ++i) {
    SendArgs s;
    s.sges = {region.Sge(0, i == 0 ? 3000 : 64)};
    completed = Post(q->qp, s) == 0 && PollOne(q->scq, &wc[i], std::chrono::seconds(2));
  }
  ASSERT_NO_FATAL_FAILURE(Resume());
  ASSERT_TRUE(completed) << "no send completion while the receiver was stopped";
  for (const ibv_wc& w : wc) EXPECT_EQ(w.status, IBV_WC_SUCCESS) << WcStr(w);
  EXPECT_EQ(Verdict(), 'K') << "n: no completion, w: wrong fields, d: wrong data, o: overrun";
}

// Where a direct RDMA WRITE with immediate goes: the receiving child's region, and the receive WQE
// it consumes (posted with no buffer, as rsockets posts its receives).
struct WriteTarget {
  uint64_t addr;
  uint32_t rkey;
};
constexpr uint32_t kImmOffset = 4096;

// The receiving child of WRITEs with immediate: it posts two receives without buffers, tells the
// parent where to write, and when told to go checks the two completions: 256 bytes of Pattern at
// kImmOffset with immediate 0x1234, then no bytes with immediate 0x5678.
int ImmReceiver(ChildPipe p, QpOpts o) {
  ChildQp c;
  if (int e = c.Connect(p, o, 64)) return e;
  Region r;
  if (!r.Make(c.v.pd)) return 20;
  if (PostRecvSges(c.q->qp, {}, 78) || PostRecvSges(c.q->qp, {}, 79)) return 21;
  WriteTarget t{reinterpret_cast<uintptr_t>(r.p), r.mr->rkey};
  if (!p.Send('r') || !p.Send(t)) return 22;
  char go;
  if (!p.Recv(&go)) return 23;
  char verdict = 'K';
  const uint32_t imms[2] = {0x1234, 0x5678};
  const uint32_t lens[2] = {256, 0};
  for (int i = 0; i < 2 && verdict == 'K'; ++i) {
    ibv_wc wc{};
    if (!PollOne(c.q->rcq, &wc, std::chrono::seconds(10)))
      verdict = 'n';
    else if (wc.status != IBV_WC_SUCCESS || wc.wr_id != uint64_t(78 + i) ||
             wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM || wc.byte_len != lens[i] ||
             !(wc.wc_flags & IBV_WC_WITH_IMM) || ntohl(wc.imm_data) != imms[i])
      verdict = 'w';
  }
  for (size_t i = 0; i < 256 && verdict == 'K'; ++i)
    if (r.p[kImmOffset + i] != Pattern(i)) verdict = 'd';
  return p.Send(verdict) ? 0 : 24;
}

// An RDMA WRITE with immediate consumes a receive WQE as a SEND does, and is done the same direct
// way (rsockets moves all its data and credits so): with the receiver stopped, both the 256-byte
// and the empty one complete at once at the sender, and the receiver finds them when it runs.
TEST_F(StoppedPeer, GetsWritesWithImmediateAndTheSenderCompletesAtOnce) {
  ASSERT_NO_FATAL_FAILURE(Start(ImmReceiver));
  if (IsSkipped()) return;
  WriteTarget t{};
  ASSERT_TRUE(child.Recv(&t));
  ASSERT_NO_FATAL_FAILURE(Stop());
  SendArgs s;
  s.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  s.sges = {region.Sge(0, 256)};
  s.remote_addr = t.addr + kImmOffset;
  s.rkey = t.rkey;
  s.imm = 0x1234;
  ibv_wc wc[2] = {};
  bool completed = Post(q->qp, s) == 0 && PollOne(q->scq, &wc[0], std::chrono::seconds(2));
  s.sges.clear();
  s.imm = 0x5678;
  completed = completed && Post(q->qp, s) == 0 && PollOne(q->scq, &wc[1], std::chrono::seconds(2));
  ASSERT_NO_FATAL_FAILURE(Resume());
  ASSERT_TRUE(completed) << "no send completion while the receiver was stopped";
  for (const ibv_wc& w : wc) {
    EXPECT_EQ(w.status, IBV_WC_SUCCESS) << WcStr(w);
    EXPECT_EQ(w.opcode, IBV_WC_RDMA_WRITE);
  }
  EXPECT_EQ(Verdict(), 'K') << "n: no completion, w: wrong fields, d: wrong data";
}

// SENDs that take the long way (the second WQE's buffer is not shared, and too large to stage)
// and SENDs placed directly complete in the order of the receive queue, with their own data.
TEST_F(DirectSend, DirectAndFramedSendsCompleteInReceiveQueueOrder) {
  Connect();
  Buffer* small = Buf(5000);  // heap memory, not shared, over 4 KiB: its WQE is not published
  ASSERT_NE(small, nullptr);
  ASSERT_EQ(PostRecvSges(q->qp, {region.Sge(0, 512)}, 1), 0);
  ASSERT_EQ(PostRecv(q->qp, *small, 0, 5000, 2), 0);
  ASSERT_EQ(PostRecvSges(q->qp, {region.Sge(4096, 512)}, 3), 0);
  ASSERT_EQ(PostRecvSges(q->qp, {region.Sge(8192, 512)}, 4), 0);
  for (uint32_t len : {100u, 200u, 300u, 400u}) ASSERT_EQ(Send(len), IBV_WC_SUCCESS);
  auto wcs = PollN(q->rcq, 4);
  ASSERT_EQ(wcs.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(wcs[i].wr_id, i + 1) << "completion " << i;
    EXPECT_EQ(wcs[i].status, IBV_WC_SUCCESS) << "completion " << i;
    EXPECT_EQ(wcs[i].byte_len, 100u * (i + 1)) << "completion " << i;
  }
  EXPECT_TRUE(Holds(0, 100));
  for (size_t i = 0; i < 200; ++i) ASSERT_EQ(small->data()[i], Pattern(i));
  EXPECT_TRUE(Holds(4096, 300));
  EXPECT_TRUE(Holds(8192, 400));
}

// A buffer too small is the receiver's LOC_LEN_ERR and the sender's remote error, as on frames.
TEST_F(DirectSend, AMessageLargerThanTheBufferFailsBothSides) {
  Connect();
  ASSERT_EQ(PostRecvSges(q->qp, {region.Sge(0, 64)}, 9), 0);
  EXPECT_EQ(Send(65), IBV_WC_REM_INV_REQ_ERR);
  ibv_wc wc{};
  ASSERT_TRUE(PollOne(q->rcq, &wc));
  EXPECT_EQ(wc.wr_id, 9u);
  EXPECT_EQ(wc.status, IBV_WC_LOC_LEN_ERR);
}

// Without a receive WQE the SEND takes the long way and waits (RNR) until one is posted.
TEST_F(DirectSend, ASendWithoutAReceiveWaitsForOne) {
  Connect();
  Order ord{128, 0, 0};
  ASSERT_TRUE(child.Send('s') && child.Send(ord));
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  ASSERT_EQ(PostRecvSges(q->qp, {region.Sge(0, 256)}, 3), 0);
  int st = -1;
  ASSERT_TRUE(child.Recv(&st, std::chrono::seconds(15)));
  EXPECT_EQ(st, IBV_WC_SUCCESS);
  ibv_wc wc{};
  ASSERT_TRUE(PollOne(q->rcq, &wc));
  EXPECT_EQ(wc.wr_id, 3u);
  EXPECT_TRUE(Holds(0, 128));
}

// A process blocked on its completion channel is woken by a SEND placed directly.
TEST_F(DirectSend, AReceiverBlockedOnItsChannelIsWoken) {
  ibv_comp_channel* ch = nullptr;
  QpOpts o;
  ASSERT_NO_FATAL_FAILURE(EventCqOpts(64, &o, &ch));
  Connect(o);
  for (int round = 0; round < 20; ++round) {
    ASSERT_EQ(PostRecvSges(q->qp, {region.Sge(0, 64)}, round), 0);
    ASSERT_EQ(ibv_req_notify_cq(q->rcq, 0), 0);
    ibv_wc wc{};
    ASSERT_EQ(ibv_poll_cq(q->rcq, 1, &wc), 0);
    Order ord{64, 0, 0};
    ASSERT_TRUE(child.Send('s') && child.Send(ord));
    ASSERT_TRUE(Readable(ch->fd, std::chrono::seconds(5))) << "round " << round << ": not woken";
    ibv_cq* ev_cq = nullptr;
    void* ev_ctx = nullptr;
    ASSERT_EQ(ibv_get_cq_event(ch, &ev_cq, &ev_ctx), 0);
    ibv_ack_cq_events(ev_cq, 1);
    ASSERT_TRUE(PollOne(q->rcq, &wc));
    EXPECT_EQ(wc.wr_id, static_cast<uint64_t>(round));
    int st = -1;
    ASSERT_TRUE(child.Recv(&st));
    EXPECT_EQ(st, IBV_WC_SUCCESS);
  }
}

// A message placed before the receiver's QP enters the error state completes successfully,
// ahead of the flushed WQEs behind it.
TEST_F(DirectSend, WhatArrivedBeforeAnErrorCompletesBeforeTheFlush) {
  Connect();
  for (uint64_t id = 1; id <= 3; ++id)
    ASSERT_EQ(PostRecvSges(q->qp, {region.Sge(id * 4096, 256)}, id), 0);
  ASSERT_EQ(Send(50), IBV_WC_SUCCESS);  // this process has not polled yet
  ASSERT_EQ(ToErr(q->qp), 0);
  auto wcs = PollN(q->rcq, 3);
  ASSERT_EQ(wcs.size(), 3u);
  EXPECT_EQ(wcs[0].wr_id, 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wcs[0].byte_len, 50u);
  EXPECT_TRUE(Holds(4096, 50));
  for (size_t i = 1; i < 3; ++i) {
    EXPECT_EQ(wcs[i].wr_id, i + 1);
    EXPECT_EQ(wcs[i].status, IBV_WC_WR_FLUSH_ERR);
  }
}

// A region deregistered while a receive WQE names it is not written, not even where the arena's
// pages went to a region registered after it: the SEND takes the long way and fails there.
TEST_F(DirectSend, AReceiveBufferDeregisteredAfterPostingIsNeverWritten) {
  Connect();
  ASSERT_EQ(PostRecvSges(q->qp, {region.Sge(0, 256)}, 1), 0);
  ExpectASendIntoTheDeregisteredRegionFails(1);
}

// A message small enough to travel in its receive slot is checked against the buffers as one
// placed in them: a deregistered one fails both sides (without, the sender's SEND succeeded).
TEST_F(DirectSend, ASmallSendIntoADeregisteredReceiveBufferFailsBothSides) {
  Connect();
  ASSERT_EQ(PostRecvSges(q->qp, {region.Sge(0, 256)}, 1), 0);
  ExpectASendIntoTheDeregisteredRegionFails(1, 16);
}

// The sender remembers the window its last SEND reached (recv_window_memo_): a region
// deregistered after one message went into it is not reached through that memory by the next.
TEST_F(DirectSend, ABufferDeregisteredAfterAMessageWentIntoItIsNeverWrittenByTheNext) {
  Connect();
  ASSERT_EQ(PostRecvSges(q->qp, {region.Sge(0, 256)}, 1), 0);
  ASSERT_EQ(Send(256), IBV_WC_SUCCESS);
  ibv_wc wc{};
  ASSERT_TRUE(PollOne(q->rcq, &wc));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
  ASSERT_TRUE(Holds(0, 256));
  ASSERT_EQ(PostRecvSges(q->qp, {region.Sge(0, 256)}, 2), 0);
  ExpectASendIntoTheDeregisteredRegionFails(2);
}

// The same with a buffer too small to share, whose WQE was published staged: it is taken back
// at the deregistration, and both sides fail as on frames (without, the sender's SEND succeeded).
TEST_F(DirectSend, AStagedReceiveBufferDeregisteredAfterPostingIsNeverWritten) {
  Connect();
  std::vector<uint8_t> bytes(512, 0xee);
  ibv_mr* mr = ibv_reg_mr(v.pd, bytes.data(), bytes.size(), kLocalWrite);
  ASSERT_NE(mr, nullptr);
  // Enough WQEs that the QP makes its staging area (Qp::kStagingDemand) and publishes the first.
  for (uint64_t id = 5; id < 75; ++id)
    ASSERT_EQ(PostRecvSges(q->qp, {{reinterpret_cast<uintptr_t>(bytes.data()), 512, mr->lkey}}, id),
              0);
  ASSERT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(Send(100), IBV_WC_REM_OP_ERR);
  ibv_wc wc{};
  ASSERT_TRUE(PollOne(q->rcq, &wc, std::chrono::seconds(5)));
  EXPECT_EQ(wc.wr_id, 5u);
  EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << WcStr(wc);
  for (uint8_t b : bytes) ASSERT_EQ(b, 0xee);
}

// Small messages into a buffer too small to share (its WQEs published staged) travel in the slot
// and are copied into the buffer, not into the staging area: exactly their bytes, in order. The
// buffer is written before the WQEs are posted only: the sender's causality runs through another
// process, which ThreadSanitizer cannot see.
TEST_F(DirectSend, SmallSendsIntoAStagedReceiveBufferArriveWhole) {
  Connect();
  constexpr size_t kPiece = 40, kMessages = 12;
  std::vector<uint8_t> bytes(1024, 0xee);
  ibv_mr* mr = ibv_reg_mr(v.pd, bytes.data(), bytes.size(), kLocalWrite);
  ASSERT_NE(mr, nullptr);
  const uint64_t base = reinterpret_cast<uintptr_t>(bytes.data());
  auto length = [](size_t k) { return static_cast<uint32_t>(1 + k * 3); };  // 1 .. 34 bytes
  // Enough WQEs that the QP makes its staging area (Qp::kStagingDemand) and publishes them; the
  // first kMessages each name a piece of their own.
  for (uint64_t id = 5; id < 75; ++id) {
    const size_t k = id - 5;
    const uint64_t at = base + (k < kMessages ? k : kMessages) * kPiece;
    ASSERT_EQ(PostRecvSges(q->qp, {{at, kPiece, mr->lkey}}, id), 0);
  }
  for (size_t k = 0; k < kMessages; ++k) {
    ASSERT_EQ(Send(length(k)), IBV_WC_SUCCESS) << "message " << k;
    ibv_wc wc{};
    ASSERT_TRUE(PollOne(q->rcq, &wc));
    EXPECT_EQ(wc.wr_id, 5u + k);
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
    EXPECT_EQ(wc.byte_len, length(k));
  }
  for (size_t i = 0; i < bytes.size(); ++i) {
    const size_t k = i / kPiece, at = i % kPiece;
    const bool in = k < kMessages && at < length(k);
    ASSERT_EQ(bytes[i], in ? Pattern(at) : 0xee) << "byte " << i;
  }
  ASSERT_EQ(ibv_dereg_mr(mr), 0);
}

// Receive buffers the application made read-only after posting them (mprotect): an HCA writes them
// all the same (link/placement_guard.h). The owner's copy of a message out of its slot or out of a
// staging buffer goes past the protection: into a shared region's pages (a message in its slot),
// and into a buffer too small to share, whose WQEs are published staged (a message in its slot, one
// through the staging area). Before, the owner died of SIGSEGV at the first.
TEST_F(DirectSend, MessagesLandInReceiveBuffersMadeReadOnly) {
  Connect();
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* m = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  auto* small = static_cast<uint8_t*>(m);
  std::memset(small, 0xee, page);
  ibv_mr* mr = ibv_reg_mr(v.pd, small, page, kLocalWrite);
  ASSERT_NE(mr, nullptr);
  const uint64_t base = reinterpret_cast<uintptr_t>(small);
  ASSERT_EQ(PostRecvSges(q->qp, {region.Sge(0, 64)}, 1), 0);
  // Enough WQEs that the QP makes its staging area (Qp::kStagingDemand) and publishes them.
  ASSERT_EQ(PostRecvSges(q->qp, {{base, 64, mr->lkey}}, 2), 0);
  ASSERT_EQ(PostRecvSges(q->qp, {{base + 1024, 2048, mr->lkey}}, 3), 0);
  for (uint64_t id = 4; id < 75; ++id)
    ASSERT_EQ(PostRecvSges(q->qp, {{base + 3072, 64, mr->lkey}}, id), 0);
  ASSERT_EQ(mprotect(region.p, kRegion, PROT_READ), 0);
  ASSERT_EQ(mprotect(small, page, PROT_READ), 0);
  const uint32_t lengths[] = {20, 20, 1500};
  const uint8_t* into[] = {region.p, small, small + 1024};
  for (uint64_t k = 0; k < 3; ++k) {
    ASSERT_EQ(Send(lengths[k]), IBV_WC_SUCCESS) << "message " << k;
    ibv_wc wc{};
    ASSERT_TRUE(PollOne(q->rcq, &wc));
    EXPECT_EQ(wc.wr_id, k + 1);
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
    ASSERT_EQ(wc.byte_len, lengths[k]);
    for (size_t i = 0; i < lengths[k]; ++i)
      ASSERT_EQ(into[k][i], Pattern(i)) << "message " << k << ", byte " << i;
  }
  EXPECT_EQ(small[20], 0xee);
  ASSERT_EQ(mprotect(region.p, kRegion, PROT_READ | PROT_WRITE), 0);
  ASSERT_EQ(ibv_dereg_mr(mr), 0);
  munmap(small, page);
}

// Destroying the receiving QP while its peer keeps sending returns promptly (senders inside its
// receive queue are waited for, boundedly) and the peer's next SEND fails instead of hanging.
TEST_F(DirectSend, DestroyingTheReceiverWhileThePeerSendsIsPromptAndFailsThePeer) {
  Connect();
  for (uint64_t id = 0; id < 64; ++id) ASSERT_EQ(PostRecvSges(q->qp, {region.Sge(0, 64)}, id), 0);
  Stream m{1000000, 64};
  ASSERT_TRUE(child.Send('m') && child.Send(m));
  ibv_wc wc{};
  for (int i = 0; i < 500; ++i) {
    ASSERT_TRUE(PollOne(q->rcq, &wc)) << "completion " << i;
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
    ASSERT_EQ(PostRecvSges(q->qp, {region.Sge(0, 64)}, wc.wr_id), 0);
  }
  auto start = Clock::now();
  ASSERT_EQ(v.DestroyQp(q), 0);
  q = nullptr;
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(2));
  int st = IBV_WC_SUCCESS;
  ASSERT_TRUE(child.Recv(&st, std::chrono::seconds(20))) << "the peer's stream never ended";
  EXPECT_NE(st, IBV_WC_SUCCESS);
}

// A SEND that takes the long way while WQEs are published (zero bytes always does) takes the first
// of them back from the peer, and marks its slot so: a withdrawal later, which seals the queue and
// waits for the WQEs peers took, does not wait for it (it waited out its bound, 200 ms, before).
TEST_F(DirectSend, AWqeTheResponderTookBackHoldsUpNoWithdrawal) {
  Connect();
  ASSERT_EQ(PostRecvSges(q->qp, {region.Sge(0, 256)}, 1), 0);
  ASSERT_EQ(PostRecvSges(q->qp, {region.Sge(4096, 256)}, 2), 0);
  ASSERT_EQ(Send(0), IBV_WC_SUCCESS);  // by frames, into WQE 1
  ASSERT_EQ(Send(8), IBV_WC_SUCCESS);  // placed directly into WQE 2
  auto wcs = PollN(q->rcq, 2);
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[0].wr_id, 1u);
  EXPECT_EQ(wcs[0].byte_len, 0u);
  EXPECT_EQ(wcs[1].wr_id, 2u);
  EXPECT_EQ(wcs[1].byte_len, 8u);
  Region other;
  ASSERT_TRUE(other.Make(v.pd));
  auto start = Clock::now();
  other.Free();  // ibv_dereg_mr: a withdrawal
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(150));
}

// A sender that takes every WQE the receiver published before the receiver looks again (it is
// busy elsewhere, not asleep) waits a moment for the refill, then sends a frame and holds what
// follows until that frame's ACK (Qp::hold_for_direct_): every message still arrives, whole and in
// queue order, and the stream ends successfully.
TEST_F(DirectSend, AStreamThatOutrunsThePublishedWqesArrivesWholeAndInOrder) {
  constexpr uint32_t kCount = 200, kLen = 128;
  QpOpts o;
  o.max_recv_wr = kCount;
  Connect(o);
  for (uint32_t i = 0; i < kCount; ++i)
    ASSERT_EQ(PostRecvSges(q->qp, {region.Sge(i * 256, kLen)}, i), 0);
  Stream m{kCount, kLen};
  ASSERT_TRUE(child.Send('m') && child.Send(m));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the sender runs out meanwhile
  std::vector<ibv_wc> wcs = PollN(q->rcq, kCount);
  ASSERT_EQ(wcs.size(), kCount);
  for (uint32_t i = 0; i < kCount; ++i) {
    ASSERT_EQ(wcs[i].wr_id, i) << "completion " << i;
    ASSERT_EQ(wcs[i].status, IBV_WC_SUCCESS) << "completion " << i;
    ASSERT_EQ(wcs[i].byte_len, kLen) << "completion " << i;
    ASSERT_TRUE(Holds(i * 256, kLen)) << "message " << i;
  }
  int st = -1;
  ASSERT_TRUE(child.Recv(&st, std::chrono::seconds(15)));
  EXPECT_EQ(st, IBV_WC_SUCCESS);
}

// A poll collects placed messages into the caller's array itself (Cq::PollDirectFeeds): never
// more than it asked for, the rest in order at the next polls, with their own lengths.
TEST_F(DirectSend, APollTakesNoMoreThanItAsksForAndTheRestFollowInOrder) {
  Connect();
  for (uint64_t id = 1; id <= 7; ++id)
    ASSERT_EQ(PostRecvSges(q->qp, {region.Sge(id * 4096, 256)}, id), 0);
  for (uint32_t i = 1; i <= 7; ++i) ASSERT_EQ(Send(10 * i), IBV_WC_SUCCESS);  // all placed
  std::vector<ibv_wc> got;
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while (got.size() < 7 && Clock::now() < deadline) {
    // Arrays of exactly the size asked for, on the heap: ASan sees a write beyond one.
    const int want = got.size() < 3 ? 1 : 2;
    auto wc = std::make_unique<ibv_wc[]>(want);
    int n = ibv_poll_cq(q->rcq, want, wc.get());
    ASSERT_GE(n, 0);
    ASSERT_LE(n, want);
    got.insert(got.end(), wc.get(), wc.get() + n);
  }
  ASSERT_EQ(got.size(), 7u);
  for (size_t i = 0; i < 7; ++i) {
    EXPECT_EQ(got[i].wr_id, i + 1) << "completion " << i;
    EXPECT_EQ(got[i].status, IBV_WC_SUCCESS) << "completion " << i;
    EXPECT_EQ(got[i].byte_len, 10 * (i + 1)) << "completion " << i;
  }
  ibv_wc extra{};
  EXPECT_EQ(ibv_poll_cq(q->rcq, 1, &extra), 0);
}

// A QP destroyed while another thread polls its CQ and its peer keeps placing messages: the
// poller's collection never touches the QP once it is gone (ASan, TSan), and the CQ stays usable.
TEST_F(DirectSend, DestroyingAQpWhileAnotherThreadPollsItsCqIsSafe) {
  ibv_cq* cq = v.NewCq(4096);
  ASSERT_NE(cq, nullptr);
  QpOpts o;
  o.recv_cq = cq;
  o.max_recv_wr = 1024;
  Connect(o);
  for (uint64_t id = 0; id < 1024; ++id) ASSERT_EQ(PostRecvSges(q->qp, {region.Sge(0, 64)}, id), 0);
  Stream m{1000000, 64};
  ASSERT_TRUE(child.Send('m') && child.Send(m));
  std::atomic<int> polled{0};
  std::atomic<bool> stop{false};
  std::thread poller([&] {
    ibv_wc wc[4];
    while (!stop.load()) {
      int n = ibv_poll_cq(cq, 4, wc);
      if (n > 0) polled.fetch_add(n);
    }
  });
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while (polled.load() < 300 && Clock::now() < deadline) std::this_thread::yield();
  EXPECT_GE(polled.load(), 300) << "the poller collected too little before the destroy";
  EXPECT_EQ(v.DestroyQp(q), 0);  // with the poller still going
  q = nullptr;
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  stop.store(true);
  poller.join();
  int st = IBV_WC_SUCCESS;
  ASSERT_TRUE(child.Recv(&st, std::chrono::seconds(20))) << "the peer's stream never ended";
  EXPECT_NE(st, IBV_WC_SUCCESS);
}

// One receive CQ for more QPs than a CQ (Cq::kDirectFeeds) and the HCA (kWatchedRecvQueues)
// watch: every message completes, whichever way it is collected.
TEST(DirectSendTo, ACqOfMoreQpsThanItWatchesGetsEveryMessage) {
  if (ShmLinkOff()) GTEST_SKIP() << kShmLinkOff;
  constexpr int kQps = 6, kRounds = 20;
  Verbs v;
  ASSERT_TRUE(v.Open());
  QpOpts o;
  o.recv_cq = v.NewCq(1024);
  ASSERT_NE(o.recv_cq, nullptr);
  Region region;
  ASSERT_TRUE(region.Make(v.pd));
  std::vector<Qp*> qps;
  ForkedPeer children[kQps];
  for (int i = 0; i < kQps; ++i) {
    Qp* q = v.NewQp(o);
    ASSERT_NE(q, nullptr);
    qps.push_back(q);
    ASSERT_TRUE(children[i].Start([o](int up, int down) {
      return Sender(ChildPipe{up, down}, o);
    }));
    Remote theirs;
    ASSERT_TRUE(children[i].Recv(&theirs));
    ASSERT_TRUE(children[i].Send(v.RemoteOf(q)));
    ASSERT_EQ(BringUp(q->qp, o, theirs), 0);
    for (int r = 0; r < kRounds; ++r)
      ASSERT_EQ(PostRecvSges(q->qp, {region.Sge(4096 * i, 512)}, 1000 * i + r), 0);
  }
  Stream m{kRounds, 100};
  for (auto& c : children) ASSERT_TRUE(c.Send('m') && c.Send(m));
  auto wcs = PollN(o.recv_cq, kQps * kRounds, std::chrono::seconds(20));
  ASSERT_EQ(wcs.size(), size_t{kQps * kRounds});
  int next[kQps] = {};
  for (const ibv_wc& wc : wcs) {
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
    const int i = static_cast<int>(wc.wr_id / 1000);
    ASSERT_TRUE(i >= 0 && i < kQps);
    EXPECT_EQ(wc.qp_num, qps[i]->qpn());
    EXPECT_EQ(static_cast<int>(wc.wr_id % 1000), next[i]++) << "QP " << i << " out of order";
    EXPECT_EQ(wc.byte_len, 100u);
  }
  for (auto& c : children) {
    int st = -1;
    ASSERT_TRUE(c.Recv(&st, std::chrono::seconds(10)));
    EXPECT_EQ(st, IBV_WC_SUCCESS);
    c.Send('x');
    EXPECT_EQ(c.Wait(), 0);
  }
  region.Free();
}

}  // namespace
