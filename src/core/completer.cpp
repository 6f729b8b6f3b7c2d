// The completer: retires send WQEs when their responses arrive (ACK, NAK, RNR NAK, read response,
// atomic acknowledge), in order, and turns NAKs into the work-completion errors verbs defines.
#include <algorithm>
#include <cstring>

#include "core/context.h"
#include "core/cq.h"
#include "core/hca.h"
#include "core/qp.h"
#include "core/qp_internal.h"
#include "link/placement_guard.h"

namespace softrdma::core {
namespace {

ibv_wc_opcode WcOpcode(ibv_wr_opcode op) {
  switch (op) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
      return IBV_WC_RDMA_WRITE;
    case IBV_WR_RDMA_READ:
      return IBV_WC_RDMA_READ;
    case IBV_WR_ATOMIC_CMP_AND_SWP:
      return IBV_WC_COMP_SWAP;
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
      return IBV_WC_FETCH_ADD;
    case IBV_WR_LOCAL_INV:
      return IBV_WC_LOCAL_INV;
    case IBV_WR_BIND_MW:
      return IBV_WC_BIND_MW;
    default:
      return IBV_WC_SEND;
  }
}

bool IsReadOrAtomic(ibv_wr_opcode op) {
  return op == IBV_WR_RDMA_READ || op == IBV_WR_ATOMIC_CMP_AND_SWP ||
         op == IBV_WR_ATOMIC_FETCH_AND_ADD;
}

ibv_wc_status NakStatus(uint8_t code) {
  switch (code) {
    case wire::aeth::kNakInvalidRequest:
      return IBV_WC_REM_INV_REQ_ERR;
    case wire::aeth::kNakRemoteAccess:
      return IBV_WC_REM_ACCESS_ERR;
    case wire::aeth::kNakRemoteOperation:
      return IBV_WC_REM_OP_ERR;
    default:
      return IBV_WC_BAD_RESP_ERR;
  }
}

// IBTA table 45: the RNR NAK timer field, in microseconds.
constexpr uint32_t kRnrDelayUs[32] = {655360, 10,    20,    30,     40,     60,     80,     120,
                                      160,    240,   320,   480,    640,    960,    1280,   1920,
                                      2560,   3840,  5120,  7680,   10240,  15360,  20480,  30720,
                                      40960,  61440, 81920, 122880, 163840, 245760, 327680, 491520};

}  // namespace

void Qp::RetireLocked() {
  while (head_ < tail_) {
    SendWqe& w = SqAt(head_);
    if (!w.done) break;
    PushSendCompletionLocked(w);
    ++head_;
  }
  if (next_ < head_) next_ = head_;
  if (drained_event_pending_ && state_ == IBV_QPS_SQD && head_ == next_) {
    drained_event_pending_ = false;
    RaiseAsync(IBV_EVENT_SQ_DRAINED);
  }
}

void Qp::PushSendCompletionLocked(const SendWqe& w) {
  if (!CompletesLocked(w.status, w.send_flags)) return;
  ibv_wc wc{};
  wc.wr_id = w.wr_id;
  wc.status = w.status;
  wc.opcode = WcOpcode(w.opcode);
  wc.byte_len = w.length;
  wc.qp_num = qpn_;
  PushCompletionLocked(send_cq_, wc, false);
}

void Qp::CompleteSendWqeLocked(SendWqe& w, ibv_wc_status st) {
  w.done = true;
  w.status = st;
}

// Marks every WQE before `end` acknowledged. Stops at a read or atomic still waiting for its data.
void Qp::AckUpToLocked(size_t end) {
  bool progress = false;
  for (uint64_t i = head_; i < end; ++i) {
    SendWqe& w = SqAt(i);
    if (w.done) continue;
    if (IsReadOrAtomic(w.opcode)) break;
    CompleteSendWqeLocked(w, IBV_WC_SUCCESS);
    progress = true;
  }
  if (!progress) return;
  retry_left_ = attr_.retry_cnt;
  rnr_left_ = attr_.rnr_retry;
  retransmit_deadline_ = INT64_MAX;
  RetireLocked();
  if (head_ != next_) ArmRetransmitLocked();
}

void Qp::FailHeadLocked(size_t idx, ibv_wc_status st) {
  CompleteSendWqeLocked(SqAt(idx), st);
  if (Reliable()) {
    EnterErrorLocked();
    return;
  }
  // UC and UD: the send queue alone stops (SQE); receives keep working.
  SetStateLocked(IBV_QPS_SQE);
  for (uint64_t i = head_; i < tail_; ++i) {
    SendWqe& w = SqAt(i);
    if (!w.done) CompleteSendWqeLocked(w, IBV_WC_WR_FLUSH_ERR);
  }
  next_ = tail_;
  RetireLocked();
}

bool Qp::AnsweredWqeLocked(uint32_t psn, uint64_t* idx) {
  if (!Reliable() || head_ == next_) return false;
  if (state_ != IBV_QPS_RTS && state_ != IBV_QPS_SQD && state_ != IBV_QPS_SQE) return false;
  int32_t d = wire::PsnDiff(psn, SqAt(head_).psn);
  if (d < 0) return false;  // a duplicate of something already retired
  *idx = head_ + static_cast<uint64_t>(d);
  return *idx < next_;  // else it answers nothing we sent
}

