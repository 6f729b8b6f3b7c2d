// Work-completion errors the device produces, each with the exact ibv_wc_status the IBTA and
// rdma-core's software providers (rxe) give: local length and protection errors, remote access and
// invalid-request NAKs, RNR and transport retry exhaustion (peer QP destroyed, peer process
// killed), and flushes when a QP enters the error state.
#include "support/semantics_harness.h"

namespace semantics {
namespace {

using WcErrors = VerbsTest;

// Expects one async event of `type` on `ctx` for `qp`, and acknowledges it.
void ExpectQpEvent(ibv_context* ctx, ibv_event_type type, ibv_qp* qp) {
  ibv_async_event e{};
  ASSERT_TRUE(NextAsyncEvent(ctx, &e)) << "no async event " << ibv_event_type_str(type);
  EXPECT_EQ(e.event_type, type) << ibv_event_type_str(e.event_type);
  EXPECT_EQ(e.element.qp, qp);
  ibv_ack_async_event(&e);
}

// ---- IBV_WC_LOC_LEN_ERR -------------------------------------------------------------------------

TEST_F(WcErrors, RcReceiveBufferTooSmallIsLocLenErrAndSenderGetsRemInvReqErr) {
  Qp *a, *b;
  Pair(QpOpts{}, &a, &b);
  Buffer* buf = Buf(4096);
  buf->Fill(0x5a);
  ASSERT_EQ(PostRecv(b->qp, *buf, 1024, 16, 10), 0);
  ASSERT_EQ(PostRecv(b->qp, *buf, 2048, 16, 11), 0);
  ASSERT_EQ(PostSendMsg(a->qp, *buf, 0, 64, 1), 0);

  ibv_wc wc;
  ASSERT_TRUE(PollOne(b->rcq, &wc));
  EXPECT_EQ(wc.wr_id, 10u);
  EXPECT_EQ(wc.status, IBV_WC_LOC_LEN_ERR) << WcStr(wc);
  EXPECT_EQ(wc.qp_num, b->qpn());
  // The responder is in error: its other receive is flushed.
  ASSERT_TRUE(PollOne(b->rcq, &wc));
  EXPECT_EQ(wc.wr_id, 11u);
  EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR) << WcStr(wc);

