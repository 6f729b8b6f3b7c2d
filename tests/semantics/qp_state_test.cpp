// QP state machine through the public API: ibv_modify_qp / ibv_query_qp on RC, UC and UD QPs.
// Legal transitions with the masks the Debian tools use succeed and are reported back; illegal
// ones (wrong, missing or extra mask bits, illegal state pairs, bad values) answer EINVAL and leave
// the QP exactly as it was; posting is refused in the states that do not allow it.
#include "support/semantics_harness.h"

namespace semantics {
namespace {

const char* TypeName(ibv_qp_type t) {
  return t == IBV_QPT_RC ? "RC" : t == IBV_QPT_UC ? "UC" : "UD";
}

class QpStateTest : public VerbsTest, public ::testing::WithParamInterface<ibv_qp_type> {
 protected:
  QpOpts Opts() const {
    QpOpts o;
    o.type = GetParam();
    o.psn = 0x123456;
    o.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    return o;
  }
  // Some other QP number to connect to: no traffic flows in these tests.
  Remote Peer() const {
    Remote r;
    r.qpn = 0x1234;
    r.lid = v.port.lid;
    r.gid = v.gid;
    r.psn = 0xabcdef;
    return r;
  }
  // Moves a fresh QP to `s` along the legal path.
  void Advance(ibv_qp* qp, ibv_qp_state s) {
    const QpOpts o = Opts();
    if (s == IBV_QPS_RESET) return;
    if (s == IBV_QPS_ERR) {
      ASSERT_EQ(ToErr(qp), 0);
      return;
    }
    ASSERT_EQ(ToInit(qp, o), 0);
    if (s == IBV_QPS_INIT) return;
    ASSERT_EQ(ToRtr(qp, o, Peer()), 0);
    if (s == IBV_QPS_RTR) return;
    ASSERT_EQ(ToRts(qp, o), 0);
    if (s == IBV_QPS_RTS) return;
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_SQD;
    ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE), 0);
  }
};

// Every attribute we can read back, to prove a refused modify changed nothing.
struct Snapshot {
  ibv_qp_attr a{};
  bool operator==(const Snapshot& o) const {
    return a.qp_state == o.a.qp_state && a.qp_access_flags == o.a.qp_access_flags &&
           a.qkey == o.a.qkey && a.path_mtu == o.a.path_mtu && a.dest_qp_num == o.a.dest_qp_num &&
           a.rq_psn == o.a.rq_psn && a.sq_psn == o.a.sq_psn && a.timeout == o.a.timeout &&
           a.retry_cnt == o.a.retry_cnt && a.rnr_retry == o.a.rnr_retry &&
           a.min_rnr_timer == o.a.min_rnr_timer && a.max_rd_atomic == o.a.max_rd_atomic &&
           a.max_dest_rd_atomic == o.a.max_dest_rd_atomic && a.port_num == o.a.port_num &&
           a.pkey_index == o.a.pkey_index && a.ah_attr.dlid == o.a.ah_attr.dlid;
  }
};
Snapshot Snap(ibv_qp* qp) {
  Snapshot s;
  ibv_qp_init_attr init{};
  EXPECT_EQ(ibv_query_qp(qp, &s.a, 0x1fffff, &init), 0);
  return s;
}

