// Work requests posted to an empty send queue towards a same-host peer are done at once, without
// entering the queue (architecture §12, "Direct access"). Whatever the queue's path would have
// given must still hold: the completion's fields, unsignaled work completing silently, inline
// data gathered from several pieces, order with work that takes the queue, and the errors the
// queue's path reports. Each test runs against a forked peer on the shared-memory link.
#include <infiniband/verbs.h>

#include <arpa/inet.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <cstring>

#include "support/semantics_harness.h"

namespace {

using namespace semantics;

constexpr size_t kBytes = 64 << 10;

// Where the parent may reach the child's buffer.
struct Target {
  uint64_t addr;
  uint32_t rkey;
};

// What the child's receive queue saw (for a WRITE with immediate).
struct Received {
  int status;
  uint32_t opcode;
  uint32_t imm;
};

// The peer: a connected QP and a region the parent writes, reads and updates, of anonymous memory
// (what the link lets a peer reach directly): whole pages, or from `offset` into the first page
// (as a buffer from malloc may start). It posts one receive (for an immediate), then answers 'r'
// with its receive completion; 'w' re-registers the region without remote write and 'u' moves it
// to the buffer's upper half, each answered with ibv_rereg_mr's result; 'x' ends.
int Peer(ChildPipe p, QpOpts o, size_t offset = 0) {
  ChildQp c;
  if (int e = c.Connect(p, o, 64)) return e;
  void* m = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return 24;
  std::memset(m, 0, kBytes);
  ibv_mr* mr = ibv_reg_mr(c.v.pd, static_cast<uint8_t*>(m) + offset, kBytes - offset, kAllAccess);
  if (!mr) return 25;
  if (PostRecv(c.q->qp, *c.b, 0, 0, 7)) return 20;
  if (!p.Send(Target{reinterpret_cast<uintptr_t>(m) + offset, mr->rkey})) return 21;
  for (;;) {
    char kind;
    if (!p.Recv(&kind)) return 22;
    if (kind == 'x') return ibv_dereg_mr(mr) ? 26 : 0;
    if (kind == 'w' || kind == 'u') {
      int r = kind == 'w' ? ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0,
                                         kAllAccess & ~IBV_ACCESS_REMOTE_WRITE)
                          : ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr,
                                         static_cast<uint8_t*>(m) + kBytes / 2, kBytes / 2, 0);
      if (!p.Send(r)) return 27;
      continue;
    }
    ibv_wc wc{};
    Received r{-1, 0, 0};
    if (PollOne(c.q->rcq, &wc, std::chrono::seconds(10)))
      r = Received{wc.status, wc.opcode, ntohl(wc.imm_data)};
    if (!p.Send(r)) return 23;
  }
}

class DirectPost : public VerbsTest {
 protected:
  void SetUp() override {
    VerbsTest::SetUp();
    QpOpts o;
    ASSERT_NO_FATAL_FAILURE(ChooseOpts(&o));
    q = v.NewQp(o);
    ASSERT_NE(q, nullptr);
    local = Buf(kBytes);
    ASSERT_NE(local, nullptr);
    const size_t offset = target_offset;
    ASSERT_TRUE(child.Start([offset](int up, int down) {
      return Peer(ChildPipe{up, down}, {}, offset);
    }));
    Remote theirs;
    ASSERT_TRUE(child.Recv(&theirs));
    ASSERT_TRUE(child.Send(v.RemoteOf(q)));
    ASSERT_EQ(BringUp(q->qp, QpOpts{}, theirs), 0);
    ASSERT_TRUE(child.Recv(&target));
  }
  void TearDown() override {
    child.Send('x');
    EXPECT_EQ(child.Wait(), 0) << "the peer failed";
    VerbsTest::TearDown();
  }
  // Reads `len` bytes of the peer's buffer at `off` into local[at].
  void ReadBack(size_t off, uint32_t len, size_t at) {
    ASSERT_EQ(
        PostRdma(q->qp, IBV_WR_RDMA_READ, *local, at, len, target.addr + off, target.rkey, 99), 0);
    ibv_wc wc{};
    ASSERT_TRUE(PollOne(q->scq, &wc));
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
  }