  ASSERT_TRUE(PollOne(a->scq, &wc));
  EXPECT_EQ(wc.wr_id, 1u);
  EXPECT_EQ(wc.status, IBV_WC_REM_INV_REQ_ERR) << WcStr(wc);
  EXPECT_EQ(StateOf(a->qp), IBV_QPS_ERR);
  EXPECT_EQ(StateOf(b->qp), IBV_QPS_ERR);
  // Nothing was written past the 16 bytes the receive offered.
  for (int i = 16; i < 64; ++i) ASSERT_EQ(buf->data()[1024 + i], 0x5a) << i;
}

TEST_F(WcErrors, UcAndUdReceiveBufferTooSmallIsLocLenErr) {
  for (ibv_qp_type t : {IBV_QPT_UC, IBV_QPT_UD}) {
    SCOPED_TRACE(t == IBV_QPT_UC ? "UC" : "UD");
    QpOpts o;
    o.type = t;
    Qp *a, *b;
    Pair(o, &a, &b);
    Buffer* buf = Buf(4096);
    const uint32_t grh = t == IBV_QPT_UD ? 40 : 0;
    ASSERT_EQ(PostRecv(b->qp, *buf, 1024, grh + 16, 10), 0);
    SendArgs s;
    s.wr_id = 1;
    s.sges = {buf->Sge(0, 64)};
    if (t == IBV_QPT_UD) {
      s.ah = v.AhTo(v.RemoteOf(b), true);
      ASSERT_NE(s.ah, nullptr);
      s.remote_qpn = b->qpn();
      s.remote_qkey = o.qkey;
    }
    ASSERT_EQ(Post(a->qp, s), 0);
    ibv_wc wc;
    ASSERT_TRUE(PollOne(b->rcq, &wc));
    EXPECT_EQ(wc.wr_id, 10u);
    EXPECT_EQ(wc.status, IBV_WC_LOC_LEN_ERR) << WcStr(wc);
    // Unreliable transports: the sender knows nothing of the receiver's trouble.
    ASSERT_TRUE(PollOne(a->scq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
  }
}

// A datagram larger than the path MTU cannot be sent: the sender's error (IBTA 10.7.3.1). A UD
// send-queue error stops only the send queue (SQE): later sends are flushed, receives go on, and
// SQE -> RTS recovers.
TEST_F(WcErrors, UdSendLargerThanMtuIsLocLenErrAndOnlyStopsTheSendQueue) {
  QpOpts o;
  o.type = IBV_QPT_UD;
  Qp *a, *b;
  Pair(o, &a, &b);
  Buffer* buf = Buf(16384);
  ibv_ah* to_b = v.AhTo(v.RemoteOf(b), false);
  ibv_ah* to_a = v.AhTo(v.RemoteOf(a), false);
  ASSERT_NE(to_b, nullptr);
  ASSERT_NE(to_a, nullptr);
  auto ud_send = [&](Qp* from, ibv_ah* ah, uint32_t qpn, uint32_t len, uint64_t id) {
    SendArgs s;
    s.wr_id = id;
    s.sges = {buf->Sge(0, len)};
    s.ah = ah;
    s.remote_qpn = qpn;
    s.remote_qkey = o.qkey;
    return Post(from->qp, s);
  };
  ASSERT_EQ(ud_send(a, to_b, b->qpn(), 4097, 1), 0);  // active MTU is 4096
  ibv_wc wc;
  ASSERT_TRUE(PollOne(a->scq, &wc));
  EXPECT_EQ(wc.wr_id, 1u);
  EXPECT_EQ(wc.status, IBV_WC_LOC_LEN_ERR) << WcStr(wc);
  EXPECT_EQ(StateOf(a->qp), IBV_QPS_SQE);

  ASSERT_EQ(ud_send(a, to_b, b->qpn(), 16, 2), 0);
  ASSERT_TRUE(PollOne(a->scq, &wc)) << "a send posted in SQE was neither run nor flushed";
  EXPECT_EQ(wc.wr_id, 2u);
  EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR) << WcStr(wc);

  ASSERT_EQ(PostRecv(a->qp, *buf, 8192, 1024, 3), 0);
  ASSERT_EQ(ud_send(b, to_a, a->qpn(), 16, 4), 0);
  ASSERT_TRUE(PollOne(a->rcq, &wc)) << "receives must go on in SQE";
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);

  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTS;
  ASSERT_EQ(ibv_modify_qp(a->qp, &attr, IBV_QP_STATE), 0);
  ASSERT_EQ(PostRecv(b->qp, *buf, 12288, 1024, 5), 0);
  ASSERT_EQ(ud_send(a, to_b, b->qpn(), 4096, 6), 0);
  ASSERT_TRUE(PollOne(a->scq, &wc));
  EXPECT_EQ(wc.wr_id, 6u);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
  ASSERT_TRUE(PollOne(b->rcq, &wc));
  EXPECT_EQ(wc.byte_len, 4096u + 40);
}

// ---- IBV_WC_LOC_PROT_ERR ------------------------------------------------------------------------

TEST_F(WcErrors, SendWithBadLkeyOrOutsideTheMrIsLocProtErr) {
  struct Case {
    const char* what;
    bool bad_key;
  };
  for (Case c : {Case{"bad lkey", true}, Case{"address beyond the MR", false}}) {
    SCOPED_TRACE(c.what);
    Qp *a, *b;
    Pair(QpOpts{}, &a, &b);
    Buffer* buf = Buf(4096);
    ASSERT_EQ(PostRecv(b->qp, *buf, 0, 4096, 10), 0);
    SendArgs s;
    s.wr_id = 7;
    s.sges = {c.bad_key ? ibv_sge{buf->addr(0), 64, buf->lkey() ^ 0x5a5a5a}
                        : ibv_sge{buf->addr(4096 - 32), 64, buf->lkey()}};
    ASSERT_EQ(Post(a->qp, s), 0);
    ibv_wc wc;
    ASSERT_TRUE(PollOne(a->scq, &wc));
    EXPECT_EQ(wc.wr_id, 7u);
    EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << WcStr(wc);
    EXPECT_EQ(StateOf(a->qp), IBV_QPS_ERR);
    EXPECT_TRUE(Drain(b->rcq).empty()) << "nothing may reach the receiver";
  }
}

// ---- IBV_WC_REM_ACCESS_ERR ----------------------------------------------------------------------

TEST_F(WcErrors, RdmaAndAtomicsWithBadRemoteKeysRangesOrRightsAreRemAccessErr) {
  enum Target { kWrongKey, kOutOfRange, kNoRight };
  struct Case {
    const char* what;
    ibv_wr_opcode op;
    Target target;
  };
  const Case cases[] = {
      {"WRITE wrong rkey", IBV_WR_RDMA_WRITE, kWrongKey},
      {"WRITE out of range", IBV_WR_RDMA_WRITE, kOutOfRange},
      {"WRITE to MR without REMOTE_WRITE", IBV_WR_RDMA_WRITE, kNoRight},
      {"WRITE_WITH_IMM wrong rkey", IBV_WR_RDMA_WRITE_WITH_IMM, kWrongKey},
      {"READ wrong rkey", IBV_WR_RDMA_READ, kWrongKey},
      {"READ out of range", IBV_WR_RDMA_READ, kOutOfRange},
      {"READ from MR without REMOTE_READ", IBV_WR_RDMA_READ, kNoRight},
      {"FETCH_ADD wrong rkey", IBV_WR_ATOMIC_FETCH_AND_ADD, kWrongKey},
      {"FETCH_ADD out of range", IBV_WR_ATOMIC_FETCH_AND_ADD, kOutOfRange},
      {"CMP_AND_SWP on MR without REMOTE_ATOMIC", IBV_WR_ATOMIC_CMP_AND_SWP, kNoRight},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Qp *a, *b;
    Pair(QpOpts{}, &a, &b);
    Buffer* local = Buf(4096);
    local->Fill(0x11);
    // The remote MR grants every right except the one the operation needs (kNoRight case).
    int rights = kAllAccess;
    if (c.target == kNoRight) {
      rights &= c.op == IBV_WR_RDMA_READ            ? ~IBV_ACCESS_REMOTE_READ
                : c.op == IBV_WR_ATOMIC_CMP_AND_SWP ? ~IBV_ACCESS_REMOTE_ATOMIC
                                                    : ~IBV_ACCESS_REMOTE_WRITE;
    }
    Buffer* remote = Buf(256, rights);
    remote->Fill(0x77);
    if (c.op == IBV_WR_RDMA_WRITE_WITH_IMM) {
      ASSERT_EQ(PostRecv(b->qp, *local, 0, 64, 50), 0);
    }
    uint64_t raddr = remote->addr(0);
    uint32_t rkey = remote->rkey();
    uint32_t len = 64;
    if (c.target == kWrongKey) rkey ^= 0x10101;
    if (c.target == kOutOfRange) raddr = remote->addr(256 - 32);  // runs 32 bytes past the end
    if (c.op == IBV_WR_ATOMIC_FETCH_AND_ADD && c.target == kOutOfRange) raddr = remote->addr(256);
    int r = (c.op == IBV_WR_ATOMIC_FETCH_AND_ADD || c.op == IBV_WR_ATOMIC_CMP_AND_SWP)
                ? PostAtomic(a->qp, c.op, *local, 0, raddr, rkey, 1, 2, 9)
                : PostRdma(a->qp, c.op, *local, 0, len, raddr, rkey, 9);
    ASSERT_EQ(r, 0);
    ibv_wc wc;
    ASSERT_TRUE(PollOne(a->scq, &wc));
    EXPECT_EQ(wc.wr_id, 9u);
    EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << WcStr(wc);
    EXPECT_EQ(StateOf(a->qp), IBV_QPS_ERR);
    // The responder stops too and says why.
    ExpectQpEvent(v.ctx, IBV_EVENT_QP_ACCESS_ERR, b->qp);
    EXPECT_EQ(StateOf(b->qp), IBV_QPS_ERR);
    for (size_t i = 0; i < remote->len; ++i) ASSERT_EQ(remote->data()[i], 0x77) << i;
    for (size_t i = 0; i < 64; ++i) ASSERT_EQ(local->data()[i], 0x11) << i;
    ASSERT_EQ(v.DestroyQp(a), 0);
    ASSERT_EQ(v.DestroyQp(b), 0);
  }
}

// ---- IBV_WC_REM_INV_REQ_ERR ---------------------------------------------------------------------

TEST_F(WcErrors, OperationsTheResponderQpDoesNotEnableAreRemInvReqErr) {
  struct Case {
    const char* what;
    ibv_wr_opcode op;
    int qp_access;  // of the responder QP
  };
  const int all = kAllAccess;
  const Case cases[] = {
      {"WRITE, QP without REMOTE_WRITE", IBV_WR_RDMA_WRITE, all & ~IBV_ACCESS_REMOTE_WRITE},
      {"READ, QP without REMOTE_READ", IBV_WR_RDMA_READ, all & ~IBV_ACCESS_REMOTE_READ},
      {"FETCH_ADD, QP without REMOTE_ATOMIC", IBV_WR_ATOMIC_FETCH_AND_ADD,
       all & ~IBV_ACCESS_REMOTE_ATOMIC},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    QpOpts oa, ob;
    ob.access = c.qp_access;
    Qp *a, *b;
    Pair(oa, ob, &a, &b);
    Buffer* local = Buf(4096);
    Buffer* remote = Buf(256);  // the MR itself allows everything
    remote->Fill(0x77);
    int r = c.op == IBV_WR_ATOMIC_FETCH_AND_ADD
                ? PostAtomic(a->qp, c.op, *local, 0, remote->addr(), remote->rkey(), 1, 0, 3)
                : PostRdma(a->qp, c.op, *local, 0, 64, remote->addr(), remote->rkey(), 3);
    ASSERT_EQ(r, 0);
    ibv_wc wc;
    ASSERT_TRUE(PollOne(a->scq, &wc));
    EXPECT_EQ(wc.wr_id, 3u);
    EXPECT_EQ(wc.status, IBV_WC_REM_INV_REQ_ERR) << WcStr(wc);
    ExpectQpEvent(v.ctx, IBV_EVENT_QP_REQ_ERR, b->qp);
    for (size_t i = 0; i < remote->len; ++i) ASSERT_EQ(remote->data()[i], 0x77) << i;
    ASSERT_EQ(v.DestroyQp(a), 0);
    ASSERT_EQ(v.DestroyQp(b), 0);
  }
}

// ---- IBV_WC_RNR_RETRY_EXC_ERR -------------------------------------------------------------------

TEST_F(WcErrors, RnrRetryZeroToSixIsExhaustedAfterThatManyRetries) {
  // The responder's min_rnr_timer goes into every RNR NAK: 14 = 1.28 ms (IBTA table 45). Each retry
  // waits at least that long, which bounds the time from below.
  constexpr auto kRnrDelay = std::chrono::microseconds(1280);
  for (uint8_t n = 0; n <= 6; ++n) {
    SCOPED_TRACE("rnr_retry " + std::to_string(n));
    QpOpts oa, ob;
    oa.rnr_retry = n;
    ob.min_rnr_timer = 14;
    Qp *a, *b;
    Pair(oa, ob, &a, &b);
    Buffer* buf = Buf(256);
    auto start = Clock::now();
    ASSERT_EQ(PostSendMsg(a->qp, *buf, 0, 32, 100 + n), 0);
    ibv_wc wc;
    ASSERT_TRUE(PollOne(a->scq, &wc));
    auto elapsed = Clock::now() - start;
    EXPECT_EQ(wc.wr_id, 100u + n);
    EXPECT_EQ(wc.status, IBV_WC_RNR_RETRY_EXC_ERR) << WcStr(wc);
    EXPECT_GE(elapsed, n * kRnrDelay) << "fewer than rnr_retry retries, or no RNR back-off";
    EXPECT_EQ(StateOf(a->qp), IBV_QPS_ERR);
    EXPECT_EQ(StateOf(b->qp), IBV_QPS_RTS) << "an RNR is not the responder's error";
    ASSERT_EQ(v.DestroyQp(a), 0);
    ASSERT_EQ(v.DestroyQp(b), 0);
  }
}

TEST_F(WcErrors, RnrRetrySevenRetriesForeverUntilAReceiveIsPosted) {
  QpOpts oa, ob;
  oa.rnr_retry = 7;
  ob.min_rnr_timer = 12;  // 0.64 ms between attempts
  Qp *a, *b;
  Pair(oa, ob, &a, &b);
  Buffer* buf = Buf(4096);
  for (int i = 0; i < 32; ++i) buf->data()[i] = static_cast<uint8_t>(i);
  ASSERT_EQ(PostSendMsg(a->qp, *buf, 0, 32, 1), 0);
  EXPECT_TRUE(Drain(a->scq, milliseconds(150)).empty()) << "rnr_retry 7 gave up";
  ASSERT_EQ(PostRecv(b->qp, *buf, 1024, 64, 2), 0);
  ibv_wc wc;
  ASSERT_TRUE(PollOne(a->scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
  ASSERT_TRUE(PollOne(b->rcq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
  EXPECT_EQ(wc.byte_len, 32u);
  EXPECT_EQ(std::memcmp(buf->data(), buf->data() + 1024, 32), 0);
}

// ---- IBV_WC_RETRY_EXC_ERR -----------------------------------------------------------------------

// Posts wr 2..4 after the peer is gone and expects RETRY_EXC_ERR for the first and flushes after.
void ExpectRetryExceeded(Qp* a, const Buffer& buf, std::chrono::nanoseconds at_least) {
  auto start = Clock::now();
  for (uint64_t id = 2; id <= 4; ++id) ASSERT_EQ(PostSendMsg(a->qp, buf, 0, 32, id), 0);
  auto wcs = PollN(a->scq, 3);
  auto elapsed = Clock::now() - start;
  ASSERT_EQ(wcs.size(), 3u);
  EXPECT_EQ(wcs[0].wr_id, 2u);
  EXPECT_EQ(wcs[0].status, IBV_WC_RETRY_EXC_ERR) << WcStr(wcs[0]);
  for (int i = 1; i < 3; ++i) {
    EXPECT_EQ(wcs[i].wr_id, 2u + i);
    EXPECT_EQ(wcs[i].status, IBV_WC_WR_FLUSH_ERR) << WcStr(wcs[i]);
  }
  EXPECT_GE(elapsed, at_least);
  EXPECT_EQ(StateOf(a->qp), IBV_QPS_ERR);
}

TEST_F(WcErrors, RetryExceededWhenPeerQpIsDestroyedInProcess) {
  QpOpts o;
  o.timeout = 8;  // 4.096 us * 2^8 = 1 ms
  o.retry_cnt = 2;
  Qp *a, *b;
  Pair(o, &a, &b);
  Buffer* buf = Buf(4096);
  ASSERT_EQ(PostRecv(b->qp, *buf, 1024, 64, 1), 0);
  ASSERT_EQ(PostSendMsg(a->qp, *buf, 0, 32, 1), 0);
  ibv_wc wc;
  ASSERT_TRUE(PollOne(a->scq, &wc));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
  ASSERT_EQ(v.DestroyQp(b), 0);
  // The first try and retry_cnt retries each wait at least the IBTA transport timer.
  ExpectRetryExceeded(a, *buf, (o.retry_cnt + 1) * std::chrono::nanoseconds(4096ll << o.timeout));
}

// A peer in another process (forked before it opens the device: TCP link). It connects to the
// parent's QP, posts `recvs` receives, takes one message, reports it, then obeys: 'D' destroys
// its QP and stays alive.
int PeerProcess(ChildPipe p, QpOpts o, int recvs) {
  ChildQp c;
  if (int e = c.Connect(p, o, 4096)) return e;
  Verbs& v = c.v;
  Qp* q = c.q;
  Buffer* b = c.b;
  for (int i = 0; i < recvs; ++i) PostRecv(q->qp, *b, i * 256, 256, i);
  if (!p.Send('R')) return 14;
  ibv_wc wc;
  if (!PollOne(q->rcq, &wc) || wc.status != IBV_WC_SUCCESS) return 15;
  if (!p.Send('G')) return 16;
  char cmd;
  while (p.Recv(&cmd)) {
    if (cmd == 'D') {
      v.DestroyQp(q);
      p.Send('d');
    }
  }
  return 0;
}

// Connects `a` with a forked PeerProcess and exchanges one message.
void ConnectToForkedPeer(Verbs& v, ForkedPeer& child, Qp* a, const Buffer& buf, int recvs = 8) {
  QpOpts o = a->opts;
  ASSERT_TRUE(child.Start([o, recvs](int up, int down) {
    return PeerProcess(ChildPipe{up, down}, o, recvs);
  }));
  Remote theirs;
  ASSERT_TRUE(child.Recv(&theirs)) << "child did not start";
  ASSERT_TRUE(child.Send(v.RemoteOf(a)));
  ASSERT_EQ(BringUp(a->qp, o, theirs), 0);
  char c = 0;
  ASSERT_TRUE(child.Recv(&c));
  ASSERT_EQ(c, 'R');
  ASSERT_EQ(PostSendMsg(a->qp, buf, 0, 32, 1), 0);
  ibv_wc wc;
  ASSERT_TRUE(PollOne(a->scq, &wc));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
  ASSERT_TRUE(child.Recv(&c));
  ASSERT_EQ(c, 'G');
}

TEST_F(WcErrors, RetryExceededWhenPeerProcessIsKilled) {
  QpOpts o;
  o.use_gid = true;  // GID addressing: the GID names the child's TCP endpoint
  o.timeout = 12;    // 16 ms
  o.retry_cnt = 3;
  Qp* a = v.NewQp(o);
  ASSERT_NE(a, nullptr);
  Buffer* buf = Buf(4096);
  ForkedPeer child;
  ASSERT_NO_FATAL_FAILURE(ConnectToForkedPeer(v, child, a, *buf));
  child.Kill();
  ExpectRetryExceeded(a, *buf, std::chrono::nanoseconds(0));
}

TEST_F(WcErrors, RetryExceededWhenPeerProcessDestroysItsQp) {
  QpOpts o;  // LID addressing: the slot registry finds the child
  o.timeout = 8;
  o.retry_cnt = 2;
  Qp* a = v.NewQp(o);
  ASSERT_NE(a, nullptr);
  Buffer* buf = Buf(4096);
  ForkedPeer child;
  ASSERT_NO_FATAL_FAILURE(ConnectToForkedPeer(v, child, a, *buf));
  ASSERT_TRUE(child.Send('D'));
  char c = 0;
  ASSERT_TRUE(child.Recv(&c));
  ASSERT_EQ(c, 'd');
  ExpectRetryExceeded(a, *buf, (o.retry_cnt + 1) * std::chrono::nanoseconds(4096ll << o.timeout));
  EXPECT_EQ(waitpid(child.pid(), nullptr, WNOHANG), 0) << "the child died: only its QP should go";
}

// The WRs are already outstanding (the peer answers RNR NAKs: no receive) when the peer goes.
TEST_F(WcErrors, OutstandingWrsFailWithRetryExceededWhenPeerProcessIsKilled) {
  QpOpts o;
  o.rnr_retry = 7;
  o.min_rnr_timer = 12;
  Qp* a = v.NewQp(o);
  ASSERT_NE(a, nullptr);
  Buffer* buf = Buf(4096);
  ForkedPeer child;
  ASSERT_NO_FATAL_FAILURE(ConnectToForkedPeer(v, child, a, *buf, /*recvs=*/1));
  for (uint64_t id = 2; id <= 4; ++id) ASSERT_EQ(PostSendMsg(a->qp, *buf, 0, 32, id), 0);
  EXPECT_TRUE(Drain(a->scq).empty()) << "completed although the peer has no receive";
  child.Kill();
  auto wcs = PollN(a->scq, 3);
  ASSERT_EQ(wcs.size(), 3u);
  EXPECT_EQ(wcs[0].wr_id, 2u);
  EXPECT_EQ(wcs[0].status, IBV_WC_RETRY_EXC_ERR) << WcStr(wcs[0]);
  for (int i = 1; i < 3; ++i) EXPECT_EQ(wcs[i].status, IBV_WC_WR_FLUSH_ERR) << WcStr(wcs[i]);
  EXPECT_EQ(StateOf(a->qp), IBV_QPS_ERR);
}

TEST_F(WcErrors, OutstandingWrFailsWithRetryExceededWhenPeerQpIsDestroyedDuringRnr) {
  QpOpts oa, ob;
  oa.rnr_retry = 7;
  oa.timeout = 8;
  oa.retry_cnt = 2;
  ob.min_rnr_timer = 12;
  Qp *a, *b;
  Pair(oa, ob, &a, &b);
  Buffer* buf = Buf(4096);
  ASSERT_EQ(PostSendMsg(a->qp, *buf, 0, 32, 1), 0);
  EXPECT_TRUE(Drain(a->scq, milliseconds(20)).empty());
  ASSERT_EQ(v.DestroyQp(b), 0);
  ibv_wc wc;
  ASSERT_TRUE(PollOne(a->scq, &wc));
  EXPECT_EQ(wc.wr_id, 1u);
  EXPECT_EQ(wc.status, IBV_WC_RETRY_EXC_ERR) << WcStr(wc);
}

// ---- IBV_WC_WR_FLUSH_ERR ------------------------------------------------------------------------

TEST_F(WcErrors, OutstandingAndLaterSendsAreFlushedAfterModifyToErr) {
  QpOpts oa, ob;
  oa.rnr_retry = 7;  // the first SEND never completes: the responder has no receive
  ob.min_rnr_timer = 12;
  Qp *a, *b;
  Pair(oa, ob, &a, &b);
  Buffer* buf = Buf(4096);
  for (uint64_t id = 1; id <= 6; ++id) {
    unsigned flags = id % 2 ? IBV_SEND_SIGNALED : 0;  // flushes complete even when unsignaled
    ASSERT_EQ(PostSendMsg(a->qp, *buf, 0, 32, id, flags), 0);
  }
  EXPECT_TRUE(Drain(a->scq, milliseconds(20)).empty());
  ASSERT_EQ(ToErr(a->qp), 0);
  auto wcs = PollN(a->scq, 6);
  ASSERT_EQ(wcs.size(), 6u);
  for (size_t i = 0; i < wcs.size(); ++i) {
    EXPECT_EQ(wcs[i].wr_id, i + 1);
    EXPECT_EQ(wcs[i].status, IBV_WC_WR_FLUSH_ERR) << WcStr(wcs[i]);
    EXPECT_EQ(wcs[i].qp_num, a->qpn());
  }
  ASSERT_EQ(PostSendMsg(a->qp, *buf, 0, 32, 7, 0), 0);
  ibv_wc wc;
  ASSERT_TRUE(PollOne(a->scq, &wc));
  EXPECT_EQ(wc.wr_id, 7u);
  EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_TRUE(Drain(a->scq).empty());
  EXPECT_TRUE(Drain(b->rcq, milliseconds(1)).empty());
}

TEST_F(WcErrors, PostedAndLaterReceivesAreFlushedAfterModifyToErr) {
  for (ibv_qp_type t : {IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD}) {
    SCOPED_TRACE(t == IBV_QPT_RC ? "RC" : t == IBV_QPT_UC ? "UC" : "UD");
    QpOpts o;
    o.type = t;
    Qp *a, *b;
    Pair(o, &a, &b);
    Buffer* buf = Buf(4096);
    for (uint64_t id = 1; id <= 5; ++id) ASSERT_EQ(PostRecv(b->qp, *buf, id * 128, 128, id), 0);
    ASSERT_EQ(ToErr(b->qp), 0);
    auto wcs = PollN(b->rcq, 5);
    ASSERT_EQ(wcs.size(), 5u);
    for (size_t i = 0; i < wcs.size(); ++i) {
      EXPECT_EQ(wcs[i].wr_id, i + 1);
      EXPECT_EQ(wcs[i].status, IBV_WC_WR_FLUSH_ERR) << WcStr(wcs[i]);
      EXPECT_EQ(wcs[i].qp_num, b->qpn());
    }
    ASSERT_EQ(PostRecv(b->qp, *buf, 0, 128, 9), 0);
    ibv_wc wc;
    ASSERT_TRUE(PollOne(b->rcq, &wc));
    EXPECT_EQ(wc.wr_id, 9u);
    EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
    // The send side of the QP in error flushes too.
    SendArgs s;
    s.wr_id = 10;
    s.flags = 0;
    s.sges = {buf->Sge(0, 8)};
    if (t == IBV_QPT_UD) {
      s.ah = v.AhTo(v.RemoteOf(a), false);
      s.remote_qpn = a->qpn();
      s.remote_qkey = o.qkey;
    }
    ASSERT_EQ(Post(b->qp, s), 0);
    ASSERT_TRUE(PollOne(b->scq, &wc));
    EXPECT_EQ(wc.wr_id, 10u);
    EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_TRUE(Drain(b->rcq).empty());
    EXPECT_TRUE(Drain(a->rcq, milliseconds(1)).empty());
  }
}

}  // namespace
}  // namespace semantics
