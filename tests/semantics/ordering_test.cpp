// Ordering and signaling: completions come in post order whatever the opcode mix, RDMA WRITE data
// is in place before the completion of a following SEND is seen by the receiver (in-process and
// over TCP), IBV_SEND_FENCE holds a WR until preceding READs/atomics are done, and only signaled
// WRs (or all, with sq_sig_all) produce completions, except errors, which always do.
#include "support/semantics_harness.h"

namespace semantics {
namespace {

class OrderingTest : public VerbsTest, public ::testing::WithParamInterface<ibv_qp_type> {};

TEST_P(OrderingTest, ManySendsCompleteInPostOrderOnBothSides) {
  constexpr int kN = 400;
  constexpr uint32_t kLen = 64;
  QpOpts o;
  o.type = GetParam();
  o.max_send_wr = o.max_recv_wr = kN;
  o.cq_depth = 2 * kN;
  Qp *a, *b;
  Pair(o, &a, &b);
  Buffer* src = Buf(kN * kLen);
  Buffer* dst = Buf(kN * kLen);
  for (int i = 0; i < kN; ++i) {
    for (uint32_t j = 0; j < kLen; ++j) src->data()[i * kLen + j] = static_cast<uint8_t>(i + j);
    ASSERT_EQ(PostRecv(b->qp, *dst, i * kLen, kLen, i), 0);
  }
  for (int i = 0; i < kN; ++i) ASSERT_EQ(PostSendMsg(a->qp, *src, i * kLen, kLen, i), 0);

  auto sent = PollN(a->scq, kN);
  ASSERT_EQ(sent.size(), size_t{kN});
  auto got = PollN(b->rcq, kN);
  ASSERT_EQ(got.size(), size_t{kN});
  for (int i = 0; i < kN; ++i) {
    ASSERT_EQ(sent[i].wr_id, uint64_t(i)) << "send completions out of order";
    ASSERT_EQ(sent[i].status, IBV_WC_SUCCESS);
    ASSERT_EQ(got[i].wr_id, uint64_t(i)) << "receive completions out of order";
    ASSERT_EQ(got[i].status, IBV_WC_SUCCESS);
    ASSERT_EQ(got[i].byte_len, kLen);
  }
  EXPECT_EQ(std::memcmp(src->data(), dst->data(), kN * kLen), 0)
      << "message i did not land in receive i";
}

TEST_P(OrderingTest, MixedWritesAndSendsCompleteInPostOrder) {
  constexpr int kN = 300;
  constexpr uint32_t kLen = 128;
  QpOpts o;
  o.type = GetParam();
  if (o.type == IBV_QPT_UD) GTEST_SKIP() << "UD has no RDMA WRITE";
  o.max_send_wr = o.max_recv_wr = kN;
  o.cq_depth = 2 * kN;
  Qp *a, *b;
  Pair(o, &a, &b);
  Buffer* src = Buf(kN * kLen);
  Buffer* dst = Buf(kN * kLen);
  Buffer* msgs = Buf(kN * kLen);
  for (size_t i = 0; i < src->len; ++i) src->data()[i] = static_cast<uint8_t>(i * 13 + 1);
  for (int i = 0; i < kN; ++i) ASSERT_EQ(PostRecv(b->qp, *msgs, i * kLen, kLen, 1000 + i), 0);
  for (int i = 0; i < kN; ++i) {
    SendArgs s;
    s.wr_id = i;
    s.sges = {src->Sge(i * kLen, kLen)};
    s.opcode = i % 3 == 0   ? IBV_WR_SEND
               : i % 3 == 1 ? IBV_WR_RDMA_WRITE
                            : IBV_WR_RDMA_WRITE_WITH_IMM;
    s.remote_addr = dst->addr(i * kLen);
    s.rkey = dst->rkey();
    s.imm = 0xabc00000u + i;
    ASSERT_EQ(Post(a->qp, s), 0);
  }
  auto sent = PollN(a->scq, kN);
  ASSERT_EQ(sent.size(), size_t{kN});
  for (int i = 0; i < kN; ++i) {
    ASSERT_EQ(sent[i].wr_id, uint64_t(i));
    ASSERT_EQ(sent[i].status, IBV_WC_SUCCESS) << WcStr(sent[i]);
    ASSERT_EQ(sent[i].opcode, i % 3 == 0 ? IBV_WC_SEND : IBV_WC_RDMA_WRITE);
  }
  // SEND and WRITE_WITH_IMM consume receives, in order.
  auto got = PollN(b->rcq, 2 * kN / 3);
  ASSERT_EQ(got.size(), size_t{2 * kN / 3});
  int k = 0;
  for (int i = 0; i < kN; ++i) {
    if (i % 3 == 1) continue;
    const ibv_wc& wc = got[k];
    ASSERT_EQ(wc.wr_id, uint64_t(1000 + k)) << "receive completions out of order";
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
    if (i % 3 == 0) {
      ASSERT_EQ(wc.opcode, IBV_WC_RECV);
      ASSERT_EQ(std::memcmp(msgs->data() + k * kLen, src->data() + i * kLen, kLen), 0);
    } else {
      ASSERT_EQ(wc.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
      ASSERT_TRUE(wc.wc_flags & IBV_WC_WITH_IMM);
      ASSERT_EQ(ntohl(wc.imm_data), 0xabc00000u + i);
    }
    ++k;
  }
  for (int i = 0; i < kN; ++i) {
    if (i % 3 == 0) continue;
    ASSERT_EQ(std::memcmp(dst->data() + i * kLen, src->data() + i * kLen, kLen), 0) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, OrderingTest, ::testing::Values(IBV_QPT_RC, IBV_QPT_UC),
                         [](const auto& info) {
                           return std::string(info.param == IBV_QPT_RC ? "RC" : "UC");
                         });

using Ordering = VerbsTest;

TEST_F(Ordering, ReadsAndSendsCompleteInPostOrder) {
  QpOpts o;
  Qp *a, *b;
  Pair(o, &a, &b);
  constexpr uint32_t kBig = 256 * 1024;
  Buffer* remote = Buf(kBig);
  Buffer* local = Buf(kBig);
  Buffer* msgs = Buf(64 * 64);
  Buffer* small = Buf(64);  // what the SENDs carry (never the READ's landing zone)
  for (size_t i = 0; i < remote->len; ++i) remote->data()[i] = static_cast<uint8_t>(i * 7 + 3);
  for (int i = 0; i < 64; ++i) ASSERT_EQ(PostRecv(b->qp, *msgs, i * 64, 64, i), 0);
  // READ (large) then SENDs, a small READ, more SENDs: the SENDs are acknowledged long before the
  // big READ's data is in, but must not complete before it.
  uint64_t id = 0;
  std::vector<ibv_wc_opcode> expect;
  ASSERT_EQ(
      PostRdma(a->qp, IBV_WR_RDMA_READ, *local, 0, kBig, remote->addr(), remote->rkey(), id++), 0);
  expect.push_back(IBV_WC_RDMA_READ);
  for (int i = 0; i < 8; ++i) {
    ASSERT_EQ(PostSendMsg(a->qp, *small, 0, 16, id++), 0);
    expect.push_back(IBV_WC_SEND);
  }
  ASSERT_EQ(
      PostRdma(a->qp, IBV_WR_RDMA_READ, *local, 0, 4096, remote->addr(), remote->rkey(), id++), 0);
  expect.push_back(IBV_WC_RDMA_READ);
  for (int i = 0; i < 8; ++i) {
    ASSERT_EQ(PostSendMsg(a->qp, *small, 0, 16, id++), 0);
    expect.push_back(IBV_WC_SEND);
  }
  auto wcs = PollN(a->scq, expect.size());
  ASSERT_EQ(wcs.size(), expect.size());
  for (size_t i = 0; i < wcs.size(); ++i) {
    EXPECT_EQ(wcs[i].wr_id, i) << "completion out of post order";
    EXPECT_EQ(wcs[i].status, IBV_WC_SUCCESS) << WcStr(wcs[i]);
    EXPECT_EQ(wcs[i].opcode, expect[i]);
  }
  EXPECT_EQ(wcs[0].byte_len, kBig);
  EXPECT_EQ(std::memcmp(local->data(), remote->data(), kBig), 0);
  EXPECT_EQ(PollN(b->rcq, 16).size(), 16u);
}

// Fills `n` bytes with a pattern that differs per round and per position.
void Pattern(uint8_t* p, size_t n, int round) {
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(round * 31 + i * 7 + (i >> 8));
}
bool HasPattern(const uint8_t* p, size_t n, int round) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != static_cast<uint8_t>(round * 31 + i * 7 + (i >> 8))) return false;
  return true;
}

constexpr uint32_t kWriteLen = 64 * 1024;  // large enough for the TCP link's direct-read path
constexpr int kWriteRounds = 24;

// Round r: WRITE (unsignaled) of pattern r, then SEND. Returns after the SEND completed.
void WriteThenSend(ibv_qp* qp, ibv_cq* scq, const Buffer& local, uint64_t raddr, uint32_t rkey,
                   int round) {
  Pattern(local.data(), kWriteLen, round);
  ASSERT_EQ(PostRdma(qp, IBV_WR_RDMA_WRITE, local, 0, kWriteLen, raddr, rkey, 2 * round, 0), 0);
  ASSERT_EQ(PostSendMsg(qp, local, kWriteLen, 8, 2 * round + 1), 0);
  ibv_wc wc;
  ASSERT_TRUE(PollOne(scq, &wc));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
  ASSERT_EQ(wc.wr_id, uint64_t(2 * round + 1));
}

TEST_F(Ordering, WriteDataIsVisibleWhenAFollowingSendCompletesInProcess) {
  Qp *a, *b;
  Pair(QpOpts{}, &a, &b);
  Buffer* local = Buf(kWriteLen + 64);
  Buffer* remote = Buf(kWriteLen);
  Buffer* msgs = Buf(64);
  for (int r = 0; r < kWriteRounds; ++r) {
    ASSERT_EQ(PostRecv(b->qp, *msgs, 0, 64, r), 0);
    ASSERT_NO_FATAL_FAILURE(
        WriteThenSend(a->qp, a->scq, *local, remote->addr(), remote->rkey(), r));
    ibv_wc wc;
    ASSERT_TRUE(PollOne(b->rcq, &wc));
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
    ASSERT_TRUE(HasPattern(remote->data(), kWriteLen, r)) << "round " << r;
  }
}

struct WriteTarget {
  Remote remote;
  uint64_t addr;
  uint32_t rkey;
};

// The peer is another process, reached over `link` ("tcp" or "shm").
void CheckWriteDataIsVisibleAcrossProcesses(Verbs& v, const char* link) {
  QpOpts o;
  o.use_gid = true;
  ForkedPeer child;
  ASSERT_TRUE(child.Start([o, link](int up, int down) {
    ChildPipe p{up, down};
    ForceLink(link);
    Verbs v;
    if (!v.Open()) return 10;
    Qp* q = v.NewQp(o);
    Buffer* target = v.NewBuffer(kWriteLen);
    Buffer* msgs = v.NewBuffer(64 * kWriteRounds);
    if (!q || !target || !msgs) return 11;
    WriteTarget mine{v.RemoteOf(q), target->addr(), target->rkey()};
    Remote theirs;
    if (!p.Send(mine) || !p.Recv(&theirs)) return 12;
    if (BringUp(q->qp, o, theirs)) return 13;
    for (int r = 0; r < kWriteRounds; ++r) PostRecv(q->qp, *msgs, r * 64, 64, r);
    p.Send('R');
    int bad = 0;
    for (int r = 0; r < kWriteRounds; ++r) {
      ibv_wc wc;
      if (!PollOne(q->rcq, &wc) || wc.status != IBV_WC_SUCCESS) return 14;
      // The completion is out: the WRITE posted before the SEND must be entirely in place.
      if (!HasPattern(target->data(), kWriteLen, r)) ++bad;
      p.Send('n');  // lets the parent start the next round
    }
    p.Send(bad);
    char c;
    p.Recv(&c);
    return 0;
  }));
  WriteTarget t;
  ASSERT_TRUE(child.Recv(&t));
  Qp* a = v.NewQp(o);
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(child.Send(v.RemoteOf(a)));
  ASSERT_EQ(BringUp(a->qp, o, t.remote), 0);
  char c;
  ASSERT_TRUE(child.Recv(&c));
  Buffer* local = v.NewBuffer(kWriteLen + 64);
  ASSERT_NE(local, nullptr);
  for (int r = 0; r < kWriteRounds; ++r) {
    ASSERT_NO_FATAL_FAILURE(WriteThenSend(a->qp, a->scq, *local, t.addr, t.rkey, r));
    ASSERT_TRUE(child.Recv(&c)) << "child lost at round " << r;
  }
  int bad = -1;
  ASSERT_TRUE(child.Recv(&bad));
  EXPECT_EQ(bad, 0) << "rounds whose WRITE data was not in place at the SEND's completion";
  child.Send('q');
  EXPECT_EQ(child.Wait(), 0);
}

TEST_F(Ordering, WriteDataIsVisibleWhenAFollowingSendCompletesOverTcp) {
  CheckWriteDataIsVisibleAcrossProcesses(v, "tcp");
}

TEST_F(Ordering, WriteDataIsVisibleWhenAFollowingSendCompletesOverShm) {
  CheckWriteDataIsVisibleAcrossProcesses(v, "shm");
}

// Large READ, WRITE and a SEND scattered over several receive SGEs, over the TCP link (where
// large payloads are read straight into registered memory): every byte lands where it belongs.
TEST_F(Ordering, LargeTransfersOverTcpLandByteExact) {
  constexpr uint32_t kBig = 1 << 20;
  constexpr uint32_t kSend = 100000;
  const uint32_t parts[3] = {40000, 30001, 29999};
  QpOpts o;
  ForkedPeer child;
  ASSERT_TRUE(child.Start([o, parts](int up, int down) {
    ChildPipe p{up, down};
    ForceLink("tcp");
    Verbs cv;
    if (!cv.Open()) return 10;
    Qp* q = cv.NewQp(o);
    Buffer* src = cv.NewBuffer(kBig);        // what the parent READs
    Buffer* dst = cv.NewBuffer(kBig);        // what the parent WRITEs
    Buffer* rbuf = cv.NewBuffer(2 * kSend);  // the scattered receive
    if (!q || !src || !dst || !rbuf) return 11;
    Pattern(src->data(), kBig, 1);
    WriteTarget t{cv.RemoteOf(q), src->addr(), src->rkey()};
    WriteTarget t2{cv.RemoteOf(q), dst->addr(), dst->rkey()};
    Remote theirs;
    if (!p.Send(t) || !p.Send(t2) || !p.Recv(&theirs)) return 12;
    if (BringUp(q->qp, o, theirs)) return 13;
    // Three SGEs with gaps between them: 40000 @0, 30001 @50000, 29999 @90000.
    ibv_sge sge[3] = {rbuf->Sge(0, parts[0]), rbuf->Sge(50000, parts[1]),
                      rbuf->Sge(90000, parts[2])};
    ibv_recv_wr wr{};
    wr.wr_id = 5;
    wr.sg_list = sge;
    wr.num_sge = 3;
    ibv_recv_wr* bad;
    if (ibv_post_recv(q->qp, &wr, &bad)) return 14;
    p.Send('R');
    ibv_wc wc;
    if (!PollOne(q->rcq, &wc) || wc.status != IBV_WC_SUCCESS || wc.byte_len != kSend) return 15;
    std::vector<uint8_t> expect(kSend);
    Pattern(expect.data(), kSend, 3);
    int bad_bytes = 0;
    bad_bytes += std::memcmp(rbuf->data(), expect.data(), parts[0]) != 0;
    bad_bytes += std::memcmp(rbuf->data() + 50000, expect.data() + parts[0], parts[1]) != 0;
    bad_bytes +=
        std::memcmp(rbuf->data() + 90000, expect.data() + parts[0] + parts[1], parts[2]) != 0;
    for (uint32_t i = parts[0]; i < 50000; ++i) bad_bytes += rbuf->data()[i] != 0;
    bad_bytes += !HasPattern(dst->data(), kBig, 2);
    p.Send(bad_bytes);
    char c;
    p.Recv(&c);
    return 0;
  }));
  WriteTarget t, t2;
  ASSERT_TRUE(child.Recv(&t));
  ASSERT_TRUE(child.Recv(&t2));
  Qp* a = v.NewQp(o);
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(child.Send(v.RemoteOf(a)));
  ASSERT_EQ(BringUp(a->qp, o, t.remote), 0);
  char c;
  ASSERT_TRUE(child.Recv(&c));
  Buffer* local = Buf(kBig);
  Buffer* out = Buf(kBig);
  Buffer* msg = Buf(kSend);
  Pattern(out->data(), kBig, 2);
  Pattern(msg->data(), kSend, 3);
  ASSERT_EQ(PostRdma(a->qp, IBV_WR_RDMA_READ, *local, 0, kBig, t.addr, t.rkey, 1), 0);
  ASSERT_EQ(PostRdma(a->qp, IBV_WR_RDMA_WRITE, *out, 0, kBig / 2, t2.addr, t2.rkey, 2), 0);
  ASSERT_EQ(
      PostRdma(a->qp, IBV_WR_RDMA_WRITE, *out, kBig / 2, kBig / 2, t2.addr + kBig / 2, t2.rkey, 3),
      0);
  ASSERT_EQ(PostSendMsg(a->qp, *msg, 0, kSend, 4), 0);
  auto wcs = PollN(a->scq, 4);
  ASSERT_EQ(wcs.size(), 4u);
  for (uint64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(wcs[i].wr_id, i + 1);
    EXPECT_EQ(wcs[i].status, IBV_WC_SUCCESS) << WcStr(wcs[i]);
  }
  EXPECT_TRUE(HasPattern(local->data(), kBig, 1)) << "READ data";
  int bad = -1;
  ASSERT_TRUE(child.Recv(&bad));
  EXPECT_EQ(bad, 0) << "misplaced bytes at the receiver (WRITE or scattered SEND)";
  child.Send('q');
  EXPECT_EQ(child.Wait(), 0);
}

TEST_F(Ordering, FenceHoldsAWriteUntilThePrecedingReadHasItsData) {
  Qp *a, *b;
  Pair(QpOpts{}, &a, &b);
  constexpr uint32_t kLen = 4096;
  Buffer* remote = Buf(kLen);
  Buffer* remote2 = Buf(kLen);
  Buffer* local = Buf(kLen);
  for (int r = 0; r < 16; ++r) {
    SCOPED_TRACE("round " + std::to_string(r));
    Pattern(remote->data(), kLen, r);
    local->Fill(0xee);
    remote2->Fill(0);
    // READ remote -> local, then a fenced WRITE local -> remote2: it must carry what the READ
    // brought, not what local held when both were posted.
    ASSERT_EQ(
        PostRdma(a->qp, IBV_WR_RDMA_READ, *local, 0, kLen, remote->addr(), remote->rkey(), 1, 0),
        0);
    ASSERT_EQ(PostRdma(a->qp, IBV_WR_RDMA_WRITE, *local, 0, kLen, remote2->addr(), remote2->rkey(),
                       2, IBV_SEND_SIGNALED | IBV_SEND_FENCE),
              0);
    ibv_wc wc;
    ASSERT_TRUE(PollOne(a->scq, &wc));
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
    ASSERT_EQ(wc.wr_id, 2u);
    EXPECT_TRUE(HasPattern(remote2->data(), kLen, r)) << "fenced WRITE ran before the READ ended";
  }
}

TEST_F(Ordering, FenceHoldsAWriteUntilThePrecedingAtomicHasItsResult) {
  Qp *a, *b;
  Pair(QpOpts{}, &a, &b);
  Buffer* counter = Buf(8);
  Buffer* remote2 = Buf(8);
  Buffer* local = Buf(8);
  counter->u64(0) = 1000;
  for (uint64_t r = 0; r < 16; ++r) {
    local->u64(0) = 0xdeadbeef;
    ASSERT_EQ(PostAtomic(a->qp, IBV_WR_ATOMIC_FETCH_AND_ADD, *local, 0, counter->addr(),
                         counter->rkey(), 5, 0, 1, 0),
              0);
    ASSERT_EQ(PostRdma(a->qp, IBV_WR_RDMA_WRITE, *local, 0, 8, remote2->addr(), remote2->rkey(), 2,
                       IBV_SEND_SIGNALED | IBV_SEND_FENCE),
              0);
    ibv_wc wc;
    ASSERT_TRUE(PollOne(a->scq, &wc));
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
    EXPECT_EQ(remote2->u64(0), 1000 + 5 * r) << "fenced WRITE ran before the atomic ended";
  }
  EXPECT_EQ(counter->u64(0), 1000u + 5 * 16);
}

// ---- Signaling ----------------------------------------------------------------------------------

TEST_F(Ordering, UnsignaledWrsProduceNoCompletionButErrorsAlwaysDo) {
  QpOpts o;
  o.sq_sig_all = false;
  Qp *a, *b;
  Pair(o, &a, &b);
  ibv_qp_attr attr;
  ibv_qp_init_attr init;
  ASSERT_EQ(ibv_query_qp(a->qp, &attr, IBV_QP_STATE, &init), 0);
  EXPECT_EQ(init.sq_sig_all, 0);
  Buffer* buf = Buf(64 * 1024);
  Buffer* remote = Buf(4096);
  for (int i = 0; i < 32; ++i) ASSERT_EQ(PostRecv(b->qp, *buf, 32768 + i * 64, 64, i), 0);
  // 30 WRs of every kind; only ids 9, 19 and 29 ask for a completion.
  for (uint64_t id = 0; id < 30; ++id) {
    unsigned flags = id % 10 == 9 ? IBV_SEND_SIGNALED : 0;
    int r;
    switch (id % 3) {
      case 0:
        r = PostSendMsg(a->qp, *buf, 0, 32, id, flags);
        break;
      case 1:
        r = PostRdma(a->qp, IBV_WR_RDMA_WRITE, *buf, 0, 256, remote->addr(), remote->rkey(), id,
                     flags);
        break;
      default:
        r = PostRdma(a->qp, IBV_WR_RDMA_READ, *buf, 1024, 256, remote->addr(), remote->rkey(), id,
                     flags);
        break;
    }
    ASSERT_EQ(r, 0);
  }
  auto wcs = PollN(a->scq, 3);
  ASSERT_EQ(wcs.size(), 3u);
  EXPECT_EQ(wcs[0].wr_id, 9u);
  EXPECT_EQ(wcs[1].wr_id, 19u);
  EXPECT_EQ(wcs[2].wr_id, 29u);
  for (auto& wc : wcs) EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_TRUE(Drain(a->scq).empty()) << "an unsignaled WR produced a completion";
  EXPECT_EQ(PollN(b->rcq, 10).size(), 10u);  // every SEND arrived

  // An unsignaled WR that fails completes anyway, and so do the flushes after it.
  SendArgs s;
  s.wr_id = 100;
  s.flags = 0;
  s.sges = {ibv_sge{buf->addr(), 32, buf->lkey() + 1}};
  ASSERT_EQ(Post(a->qp, s), 0);
  ibv_wc wc;
  ASSERT_TRUE(PollOne(a->scq, &wc));
  EXPECT_EQ(wc.wr_id, 100u);
  EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << WcStr(wc);
  ASSERT_EQ(PostSendMsg(a->qp, *buf, 0, 32, 101, 0), 0);
  ASSERT_TRUE(PollOne(a->scq, &wc));
  EXPECT_EQ(wc.wr_id, 101u);
  EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
}

TEST_F(Ordering, UnsignaledSendsOnUnreliableTransportsProduceNoCompletion) {
  for (ibv_qp_type t : {IBV_QPT_UC, IBV_QPT_UD}) {
    SCOPED_TRACE(t == IBV_QPT_UC ? "UC" : "UD");
    QpOpts o;
    o.type = t;
    Qp *a, *b;
    Pair(o, &a, &b);
    Buffer* buf = Buf(8192);
    ibv_ah* ah = t == IBV_QPT_UD ? v.AhTo(v.RemoteOf(b), false) : nullptr;
    for (int i = 0; i < 10; ++i) ASSERT_EQ(PostRecv(b->qp, *buf, 1024 + i * 128, 128, i), 0);
    for (uint64_t id = 0; id < 10; ++id) {
      SendArgs s;
      s.wr_id = id;
      s.flags = id == 4 || id == 9 ? IBV_SEND_SIGNALED : 0;
      s.sges = {buf->Sge(0, 16)};
      s.ah = ah;
      s.remote_qpn = b->qpn();
      s.remote_qkey = o.qkey;
      ASSERT_EQ(Post(a->qp, s), 0);
    }
    auto wcs = PollN(a->scq, 2);
    ASSERT_EQ(wcs.size(), 2u);
    EXPECT_EQ(wcs[0].wr_id, 4u);
    EXPECT_EQ(wcs[1].wr_id, 9u);
    EXPECT_EQ(PollN(b->rcq, 10).size(), 10u);
    EXPECT_TRUE(Drain(a->scq).empty());
  }
}

TEST_F(Ordering, SqSigAllSignalsEveryWr) {
  QpOpts o;
  o.sq_sig_all = true;
  Qp *a, *b;
  Pair(o, &a, &b);
  ibv_qp_attr attr;
  ibv_qp_init_attr init;
  ASSERT_EQ(ibv_query_qp(a->qp, &attr, IBV_QP_STATE, &init), 0);
  EXPECT_EQ(init.sq_sig_all, 1);
  Buffer* buf = Buf(8192);
  Buffer* remote = Buf(4096);
  for (int i = 0; i < 4; ++i) ASSERT_EQ(PostRecv(b->qp, *buf, 4096 + i * 64, 64, i), 0);
  for (uint64_t id = 0; id < 12; ++id) {
    int r = id % 3 == 0   ? PostSendMsg(a->qp, *buf, 0, 32, id, 0)
            : id % 3 == 1 ? PostRdma(a->qp, IBV_WR_RDMA_WRITE, *buf, 0, 64, remote->addr(),
                                     remote->rkey(), id, 0)
                          : PostRdma(a->qp, IBV_WR_RDMA_READ, *buf, 512, 64, remote->addr(),
                                     remote->rkey(), id, 0);
    ASSERT_EQ(r, 0);
  }
  auto wcs = PollN(a->scq, 12);
  ASSERT_EQ(wcs.size(), 12u);
  for (uint64_t i = 0; i < 12; ++i) {
    EXPECT_EQ(wcs[i].wr_id, i);
    EXPECT_EQ(wcs[i].status, IBV_WC_SUCCESS);
  }
  EXPECT_TRUE(Drain(a->scq).empty());
}

}  // namespace
}  // namespace semantics