TEST_P(QpStateTest, LegalPathWithToolMasksIsReportedByQuery) {
  const ibv_qp_type t = GetParam();
  QpOpts o = Opts();
  o.timeout = 17;
  o.retry_cnt = 5;
  o.rnr_retry = 6;
  o.min_rnr_timer = 12;
  o.max_rd_atomic = 4;
  o.max_dest_rd_atomic = 8;
  o.sq_sig_all = true;
  Qp* q = v.NewQp(o);
  ASSERT_NE(q, nullptr);
  ibv_qp* qp = q->qp;
  EXPECT_EQ(qp->state, IBV_QPS_RESET);
  EXPECT_EQ(StateOf(qp), IBV_QPS_RESET);

  ASSERT_EQ(ToInit(qp, o), 0);
  ibv_qp_attr a{};
  ibv_qp_init_attr init{};
  ASSERT_EQ(ibv_query_qp(
                qp, &a,
                IBV_QP_STATE | IBV_QP_PORT | IBV_QP_PKEY_INDEX | IBV_QP_ACCESS_FLAGS | IBV_QP_QKEY,
                &init),
            0);
  EXPECT_EQ(a.qp_state, IBV_QPS_INIT);
  EXPECT_EQ(qp->state, IBV_QPS_INIT);
  EXPECT_EQ(a.port_num, 1);
  EXPECT_EQ(a.pkey_index, 0);
  if (t == IBV_QPT_UD)
    EXPECT_EQ(a.qkey, o.qkey);
  else
    EXPECT_EQ(a.qp_access_flags, static_cast<unsigned>(o.access));
  EXPECT_EQ(init.qp_type, t);
  EXPECT_EQ(init.send_cq, q->scq);
  EXPECT_EQ(init.recv_cq, q->rcq);
  EXPECT_EQ(init.sq_sig_all, 1);
  EXPECT_GE(init.cap.max_send_wr, o.max_send_wr);
  EXPECT_GE(init.cap.max_recv_wr, o.max_recv_wr);
  EXPECT_GE(init.cap.max_inline_data, o.max_inline);

  const Remote peer = Peer();
  ASSERT_EQ(ToRtr(qp, o, peer), 0);
  a = {};
  ASSERT_EQ(ibv_query_qp(qp, &a, RtrMask(t), &init), 0);
  EXPECT_EQ(a.qp_state, IBV_QPS_RTR);
  EXPECT_EQ(qp->state, IBV_QPS_RTR);
  if (t != IBV_QPT_UD) {
    EXPECT_EQ(a.path_mtu, IBV_MTU_1024);
    EXPECT_EQ(a.dest_qp_num, peer.qpn);
    EXPECT_EQ(a.rq_psn, peer.psn);
    EXPECT_EQ(a.ah_attr.dlid, peer.lid);
  }
  if (t == IBV_QPT_RC) {
    EXPECT_EQ(a.max_dest_rd_atomic, o.max_dest_rd_atomic);
    EXPECT_EQ(a.min_rnr_timer, o.min_rnr_timer);
  }

  ASSERT_EQ(ToRts(qp, o), 0);
  a = {};
  ASSERT_EQ(ibv_query_qp(qp, &a, RtsMask(t), &init), 0);
  EXPECT_EQ(a.qp_state, IBV_QPS_RTS);
  EXPECT_EQ(qp->state, IBV_QPS_RTS);
  EXPECT_EQ(a.sq_psn, o.psn);
  if (t == IBV_QPT_RC) {
    EXPECT_EQ(a.timeout, o.timeout);
    EXPECT_EQ(a.retry_cnt, o.retry_cnt);
    EXPECT_EQ(a.rnr_retry, o.rnr_retry);
    EXPECT_EQ(a.max_rd_atomic, o.max_rd_atomic);
  }

  // RTS -> RTS with the optional attributes of the type.
  a = {};
  a.qp_state = IBV_QPS_RTS;
  int mask = IBV_QP_STATE;
  if (t == IBV_QPT_UD) {
    a.qkey = 0x2222;
    mask |= IBV_QP_QKEY;
  } else {
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
    mask |= IBV_QP_ACCESS_FLAGS;
    if (t == IBV_QPT_RC) {
      a.min_rnr_timer = 3;
      mask |= IBV_QP_MIN_RNR_TIMER;
    }
  }
  ASSERT_EQ(ibv_modify_qp(qp, &a, mask), 0);
  ibv_qp_attr b{};
  ASSERT_EQ(ibv_query_qp(qp, &b, mask, &init), 0);
  EXPECT_EQ(b.qp_state, IBV_QPS_RTS);
  if (t == IBV_QPT_UD) {
    EXPECT_EQ(b.qkey, 0x2222u);
  } else {
    EXPECT_EQ(b.qp_access_flags, unsigned{IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ});
    if (t == IBV_QPT_RC) {
      EXPECT_EQ(b.min_rnr_timer, 3);
    }
  }

  // RTS -> SQD -> RTS, then to ERR, RESET, and up again.
  a = {};
  a.qp_state = IBV_QPS_SQD;
  ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE), 0);
  EXPECT_EQ(StateOf(qp), IBV_QPS_SQD);
  a.qp_state = IBV_QPS_RTS;
  ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE), 0);
  EXPECT_EQ(StateOf(qp), IBV_QPS_RTS);
  ASSERT_EQ(ToErr(qp), 0);
  EXPECT_EQ(StateOf(qp), IBV_QPS_ERR);
  EXPECT_EQ(qp->state, IBV_QPS_ERR);
  a.qp_state = IBV_QPS_RESET;
  ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE), 0);
  EXPECT_EQ(StateOf(qp), IBV_QPS_RESET);
  EXPECT_EQ(qp->state, IBV_QPS_RESET);
  EXPECT_EQ(BringUp(qp, o, peer), 0);
  EXPECT_EQ(StateOf(qp), IBV_QPS_RTS);

  // INIT -> ERR and INIT -> INIT are legal too.
  Qp* q2 = v.NewQp(o);
  ASSERT_NE(q2, nullptr);
  ASSERT_EQ(ToInit(q2->qp, o), 0);
  a = {};
  a.qp_state = IBV_QPS_INIT;
  a.qkey = 7;
  a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE;
  ASSERT_EQ(ibv_modify_qp(q2->qp, &a,
                          IBV_QP_STATE | (t == IBV_QPT_UD ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS)),
            0);
  EXPECT_EQ(StateOf(q2->qp), IBV_QPS_INIT);
  ASSERT_EQ(ToErr(q2->qp), 0);
  EXPECT_EQ(StateOf(q2->qp), IBV_QPS_ERR);
}

