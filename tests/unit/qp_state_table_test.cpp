// Tests for the ibv_modify_qp() state/attribute-mask rule table.
//
// The expectations below are written out per QP type (the implementation is organised per
// transition), so the two are independent descriptions of the same rules.
#include "core/qp_state_table.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdint>
#include <string>
#include <vector>

namespace softrdma::core {
namespace {

constexpr int S = IBV_QP_STATE;

struct Legal {
  ibv_qp_type type;
  ibv_qp_state cur;
  ibv_qp_state next;
  int required;  // excluding IBV_QP_STATE
  int optional;
};

const ibv_qp_type kTypes[] = {IBV_QPT_RC,       IBV_QPT_UC,       IBV_QPT_UD,
                              IBV_QPT_XRC_SEND, IBV_QPT_XRC_RECV, IBV_QPT_RAW_PACKET};
const ibv_qp_state kStates[] = {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS,
                                IBV_QPS_SQD,   IBV_QPS_SQE,  IBV_QPS_ERR};

const char* TypeName(ibv_qp_type t) {
  switch (t) {
    case IBV_QPT_RC:
      return "RC";
    case IBV_QPT_UC:
      return "UC";
    case IBV_QPT_UD:
      return "UD";
    case IBV_QPT_XRC_SEND:
      return "XRC_SEND";
    case IBV_QPT_XRC_RECV:
      return "XRC_RECV";
    case IBV_QPT_RAW_PACKET:
      return "RAW_PACKET";
    default:
      return "?";
  }
}

std::string Describe(ibv_qp_type t, ibv_qp_state cur, ibv_qp_state next) {
  return std::string(TypeName(t)) + " " + QpStateName(cur) + "->" + QpStateName(next);
}

// Per-type transition lists, straight from IBA chapter 11 / what the kernel accepts.
std::vector<Legal> ForType(ibv_qp_type t, std::vector<Legal> rows) {
  // Every type may always go to RESET or ERR from anywhere (including RESET and ERR themselves),
  // with no attributes.
  for (ibv_qp_state s : kStates) {
    rows.push_back({t, s, IBV_QPS_RESET, 0, 0});
    rows.push_back({t, s, IBV_QPS_ERR, 0, 0});
  }
  for (Legal& r : rows) r.type = t;
  return rows;
}

std::vector<Legal> AllLegal() {
  const int cur = IBV_QP_CUR_STATE;
  const int rc_rts_req = IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                         IBV_QP_MAX_QP_RD_ATOMIC;
  const int uc_rtr_req = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
  const int rc_rtr_req = uc_rtr_req | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  const int conn_init = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  const int conn_rtr_opt = IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX;
  const int uc_rts_opt = cur | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE;
  const int rc_rts_opt = uc_rts_opt | IBV_QP_MIN_RNR_TIMER;
  const int ud_rts_opt = cur | IBV_QP_QKEY;
  const int uc_sqd_opt =
      IBV_QP_AV | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_PATH_MIG_STATE;
  const int notify = IBV_QP_EN_SQD_ASYNC_NOTIFY;

  std::vector<Legal> all;
  auto add = [&all](const std::vector<Legal>& v) { all.insert(all.end(), v.begin(), v.end()); };

  add(ForType(IBV_QPT_RC,
              {
                  {{}, IBV_QPS_RESET, IBV_QPS_INIT, conn_init, 0},
                  {{}, IBV_QPS_INIT, IBV_QPS_INIT, 0, conn_init},
                  {{}, IBV_QPS_INIT, IBV_QPS_RTR, rc_rtr_req, conn_rtr_opt},
                  {{}, IBV_QPS_RTR, IBV_QPS_RTS, rc_rts_req, rc_rts_opt},
                  {{}, IBV_QPS_RTS, IBV_QPS_RTS, 0, rc_rts_opt},
                  {{}, IBV_QPS_RTS, IBV_QPS_SQD, 0, notify},
                  {{}, IBV_QPS_SQD, IBV_QPS_RTS, 0, rc_rts_opt},
                  {{},
                   IBV_QPS_SQD,
                   IBV_QPS_SQD,
                   0,
                   uc_sqd_opt | IBV_QP_PORT | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                       IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER},
              }));
  add(ForType(IBV_QPT_UC, {
                              {{}, IBV_QPS_RESET, IBV_QPS_INIT, conn_init, 0},
                              {{}, IBV_QPS_INIT, IBV_QPS_INIT, 0, conn_init},
                              {{}, IBV_QPS_INIT, IBV_QPS_RTR, uc_rtr_req, conn_rtr_opt},
                              {{}, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QP_SQ_PSN, uc_rts_opt},
                              {{}, IBV_QPS_RTS, IBV_QPS_RTS, 0, uc_rts_opt},
                              {{}, IBV_QPS_RTS, IBV_QPS_SQD, 0, notify},
                              {{}, IBV_QPS_SQD, IBV_QPS_RTS, 0, uc_rts_opt},
                              {{}, IBV_QPS_SQD, IBV_QPS_SQD, 0, uc_sqd_opt},
                              {{}, IBV_QPS_SQE, IBV_QPS_RTS, 0, cur | IBV_QP_ACCESS_FLAGS},
                          }));
  add(ForType(
      IBV_QPT_UD,
      {
          {{}, IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY, 0},
          {{}, IBV_QPS_INIT, IBV_QPS_INIT, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY},
          {{}, IBV_QPS_INIT, IBV_QPS_RTR, 0, IBV_QP_PKEY_INDEX | IBV_QP_QKEY},
          {{}, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QP_SQ_PSN, ud_rts_opt},
          {{}, IBV_QPS_RTS, IBV_QPS_RTS, 0, ud_rts_opt},
          {{}, IBV_QPS_RTS, IBV_QPS_SQD, 0, notify},
          {{}, IBV_QPS_SQD, IBV_QPS_RTS, 0, ud_rts_opt},
          {{}, IBV_QPS_SQD, IBV_QPS_SQD, 0, IBV_QP_PKEY_INDEX | IBV_QP_QKEY},
          {{}, IBV_QPS_SQE, IBV_QPS_RTS, 0, ud_rts_opt},
      }));
  add(ForType(IBV_QPT_XRC_SEND, {
                                    {{}, IBV_QPS_RESET, IBV_QPS_INIT, conn_init, 0},
                                    {{}, IBV_QPS_INIT, IBV_QPS_INIT, 0, conn_init},
                                    {{}, IBV_QPS_INIT, IBV_QPS_RTR, uc_rtr_req, conn_rtr_opt},
                                    {{}, IBV_QPS_RTR, IBV_QPS_RTS, rc_rts_req, uc_rts_opt},
                                    {{}, IBV_QPS_RTS, IBV_QPS_RTS, 0, uc_rts_opt},
                                    {{}, IBV_QPS_RTS, IBV_QPS_SQD, 0, notify},
                                    {{}, IBV_QPS_SQD, IBV_QPS_RTS, 0, uc_rts_opt},
                                    {{},
                                     IBV_QPS_SQD,
                                     IBV_QPS_SQD,
                                     0,
                                     uc_sqd_opt | IBV_QP_PORT | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                         IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC},
                                }));
  add(ForType(IBV_QPT_XRC_RECV,
              {
                  {{}, IBV_QPS_RESET, IBV_QPS_INIT, conn_init, 0},
                  {{}, IBV_QPS_INIT, IBV_QPS_INIT, 0, conn_init},
                  {{}, IBV_QPS_INIT, IBV_QPS_RTR, rc_rtr_req, conn_rtr_opt},
                  {{}, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QP_TIMEOUT | IBV_QP_SQ_PSN, rc_rts_opt},
                  {{}, IBV_QPS_RTS, IBV_QPS_RTS, 0, rc_rts_opt},
                  {{}, IBV_QPS_RTS, IBV_QPS_SQD, 0, notify},
                  {{}, IBV_QPS_SQD, IBV_QPS_RTS, 0, rc_rts_opt},
                  {{},
                   IBV_QPS_SQD,
                   IBV_QPS_SQD,
                   0,
                   uc_sqd_opt | IBV_QP_PORT | IBV_QP_TIMEOUT | IBV_QP_MAX_DEST_RD_ATOMIC |
                       IBV_QP_MIN_RNR_TIMER},
              }));
  add(ForType(IBV_QPT_RAW_PACKET, {
                                      {{}, IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_PORT, 0},
                                      {{}, IBV_QPS_INIT, IBV_QPS_INIT, 0, 0},
                                      {{}, IBV_QPS_INIT, IBV_QPS_RTR, 0, 0},
                                      {{}, IBV_QPS_RTR, IBV_QPS_RTS, 0, IBV_QP_RATE_LIMIT},
                                      {{}, IBV_QPS_RTS, IBV_QPS_RTS, 0, IBV_QP_RATE_LIMIT},
                                      {{}, IBV_QPS_RTS, IBV_QPS_SQD, 0, 0},
                                      {{}, IBV_QPS_SQD, IBV_QPS_RTS, 0, 0},
                                      {{}, IBV_QPS_SQD, IBV_QPS_SQD, 0, 0},
                                      {{}, IBV_QPS_SQE, IBV_QPS_RTS, 0, 0},
                                  }));
  return all;
}

const Legal* FindLegal(const std::vector<Legal>& all, ibv_qp_type t, ibv_qp_state cur,
                       ibv_qp_state next) {
  for (const Legal& l : all) {
    if (l.type == t && l.cur == cur && l.next == next) return &l;
  }
  return nullptr;
}

// Shorthand: an explicit state change, with CUR_STATE (if present in mask) claiming the truth.
int Check(ibv_qp_type t, ibv_qp_state cur, ibv_qp_state next, int mask) {
  return CheckQpTransition(t, cur, next, mask, cur);
}

TEST(QpStateTableTest, ExpectationListHasNoDuplicates) {
  const auto all = AllLegal();
  for (size_t i = 0; i < all.size(); ++i) {
    for (size_t j = i + 1; j < all.size(); ++j) {
      EXPECT_FALSE(all[i].type == all[j].type && all[i].cur == all[j].cur &&
                   all[i].next == all[j].next)
          << Describe(all[i].type, all[i].cur, all[i].next);
    }
  }
}

TEST(QpStateTableTest, ExactlyRequiredMaskIsAccepted) {
  for (const Legal& l : AllLegal()) {
    SCOPED_TRACE(Describe(l.type, l.cur, l.next));
    EXPECT_EQ(0, Check(l.type, l.cur, l.next, S | l.required));
  }
}

TEST(QpStateTableTest, MissingRequiredBitIsRejected) {
  for (const Legal& l : AllLegal()) {
    for (int bit = 0; bit < 32; ++bit) {
      const int b = static_cast<int>(1u << bit);
      if (!(l.required & b)) continue;
      SCOPED_TRACE(Describe(l.type, l.cur, l.next) + " without bit " + std::to_string(bit));
      EXPECT_EQ(EINVAL, Check(l.type, l.cur, l.next, (S | l.required) & ~b));
    }
  }
}

TEST(QpStateTableTest, ForeignBitIsRejected) {
  for (const Legal& l : AllLegal()) {
    for (int bit = 0; bit < 32; ++bit) {
      const int b = static_cast<int>(1u << bit);
      if ((S | l.required | l.optional) & b) continue;
      SCOPED_TRACE(Describe(l.type, l.cur, l.next) + " with bit " + std::to_string(bit));
      EXPECT_EQ(EINVAL, Check(l.type, l.cur, l.next, S | l.required | b));
      // Also with every optional bit present: a foreign bit still spoils the request.
      EXPECT_EQ(EINVAL, Check(l.type, l.cur, l.next, S | l.required | l.optional | b));
    }
  }
}

TEST(QpStateTableTest, AllOptionalBitsAreAccepted) {
  for (const Legal& l : AllLegal()) {
    SCOPED_TRACE(Describe(l.type, l.cur, l.next));
    EXPECT_EQ(0, Check(l.type, l.cur, l.next, S | l.required | l.optional));
    for (int bit = 0; bit < 32; ++bit) {
      const int b = static_cast<int>(1u << bit);
      if (!(l.optional & b)) continue;
      EXPECT_EQ(0, Check(l.type, l.cur, l.next, S | l.required | b)) << "bit " << bit;
    }
  }
}

TEST(QpStateTableTest, EveryUnlistedTransitionIsRejected) {
  const auto all = AllLegal();
  for (ibv_qp_type t : kTypes) {
    for (ibv_qp_state cur : kStates) {
      for (ibv_qp_state next : kStates) {
        if (FindLegal(all, t, cur, next)) continue;
        SCOPED_TRACE(Describe(t, cur, next));
        EXPECT_EQ(EINVAL, Check(t, cur, next, S));
        EXPECT_EQ(EINVAL, Check(t, cur, next, -1));  // every bit
        for (int bit = 1; bit < 32; ++bit) {
          EXPECT_EQ(EINVAL, Check(t, cur, next, S | static_cast<int>(1u << bit))) << bit;
        }
      }
    }
  }
}

TEST(QpStateTableTest, WellKnownIllegalTransitions) {
  for (ibv_qp_type t : kTypes) {
    SCOPED_TRACE(TypeName(t));
    EXPECT_EQ(EINVAL, Check(t, IBV_QPS_RESET, IBV_QPS_RTR, -1));
    EXPECT_EQ(EINVAL, Check(t, IBV_QPS_RESET, IBV_QPS_RTS, S));
    EXPECT_EQ(EINVAL, Check(t, IBV_QPS_INIT, IBV_QPS_RTS, -1));
    EXPECT_EQ(EINVAL, Check(t, IBV_QPS_RTR, IBV_QPS_SQD, S));
    EXPECT_EQ(EINVAL, Check(t, IBV_QPS_RTR, IBV_QPS_INIT, S));
    EXPECT_EQ(EINVAL, Check(t, IBV_QPS_RTS, IBV_QPS_RTR, S));
    EXPECT_EQ(EINVAL, Check(t, IBV_QPS_ERR, IBV_QPS_RTS, S));
    EXPECT_EQ(EINVAL, Check(t, IBV_QPS_ERR, IBV_QPS_INIT, S));
    // Nobody enters SQE by ibv_modify_qp(); it is reached only through a send error.
    for (ibv_qp_state cur : kStates) EXPECT_EQ(EINVAL, Check(t, cur, IBV_QPS_SQE, S));
  }
  // Reliable types never sit in SQE, so SQE->RTS is not theirs.
  EXPECT_EQ(EINVAL, Check(IBV_QPT_RC, IBV_QPS_SQE, IBV_QPS_RTS, S));
  EXPECT_EQ(EINVAL, Check(IBV_QPT_XRC_SEND, IBV_QPS_SQE, IBV_QPS_RTS, S));
  EXPECT_EQ(EINVAL, Check(IBV_QPT_XRC_RECV, IBV_QPS_SQE, IBV_QPS_RTS, S));
  EXPECT_EQ(0, Check(IBV_QPT_UD, IBV_QPS_SQE, IBV_QPS_RTS, S));
  EXPECT_EQ(0, Check(IBV_QPT_UC, IBV_QPS_SQE, IBV_QPS_RTS, S));
}

TEST(QpStateTableTest, NoStateBitMeansModifyInPlace) {
  // RC in RTS: MIN_RNR_TIMER / ACCESS_FLAGS / ALT_PATH may change in place, TIMEOUT may not
  // (timeout/retry parameters are only changeable in SQD).
  EXPECT_EQ(0, CheckQpTransition(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_RTS, IBV_QP_MIN_RNR_TIMER,
                                 IBV_QPS_RESET));
  EXPECT_EQ(0, CheckQpTransition(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_RTS,
                                 IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH, IBV_QPS_RESET));
  EXPECT_EQ(EINVAL,
            CheckQpTransition(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_RTS, IBV_QP_TIMEOUT, IBV_QPS_RESET));
  EXPECT_EQ(0,
            CheckQpTransition(IBV_QPT_RC, IBV_QPS_SQD, IBV_QPS_SQD, IBV_QP_TIMEOUT, IBV_QPS_RESET));
  EXPECT_EQ(0, CheckQpTransition(IBV_QPT_UD, IBV_QPS_RTS, IBV_QPS_RTS, IBV_QP_QKEY, IBV_QPS_RESET));
  EXPECT_EQ(0, CheckQpTransition(IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_INIT, IBV_QP_PKEY_INDEX,
                                 IBV_QPS_RESET));
  // Mask 0 is a no-op modify wherever cur->cur exists.
  EXPECT_EQ(0, CheckQpTransition(IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_RESET, 0, IBV_QPS_RESET));
  EXPECT_EQ(0, CheckQpTransition(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_RTS, 0, IBV_QPS_RESET));
  EXPECT_EQ(0, CheckQpTransition(IBV_QPT_RC, IBV_QPS_ERR, IBV_QPS_ERR, 0, IBV_QPS_RESET));
  // ... and is illegal where it does not (RTR->RTR, SQE->SQE).
  EXPECT_EQ(EINVAL, CheckQpTransition(IBV_QPT_RC, IBV_QPS_RTR, IBV_QPS_RTR, 0, IBV_QPS_RESET));
  EXPECT_EQ(EINVAL, CheckQpTransition(IBV_QPT_UD, IBV_QPS_SQE, IBV_QPS_SQE, 0, IBV_QPS_RESET));
  EXPECT_EQ(EINVAL, CheckQpTransition(IBV_QPT_RC, IBV_QPS_RTR, IBV_QPS_RTR, IBV_QP_MIN_RNR_TIMER,
                                      IBV_QPS_RESET));
  // Without IBV_QP_STATE, `next` must be `cur`.
  EXPECT_EQ(EINVAL, CheckQpTransition(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_ERR, 0, IBV_QPS_RESET));
  EXPECT_EQ(EINVAL,
            CheckQpTransition(IBV_QPT_UD, IBV_QPS_RESET, IBV_QPS_INIT,
                              IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY, IBV_QPS_RESET));
}

TEST(QpStateTableTest, CurStateMustMatch) {
  const int rts_cur = S | IBV_QP_CUR_STATE;
  EXPECT_EQ(0, CheckQpTransition(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_RTS, rts_cur, IBV_QPS_RTS));
  EXPECT_EQ(0, CheckQpTransition(IBV_QPT_UD, IBV_QPS_SQE, IBV_QPS_RTS, rts_cur, IBV_QPS_SQE));
  EXPECT_EQ(0, CheckQpTransition(IBV_QPT_RC, IBV_QPS_SQD, IBV_QPS_RTS, rts_cur, IBV_QPS_SQD));
  EXPECT_EQ(0, CheckQpTransition(IBV_QPT_UC, IBV_QPS_RTR, IBV_QPS_RTS, rts_cur | IBV_QP_SQ_PSN,
                                 IBV_QPS_RTR));
  // In-place modify with CUR_STATE and no STATE.
  EXPECT_EQ(0,
            CheckQpTransition(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_RTS, IBV_QP_CUR_STATE, IBV_QPS_RTS));

  // Mismatches, including the RTS/SQE pair in both directions: the claim must be the truth.
  EXPECT_EQ(EINVAL, CheckQpTransition(IBV_QPT_UD, IBV_QPS_RTS, IBV_QPS_RTS, rts_cur, IBV_QPS_SQE));
  EXPECT_EQ(EINVAL, CheckQpTransition(IBV_QPT_UD, IBV_QPS_SQE, IBV_QPS_RTS, rts_cur, IBV_QPS_RTS));
  EXPECT_EQ(EINVAL, CheckQpTransition(IBV_QPT_UC, IBV_QPS_SQE, IBV_QPS_RTS, rts_cur, IBV_QPS_RTS));
  EXPECT_EQ(EINVAL, CheckQpTransition(IBV_QPT_RC, IBV_QPS_SQD, IBV_QPS_RTS, rts_cur, IBV_QPS_RTS));
  EXPECT_EQ(EINVAL, CheckQpTransition(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_RTS, rts_cur, IBV_QPS_SQD));
  EXPECT_EQ(EINVAL,
            CheckQpTransition(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_RTS, rts_cur, IBV_QPS_UNKNOWN));

  // A correct claim is still refused where the IBA does not list CUR_STATE.
  EXPECT_EQ(EINVAL, CheckQpTransition(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_ERR, rts_cur, IBV_QPS_RTS));
  EXPECT_EQ(EINVAL, CheckQpTransition(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_SQD, rts_cur, IBV_QPS_RTS));
  EXPECT_EQ(EINVAL,
            CheckQpTransition(IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_INIT,
                              rts_cur | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
                              IBV_QPS_RESET));
  EXPECT_EQ(EINVAL,
            CheckQpTransition(IBV_QPT_RAW_PACKET, IBV_QPS_RTS, IBV_QPS_RTS, rts_cur, IBV_QPS_RTS));

  // Without the bit, claimed_cur is ignored.
  EXPECT_EQ(0, CheckQpTransition(IBV_QPT_UD, IBV_QPS_RTS, IBV_QPS_RTS, S, IBV_QPS_SQE));
  EXPECT_EQ(0, CheckQpTransition(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_ERR, S, IBV_QPS_UNKNOWN));
}

TEST(QpStateTableTest, RateLimitOnlyOnRawPacketIntoRts) {
  const int rl = IBV_QP_RATE_LIMIT;
  EXPECT_EQ(0, Check(IBV_QPT_RAW_PACKET, IBV_QPS_RTR, IBV_QPS_RTS, S | rl));
  EXPECT_EQ(0, Check(IBV_QPT_RAW_PACKET, IBV_QPS_RTS, IBV_QPS_RTS, S | rl));
  EXPECT_EQ(0, Check(IBV_QPT_RAW_PACKET, IBV_QPS_RTS, IBV_QPS_RTS, rl));
  EXPECT_EQ(EINVAL, Check(IBV_QPT_RAW_PACKET, IBV_QPS_SQD, IBV_QPS_RTS, S | rl));
  EXPECT_EQ(EINVAL, Check(IBV_QPT_RAW_PACKET, IBV_QPS_INIT, IBV_QPS_RTR, S | rl));
  for (ibv_qp_type t : {IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD, IBV_QPT_XRC_SEND, IBV_QPT_XRC_RECV}) {
    EXPECT_EQ(EINVAL, Check(t, IBV_QPS_RTS, IBV_QPS_RTS, S | rl)) << TypeName(t);
  }
}

TEST(QpStateTableTest, QpCapIsNeverAccepted) {
  const auto all = AllLegal();
  for (const Legal& l : all) {
    EXPECT_EQ(EINVAL, Check(l.type, l.cur, l.next, S | l.required | l.optional | IBV_QP_CAP))
        << Describe(l.type, l.cur, l.next);
  }
}

// The exact masks used by the rdma-core example programs shipped in Debian's ibverbs-utils.
TEST(QpStateTableTest, PingpongToolMasks) {
  // ibv_rc_pingpong / ibv_srq_pingpong
  EXPECT_EQ(0, Check(IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_INIT,
                     S | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
  EXPECT_EQ(0, Check(IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_RTR,
                     S | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                         IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER));
  EXPECT_EQ(0, Check(IBV_QPT_RC, IBV_QPS_RTR, IBV_QPS_RTS,
                     S | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                         IBV_QP_MAX_QP_RD_ATOMIC));
  // ibv_ud_pingpong
  EXPECT_EQ(0, Check(IBV_QPT_UD, IBV_QPS_RESET, IBV_QPS_INIT,
                     S | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY));
  EXPECT_EQ(0, Check(IBV_QPT_UD, IBV_QPS_INIT, IBV_QPS_RTR, S));
  EXPECT_EQ(0, Check(IBV_QPT_UD, IBV_QPS_RTR, IBV_QPS_RTS, S | IBV_QP_SQ_PSN));
  // ibv_uc_pingpong
  EXPECT_EQ(0, Check(IBV_QPT_UC, IBV_QPS_RESET, IBV_QPS_INIT,
                     S | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
  EXPECT_EQ(0, Check(IBV_QPT_UC, IBV_QPS_INIT, IBV_QPS_RTR,
                     S | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN));
  EXPECT_EQ(0, Check(IBV_QPT_UC, IBV_QPS_RTR, IBV_QPS_RTS, S | IBV_QP_SQ_PSN));
  // ibv_xsrq_pingpong: target (XRC_RECV) and initiator (XRC_SEND) halves.
  for (ibv_qp_type t : {IBV_QPT_XRC_RECV, IBV_QPT_XRC_SEND}) {
    EXPECT_EQ(0, Check(t, IBV_QPS_RESET, IBV_QPS_INIT,
                       S | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        << TypeName(t);
  }
  EXPECT_EQ(0, Check(IBV_QPT_XRC_RECV, IBV_QPS_INIT, IBV_QPS_RTR,
                     S | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                         IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER));
  EXPECT_EQ(0,
            Check(IBV_QPT_XRC_RECV, IBV_QPS_RTR, IBV_QPS_RTS, S | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN));
  EXPECT_EQ(0, Check(IBV_QPT_XRC_SEND, IBV_QPS_INIT, IBV_QPS_RTR,
                     S | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN));
  EXPECT_EQ(0, Check(IBV_QPT_XRC_SEND, IBV_QPS_RTR, IBV_QPS_RTS,
                     S | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                         IBV_QP_MAX_QP_RD_ATOMIC));
  // Teardown paths every tool relies on.
  for (ibv_qp_type t : kTypes) {
    EXPECT_EQ(0, Check(t, IBV_QPS_RTS, IBV_QPS_ERR, S)) << TypeName(t);
    EXPECT_EQ(0, Check(t, IBV_QPS_ERR, IBV_QPS_RESET, S)) << TypeName(t);
  }
}

TEST(QpStateTableTest, BadTypeOrStateIsRejected) {
  const ibv_qp_type bad_types[] = {static_cast<ibv_qp_type>(0), static_cast<ibv_qp_type>(1),
                                   static_cast<ibv_qp_type>(5), IBV_QPT_DRIVER};
  for (ibv_qp_type t : bad_types) {
    EXPECT_EQ(EINVAL, Check(t, IBV_QPS_RESET, IBV_QPS_RESET, S)) << static_cast<int>(t);
    EXPECT_EQ(EINVAL, Check(t, IBV_QPS_RTS, IBV_QPS_ERR, S)) << static_cast<int>(t);
  }
  for (ibv_qp_type t : kTypes) {
    EXPECT_EQ(EINVAL, Check(t, IBV_QPS_UNKNOWN, IBV_QPS_RESET, S)) << TypeName(t);
    EXPECT_EQ(EINVAL, Check(t, IBV_QPS_RTS, IBV_QPS_UNKNOWN, S)) << TypeName(t);
    EXPECT_EQ(EINVAL, Check(t, IBV_QPS_UNKNOWN, IBV_QPS_UNKNOWN, 0)) << TypeName(t);
  }
}

TEST(QpStateTableTest, StateNames) {
  EXPECT_STREQ("RESET", QpStateName(IBV_QPS_RESET));
  EXPECT_STREQ("INIT", QpStateName(IBV_QPS_INIT));
  EXPECT_STREQ("RTR", QpStateName(IBV_QPS_RTR));
  EXPECT_STREQ("RTS", QpStateName(IBV_QPS_RTS));
  EXPECT_STREQ("SQD", QpStateName(IBV_QPS_SQD));
  EXPECT_STREQ("SQE", QpStateName(IBV_QPS_SQE));
  EXPECT_STREQ("ERR", QpStateName(IBV_QPS_ERR));
  EXPECT_STREQ("UNKNOWN", QpStateName(IBV_QPS_UNKNOWN));
}

}  // namespace
}  // namespace softrdma::core