  // WRITEs `len` bytes of `from` at `at` to the peer's buffer at `off`, and sees it succeed.
  void WriteFrom(Buffer& from, size_t at, uint32_t len, size_t off, uint64_t wr_id) {
    ASSERT_EQ(
        PostRdma(q->qp, IBV_WR_RDMA_WRITE, from, at, len, target.addr + off, target.rkey, wr_id),
        0);
    ibv_wc wc{};
    ASSERT_TRUE(PollOne(q->scq, &wc));
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
  }

  // Stops the peer (a direct operation needs nothing of it; a frame waits for its answer).
  void StopPeer() {
    ASSERT_EQ(kill(child.pid(), SIGSTOP), 0);
    int st = 0;
    ASSERT_EQ(waitpid(child.pid(), &st, WUNTRACED), child.pid());
    ASSERT_TRUE(WIFSTOPPED(st));
  }

  // The options of the parent's QP (default: QpOpts{}, with fresh CQs).
  virtual void ChooseOpts(QpOpts*) {}

  size_t target_offset = 0;  // where the peer's region starts in its first page
  Qp* q = nullptr;
  Buffer* local = nullptr;
  ForkedPeer child;
  Target target{};
};

// A region that starts inside a page (a buffer from malloc): its whole pages are reached directly,
// so a WRITE there completes while the peer is stopped; one that touches the shared first page
// goes by frames and completes only once the peer runs again.
class DirectPostUnaligned : public DirectPost {
 protected:
  void SetUp() override {
    target_offset = 100;
    DirectPost::SetUp();
  }
};

TEST_F(DirectPostUnaligned, TheWholePagesOfARegionAreReachedDirectly) {
  if (ShmLinkOff()) GTEST_SKIP() << kShmLinkOff;
  const uint64_t interior = (target.addr + 4095) / 4096 * 4096 + 64;
  ASSERT_NO_FATAL_FAILURE(StopPeer());
  ASSERT_EQ(PostRdma(q->qp, IBV_WR_RDMA_WRITE, *local, 0, 64, interior, target.rkey, 61), 0);
  ibv_wc wc{};
  bool done = PollOne(q->scq, &wc, std::chrono::milliseconds(2000));
  ASSERT_EQ(PostRdma(q->qp, IBV_WR_RDMA_WRITE, *local, 0, 8, target.addr, target.rkey, 62), 0);
  ibv_wc edge{};
  bool edge_done = PollOne(q->scq, &edge, std::chrono::milliseconds(200));
  ASSERT_EQ(kill(child.pid(), SIGCONT), 0);
  EXPECT_TRUE(done) << "a WRITE into the region's whole pages waited for the stopped peer";
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_FALSE(edge_done) << "a WRITE into the region's first page completed without the peer";
  if (!edge_done) {
    ASSERT_TRUE(PollOne(q->scq, &edge));
  }
  EXPECT_EQ(edge.wr_id, 62u);
  EXPECT_EQ(edge.status, IBV_WC_SUCCESS) << WcStr(edge);
}

// A QP made with sq_sig_all: every work request completes, signaled or not, whichever path does it
// (the WQE-less ones decide that themselves: Qp::PushDirectCompletionLocked).
class DirectPostSignalAll : public DirectPost {
 protected:
  void ChooseOpts(QpOpts* o) override { o->sq_sig_all = true; }
};