// What a C program can store in an enum field (C++ code may not form such enum values).
template <typename E>
void SetRaw(E* field, int v) {
  static_assert(sizeof(E) == sizeof(int));
  std::memcpy(field, &v, sizeof v);
}

struct BadCase {
  const char* what;
  ibv_qp_state from;
  ibv_qp_state to;
  int mask;
  void (*tweak)(ibv_qp_attr&);
  unsigned types;  // bit 0 RC, 1 UC, 2 UD
};
constexpr unsigned kRc = 1, kUc = 2, kUd = 4, kAll = 7, kConn = kRc | kUc;

unsigned Bit(ibv_qp_type t) {
  return t == IBV_QPT_RC ? kRc : t == IBV_QPT_UC ? kUc : kUd;
}

TEST_P(QpStateTest, IllegalModifyIsEinvalAndChangesNothing) {
  const ibv_qp_type t = GetParam();
  const int init = InitMask(t), rtr = RtrMask(t), rts = RtsMask(t);
  const int rc_rtr_only = IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  const BadCase cases[] = {
      // Illegal state pairs, each with the mask the target state would normally take.
      {"RESET->RTR", IBV_QPS_RESET, IBV_QPS_RTR, rtr, nullptr, kAll},
      {"RESET->RTS", IBV_QPS_RESET, IBV_QPS_RTS, rts, nullptr, kAll},
      {"RESET->SQD", IBV_QPS_RESET, IBV_QPS_SQD, IBV_QP_STATE, nullptr, kAll},
      {"INIT->RTS", IBV_QPS_INIT, IBV_QPS_RTS, rts, nullptr, kAll},
      {"INIT->SQD", IBV_QPS_INIT, IBV_QPS_SQD, IBV_QP_STATE, nullptr, kAll},
      {"RTR->INIT", IBV_QPS_RTR, IBV_QPS_INIT, init, nullptr, kAll},
      {"RTR->RTR", IBV_QPS_RTR, IBV_QPS_RTR, IBV_QP_STATE, nullptr, kAll},
      {"RTR->SQD", IBV_QPS_RTR, IBV_QPS_SQD, IBV_QP_STATE, nullptr, kAll},
      {"RTS->INIT", IBV_QPS_RTS, IBV_QPS_INIT, init, nullptr, kAll},
      {"RTS->RTR", IBV_QPS_RTS, IBV_QPS_RTR, rtr, nullptr, kAll},
      {"SQD->RTR", IBV_QPS_SQD, IBV_QPS_RTR, rtr, nullptr, kAll},
      {"SQD->INIT", IBV_QPS_SQD, IBV_QPS_INIT, init, nullptr, kAll},
      {"ERR->INIT", IBV_QPS_ERR, IBV_QPS_INIT, init, nullptr, kAll},
      {"ERR->RTR", IBV_QPS_ERR, IBV_QPS_RTR, rtr, nullptr, kAll},
      {"ERR->RTS", IBV_QPS_ERR, IBV_QPS_RTS, rts, nullptr, kAll},
      {"ERR->SQD", IBV_QPS_ERR, IBV_QPS_SQD, IBV_QP_STATE, nullptr, kAll},
      // Missing required bits.
      {"RESET->INIT without PKEY_INDEX", IBV_QPS_RESET, IBV_QPS_INIT, init & ~IBV_QP_PKEY_INDEX,
       nullptr, kAll},
      {"RESET->INIT without PORT", IBV_QPS_RESET, IBV_QPS_INIT, init & ~IBV_QP_PORT, nullptr, kAll},
      {"RESET->INIT without ACCESS_FLAGS", IBV_QPS_RESET, IBV_QPS_INIT, init & ~IBV_QP_ACCESS_FLAGS,
       nullptr, kConn},
      {"RESET->INIT without QKEY", IBV_QPS_RESET, IBV_QPS_INIT, init & ~IBV_QP_QKEY, nullptr, kUd},
      {"INIT->RTR without AV", IBV_QPS_INIT, IBV_QPS_RTR, rtr & ~IBV_QP_AV, nullptr, kConn},
      {"INIT->RTR without PATH_MTU", IBV_QPS_INIT, IBV_QPS_RTR, rtr & ~IBV_QP_PATH_MTU, nullptr,
       kConn},
      {"INIT->RTR without DEST_QPN", IBV_QPS_INIT, IBV_QPS_RTR, rtr & ~IBV_QP_DEST_QPN, nullptr,
       kConn},
      {"INIT->RTR without RQ_PSN", IBV_QPS_INIT, IBV_QPS_RTR, rtr & ~IBV_QP_RQ_PSN, nullptr, kConn},
      {"INIT->RTR without MAX_DEST_RD_ATOMIC", IBV_QPS_INIT, IBV_QPS_RTR,
       rtr & ~IBV_QP_MAX_DEST_RD_ATOMIC, nullptr, kRc},
      {"INIT->RTR without MIN_RNR_TIMER", IBV_QPS_INIT, IBV_QPS_RTR, rtr & ~IBV_QP_MIN_RNR_TIMER,
       nullptr, kRc},
      {"RTR->RTS without SQ_PSN", IBV_QPS_RTR, IBV_QPS_RTS, rts & ~IBV_QP_SQ_PSN, nullptr, kAll},
      {"RTR->RTS without TIMEOUT", IBV_QPS_RTR, IBV_QPS_RTS, rts & ~IBV_QP_TIMEOUT, nullptr, kRc},
      {"RTR->RTS without RETRY_CNT", IBV_QPS_RTR, IBV_QPS_RTS, rts & ~IBV_QP_RETRY_CNT, nullptr,
       kRc},
      {"RTR->RTS without RNR_RETRY", IBV_QPS_RTR, IBV_QPS_RTS, rts & ~IBV_QP_RNR_RETRY, nullptr,
       kRc},
      {"RTR->RTS without MAX_QP_RD_ATOMIC", IBV_QPS_RTR, IBV_QPS_RTS,
       rts & ~IBV_QP_MAX_QP_RD_ATOMIC, nullptr, kRc},
      // Extra bits the transition does not take.
      {"RESET->INIT with QKEY", IBV_QPS_RESET, IBV_QPS_INIT, init | IBV_QP_QKEY, nullptr, kConn},
      {"RESET->INIT with ACCESS_FLAGS", IBV_QPS_RESET, IBV_QPS_INIT, init | IBV_QP_ACCESS_FLAGS,
       nullptr, kUd},
      {"RESET->INIT with AV", IBV_QPS_RESET, IBV_QPS_INIT, init | IBV_QP_AV, nullptr, kAll},
      {"RESET->INIT with SQ_PSN", IBV_QPS_RESET, IBV_QPS_INIT, init | IBV_QP_SQ_PSN, nullptr, kAll},
      {"RESET->INIT with CUR_STATE", IBV_QPS_RESET, IBV_QPS_INIT, init | IBV_QP_CUR_STATE,
       [](ibv_qp_attr& a) { a.cur_qp_state = IBV_QPS_RESET; }, kAll},
      {"INIT->RTR with SQ_PSN", IBV_QPS_INIT, IBV_QPS_RTR, rtr | IBV_QP_SQ_PSN, nullptr, kAll},
      {"INIT->RTR with TIMEOUT", IBV_QPS_INIT, IBV_QPS_RTR, rtr | IBV_QP_TIMEOUT, nullptr, kAll},
      {"INIT->RTR with MAX_DEST_RD_ATOMIC", IBV_QPS_INIT, IBV_QPS_RTR, rtr | rc_rtr_only, nullptr,
       kUc | kUd},
      {"INIT->RTR with AV", IBV_QPS_INIT, IBV_QPS_RTR, rtr | IBV_QP_AV | IBV_QP_DEST_QPN, nullptr,
       kUd},
      {"RTR->RTS with PATH_MTU", IBV_QPS_RTR, IBV_QPS_RTS, rts | IBV_QP_PATH_MTU, nullptr, kAll},
      {"RTR->RTS with RQ_PSN", IBV_QPS_RTR, IBV_QPS_RTS, rts | IBV_QP_RQ_PSN, nullptr, kAll},
      {"RTR->RTS with TIMEOUT", IBV_QPS_RTR, IBV_QPS_RTS, rts | IBV_QP_TIMEOUT, nullptr, kUc | kUd},
      {"RTS->RTS with PATH_MTU", IBV_QPS_RTS, IBV_QPS_RTS,
       IBV_QP_STATE | IBV_QP_PATH_MTU | (t == IBV_QPT_RC ? IBV_QP_MIN_RNR_TIMER : 0),
       [](ibv_qp_attr& a) { a.min_rnr_timer = 30; }, kAll},
      {"RTS->RTS with SQ_PSN", IBV_QPS_RTS, IBV_QPS_RTS, IBV_QP_STATE | IBV_QP_SQ_PSN, nullptr,
       kAll},
      {"RTS->RTS with DEST_QPN", IBV_QPS_RTS, IBV_QPS_RTS, IBV_QP_STATE | IBV_QP_DEST_QPN, nullptr,
       kAll},
      {"ERR->RESET with PORT", IBV_QPS_ERR, IBV_QPS_RESET, IBV_QP_STATE | IBV_QP_PORT, nullptr,
       kAll},
      // Attribute bits without IBV_QP_STATE: an in-place modify those states do not allow.
      {"RESET in place with PORT", IBV_QPS_RESET, IBV_QPS_RESET, IBV_QP_PORT, nullptr, kAll},
      {"RTR in place with RQ_PSN", IBV_QPS_RTR, IBV_QPS_RTR, IBV_QP_RQ_PSN, nullptr, kAll},
      // Wrong claim about the current state.
      {"RTS->RTS claiming RTR", IBV_QPS_RTS, IBV_QPS_RTS, IBV_QP_STATE | IBV_QP_CUR_STATE,
       [](ibv_qp_attr& a) { a.cur_qp_state = IBV_QPS_RTR; }, kAll},
      // Right mask, bad values.
      {"RESET->INIT port 2", IBV_QPS_RESET, IBV_QPS_INIT, init,
       [](ibv_qp_attr& a) { a.port_num = 2; }, kAll},
      {"RESET->INIT pkey index 5", IBV_QPS_RESET, IBV_QPS_INIT, init,
       [](ibv_qp_attr& a) { a.pkey_index = 5; }, kAll},
      {"RESET->INIT state 42", IBV_QPS_RESET, IBV_QPS_INIT, init,
       [](ibv_qp_attr& a) { SetRaw(&a.qp_state, 42); }, kAll},
      {"RTS->RTS claiming state -1", IBV_QPS_RTS, IBV_QPS_RTS, IBV_QP_STATE | IBV_QP_CUR_STATE,
       [](ibv_qp_attr& a) { SetRaw(&a.cur_qp_state, -1); }, kAll},
      {"RTS->RTS path_mig_state 9", IBV_QPS_RTS, IBV_QPS_RTS, IBV_QP_STATE | IBV_QP_PATH_MIG_STATE,
       [](ibv_qp_attr& a) { SetRaw(&a.path_mig_state, 9); }, kConn},
      {"INIT->RTR MTU 7", IBV_QPS_INIT, IBV_QPS_RTR, rtr,
       [](ibv_qp_attr& a) { SetRaw(&a.path_mtu, 7); }, kConn},
      {"INIT->RTR MTU 1000", IBV_QPS_INIT, IBV_QPS_RTR, rtr,
       [](ibv_qp_attr& a) { SetRaw(&a.path_mtu, 1000); }, kConn},
      {"RTR->RTS rnr_retry 8", IBV_QPS_RTR, IBV_QPS_RTS, rts,
       [](ibv_qp_attr& a) { a.rnr_retry = 8; }, kRc},
      {"RTR->RTS retry_cnt 8", IBV_QPS_RTR, IBV_QPS_RTS, rts,
       [](ibv_qp_attr& a) { a.retry_cnt = 8; }, kRc},
  };
  for (const BadCase& c : cases) {
    if (!(c.types & Bit(t))) continue;
    SCOPED_TRACE(std::string(TypeName(t)) + ": " + c.what);
    Qp* q = v.NewQp(Opts());
    ASSERT_NE(q, nullptr);
    Advance(q->qp, c.from);
    ASSERT_EQ(StateOf(q->qp), c.from);
    Snapshot before = Snap(q->qp);
    ibv_qp_attr a = FullAttr(Opts(), Peer(), c.to);
    a.cur_qp_state = c.from;
    // Values that differ from what the QP holds, so a partial apply would show.
    a.qkey = 0x5555;
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
    a.sq_psn = 0x777;
    a.rq_psn = 0x888;
    a.dest_qp_num = 0x4321;
    a.timeout = 3;
    if (c.tweak) c.tweak(a);
    EXPECT_EQ(ibv_modify_qp(q->qp, &a, c.mask), EINVAL);
    EXPECT_EQ(StateOf(q->qp), c.from);
    EXPECT_EQ(q->qp->state, c.from);
    EXPECT_TRUE(Snap(q->qp) == before) << "a refused modify changed attributes";
    ASSERT_EQ(v.DestroyQp(q), 0);
  }
}

