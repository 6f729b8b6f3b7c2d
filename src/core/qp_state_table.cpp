#include "core/qp_state_table.h"

#include <array>
#include <cerrno>
#include <cstdint>

namespace softrdma::core {
namespace {

// ---- Vocabulary --------------------------------------------------------------------------------

constexpr int kNumStates = IBV_QPS_ERR + 1;  // IBV_QPS_UNKNOWN is not a state a QP can be in.

// Dense index for the QP types we implement.
enum TypeIndex : int { kRc, kUc, kUd, kXrcSend, kXrcRecv, kRawPacket, kNumTypes };

constexpr int TypeIndexOf(ibv_qp_type type) {
  switch (type) {
    case IBV_QPT_RC:
      return kRc;
    case IBV_QPT_UC:
      return kUc;
    case IBV_QPT_UD:
      return kUd;
    case IBV_QPT_XRC_SEND:
      return kXrcSend;
    case IBV_QPT_XRC_RECV:
      return kXrcRecv;
    case IBV_QPT_RAW_PACKET:
      return kRawPacket;
    default:
      return -1;
  }
}

// A set of QP types, one bit per TypeIndex.
using TypeSet = uint32_t;
constexpr TypeSet kRcT = 1u << kRc;
constexpr TypeSet kUcT = 1u << kUc;
constexpr TypeSet kUdT = 1u << kUd;
constexpr TypeSet kXrcSendT = 1u << kXrcSend;
constexpr TypeSet kXrcRecvT = 1u << kXrcRecv;
constexpr TypeSet kRawT = 1u << kRawPacket;
constexpr TypeSet kAllTypes = (1u << kNumTypes) - 1;
// Connected types that carry the full RC-style addressing attributes.
constexpr TypeSet kConnected = kRcT | kUcT | kXrcSendT | kXrcRecvT;

// Attribute-mask bits, as plain unsigned values (OR-ing enumerators would produce int and trip
// enum-conversion warnings).
constexpr uint32_t kState = IBV_QP_STATE;
constexpr uint32_t kCurState = IBV_QP_CUR_STATE;
constexpr uint32_t kSqdNotify = IBV_QP_EN_SQD_ASYNC_NOTIFY;
constexpr uint32_t kAccess = IBV_QP_ACCESS_FLAGS;
constexpr uint32_t kPkey = IBV_QP_PKEY_INDEX;
constexpr uint32_t kPort = IBV_QP_PORT;
constexpr uint32_t kQkey = IBV_QP_QKEY;
constexpr uint32_t kAv = IBV_QP_AV;
constexpr uint32_t kPathMtu = IBV_QP_PATH_MTU;
constexpr uint32_t kTimeout = IBV_QP_TIMEOUT;
constexpr uint32_t kRetryCnt = IBV_QP_RETRY_CNT;
constexpr uint32_t kRnrRetry = IBV_QP_RNR_RETRY;
constexpr uint32_t kRqPsn = IBV_QP_RQ_PSN;
constexpr uint32_t kMaxQpRdAtomic = IBV_QP_MAX_QP_RD_ATOMIC;
constexpr uint32_t kAltPath = IBV_QP_ALT_PATH;
constexpr uint32_t kMinRnrTimer = IBV_QP_MIN_RNR_TIMER;
constexpr uint32_t kSqPsn = IBV_QP_SQ_PSN;
constexpr uint32_t kMaxDestRdAtomic = IBV_QP_MAX_DEST_RD_ATOMIC;
constexpr uint32_t kPathMig = IBV_QP_PATH_MIG_STATE;
constexpr uint32_t kDestQpn = IBV_QP_DEST_QPN;
constexpr uint32_t kRateLimit = IBV_QP_RATE_LIMIT;
// IBV_QP_CAP (QP resize) is deliberately absent from every rule: we do not support resizing.

// ---- The rules ---------------------------------------------------------------------------------
//
// One row per (transition, group of QP types sharing the same masks). A (cur, next, type) triple
// that no row mentions is an illegal transition. IBV_QP_STATE is implicitly allowed everywhere and
// never listed. IBV_QP_CUR_STATE is listed as optional exactly where the IBA allows a consumer to
// state the current state (RTR/RTS/SQD/SQE -> RTS, and RTS -> RTS).
//
// XRC_SEND is the initiator half of an RC connection (requester attributes only); XRC_RECV is the
// target half (responder attributes; it still takes TIMEOUT and SQ_PSN at RTR->RTS, since it
// generates the ACK/response stream). RAW_PACKET has no transport state: it needs only a port.

struct Rule {
  ibv_qp_state cur;
  ibv_qp_state next;
  TypeSet types;
  uint32_t required;
  uint32_t optional;
};

// Attributes a connected QP may change in RTS (and when re-entering RTS).
constexpr uint32_t kUcRtsOpt = kCurState | kAccess | kAltPath | kPathMig;
constexpr uint32_t kRcRtsOpt = kUcRtsOpt | kMinRnrTimer;
constexpr uint32_t kUdRtsOpt = kCurState | kQkey;
// RC requester-side attributes needed to start sending.
constexpr uint32_t kRcRtsReq = kTimeout | kRetryCnt | kRnrRetry | kSqPsn | kMaxQpRdAtomic;
// Remote-address attributes needed to start receiving on a connected QP.
constexpr uint32_t kUcRtrReq = kAv | kPathMtu | kDestQpn | kRqPsn;
constexpr uint32_t kRcRtrReq = kUcRtrReq | kMaxDestRdAtomic | kMinRnrTimer;
// SQD -> SQD: path and transport parameters that may be changed while the SQ is drained.
constexpr uint32_t kUcSqdOpt = kAv | kAltPath | kAccess | kPkey | kPathMig;
constexpr uint32_t kXrcSendSqdOpt =
    kUcSqdOpt | kPort | kTimeout | kRetryCnt | kRnrRetry | kMaxQpRdAtomic;
constexpr uint32_t kXrcRecvSqdOpt = kUcSqdOpt | kPort | kTimeout | kMaxDestRdAtomic | kMinRnrTimer;
constexpr uint32_t kRcSqdOpt = kXrcSendSqdOpt | kMaxDestRdAtomic | kMinRnrTimer;

constexpr Rule kRules[] = {
    // Leaving for RESET or ERR is always possible and takes no attributes. RESET -> ERR is in the
    // IBA state diagram ("any state -> Error"); the Linux core table omits it, we allow it.
    {IBV_QPS_RESET, IBV_QPS_RESET, kAllTypes, 0, 0},
    {IBV_QPS_RESET, IBV_QPS_ERR, kAllTypes, 0, 0},
    {IBV_QPS_INIT, IBV_QPS_RESET, kAllTypes, 0, 0},
    {IBV_QPS_INIT, IBV_QPS_ERR, kAllTypes, 0, 0},
    {IBV_QPS_RTR, IBV_QPS_RESET, kAllTypes, 0, 0},
    {IBV_QPS_RTR, IBV_QPS_ERR, kAllTypes, 0, 0},
    {IBV_QPS_RTS, IBV_QPS_RESET, kAllTypes, 0, 0},
    {IBV_QPS_RTS, IBV_QPS_ERR, kAllTypes, 0, 0},
    {IBV_QPS_SQD, IBV_QPS_RESET, kAllTypes, 0, 0},
    {IBV_QPS_SQD, IBV_QPS_ERR, kAllTypes, 0, 0},
    {IBV_QPS_SQE, IBV_QPS_RESET, kAllTypes, 0, 0},
    {IBV_QPS_SQE, IBV_QPS_ERR, kAllTypes, 0, 0},
    {IBV_QPS_ERR, IBV_QPS_RESET, kAllTypes, 0, 0},
    {IBV_QPS_ERR, IBV_QPS_ERR, kAllTypes, 0, 0},

    // RESET -> INIT: bind to a port and set the receive-side protection attributes.
    {IBV_QPS_RESET, IBV_QPS_INIT, kConnected, kPkey | kPort | kAccess, 0},
    {IBV_QPS_RESET, IBV_QPS_INIT, kUdT, kPkey | kPort | kQkey, 0},
    {IBV_QPS_RESET, IBV_QPS_INIT, kRawT, kPort, 0},

    // INIT -> INIT: the RESET -> INIT attributes may be changed again.
    {IBV_QPS_INIT, IBV_QPS_INIT, kConnected, 0, kPkey | kPort | kAccess},
    {IBV_QPS_INIT, IBV_QPS_INIT, kUdT, 0, kPkey | kPort | kQkey},
    {IBV_QPS_INIT, IBV_QPS_INIT, kRawT, 0, 0},

    // INIT -> RTR: connected QPs learn their peer.
    {IBV_QPS_INIT, IBV_QPS_RTR, kRcT | kXrcRecvT, kRcRtrReq, kAltPath | kAccess | kPkey},
    {IBV_QPS_INIT, IBV_QPS_RTR, kUcT | kXrcSendT, kUcRtrReq, kAltPath | kAccess | kPkey},
    {IBV_QPS_INIT, IBV_QPS_RTR, kUdT, 0, kPkey | kQkey},
    {IBV_QPS_INIT, IBV_QPS_RTR, kRawT, 0, 0},

    // RTR -> RTS: start the send queue.
    {IBV_QPS_RTR, IBV_QPS_RTS, kRcT, kRcRtsReq, kRcRtsOpt},
    {IBV_QPS_RTR, IBV_QPS_RTS, kXrcSendT, kRcRtsReq, kUcRtsOpt},
    {IBV_QPS_RTR, IBV_QPS_RTS, kXrcRecvT, kTimeout | kSqPsn, kRcRtsOpt},
    {IBV_QPS_RTR, IBV_QPS_RTS, kUcT, kSqPsn, kUcRtsOpt},
    {IBV_QPS_RTR, IBV_QPS_RTS, kUdT, kSqPsn, kUdRtsOpt},
    {IBV_QPS_RTR, IBV_QPS_RTS, kRawT, 0, kRateLimit},

    // RTS -> RTS: modify in place.
    {IBV_QPS_RTS, IBV_QPS_RTS, kRcT | kXrcRecvT, 0, kRcRtsOpt},
    {IBV_QPS_RTS, IBV_QPS_RTS, kUcT | kXrcSendT, 0, kUcRtsOpt},
    {IBV_QPS_RTS, IBV_QPS_RTS, kUdT, 0, kUdRtsOpt},
    {IBV_QPS_RTS, IBV_QPS_RTS, kRawT, 0, kRateLimit},

    // RTS -> SQD: drain the send queue, optionally asking for the "SQ drained" async event.
    {IBV_QPS_RTS, IBV_QPS_SQD, kAllTypes & ~kRawT, 0, kSqdNotify},
    {IBV_QPS_RTS, IBV_QPS_SQD, kRawT, 0, 0},

    // SQD -> RTS: resume.
    {IBV_QPS_SQD, IBV_QPS_RTS, kRcT | kXrcRecvT, 0, kRcRtsOpt},
    {IBV_QPS_SQD, IBV_QPS_RTS, kUcT | kXrcSendT, 0, kUcRtsOpt},
    {IBV_QPS_SQD, IBV_QPS_RTS, kUdT, 0, kUdRtsOpt},
    {IBV_QPS_SQD, IBV_QPS_RTS, kRawT, 0, 0},

    // SQD -> SQD: reconfigure while drained.
    {IBV_QPS_SQD, IBV_QPS_SQD, kRcT, 0, kRcSqdOpt},
    {IBV_QPS_SQD, IBV_QPS_SQD, kXrcSendT, 0, kXrcSendSqdOpt},
    {IBV_QPS_SQD, IBV_QPS_SQD, kXrcRecvT, 0, kXrcRecvSqdOpt},
    {IBV_QPS_SQD, IBV_QPS_SQD, kUcT, 0, kUcSqdOpt},
    {IBV_QPS_SQD, IBV_QPS_SQD, kUdT, 0, kPkey | kQkey},
    {IBV_QPS_SQD, IBV_QPS_SQD, kRawT, 0, 0},

    // SQE -> RTS: recover from a send-queue error. Only the unreliable types ever enter SQE (a
    // reliable-connected QP goes straight to ERR), so only they may leave it this way.
    {IBV_QPS_SQE, IBV_QPS_RTS, kUcT, 0, kCurState | kAccess},
    {IBV_QPS_SQE, IBV_QPS_RTS, kUdT, 0, kUdRtsOpt},
    {IBV_QPS_SQE, IBV_QPS_RTS, kRawT, 0, 0},
};

// ---- The [cur][next] table built from the rules ------------------------------------------------

struct TypeRule {
  bool valid;
  uint32_t required;
  uint32_t optional;
};

struct Transition {
  std::array<TypeRule, kNumTypes> by_type;
};

using Table = std::array<std::array<Transition, kNumStates>, kNumStates>;

constexpr Table BuildTable() {
  Table table{};
  for (const Rule& rule : kRules) {
    for (int t = 0; t < kNumTypes; ++t) {
      if (rule.types & (1u << t)) {
        table[rule.cur][rule.next].by_type[t] = {true, rule.required, rule.optional};
      }
    }
  }
  return table;
}

constexpr Table kTable = BuildTable();

// Compile-time sanity checks on the rule list.
constexpr bool RulesAreWellFormed() {
  for (size_t i = 0; i < std::size(kRules); ++i) {
    const Rule& r = kRules[i];
    if (r.cur < 0 || r.cur >= kNumStates || r.next < 0 || r.next >= kNumStates) return false;
    if (r.types == 0 || (r.types & ~kAllTypes) != 0) return false;
    if ((r.required & r.optional) != 0) return false;
    if (((r.required | r.optional) & kState) != 0) return false;
    // CUR_STATE is never required, and only optional on the transitions into RTS from a state in
    // which the QP may have moved asynchronously (RTR/RTS/SQD/SQE).
    if ((r.required & kCurState) != 0) return false;
    if ((r.optional & kCurState) != 0 && (r.next != IBV_QPS_RTS || r.cur < IBV_QPS_RTR))
      return false;
    // No (cur, next, type) triple may be described twice.
    for (size_t j = i + 1; j < std::size(kRules); ++j) {
      const Rule& o = kRules[j];
      if (o.cur == r.cur && o.next == r.next && (o.types & r.types) != 0) return false;
    }
  }
  return true;
}
static_assert(RulesAreWellFormed(), "qp_state_table: malformed or duplicate rule");

// The transitions that exist for at least one type must be exactly those of the IBA diagram.
constexpr bool TransitionSetIsTheIbaOne() {
  constexpr bool kExpected[kNumStates][kNumStates] = {
      //          RESET  INIT   RTR    RTS    SQD    SQE    ERR
      /* RESET */ {true, true, false, false, false, false, true},
      /* INIT  */ {true, true, true, false, false, false, true},
      /* RTR   */ {true, false, false, true, false, false, true},
      /* RTS   */ {true, false, false, true, true, false, true},
      /* SQD   */ {true, false, false, true, true, false, true},
      /* SQE   */ {true, false, false, true, false, false, true},
      /* ERR   */ {true, false, false, false, false, false, true},
  };
  for (int cur = 0; cur < kNumStates; ++cur) {
    for (int next = 0; next < kNumStates; ++next) {
      bool any = false;
      for (const TypeRule& tr : kTable[cur][next].by_type) any = any || tr.valid;
      if (any != kExpected[cur][next]) return false;
    }
  }
  return true;
}
static_assert(TransitionSetIsTheIbaOne(), "qp_state_table: transition set differs from the IBA");

constexpr bool IsQpState(ibv_qp_state s) {
  const int v = static_cast<int>(s);
  return v >= 0 && v < kNumStates;
}

}  // namespace

int CheckQpTransition(ibv_qp_type type, ibv_qp_state cur, ibv_qp_state next, int attr_mask,
                      ibv_qp_state claimed_cur) {
  const int t = TypeIndexOf(type);
  if (t < 0 || !IsQpState(cur) || !IsQpState(next)) return EINVAL;

  const uint32_t mask = static_cast<uint32_t>(attr_mask);
  // Without IBV_QP_STATE the request is an in-place modify of the current state.
  if ((mask & kState) == 0 && next != cur) return EINVAL;
  // The consumer's idea of the current state must be right (see the header for why we do not
  // accept SQE for RTS or vice versa). Whether the bit is allowed at all is the table's business.
  if ((mask & kCurState) != 0 && claimed_cur != cur) return EINVAL;

  const TypeRule& rule = kTable[cur][next].by_type[t];
  if (!rule.valid) return EINVAL;
  if ((mask & rule.required) != rule.required) return EINVAL;
  if ((mask & ~(rule.required | rule.optional | kState)) != 0) return EINVAL;
  return 0;
}

const char* QpStateName(ibv_qp_state state) {
  static constexpr const char* kNames[] = {"RESET", "INIT", "RTR", "RTS",
                                           "SQD",   "SQE",  "ERR", "UNKNOWN"};
  static_assert(std::size(kNames) == IBV_QPS_UNKNOWN + 1);
  const int v = static_cast<int>(state);
  if (v < 0 || v > IBV_QPS_UNKNOWN) return "INVALID";
  return kNames[v];
}

}  // namespace softrdma::core
