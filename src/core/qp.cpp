// QP control path: creation, the state machine, posting, and error/flush handling.
#include "core/qp.h"

#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "core/context.h"
#include "core/cq.h"
#include "core/hca.h"
#include "core/limits.h"
#include "core/log.h"
#include "core/qp_internal.h"
#include "core/qp_state_table.h"
#include "link/shared_windows.h"

namespace softrdma::core {

Qp::Qp(Context& ctx, uint32_t qpn, const Init& init)
    : ctx_(ctx),
      hca_(ctx.hca()),
      qpn_(qpn),
      type_(init.type),
      pd_(init.pd),
      send_cq_(init.send_cq),
      recv_cq_(init.recv_cq),
      srq_(init.srq),
      xrcd_(init.xrcd),
      cap_(init.cap),
      sq_sig_all_(init.sq_sig_all),
      block_self_mcast_(init.block_self_mcast),
      user_handle_(init.user_handle) {
  sq_depth_ = cap_.max_send_wr ? cap_.max_send_wr : 1;
  // A power of two: WQE indices grow forever and are masked, not divided (a 64-bit division per
  // index, several per WQE, was most of a direct SEND's bookkeeping).
  const size_t slots = std::bit_ceil(size_t{sq_depth_});
  sq_.resize(slots);
  uint32_t sges = cap_.max_send_sge ? cap_.max_send_sge : 1;
  sge_pool_.resize(slots * sges);
  inline_pool_.resize(slots * cap_.max_inline_data);
  for (size_t i = 0; i < slots; ++i) {
    sq_[i].sge = &sge_pool_[size_t{i} * sges];
    sq_[i].inline_buf =
        cap_.max_inline_data ? &inline_pool_[size_t{i} * cap_.max_inline_data] : nullptr;
  }
  if (!srq_ && type_ != IBV_QPT_XRC_SEND && type_ != IBV_QPT_XRC_RECV)
    rq_ = std::make_unique<RecvQueue>(cap_.max_recv_wr ? cap_.max_recv_wr : 1,
                                      cap_.max_recv_sge ? cap_.max_recv_sge : 1, false);
  attr_.qp_state = IBV_QPS_RESET;
  attr_.port_num = kPortNum;
  attr_.path_mtu = IBV_MTU_4096;
}

Qp::~Qp() = default;

void Qp::SetStateLocked(ibv_qp_state s) {
  state_ = s;
  attr_.qp_state = s;
  if (user_handle_) user_handle_->state = s;
  PublishEndpointLocked();
}

void Qp::PublishEndpointLocked() {
  if (type_ != IBV_QPT_RC) return;  // XRC targets check keys against the PD of the SRQ named
  constexpr int kRemote =
      IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  // The states in which the responder answers requests (docs/architecture.md §8).
  bool answers = state_ == IBV_QPS_RTR || state_ == IBV_QPS_RTS || state_ == IBV_QPS_SQD ||
                 state_ == IBV_QPS_SQE;
  uint32_t rights = answers && !shut_down_ ? attr_.qp_access_flags & kRemote : 0;
  if (answers && !shut_down_ && direct_rq_) rights |= link::kRecvRight;
  link::SharedWindows::Get().SetEndpoint(qpn_, pd_->handle, rights);
}

void Qp::RaiseAsync(ibv_event_type type) {
  if (!user_handle_) return;  // a shared XRC target whose handles here are all closed
  ibv_async_event e{};
  e.element.qp = user_handle_;
  e.event_type = type;
  ctx_.RaiseAsync(e);
}

void Qp::PushCompletionLocked(Cq* cq, const ibv_wc& wc, bool solicited) {
  if (cq) cq->Push(wc, solicited);
}

namespace {

// Applications are C: an enum field of their ibv_qp_attr can hold any int, and loading an
// out-of-range value as the C++ enum is undefined behaviour (UBSan: "load of value 42, which is not
// a valid value for type 'ibv_qp_state'", qp_state_test IllegalModifyIsEinvalAndChangesNothing).
// Such fields are read as the integers they are.
template <typename E>
int RawEnum(const E& field) {
  static_assert(sizeof(E) == sizeof(int));
  int v;
  std::memcpy(&v, &field, sizeof v);
  return v;
}

bool ValidAccess(int flags) {
  constexpr int kKnown = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                         IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND | IBV_ACCESS_ZERO_BASED |
                         IBV_ACCESS_ON_DEMAND | IBV_ACCESS_HUGETLB | IBV_ACCESS_RELAXED_ORDERING;
  return (flags & ~kKnown) == 0;
}

}  // namespace

int Qp::ApplyAttrs(const ibv_qp_attr& a, int mask) {
  if ((mask & IBV_QP_PORT) && a.port_num != kPortNum) return EINVAL;
  if ((mask & IBV_QP_PKEY_INDEX) && a.pkey_index != 0) return EINVAL;
  if ((mask & IBV_QP_ACCESS_FLAGS) && !ValidAccess(a.qp_access_flags)) return EINVAL;
  if ((mask & IBV_QP_PATH_MTU) &&
      (RawEnum(a.path_mtu) < IBV_MTU_256 || RawEnum(a.path_mtu) > IBV_MTU_4096))
    return EINVAL;
  if ((mask & IBV_QP_PATH_MIG_STATE) &&
      (RawEnum(a.path_mig_state) < IBV_MIG_MIGRATED || RawEnum(a.path_mig_state) > IBV_MIG_ARMED))
    return EINVAL;
  if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && a.max_rd_atomic > kMaxRdAtomic) return EINVAL;
  if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && a.max_dest_rd_atomic > kMaxRdAtomic) return EINVAL;
  if ((mask & IBV_QP_TIMEOUT) && a.timeout > 31) return EINVAL;
  if ((mask & IBV_QP_RETRY_CNT) && a.retry_cnt > 7) return EINVAL;
  if ((mask & IBV_QP_RNR_RETRY) && a.rnr_retry > 7) return EINVAL;
  if ((mask & IBV_QP_MIN_RNR_TIMER) && a.min_rnr_timer > 31) return EINVAL;
  if ((mask & IBV_QP_DEST_QPN) && a.dest_qp_num > wire::kQpnMask) return EINVAL;
  if (mask & IBV_QP_AV) {
    const ibv_ah_attr& ah = a.ah_attr;
    if (ah.is_global && ah.grh.sgid_index >= hca_.gids().size()) return EINVAL;
    if (ah.port_num != 0 && ah.port_num != kPortNum) return EINVAL;
  }

  if (mask & IBV_QP_CUR_STATE) attr_.cur_qp_state = a.cur_qp_state;
  if (mask & IBV_QP_EN_SQD_ASYNC_NOTIFY) attr_.en_sqd_async_notify = a.en_sqd_async_notify;
  if (mask & IBV_QP_ACCESS_FLAGS) attr_.qp_access_flags = a.qp_access_flags;
  if (mask & IBV_QP_PKEY_INDEX) attr_.pkey_index = a.pkey_index;
  if (mask & IBV_QP_PORT) attr_.port_num = a.port_num;
  if (mask & IBV_QP_QKEY) attr_.qkey = a.qkey;
  if (mask & IBV_QP_PATH_MTU) attr_.path_mtu = a.path_mtu;
  if (mask & IBV_QP_TIMEOUT) attr_.timeout = a.timeout;
  if (mask & IBV_QP_RETRY_CNT) {
    attr_.retry_cnt = a.retry_cnt;
    retry_left_ = a.retry_cnt;
  }
  if (mask & IBV_QP_RNR_RETRY) {
    attr_.rnr_retry = a.rnr_retry;
    rnr_left_ = a.rnr_retry;
  }
  if (mask & IBV_QP_RQ_PSN) {
    attr_.rq_psn = a.rq_psn & wire::kPsnMask;
    rq_psn_ = attr_.rq_psn;
  }
  if (mask & IBV_QP_SQ_PSN) {
    attr_.sq_psn = a.sq_psn & wire::kPsnMask;
    sq_psn_ = attr_.sq_psn;
  }
  if (mask & IBV_QP_MAX_QP_RD_ATOMIC) attr_.max_rd_atomic = a.max_rd_atomic;
  if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) attr_.max_dest_rd_atomic = a.max_dest_rd_atomic;
  if (mask & IBV_QP_MIN_RNR_TIMER) attr_.min_rnr_timer = a.min_rnr_timer;
  if (mask & IBV_QP_PATH_MIG_STATE) attr_.path_mig_state = a.path_mig_state;
  if (mask & IBV_QP_ALT_PATH) {
    attr_.alt_ah_attr = a.alt_ah_attr;
    attr_.alt_pkey_index = a.alt_pkey_index;
    attr_.alt_port_num = a.alt_port_num;
    attr_.alt_timeout = a.alt_timeout;
  }
  if (mask & IBV_QP_DEST_QPN) attr_.dest_qp_num = a.dest_qp_num;
  if (mask & IBV_QP_AV) {
    attr_.ah_attr = a.ah_attr;
    av_.attr = a.ah_attr;
    uint32_t dqpn = (mask & IBV_QP_DEST_QPN) ? a.dest_qp_num : attr_.dest_qp_num;
    av_.channel = hca_.Resolve(a.ah_attr, dqpn);
  }
  return 0;
}