TEST_P(QpStateTest, PostingIsRefusedWhereTheStateDoesNotAllowIt) {
  QpOpts o = Opts();
  Qp* q = v.NewQp(o);
  ASSERT_NE(q, nullptr);
  Buffer* buf = Buf(64);
  ASSERT_NE(buf, nullptr);
  // A UD send needs an AH: give it a valid one so only the state matters.
  ibv_ah* ah = v.AhTo(v.RemoteOf(q), false);
  ASSERT_NE(ah, nullptr);

  auto try_send = [&](ibv_qp_state s) {
    SCOPED_TRACE(std::string("post_send in state ") + std::to_string(s));
    ibv_sge sge = buf->Sge(0, 16);
    ibv_send_wr wr{};
    wr.wr_id = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.wr.ud.ah = ah;
    wr.wr.ud.remote_qpn = q->qpn();
    wr.wr.ud.remote_qkey = o.qkey;
    ibv_send_wr* bad = nullptr;
    EXPECT_EQ(ibv_post_send(q->qp, &wr, &bad), EINVAL);
    EXPECT_EQ(bad, &wr);
  };
  auto try_recv = [&](int expect) {
    ibv_sge sge = buf->Sge(0, 64);
    ibv_recv_wr wr{};
    wr.wr_id = 2;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    EXPECT_EQ(ibv_post_recv(q->qp, &wr, &bad), expect);
    if (expect) {
      EXPECT_EQ(bad, &wr);
    }
  };

  try_send(IBV_QPS_RESET);
  try_recv(EINVAL);
  ASSERT_EQ(ToInit(q->qp, o), 0);
  try_send(IBV_QPS_INIT);
  try_recv(0);  // receives may be posted from INIT on
  ASSERT_EQ(ToRtr(q->qp, o, Peer()), 0);
  try_send(IBV_QPS_RTR);
  try_recv(0);
  // Back to RESET: the posted receives vanish without completions, posting is refused again.
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RESET;
  ASSERT_EQ(ibv_modify_qp(q->qp, &a, IBV_QP_STATE), 0);
  try_recv(EINVAL);
  try_send(IBV_QPS_RESET);
  EXPECT_TRUE(Drain(q->rcq).empty()) << "RESET must discard receives without completing them";
  EXPECT_TRUE(Drain(q->scq, milliseconds(1)).empty());
}