TEST_F(DirectPostSignalAll, UnsignaledWritesReadsAndAtomicsComplete) {
  ASSERT_EQ(PostRdma(q->qp, IBV_WR_RDMA_WRITE, *local, 0, 64, target.addr, target.rkey, 91, 0), 0);
  ASSERT_EQ(PostRdma(q->qp, IBV_WR_RDMA_READ, *local, 4096, 64, target.addr, target.rkey, 92, 0),
            0);
  ASSERT_EQ(PostAtomic(q->qp, IBV_WR_ATOMIC_FETCH_AND_ADD, *local, 8192, target.addr + 1024,
                       target.rkey, 1, 0, 93, 0),
            0);
  auto wcs = PollN(q->scq, 3);
  ASSERT_EQ(wcs.size(), 3u) << "unsignaled work on a sq_sig_all QP did not complete";
  const ibv_wc_opcode opcodes[3] = {IBV_WC_RDMA_WRITE, IBV_WC_RDMA_READ, IBV_WC_FETCH_ADD};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(wcs[i].status, IBV_WC_SUCCESS) << WcStr(wcs[i]);
    EXPECT_EQ(wcs[i].wr_id, uint64_t(91 + i));
    EXPECT_EQ(wcs[i].opcode, opcodes[i]);
  }
}

// One extended CQ for the QP's sends and receives, with a completion channel, as ibv_rc_pingpong
// -t -e has.
class DirectPostCqEx : public DirectPost {
 protected:
  void ChooseOpts(QpOpts* o) override {
    channel = v.NewChannel();
    ASSERT_NE(channel, nullptr) << strerror(errno);
    cq = v.NewCqEx(IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP, 512, channel);
    ASSERT_NE(cq, nullptr) << strerror(errno);
    o->send_cq = o->recv_cq = ibv_cq_ex_to_cq(cq);
  }
  void TearDown() override {
    if (events) ibv_ack_cq_events(ibv_cq_ex_to_cq(cq), events);
    DirectPost::TearDown();
  }
  // A direct WRITE of 8 bytes at `off` of the peer's buffer; it completes inside the post.
  int Write(size_t off, uint64_t wr_id) {
    return PostRdma(q->qp, IBV_WR_RDMA_WRITE, *local, off, 8, target.addr + off, target.rkey,
                    wr_id);
  }
  // Starts a poll batch, retrying while the CQ is empty, until the deadline.
  int StartPoll() {
    ibv_poll_cq_attr attr{};
    int r = ENOENT;
    for (auto deadline = Clock::now() + kWait; r == ENOENT && Clock::now() < deadline;)
      r = ibv_start_poll(cq, &attr);
    return r;
  }
  // The channel's next event, within the deadline; true when it is this CQ's.
  bool NextEvent() {
    pollfd pfd{channel->fd, POLLIN, 0};
    if (poll(&pfd, 1, static_cast<int>(kWait.count())) != 1) return false;
    ibv_cq* ev_cq = nullptr;
    void* ev_ctx = nullptr;
    if (ibv_get_cq_event(channel, &ev_cq, &ev_ctx) != 0) return false;
    ++events;
    return ev_cq == ibv_cq_ex_to_cq(cq);
  }
  ibv_comp_channel* channel = nullptr;
  ibv_cq_ex* cq = nullptr;
  unsigned events = 0;
};

// ibv_rc_pingpong -t answers a receive from inside its poll batch (start_poll .. end_poll), and a
// direct operation completes inside the post: both processes hung while the batch held the CQ's
// lock, which that completion takes. A hang ends the test through the alarm.
void OnPostInsideBatchHung(int) {
  static const char kMsg[] = "ibv_post_send inside an ibv_start_poll batch did not return\n";
  ssize_t w = write(2, kMsg, sizeof kMsg - 1);
  (void)w;
  _exit(1);
}

TEST_F(DirectPostCqEx, WorkPostedInsideAPollBatchCompletesOnThePolledCq) {
  if (ShmLinkOff()) GTEST_SKIP() << kShmLinkOff;
  ASSERT_EQ(Write(0, 1), 0);
  ASSERT_EQ(StartPoll(), 0) << "the first WRITE's completion";
  EXPECT_EQ(cq->wr_id, 1u);
  signal(SIGALRM, OnPostInsideBatchHung);
  alarm(20);
  const int posted = Write(8, 2);
  const int next = ibv_next_poll(cq);
  const uint64_t next_id = cq->wr_id;
  ibv_end_poll(cq);
  alarm(0);
  signal(SIGALRM, SIG_DFL);
  ASSERT_EQ(posted, 0);
  ASSERT_EQ(next, 0) << "the second WRITE's completion, queued inside the batch";
  EXPECT_EQ(next_id, 2u);
  EXPECT_EQ(cq->status, IBV_WC_SUCCESS);
}