void Qp::RxRiderAckLocked(uint32_t psn) {
  uint64_t idx;
  if (AnsweredWqeLocked(psn, &idx)) AckedThroughLocked(idx);
}

void Qp::AckedThroughLocked(uint64_t idx) {
  AckUpToLocked(idx + 1);
  RunRequesterLocked();
}

void Qp::RxResponseHeader(link::Channel& /*ch*/, const Packet& p, link::RxTarget& t) {
  RxWork& work = WorkOf(t);
  uint64_t idx;
  if (!AnsweredWqeLocked(p.bth->psn(), &idx)) return;
  SendWqe& w = SqAt(idx);
  const OpInfo& info = *p.info;
  uint8_t syndrome = info.has(kHasAeth) ? p.ext<wire::Aeth>(info.aeth)->syndrome : wire::aeth::kAck;

  if (info.mask & kIsRead) {
    if (w.opcode != IBV_WR_RDMA_READ || w.done) return;
    AckUpToLocked(idx);
    if (head_ != idx) return;  // an earlier read is still missing: the retransmit recovers it
    if (p.payload_len != w.length) return FailHeadLocked(idx, IBV_WC_BAD_RESP_ERR);
    KeyCheck why;
    for (uint32_t i = 0; i < w.num_sge; ++i) {
      const ibv_sge& s = w.sge[i];
      if (s.length == 0) continue;
      uint8_t* host =
          hca_.mrs().Resolve(s.lkey, pd_, s.addr, s.length, IBV_ACCESS_LOCAL_WRITE, true, &why);
      if (!host) return FailHeadLocked(idx, IBV_WC_LOC_PROT_ERR);
      t.Add(host, s.length);
    }
    work.kind = RxWork::kReadResponse;
    work.wqe_index = idx;
    return;
  }

  if (info.mask & kIsAtomic) {
    if (!IsReadOrAtomic(w.opcode) || w.opcode == IBV_WR_RDMA_READ || w.done) return;
    AckUpToLocked(idx);
    if (head_ != idx) return;
    uint64_t orig = p.ext<wire::AtomicAckEth>(info.atomic_ack)->value();
    KeyCheck why;
    uint8_t* host = hca_.mrs().Resolve(w.sge[0].lkey, pd_, w.sge[0].addr, 8, IBV_ACCESS_LOCAL_WRITE,
                                       true, &why);
    // Into pages the application may have made read-only (link/placement_guard.h).
    if (!host || !link::StoreGuarded(host, orig)) return FailHeadLocked(idx, IBV_WC_LOC_PROT_ERR);
    CompleteSendWqeLocked(w, IBV_WC_SUCCESS);
    if (rd_outstanding_ > 0) --rd_outstanding_;
    retry_left_ = attr_.retry_cnt;
    rnr_left_ = attr_.rnr_retry;
    retransmit_deadline_ = INT64_MAX;
    RetireLocked();
    if (head_ != next_) ArmRetransmitLocked();
    RunRequesterLocked();
    return;
  }

  if (wire::aeth::IsAck(syndrome)) return AckedThroughLocked(idx);
  AckUpToLocked(idx);
  if (head_ != idx) return;
  auto rewind_to = [this](uint64_t i) {
    next_ = i;
    sq_psn_ = SqAt(i).psn;
    rd_outstanding_ = 0;
    for (uint64_t j = head_; j < i; ++j)
      if (IsReadOrAtomic(SqAt(j).opcode)) ++rd_outstanding_;
  };
  if (wire::aeth::IsRnr(syndrome)) {
    if (attr_.rnr_retry != 7) {  // 7 means retry forever
      if (rnr_left_ <= 0) return FailHeadLocked(idx, IBV_WC_RNR_RETRY_EXC_ERR);
      --rnr_left_;
    }
    rewind_to(idx);
    rnr_resume_at_ = link::NowNs() + int64_t{kRnrDelayUs[syndrome & 0x1f]} * 1000;
    retransmit_deadline_ = INT64_MAX;
    timer_registered_ = true;
    // Armed even if listed: this wakes the progress thread for the short delay.
    hca_.ArmTimer(shared_from_this(), rnr_resume_at_, rnr_resume_at_);
    return;
  }
  uint8_t code = syndrome & 0x1f;
  if (code == wire::aeth::kNakPsnSeqError) {
    rewind_to(idx);
    RunRequesterLocked();
    return;
  }
  FailHeadLocked(idx, NakStatus(code));
}

void Qp::RxResponseEnd(RxWork& work) {
  if (work.kind != RxWork::kReadResponse) return;
  if (work.wqe_index < head_ || work.wqe_index >= next_) return;
  SendWqe& w = SqAt(work.wqe_index);
  if (w.done || state_ == IBV_QPS_ERR) return;
  CompleteSendWqeLocked(w, IBV_WC_SUCCESS);
  if (rd_outstanding_ > 0) --rd_outstanding_;
  retry_left_ = attr_.retry_cnt;
  rnr_left_ = attr_.rnr_retry;
  retransmit_deadline_ = INT64_MAX;
  RetireLocked();
  if (head_ != next_) ArmRetransmitLocked();
  RunRequesterLocked();
}

}  // namespace softrdma::core