INSTANTIATE_TEST_SUITE_P(AllTypes, QpStateTest,
                         ::testing::Values(IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD),
                         [](const auto& info) { return std::string(TypeName(info.param)); });

using QpPosting = VerbsTest;

// A QP moved to RESET takes its completions not yet polled with it, flushes included, as mlx4 and
// mlx5 clean their CQs: brought back from the error state, it must not meet the flushes of
// before (pyverbs' test_mr_rereg_pd). Another QP's completions on the same CQ stay, in order.
TEST_F(QpPosting, AQpResetTakesItsUnpolledCompletionsWithIt) {
  QpOpts o;
  o.send_cq = o.recv_cq = v.NewCq(64);
  ASSERT_NE(o.send_cq, nullptr);
  Qp* reset = v.NewQp(o);
  Qp* other = v.NewQp(o);
  ASSERT_TRUE(reset && other);
  Buffer* buf = Buf(4096);
  ASSERT_EQ(ToInit(reset->qp, o), 0);
  ASSERT_EQ(ToInit(other->qp, o), 0);
  ASSERT_EQ(PostRecv(other->qp, *buf, 0, 64, 21), 0);
  ASSERT_EQ(PostRecv(reset->qp, *buf, 64, 64, 11), 0);
  ASSERT_EQ(PostRecv(other->qp, *buf, 128, 64, 22), 0);
  ASSERT_EQ(PostRecv(reset->qp, *buf, 192, 64, 12), 0);
  // The error state flushes both QPs' receives into the shared CQ, interleaved.
  ASSERT_EQ(ToErr(other->qp), 0);
  ASSERT_EQ(ToErr(reset->qp), 0);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RESET;
  ASSERT_EQ(ibv_modify_qp(reset->qp, &a, IBV_QP_STATE), 0);
  const std::vector<ibv_wc> left = Drain(o.send_cq, milliseconds(1));
  ASSERT_EQ(left.size(), 2u) << "the reset QP's flushes stayed in the CQ";
  EXPECT_EQ(left[0].wr_id, 21u);
  EXPECT_EQ(left[1].wr_id, 22u);
  for (const ibv_wc& wc : left) {
    EXPECT_EQ(wc.qp_num, other->qp->qp_num);
    EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
  }
}