// ibv_rc_pingpong -t -e takes one event, re-arms, starts a batch, looks once more (ibv_next_poll)
// and ends; at its next event it fails ("poll CQ failed 2") if that batch finds nothing. So a
// completion that raised an event is never taken by an earlier event's batch: the batch ends
// before it, and the event's own batch starts with it.
TEST_F(DirectPostCqEx, ACompletionThatRaisedAnEventStartsItsOwnBatch) {
  if (ShmLinkOff()) GTEST_SKIP() << kShmLinkOff;
  ibv_cq* base = ibv_cq_ex_to_cq(cq);
  ASSERT_EQ(ibv_req_notify_cq(base, 0), 0);
  ASSERT_EQ(Write(0, 1), 0);
  ASSERT_TRUE(NextEvent()) << "the first WRITE's event";
  ASSERT_EQ(ibv_req_notify_cq(base, 0), 0);
  ASSERT_EQ(Write(8, 2), 0);  // lands between the re-arm and the batch: it raises an event
  ASSERT_EQ(StartPoll(), 0);
  EXPECT_EQ(cq->wr_id, 1u);
  EXPECT_EQ(ibv_next_poll(cq), ENOENT) << "the batch took the completion of the next event";
  ibv_end_poll(cq);
  ASSERT_TRUE(NextEvent()) << "the second WRITE's event";
  ASSERT_EQ(ibv_req_notify_cq(base, 0), 0);
  ibv_poll_cq_attr attr{};
  ASSERT_EQ(ibv_start_poll(cq, &attr), 0) << "the event's batch found nothing";
  EXPECT_EQ(cq->wr_id, 2u);
  // Work posted inside the batch while the CQ is armed raises an event too, and waits for it.
  ASSERT_EQ(Write(16, 3), 0);
  EXPECT_EQ(ibv_next_poll(cq), ENOENT);
  ibv_end_poll(cq);
  ASSERT_TRUE(NextEvent()) << "the third WRITE's event";
  ASSERT_EQ(ibv_start_poll(cq, &attr), 0);
  EXPECT_EQ(cq->wr_id, 3u);
  ibv_end_poll(cq);
  // Completions queued without an event are taken as they come.
  ASSERT_EQ(Write(24, 4), 0);
  ASSERT_EQ(Write(32, 5), 0);
  ASSERT_EQ(StartPoll(), 0);
  EXPECT_EQ(cq->wr_id, 4u);
  ASSERT_EQ(ibv_next_poll(cq), 0);
  EXPECT_EQ(cq->wr_id, 5u);
  ibv_end_poll(cq);
}