int Qp::Modify(const ibv_qp_attr& attr, int mask) {
  // The kernel's uverbs drops what the other half of an XRC connection would take, so programs
  // pass RC masks for both halves (perftest -c XRC does).
  if (type_ == IBV_QPT_XRC_SEND) mask &= ~(IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  if (type_ == IBV_QPT_XRC_RECV)
    mask &= ~(IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY);
  std::lock_guard g(mu_);
  ibv_qp_state cur = state_;
  int raw_next = (mask & IBV_QP_STATE) ? RawEnum(attr.qp_state) : cur;
  int raw_claimed = (mask & IBV_QP_CUR_STATE) ? RawEnum(attr.cur_qp_state) : cur;
  if (raw_next < IBV_QPS_RESET || raw_next > IBV_QPS_ERR || raw_claimed < IBV_QPS_RESET ||
      raw_claimed > IBV_QPS_ERR)
    return EINVAL;
  ibv_qp_state next = static_cast<ibv_qp_state>(raw_next);
  int r = CheckQpTransition(type_, cur, next, mask, static_cast<ibv_qp_state>(raw_claimed));
  if (r == 0) r = ApplyAttrs(attr, mask);
  if (r) {
    SOFTRDMA_LOG("qp %#x: modify %d->%d mask %#x refused", qpn_, cur, next, mask);
    return r;
  }
  // A shared XRC target's record follows every change, whoever's handle made it.
  struct PublishOnReturn {
    Qp* qp;
    int mask;
    ~PublishOnReturn() {
      if (qp->target_table()) qp->PublishTargetLocked(mask);
    }
  } publish{this, mask};
  if (next == cur && next != IBV_QPS_ERR && next != IBV_QPS_RESET) {
    if (mask & IBV_QP_ACCESS_FLAGS) PublishEndpointLocked();
    if (next == IBV_QPS_RTS) RunRequesterLocked();
    return 0;
  }
  switch (next) {
    case IBV_QPS_RESET:
      ResetLocked();
      SetStateLocked(IBV_QPS_RESET);
      ForgetCompletionsLocked();
      break;
    case IBV_QPS_ERR:
      EnterErrorLocked();
      break;
    case IBV_QPS_SQD:
      SetStateLocked(IBV_QPS_SQD);
      drained_event_pending_ = attr_.en_sqd_async_notify != 0;
      if (drained_event_pending_ && head_ == next_) {
        drained_event_pending_ = false;
        RaiseAsync(IBV_EVENT_SQ_DRAINED);
      }
      break;
    default:
      SetStateLocked(next);
      OpenDirectRecvLocked();
      if (next == IBV_QPS_RTS) RunRequesterLocked();
      break;
  }
  return 0;
}

int Qp::Query(ibv_qp_attr* attr, int /*mask*/, ibv_qp_init_attr* init) {
  std::lock_guard g(mu_);
  *attr = attr_;
  attr->qp_state = state_;
  attr->cur_qp_state = state_;
  attr->rq_psn = rq_psn_;
  attr->sq_psn = sq_psn_;
  attr->cap = cap_;
  attr->sq_draining = state_ == IBV_QPS_SQD && head_ != next_;
  if (init) {
    *init = ibv_qp_init_attr{};
    init->qp_type = type_;
    init->cap = cap_;
    init->sq_sig_all = sq_sig_all_;
    if (user_handle_) {
      init->qp_context = user_handle_->qp_context;
      init->send_cq = user_handle_->send_cq;
      init->recv_cq = user_handle_->recv_cq;
      init->srq = user_handle_->srq;
    }
  }
  return 0;
}

void Qp::ResetLocked() {
  pending_cqes_.clear();
  head_ = next_ = tail_ = 0;
  rd_outstanding_ = 0;
  retransmit_deadline_ = INT64_MAX;
  rnr_resume_at_ = 0;
  hold_for_direct_ = false;
  room_wait_until_ = 0;
  CloseDirectRecvLocked();
  if (rq_) rq_->Drain();
  rq_psn_ = sq_psn_ = msn_ = 0;
  rnr_nak_outstanding_ = seq_nak_sent_ = comm_est_raised_ = ack_pending_ = false;
  ack_channel_.reset();
  relay_ = Relay{};
  av_ = AddressVector{};
  ibv_qp_attr fresh{};
  fresh.port_num = kPortNum;
  fresh.path_mtu = IBV_MTU_4096;
  attr_ = fresh;
}

// Its completions not yet polled go, flushes included, as mlx4 and mlx5 clean their CQs at reset:
// a QP brought back from the error state must not meet the flushes of before (pyverbs'
// test_mr_rereg_pd polls a receive flushed at the error after its restart). Receives through an
// SRQ stay: their WQEs are the SRQ's, and the application gets them back only by their completion.
void Qp::ForgetCompletionsLocked() {
  const bool own_receives = srq_ == nullptr;
  if (send_cq_) send_cq_->Forget(qpn_, true, own_receives && recv_cq_ == send_cq_);
  if (recv_cq_ && recv_cq_ != send_cq_ && own_receives) recv_cq_->Forget(qpn_, false, true);
}

void Qp::EnterErrorLocked() {
  FlushAckLocked();
  // Frames of WQEs about to complete may still sit in a link queue, borrowing their buffers.
  if (Reliable() && head_ != next_) hca_.SecureQueuedPayloads();
  bool was_error = state_ == IBV_QPS_ERR;
  SetStateLocked(IBV_QPS_ERR);
  for (uint64_t i = head_; i < tail_; ++i) {
    SendWqe& w = SqAt(i);
    if (!w.done) {
      w.done = true;
      w.status = IBV_WC_WR_FLUSH_ERR;
    }
  }
  if (next_ < tail_) next_ = tail_;
  RetireLocked();
  rd_outstanding_ = 0;
  retransmit_deadline_ = INT64_MAX;
  rnr_resume_at_ = 0;
  hold_for_direct_ = false;
  room_wait_until_ = 0;
  ack_pending_ = false;
  ResumeWaitingLocked();
  // What the peer placed completes before the flushed WQEs; what an SRQ lent goes back to it.
  CloseDirectRecvLocked();
  if (srq_) {
    if (!was_error) RaiseAsync(IBV_EVENT_QP_LAST_WQE_REACHED);
  } else if (rq_) {
    FlushRecvQueueLocked();
  }
}

// Every WQE of the receive queue completes with WR_FLUSH_ERR (a QP in the error state).
void Qp::FlushRecvQueueLocked() {
  for (const RecvWqe& r : rq_->Drain()) {
    ibv_wc wc{};
    wc.wr_id = r.wr_id;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.opcode = IBV_WC_RECV;
    wc.qp_num = qpn_;
    PushCompletionLocked(recv_cq_, wc, false);
  }
}

namespace {

struct WrOpRule {
  bool rc, uc, ud;
};

// Which work-request opcodes each transport accepts (IBTA 10.7.3 / ibv_post_send(3)).
// `op` is read as an integer: a C caller may pass any value, which a C++ enum cannot hold.
WrOpRule RuleFor(int op) {
  switch (op) {
    case IBV_WR_SEND:
    case IBV_WR_SEND_WITH_IMM:
      return {true, true, true};
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
      return {true, true, false};
    case IBV_WR_BIND_MW:  // ibv_bind_mw(3): UC, RC (and XRC_SEND)
    case IBV_WR_LOCAL_INV:
      return {true, true, false};
    case IBV_WR_SEND_WITH_INV:
    case IBV_WR_RDMA_READ:
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
      return {true, false, false};
    default:
      return {false, false, false};
  }
}

}  // namespace

int Qp::ValidateWr(const ibv_send_wr& wr, bool type1_bind) const {
  int raw_opcode;
  std::memcpy(&raw_opcode, &wr.opcode, sizeof raw_opcode);
  WrOpRule rule = RuleFor(raw_opcode);
  bool ok = ((type_ == IBV_QPT_RC || type_ == IBV_QPT_XRC_SEND) && rule.rc) ||
            (type_ == IBV_QPT_UC && rule.uc) || (type_ == IBV_QPT_UD && rule.ud);
  if (!ok) return EINVAL;
  if (wr.opcode == IBV_WR_BIND_MW) {
    // A work request binds type 2 windows; type 1 windows bind through ibv_bind_mw(3) only.
    const ibv_mw* mw = wr.bind_mw.mw;
    if (!mw || mw->type != (type1_bind ? IBV_MW_TYPE_1 : IBV_MW_TYPE_2)) return EINVAL;
    if (!wr.bind_mw.bind_info.mr && wr.bind_mw.bind_info.length != 0) return EINVAL;
    return 0;
  }
  if (wr.num_sge < 0 || static_cast<uint32_t>(wr.num_sge) > cap_.max_send_sge) return EINVAL;
  if (wr.num_sge > 0 && !wr.sg_list) return EINVAL;
  if (type_ == IBV_QPT_UD && !wr.wr.ud.ah) return EINVAL;
  if (wr.send_flags & IBV_SEND_INLINE) {
    if (wr.opcode == IBV_WR_RDMA_READ || wr.opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
        wr.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD)
      return EINVAL;
    uint64_t len = 0;
    for (int i = 0; i < wr.num_sge; ++i) len += wr.sg_list[i].length;
    if (len > cap_.max_inline_data) return EINVAL;
  }
  return 0;
}

int Qp::PostSend(const ibv_send_wr* wr, const ibv_send_wr** bad, bool whole_batch,
                 bool type1_bind) {
  if (const void* slot = next_direct_slot_.load(std::memory_order_relaxed))
    __builtin_prefetch(slot, 1);
  std::lock_guard g(mu_);
  if (shut_down_ || state_ == IBV_QPS_RESET || state_ == IBV_QPS_INIT || state_ == IBV_QPS_RTR) {
    *bad = wr;
    return EINVAL;
  }
  if (!whole_batch && !type1_bind) {
    while (wr && TryPostDirectLocked(*wr)) wr = wr->next;
    if (!wr) return 0;
  }
  if (whole_batch) {
    // ibv_wr_post(3): "No work is executed to the queue until ibv_wr_complete() returns
    // success". Check the whole batch first so that a refused one leaves nothing queued.
    uint64_t room = sq_depth_ - (tail_ - head_);
    for (const ibv_send_wr* w = wr; w; w = w->next) {
      int r = ValidateWr(*w);
      if (r == 0 && room-- == 0) r = ENOMEM;
      if (r) {
        *bad = w;
        return r;
      }
    }
  }
  for (; wr; wr = wr->next) {
    int r = ValidateWr(*wr, type1_bind);
    if (r) {
      SOFTRDMA_LOG("qp %#x: post_send opcode %d refused (%d)", qpn_, wr->opcode, r);
      *bad = wr;
      // The WRs before the bad one are posted (ibv_post_send(3)): start them now, or they would
      // wait for the next post.
      RunRequesterLocked();
      return r;
    }
    if (tail_ - head_ == sq_depth_) {
      *bad = wr;
      RunRequesterLocked();  // as above: what was queued before the full queue still runs
      return ENOMEM;
    }
    SendWqe& w = SqAt(tail_);
    w.wr_id = wr->wr_id;
    w.opcode = wr->opcode;
    w.send_flags = wr->send_flags;
    w.imm_or_rkey = wr->opcode == IBV_WR_SEND_WITH_INV ? wr->invalidate_rkey : wr->imm_data;
    w.ah = nullptr;
    w.remote_addr = w.rkey = 0;
    w.compare_add = w.swap = 0;
    switch (wr->opcode) {
      case IBV_WR_RDMA_WRITE:
      case IBV_WR_RDMA_WRITE_WITH_IMM:
      case IBV_WR_RDMA_READ:
        w.remote_addr = wr->wr.rdma.remote_addr;
        w.rkey = wr->wr.rdma.rkey;
        break;
      case IBV_WR_ATOMIC_CMP_AND_SWP:
      case IBV_WR_ATOMIC_FETCH_AND_ADD:
        w.remote_addr = wr->wr.atomic.remote_addr;
        w.rkey = wr->wr.atomic.rkey;
        w.compare_add = wr->wr.atomic.compare_add;
        w.swap = wr->wr.atomic.swap;
        break;
      case IBV_WR_BIND_MW: {
        const ibv_mw_bind_info& b = wr->bind_mw.bind_info;
        w.mw_rkey = wr->bind_mw.mw->handle << 8;  // the handle is the window's index
        w.rkey = wr->bind_mw.rkey;
        w.bind_mr_key = b.mr ? b.mr->lkey : 0;
        w.remote_addr = b.addr;
        w.bind_len = b.length;
        w.bind_access = static_cast<int>(b.mw_access_flags);
        w.bind_type1 = type1_bind;
        break;
      }
      default:
        break;
    }
    if (type_ == IBV_QPT_UD) {
      w.ah = Ah::From(wr->wr.ud.ah);
      w.remote_qpn = wr->wr.ud.remote_qpn;
      w.remote_qkey = wr->wr.ud.remote_qkey;
    }
    w.remote_srqn = type_ == IBV_QPT_XRC_SEND ? wr->qp_type.xrc.remote_srqn : 0;
    w.length = 0;
    bool local_op = wr->opcode == IBV_WR_BIND_MW || wr->opcode == IBV_WR_LOCAL_INV;
    if (local_op) {
      w.num_sge = 0;  // no payload, whatever the list says
    } else if (wr->send_flags & IBV_SEND_INLINE) {
      // Inline data is copied now: the caller may reuse its buffers as soon as we return.
      w.length = GatherInline(*wr, w.inline_buf);
      w.num_sge = 0;
    } else {
      w.num_sge = static_cast<uint32_t>(wr->num_sge);
      for (int i = 0; i < wr->num_sge; ++i) {
        w.sge[i] = wr->sg_list[i];
        w.length += wr->sg_list[i].length;
      }
    }
    w.sent = w.done = false;
    w.status = IBV_WC_SUCCESS;
    w.psn = 0;
    ++tail_;
    // In ERR, and in SQE (the send-queue error state of UC/UD), new send WRs complete flushed
    // (IBTA 10.3.1); before, a send posted in SQE sat in the queue forever (wc_errors_test
    // UdSendLargerThanMtuIsLocLenErrAndOnlyStopsTheSendQueue).
    if (state_ == IBV_QPS_ERR || state_ == IBV_QPS_SQE) {
      w.done = true;
      w.status = IBV_WC_WR_FLUSH_ERR;
      next_ = tail_;
      RetireLocked();
    }
  }
  RunRequesterLocked();
  return 0;
}

int Qp::PostRecv(const ibv_recv_wr* wr, const ibv_recv_wr** bad) {
  if (srq_ || !rq_) {
    *bad = wr;
    return EINVAL;
  }
  int r;
  bool held;
  {
    std::lock_guard g(mu_);
    if (shut_down_ || state_ == IBV_QPS_RESET) {
      *bad = wr;
      return EINVAL;
    }
    r = rq_->Post(wr, bad);
    if (direct_rq_)
      RefillDirectRecvLocked(false);
    else
      OpenDirectRecvLocked();
    datagram_wait_since_ = 0;
    held = !waiting_channels_.empty();
    if (state_ == IBV_QPS_ERR) FlushRecvQueueLocked();
  }
  if (held) ResumeHeldHere();
  return r;
}

// Datagrams held for a WQE (WaitForReceiveLocked) are resumed on the posting thread once the lock
// is released, where the channel may deliver them at once (Hca::ResumeHeld). Apart from
// PostRecv's path: every post of a request-response exchange passes there.
void Qp::ResumeHeldHere() {
  std::vector<std::weak_ptr<link::Channel>> waiting;
  {
    std::lock_guard g(mu_);
    waiting.swap(waiting_channels_);
  }
  for (const auto& w : waiting)
    if (std::shared_ptr<link::Channel> ch = w.lock()) hca_.ResumeHeld(*ch);
}

void Qp::Shutdown() {
  // Frames that reached this host before the destroy are handled (and acknowledged) first, as a
  // hardware HCA would have done on arrival: a peer must not fail for our application's speed.
  // A QP that was receiving until just now keeps draining while its traffic goes on (quiet for
  // kDrainQuietNs, at most kDrainMaxNs): a 1 MiB message already on its way takes longer to
  // arrive than an application takes to tear down (ibv_srq_pingpong -s 1048576 lost the peer's
  // last sends). An idle QP is destroyed at once.
  const int64_t start = link::NowNs();
  uint64_t frames_seen;
  int64_t last;  // when the last inbound frame was seen to come
  {
    std::lock_guard g(mu_);
    frames_seen = rx_frames_;
    bool idle = link::CoarseNowNs() - last_rx_coarse_ns_ > kDrainQuietNs + link::kCoarseClockStepNs;
    last = idle ? start - kDrainQuietNs - 1 : start;
  }
  for (int rounds = 0;; ++rounds) {
    bool any = hca_.Progress(true);
    uint64_t frames;
    {
      std::lock_guard g(mu_);
      frames = rx_frames_;
    }
    int64_t now = link::NowNs();
    if (frames != frames_seen) {
      frames_seen = frames;
      last = now;
    }
    if (rounds >= 4 && (now - last > kDrainQuietNs || now - start > kDrainMaxNs)) break;
    if (!any && rounds >= 4) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  std::unique_lock g(mu_);
  FlushAckLocked();  // the peer must hear about everything this QP received
  shut_down_ = true;
  if (timer_registered_) hca_.NoteTimerDue(0);  // the next pass takes it off the list
  ResumeWaitingLocked();
  PublishEndpointLocked();  // closed to direct access
  CloseDirectRecvLocked();
  if (staging_) {  // the closed block's senders are done with it
    staging_.reset();
    hca_.NoteStaging(-1);
  }
  hca_.SecureQueuedPayloads();  // queued frames may borrow buffers freed after we return
  // Inbound frames already writing into this QP's buffers finish before the caller frees them.
  for (int i = 0; rx_active_ > 0 && i < 5000; ++i) {
    g.unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    g.lock();
  }
  g.unlock();
  if (srq_) srq_->Detach(this);
  // What this QP sent or acknowledged leaves the host before the application may exit.
  hca_.WaitTxIdle(kTxFlushMaxNs);
  hca_.RemoveQp(qpn_);
}

void Qp::RxHeader(link::Channel& ch, const Packet& p, link::RxTarget& t) {
  std::lock_guard g(mu_);
  RxWork& w = WorkOf(t);
  w.Clear();
  if (shut_down_) return;
  if (p.rider_ack != link::kNoRiderAck) RxRiderAckLocked(p.rider_ack);
  ++rx_active_;
  ++rx_frames_;
  last_rx_coarse_ns_ = link::CoarseNowNs();
  w.is_response = p.info->mask & kIsResponse;
  if (w.is_response)
    RxResponseHeader(ch, p, t);
  else if (type_ == IBV_QPT_UD)
    RxUdHeader(ch, p, t);
  else
    RxRequestHeader(ch, p, t);
  if (t.wait) --rx_active_;  // the channel keeps the frame: no RxEnd follows
}

void Qp::RxEnd(link::Channel& ch, link::RxTarget& t) {
  std::lock_guard g(mu_);
  RxWork& w = WorkOf(t);
  if (rx_active_ == 0) return;  // the header was refused before counting
  --rx_active_;
  if (shut_down_) return;
  if (t.refused) RefusedPlacementLocked(w);
  if (w.is_response)
    RxResponseEnd(w);
  else
    RxRequestEnd(ch, w);
}

// Bytes that could not be written into a page the application made read-only, with no way around
// its protection (link/placement_guard.h): the access fails as a page fault on an HCA fails it.
void Qp::RefusedPlacementLocked(RxWork& w) {
  SOFTRDMA_LOG("qp %#x: psn %#x: payload not placed (read-only pages, /proc/self/mem refused)",
               qpn_, w.psn);
  if (w.is_response) {
    if (w.kind == RxWork::kReadResponse && w.wqe_index >= head_ && w.wqe_index < next_) {
      SendWqe& s = SqAt(w.wqe_index);
      if (!s.done && state_ != IBV_QPS_ERR) FailHeadLocked(w.wqe_index, IBV_WC_LOC_PROT_ERR);
    }
    w.kind = RxWork::kDrop;
    return;
  }
  if (w.nak != RxWork::kNoNak) return;  // failed already
  if (w.has_recv) {
    w.recv_status = IBV_WC_LOC_PROT_ERR;
    w.nak = wire::aeth::kNakRemoteOperation;
  } else {
    w.nak = wire::aeth::kNakRemoteAccess;
  }
}

void Qp::RxAbort(link::RxTarget& t) {
  std::lock_guard g(mu_);
  if (rx_active_ > 0) --rx_active_;
  RxWork& w = WorkOf(t);
  if (w.kind == RxWork::kRelay && relay_.active && relay_.psn == w.psn) relay_ = Relay{};
  if (!shut_down_ && !w.is_response && w.has_recv && state_ != IBV_QPS_ERR) {
    if (w.xrc_srqn) {
      std::lock_guard<std::mutex> xg(hca_.xrc().mu());
      if (Srq* xs = hca_.xrc().FindSrqLocked(w.xrc_srqn, xrcd_.get())) xs->PushFront(w.recv);
    } else if (srq_)
      srq_->PushFront(w.recv);
    else
      ReturnRecvLocked(w.recv);
  }
  // Nor does the PSN its header took count: left advanced, the retransmission of this request
  // would be ACKed as a duplicate without being executed (hostile_peer_test
  // AConnectionDroppedMidWriteLeavesOthersWorking).
  if (!shut_down_ && !w.is_response && w.kind != RxWork::kDrop && Reliable() &&
      state_ != IBV_QPS_ERR && rq_psn_ == ((w.psn + 1) & wire::kPsnMask))
    rq_psn_ = w.psn;
}

void Qp::OnChannelClosed(link::Channel& ch) {
  std::lock_guard g(mu_);
  if (ack_channel_.get() == &ch) ack_channel_.reset();
  if (relay_.active && relay_.owner.get() == &ch && relay_.reply && !shut_down_ &&
      state_ != IBV_QPS_ERR) {
    // The SRQ's process is gone, and its SRQs with it: as for an SRQ number nobody has.
    std::shared_ptr<link::Channel> reply = relay_.reply;
    uint32_t psn = relay_.psn;
    relay_ = Relay{};
    ResponderErrorLocked(*reply, wire::aeth::kNakInvalidRequest, psn, IBV_EVENT_QP_REQ_ERR);
  } else if (relay_.active && (relay_.owner.get() == &ch || relay_.reply.get() == &ch)) {
    relay_ = Relay{};  // the initiator is gone: nobody waits for the answer
  }
  if (av_.channel.get() != &ch) return;
  // A destroyed QP completes nothing more: the HCA's snapshot of QPs that calls us can outlive
  // ibv_destroy_qp, and the application may have destroyed the CQs too (qperf's heap was
  // corrupted by an error completion written into its freed send CQ).
  if (shut_down_) {
    av_.channel.reset();
    return;
  }
  if (RepathIfMovedLocked(ch)) return;
  av_.channel.reset();
  if (Reliable() && (state_ == IBV_QPS_RTS || state_ == IBV_QPS_SQD) && head_ != tail_)
    FailHeadLocked(head_, IBV_WC_RETRY_EXC_ERR);
}

bool Qp::RepathIfMovedLocked(const link::Channel& ch) {
  if (repath_pending_) return true;
  if (!Reliable() || type_ == IBV_QPT_XRC_RECV ||
      (state_ != IBV_QPS_RTS && state_ != IBV_QPS_SQD) ||
      !hca_.PeerSlotMoved(ch, av_.attr, attr_.dest_qp_num))
    return false;
  repath_pending_ = true;
  hca_.QueueRepath(shared_from_this());
  return true;
}

void Qp::RegisterTimerLocked(int64_t due, int64_t wake) {
  if (timer_registered_) return hca_.NoteTimerDue(due, wake);
  timer_registered_ = true;
  hca_.ArmTimer(shared_from_this(), due, wake);
}

void Qp::OnRoom() {
  std::lock_guard g(mu_);
  if (room_wait_until_ == 0) return;
  room_wait_until_ = 0;
  RunRequesterLocked();
}

void Qp::Repath(std::shared_ptr<link::Channel> ch) {
  std::lock_guard g(mu_);
  repath_pending_ = false;
  av_.channel.reset();
  if (shut_down_ || (state_ != IBV_QPS_RTS && state_ != IBV_QPS_SQD)) return;
  if (!ch) {
    if (head_ != tail_) FailHeadLocked(head_, IBV_WC_RETRY_EXC_ERR);
    return;
  }
  SOFTRDMA_LOG("qp %#x: peer slot moved, sending again from the oldest unacknowledged request",
               qpn_);
  av_.channel = std::move(ch);
  if (head_ == next_) return RunRequesterLocked();
  next_ = head_;
  sq_psn_ = SqAt(head_).psn;
  rd_outstanding_ = 0;
  retransmit_deadline_ = INT64_MAX;
  RunRequesterLocked();
}

bool Qp::WaitForReceiveLocked(link::Channel& ch) {
  if (srq_) return false;
  const int64_t now = link::NowNs();
  if (datagram_wait_since_ == 0) datagram_wait_since_ = now;
  // Waited long enough: this and what follows until a receive is posted go as on a NIC (dropped).
  if (now - datagram_wait_since_ >= kDatagramWaitNs || !ch.Hold()) return false;
  std::shared_ptr<link::Channel> me = ch.shared_from_this();
  bool known = false;
  for (const auto& w : waiting_channels_) known = known || w.lock() == me;
  if (!known) waiting_channels_.push_back(me);
  RegisterTimerLocked(datagram_wait_since_ + kDatagramWaitNs);
  return true;
}

void Qp::ResumeWaitingChannelsLocked() {
  std::vector<std::weak_ptr<link::Channel>> waiting;
  waiting.swap(waiting_channels_);
  for (const auto& w : waiting)
    if (std::shared_ptr<link::Channel> ch = w.lock()) ch->Resume();
}

int64_t Qp::OnTimer(int64_t now, int64_t* due) {
  std::lock_guard g(mu_);
  *due = INT64_MAX;
  if (shut_down_) {
    ResumeWaitingLocked();
    timer_registered_ = false;
    hca_.DisarmTimer(this);
    return INT64_MAX;
  }
  if (!waiting_channels_.empty() && now - datagram_wait_since_ >= kDatagramWaitNs)
    ResumeWaitingLocked();
  if (rnr_resume_at_ != 0 && now >= rnr_resume_at_) {
    rnr_resume_at_ = 0;
    RunRequesterLocked();
  }
  if (room_wait_until_ != 0 && now >= room_wait_until_) {
    room_wait_until_ = 0;
    RunRequesterLocked();
  }
  if (ack_pending_ && ack_deadline_ <= now) {
    ack_defer_ = false;  // no answer came in time: this QP's traffic is not ping-pong
    FlushAckLocked();
  }
  int64_t next = RetransmitTimerLocked(now);
  if (rnr_resume_at_ != 0 && rnr_resume_at_ < next) next = rnr_resume_at_;
  if (room_wait_until_ != 0 && room_wait_until_ < next) next = room_wait_until_;
  if (!waiting_channels_.empty() && datagram_wait_since_ + kDatagramWaitNs < next)
    next = datagram_wait_since_ + kDatagramWaitNs;
  // The deferral deadline is checked exactly whenever timers run (every batch of inbound work and
  // every poll of an empty CQ); the wake-up that guarantees it is coarse, so ping-pong traffic,
  // whose ACKs leave with the answers, does not re-arm and fire a timer on every message.
  *due = next;
  if (ack_pending_) {
    int64_t coarse = AckWakeNs(ack_deadline_);
    if (coarse < next) next = coarse;
    if (ack_deadline_ < *due) *due = ack_deadline_;
  }
  // Stay registered a while after the last arming: request/response traffic re-arms the timer on
  // every post, and registering again would wake the progress thread each time.
  if (next == INT64_MAX && now < last_arm_ns_ + kTimerLingerNs) {
    if (last_arm_ns_ + kTimerLingerNs < *due) *due = last_arm_ns_ + kTimerLingerNs;
    return last_arm_ns_ + kTimerLingerNs;
  }
  if (next == INT64_MAX && timer_registered_) {
    timer_registered_ = false;
    hca_.DisarmTimer(this);
  }
  return next;
}

}  // namespace softrdma::core