// ibv_post_send(3): processing stops at the first WR that fails; those before it are posted (and
// executed), those after are not.
TEST_F(QpPosting, PostSendChainStopsAtFirstBadWrAndRunsTheOnesBefore) {
  QpOpts o;
  Qp *a, *b;
  Pair(o, &a, &b);
  Buffer* buf = Buf(4096);
  for (int i = 0; i < 4; ++i) ASSERT_EQ(PostRecv(b->qp, *buf, 1024 + i * 256, 256, 100 + i), 0);

  ibv_sge sge = buf->Sge(0, 32);
  ibv_sge many[8];
  for (auto& s : many) s = buf->Sge(0, 8);
  ibv_send_wr wr[3]{};
  for (int i = 0; i < 3; ++i) {
    wr[i].wr_id = 1 + i;
    wr[i].opcode = IBV_WR_SEND;
    wr[i].send_flags = IBV_SEND_SIGNALED;
    wr[i].sg_list = &sge;
    wr[i].num_sge = 1;
    wr[i].next = i < 2 ? &wr[i + 1] : nullptr;
  }
  wr[1].sg_list = many;
  wr[1].num_sge = 8;  // more than max_send_sge (4)
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_send(a->qp, wr, &bad), EINVAL);
  EXPECT_EQ(bad, &wr[1]);

  ibv_wc wc;
  ASSERT_TRUE(PollOne(a->scq, &wc)) << "the WR before the bad one was never executed";
  EXPECT_EQ(wc.wr_id, 1u);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  ASSERT_TRUE(PollOne(b->rcq, &wc));
  EXPECT_EQ(wc.wr_id, 100u);
  EXPECT_EQ(wc.byte_len, 32u);
  EXPECT_TRUE(Drain(a->scq).empty()) << "a WR after the bad one ran";
  EXPECT_TRUE(Drain(b->rcq, milliseconds(1)).empty());
}