TEST_F(DirectPost, EachOperationCompletesWithTheFieldsOfItsWorkRequest) {
  // The next send completion is a success of `wr_id` with `opcode` and `len` on this QP.
  auto expect_completion = [&](uint64_t wr_id, ibv_wc_opcode opcode, uint32_t len) {
    ibv_wc wc{};
    ASSERT_TRUE(PollOne(q->scq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
    EXPECT_EQ(wc.wr_id, wr_id);
    EXPECT_EQ(wc.opcode, opcode);
    EXPECT_EQ(wc.byte_len, len);
    EXPECT_EQ(wc.qp_num, q->qpn());
  };
  for (size_t i = 0; i < 100; ++i) local->data()[i] = static_cast<uint8_t>(i + 1);
  ASSERT_EQ(PostRdma(q->qp, IBV_WR_RDMA_WRITE, *local, 0, 100, target.addr + 256, target.rkey, 11),
            0);
  ASSERT_NO_FATAL_FAILURE(expect_completion(11, IBV_WC_RDMA_WRITE, 100));
  ASSERT_EQ(
      PostRdma(q->qp, IBV_WR_RDMA_READ, *local, 4096, 100, target.addr + 256, target.rkey, 12), 0);
  ASSERT_NO_FATAL_FAILURE(expect_completion(12, IBV_WC_RDMA_READ, 100));
  EXPECT_EQ(std::memcmp(local->data() + 4096, local->data(), 100), 0);

  const uint64_t slot = target.addr + 1024;
  ASSERT_EQ(
      PostAtomic(q->qp, IBV_WR_ATOMIC_FETCH_AND_ADD, *local, 8192, slot, target.rkey, 5, 0, 13), 0);
  ASSERT_NO_FATAL_FAILURE(expect_completion(13, IBV_WC_FETCH_ADD, 8));
  EXPECT_EQ(local->u64(8192 / 8), 0u);  // the original value
  ASSERT_EQ(
      PostAtomic(q->qp, IBV_WR_ATOMIC_CMP_AND_SWP, *local, 8200, slot, target.rkey, 5, 42, 14), 0);
  ASSERT_NO_FATAL_FAILURE(expect_completion(14, IBV_WC_COMP_SWAP, 8));
  EXPECT_EQ(local->u64(8200 / 8), 5u);
  ASSERT_NO_FATAL_FAILURE(ReadBack(1024, 8, 8208));
  EXPECT_EQ(local->u64(8208 / 8), 42u) << "the compare-and-swap did not take";
}

TEST_F(DirectPost, UnsignaledWorkCompletesSilentlyAndTakesEffect) {
  local->data()[0] = 0x5a;
  ASSERT_EQ(PostRdma(q->qp, IBV_WR_RDMA_WRITE, *local, 0, 1, target.addr + 77, target.rkey, 21, 0),
            0);
  EXPECT_TRUE(Drain(q->scq).empty()) << "an unsignaled WRITE completed";
  ASSERT_NO_FATAL_FAILURE(ReadBack(77, 1, 100));
  EXPECT_EQ(local->data()[100], 0x5a);
}

TEST_F(DirectPost, AnInlineWriteGathersItsPieces) {
  const char a[] = "abc", c[] = "defgh";
  SendArgs s;
  s.opcode = IBV_WR_RDMA_WRITE;
  s.wr_id = 31;
  s.flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  // Inline pieces need no key: the data is copied at post time.
  s.sges = {ibv_sge{reinterpret_cast<uintptr_t>(a), 3, 0}, ibv_sge{0, 0, 0},
            ibv_sge{reinterpret_cast<uintptr_t>(c), 5, 0}};
  s.remote_addr = target.addr + 300;
  s.rkey = target.rkey;
  ASSERT_EQ(Post(q->qp, s), 0);
  ibv_wc wc{};
  ASSERT_TRUE(PollOne(q->scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.byte_len, 8u);
  ASSERT_NO_FATAL_FAILURE(ReadBack(300, 8, 200));
  EXPECT_EQ(std::memcmp(local->data() + 200, "abcdefgh", 8), 0);
}

// A lone inline WRITE is placed from its piece's address at post time
// (Qp::TryPostDirectRdmaLocked): no key is checked, and what the buffer holds afterwards does not
// matter.
TEST_F(DirectPost, ALoneInlineWriteTakesItsBytesAtPostTimeWithoutAKey) {
  char bytes[] = "inline-1";
  SendArgs s;
  s.opcode = IBV_WR_RDMA_WRITE;
  s.wr_id = 35;
  s.flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  s.sges = {ibv_sge{reinterpret_cast<uintptr_t>(bytes), 8, 0xdeadbeef}};
  s.remote_addr = target.addr + 320;
  s.rkey = target.rkey;
  ASSERT_EQ(Post(q->qp, s), 0);
  std::memcpy(bytes, "changed!", 8);
  ibv_wc wc{};
  ASSERT_TRUE(PollOne(q->scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
  EXPECT_EQ(wc.opcode, IBV_WC_RDMA_WRITE);
  EXPECT_EQ(wc.byte_len, 8u);
  ASSERT_NO_FATAL_FAILURE(ReadBack(320, 8, 200));
  EXPECT_EQ(std::memcmp(local->data() + 200, "inline-1", 8), 0);
}

// ibv_post_send(3): inline data beyond the QP's max_inline_data is refused at post time, with
// nothing written and nothing completed, whichever path the WRITE would have taken.
TEST_F(DirectPost, AnInlineWriteBeyondTheInlineRoomIsRefused) {
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  ASSERT_EQ(ibv_query_qp(q->qp, &attr, IBV_QP_CAP, &init), 0);
  const uint32_t len = init.cap.max_inline_data + 1;
  std::vector<uint8_t> bytes(len, 0xa5);
  SendArgs s;
  s.opcode = IBV_WR_RDMA_WRITE;
  s.wr_id = 36;
  s.flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  s.sges = {ibv_sge{reinterpret_cast<uintptr_t>(bytes.data()), len, 0}};
  s.remote_addr = target.addr + 8192;
  s.rkey = target.rkey;
  EXPECT_EQ(Post(q->qp, s), EINVAL);
  EXPECT_TRUE(Drain(q->scq).empty()) << "a refused WRITE completed";
  ASSERT_NO_FATAL_FAILURE(ReadBack(8192, 1, 200));
  EXPECT_EQ(local->data()[200], 0) << "a refused WRITE wrote";
}

// A WRITE with immediate takes the queue; the WRITE chained after it must wait its turn.
TEST_F(DirectPost, WorkChainedBehindQueuedWorkCompletesInOrder) {
  std::vector<ibv_sge> sges(3);
  ibv_send_wr wrs[3] = {};
  const ibv_wr_opcode ops[3] = {IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_RDMA_WRITE};
  for (int i = 0; i < 3; ++i) {
    local->data()[i] = static_cast<uint8_t>(0x61 + i);
    sges[i] = local->Sge(i, 1);
    wrs[i].wr_id = 41 + i;
    wrs[i].opcode = ops[i];
    wrs[i].send_flags = IBV_SEND_SIGNALED;
    wrs[i].sg_list = &sges[i];
    wrs[i].num_sge = 1;
    wrs[i].imm_data = htonl(0x1234);
    wrs[i].wr.rdma.remote_addr = target.addr + 500 + i;
    wrs[i].wr.rdma.rkey = target.rkey;
    wrs[i].next = i < 2 ? &wrs[i + 1] : nullptr;
  }
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(q->qp, wrs, &bad), 0);
  auto wcs = PollN(q->scq, 3);
  ASSERT_EQ(wcs.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(wcs[i].status, IBV_WC_SUCCESS) << WcStr(wcs[i]);
    EXPECT_EQ(wcs[i].wr_id, uint64_t(41 + i)) << "completions out of order";
  }
  ASSERT_TRUE(child.Send('r'));
  Received r{};
  ASSERT_TRUE(child.Recv(&r, std::chrono::seconds(15)));
  EXPECT_EQ(r.status, IBV_WC_SUCCESS);
  EXPECT_EQ(r.opcode, uint32_t{IBV_WC_RECV_RDMA_WITH_IMM});
  EXPECT_EQ(r.imm, 0x1234u);
  ASSERT_NO_FATAL_FAILURE(ReadBack(500, 3, 600));
  EXPECT_EQ(std::memcmp(local->data() + 600, "abc", 3), 0);
}

// The direct path remembers the peer's window it used last (PeerWindows::Memo); ibv_rereg_mr(3)
// publishes the same key anew, with other rights or another place, and what was remembered must
// not outlive it.
class DirectPostReRegistered : public DirectPost {
 protected:
  // A WRITE at `off` into the peer's region, then `kind` ('w' or 'u') re-registers it; the same
  // WRITE again completes with the returned status.
  ibv_wc_status WriteAfterReRegistration(char kind, uint64_t off) {
    local->data()[0] = 0x77;
    EXPECT_EQ(PostRdma(q->qp, IBV_WR_RDMA_WRITE, *local, 0, 8, target.addr + off, target.rkey, 71),
              0);
    ibv_wc wc{};
    EXPECT_TRUE(PollOne(q->scq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
    EXPECT_TRUE(child.Send(kind));
    int r = -1;
    EXPECT_TRUE(child.Recv(&r, std::chrono::seconds(15)));
    EXPECT_EQ(r, 0) << "ibv_rereg_mr failed in the peer";
    EXPECT_EQ(PostRdma(q->qp, IBV_WR_RDMA_WRITE, *local, 0, 8, target.addr + off, target.rkey, 72),
              0);
    wc = ibv_wc{};
    EXPECT_TRUE(PollOne(q->scq, &wc));
    EXPECT_EQ(wc.wr_id, 72u);
    return wc.status;
  }
};

TEST_F(DirectPostReRegistered, ARegionThatLostRemoteWriteRefusesTheNextWrite) {
  EXPECT_EQ(WriteAfterReRegistration('w', 64), IBV_WC_REM_ACCESS_ERR);
}

TEST_F(DirectPostReRegistered, ARegionMovedElsewhereIsNoLongerReachedAtItsOldPlace) {
  EXPECT_EQ(WriteAfterReRegistration('u', 64), IBV_WC_REM_ACCESS_ERR);
}

// A lone atomic is done without a WQE (Qp::TryPostDirectAtomicLocked), its local piece answered
// by the QP's MR cache. The cache also holds regions a WRITE used, which need no local right: an
// atomic into one without IBV_ACCESS_LOCAL_WRITE must still fail.
TEST_F(DirectPost, AnAtomicIntoARegionWithoutLocalWriteFailsAfterAWriteFromIt) {
  Buffer* readonly = Buf(4096, 0);
  ASSERT_NE(readonly, nullptr);
  ASSERT_NO_FATAL_FAILURE(WriteFrom(*readonly, 0, 8, 0, 81));
  ASSERT_EQ(PostAtomic(q->qp, IBV_WR_ATOMIC_FETCH_AND_ADD, *readonly, 8, target.addr, target.rkey,
                       1, 0, 82),
            0);
  ibv_wc wc{};
  ASSERT_TRUE(PollOne(q->scq, &wc));
  EXPECT_EQ(wc.wr_id, 82u);
  EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << WcStr(wc);
}

// So is a lone READ of one piece (Qp::TryPostDirectRdmaLocked): into a region the cache holds from
// a WRITE, but without IBV_ACCESS_LOCAL_WRITE, it fails as the queue's path would fail it, and
// leaves the region as it was.
TEST_F(DirectPost, AReadIntoARegionWithoutLocalWriteFailsAfterAWriteFromIt) {
  Buffer* readonly = Buf(4096, 0);
  ASSERT_NE(readonly, nullptr);
  ASSERT_NO_FATAL_FAILURE(WriteFrom(*readonly, 0, 8, 0, 83));
  for (size_t i = 0; i < 8; ++i) local->data()[i] = 0x3c;
  ASSERT_NO_FATAL_FAILURE(WriteFrom(*local, 0, 8, 64, 84));
  ASSERT_EQ(PostRdma(q->qp, IBV_WR_RDMA_READ, *readonly, 16, 8, target.addr + 64, target.rkey, 85),
            0);
  ibv_wc wc{};
  ASSERT_TRUE(PollOne(q->scq, &wc));
  EXPECT_EQ(wc.wr_id, 85u);
  EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << WcStr(wc);
  EXPECT_EQ(readonly->data()[16], 0) << "the READ wrote into a region without local write";
}

TEST_F(DirectPost, ABadLocalKeyStillFailsAsTheQueueWouldReportIt) {
  SendArgs s;
  s.opcode = IBV_WR_RDMA_WRITE;
  s.wr_id = 51;
  s.sges = {ibv_sge{local->addr(), 8, local->lkey() ^ 0x5a5a}};
  s.remote_addr = target.addr;
  s.rkey = target.rkey;
  ASSERT_EQ(Post(q->qp, s), 0);
  ibv_wc wc{};
  ASSERT_TRUE(PollOne(q->scq, &wc));
  EXPECT_EQ(wc.wr_id, 51u);
  EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << WcStr(wc);
}

}  // namespace