// IBV_SEND_INLINE: the data is taken at post time, from memory that needs no MR (lkey ignored).
TEST_F(QpPosting, InlineSendCopiesTheDataAtPostTime) {
  Qp *a, *b;
  Pair(QpOpts{}, &a, &b);
  Buffer* rbuf = Buf(1024);
  ASSERT_EQ(PostRecv(b->qp, *rbuf, 0, 1024, 1), 0);
  uint8_t stack[48];
  for (int i = 0; i < 48; ++i) stack[i] = static_cast<uint8_t>(i + 100);
  SendArgs s;
  s.wr_id = 2;
  s.flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  s.sges = {ibv_sge{reinterpret_cast<uintptr_t>(stack), 20, 0},
            ibv_sge{reinterpret_cast<uintptr_t>(stack + 20), 28, 0xdeadbeef}};
  ASSERT_EQ(Post(a->qp, s), 0);
  std::memset(stack, 0, sizeof stack);
  ibv_wc wc;
  ASSERT_TRUE(PollOne(a->scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
  ASSERT_TRUE(PollOne(b->rcq, &wc));
  EXPECT_EQ(wc.byte_len, 48u);
  for (int i = 0; i < 48; ++i) EXPECT_EQ(rbuf->data()[i], i + 100) << i;
}

// An inline SEND of nothing, as pieces without any buffer (address 0), on a QP created without
// inline room: a valid empty message. The queue's path copied each piece with memcpy, from and
// to null pointers (UBSan: "null pointer passed as argument"); the direct paths skipped them.
TEST_F(QpPosting, AnInlineSendOfEmptyPiecesWithoutInlineRoomArrivesEmpty) {
  QpOpts o;
  o.max_inline = 0;
  Qp *a, *b;
  Pair(o, &a, &b);
  Buffer* rbuf = Buf(64);
  ASSERT_EQ(PostRecv(b->qp, *rbuf, 0, 64, 1), 0);
  SendArgs s;
  s.wr_id = 3;
  s.flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  s.sges = {ibv_sge{0, 0, 0}, ibv_sge{0, 0, 0}};
  ASSERT_EQ(Post(a->qp, s), 0);
  ibv_wc wc;
  ASSERT_TRUE(PollOne(a->scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
  EXPECT_EQ(wc.wr_id, 3u);
  ASSERT_TRUE(PollOne(b->rcq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
  EXPECT_EQ(wc.byte_len, 0u);
}

// SQD: the send queue drains (IBV_EVENT_SQ_DRAINED when asked for), WRs posted meanwhile are
// accepted but wait, and start when the QP returns to RTS.
TEST_F(QpPosting, SqdHoldsNewSendsUntilBackInRts) {
  Qp *a, *b;
  Pair(QpOpts{}, &a, &b);
  Buffer* buf = Buf(4096);
  ASSERT_EQ(PostRecv(b->qp, *buf, 1024, 64, 1), 0);
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_SQD;
  attr.en_sqd_async_notify = 1;
  ASSERT_EQ(ibv_modify_qp(a->qp, &attr, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY), 0);
  ibv_async_event e{};
  ASSERT_TRUE(NextAsyncEvent(v.ctx, &e)) << "no IBV_EVENT_SQ_DRAINED";
  EXPECT_EQ(e.event_type, IBV_EVENT_SQ_DRAINED) << ibv_event_type_str(e.event_type);
  EXPECT_EQ(e.element.qp, a->qp);
  ibv_ack_async_event(&e);
  EXPECT_EQ(StateOf(a->qp), IBV_QPS_SQD);

  ASSERT_EQ(PostSendMsg(a->qp, *buf, 0, 16, 7), 0);
  EXPECT_TRUE(Drain(a->scq).empty()) << "a WR started in SQD";
  EXPECT_TRUE(Drain(b->rcq, milliseconds(1)).empty());
  attr.qp_state = IBV_QPS_RTS;
  ASSERT_EQ(ibv_modify_qp(a->qp, &attr, IBV_QP_STATE), 0);
  ibv_wc wc;
  ASSERT_TRUE(PollOne(a->scq, &wc));
  EXPECT_EQ(wc.wr_id, 7u);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  ASSERT_TRUE(PollOne(b->rcq, &wc));
  EXPECT_EQ(wc.byte_len, 16u);
}

}  // namespace
}  // namespace semantics
