// The responder: validates and executes inbound requests (PSN, operation, receive WQE, keys,
// bounds), places their data, and answers with ACK, NAK, RNR NAK, read responses and atomic
// acknowledgements. Never touches memory outside a registered region.
#include <cstring>

#include "core/context.h"
#include "core/cq.h"
#include "core/hca.h"
#include "core/log.h"
#include "core/qp.h"
#include "core/qp_internal.h"
#include "link/placement_guard.h"

namespace softrdma::core {
bool Qp::TakeRecvLocked(Srq* xrc_srq, RecvWqe* out) {
  if (xrc_srq) return xrc_srq->PopForQp(out);
  if (rq_) return TakeOwnRecvLocked(out);  // with an SRQ, what it lent comes first
  return srq_ && PopSrqLocked(out);
}

void Qp::SendAckLocked(link::Channel& ch, uint8_t syndrome, uint32_t psn) {
  link::OutFrame f;
  uint8_t op = QpTransport(type_) | op::kAcknowledge;
  uint8_t* bth = BuildHeaderLocked(f, op, false, attr_.dest_qp_num, psn, nullptr);
  reinterpret_cast<wire::Aeth*>(bth + Opcode(op).aeth)->Set(syndrome, msn_);
  ch.Send(std::move(f));
}

void Qp::FlushAck() {
  std::lock_guard g(mu_);
  ack_queued_ = false;
  if (!shut_down_) FlushAckLocked();
}

void Qp::FlushAckLocked() {
  if (ack_pending_) {
    ack_pending_ = false;
    ack_deadline_ = INT64_MAX;
    if (ack_channel_) {
      ack_sent_ns_ = link::NowNs();  // a request of ours soon after: ping-pong (RxRequestEnd)
      SendAckLocked(*ack_channel_, wire::aeth::kAck, ack_psn_);
    }
  }
  ReleaseHeldCompletionsLocked();
}

void Qp::ReleaseHeldCompletionsLocked() {
  for (const PendingCqe& c : pending_cqes_) PushRecvCompletionLocked(c.xrc_srqn, c.wc, c.solicited);
  pending_cqes_.clear();
}

void Qp::PushRecvCompletionLocked(uint32_t xrc_srqn, const ibv_wc& wc, bool solicited) {
  if (xrc_srqn == 0) return PushCompletionLocked(recv_cq_, wc, solicited);
  std::lock_guard<std::mutex> g(hca_.xrc().mu());
  Srq* srq = hca_.xrc().FindSrqLocked(xrc_srqn, xrcd_.get());
  if (srq) PushCompletionLocked(srq->cq(), wc, solicited);  // gone: nobody to tell
}

// Responses follow the QP's own path when it reaches the node the request came from, so they
// share a connection with the requests this QP sends (which lets an ACK ride with one). The
// choice is made once: responses of one QP must not be split over two connections.
const std::shared_ptr<link::Channel>& Qp::ResponseChannelLocked(link::Channel& arrival) {
  if (ack_channel_) return ack_channel_;
  std::shared_ptr<link::Channel> own = av_.channel;
  bool same = own && !own->closed() &&
              (own.get() == &arrival || std::memcmp(own->peer_id().bytes, arrival.peer_id().bytes,
                                                    sizeof arrival.peer_id().bytes) == 0);
  static const link::NodeId kUnknown{};
  if (same && std::memcmp(own->peer_id().bytes, kUnknown.bytes, sizeof kUnknown.bytes) == 0 &&
      own.get() != &arrival)
    same = false;  // the peer's hello has not arrived on our connection yet
  ack_channel_ = same ? own : arrival.shared_from_this();
  return ack_channel_;
}

void Qp::SendReadResponseLocked(link::Channel& ch, uint32_t psn, uint8_t* src, uint32_t len,
                                bool deferrable) {
  FlushAckLocked();  // keep responses in PSN order on the wire
  link::OutFrame f;
  uint8_t op = QpTransport(type_) | op::kReadResponseOnly;
  uint8_t* bth = BuildHeaderLocked(f, op, false, attr_.dest_qp_num, psn, nullptr);
  reinterpret_cast<wire::Aeth*>(bth + Opcode(op).aeth)->Set(wire::aeth::kAck, msn_);
  if (len) f.AddPayload(src, len);
  f.payload_outlives_send = true;  // registered memory of this process
  f.deferrable = deferrable;
  ch.Send(std::move(f));
}

void Qp::SendAtomicAckLocked(link::Channel& ch, uint32_t psn, uint64_t orig, bool deferrable) {
  FlushAckLocked();
  link::OutFrame f;
  uint8_t op = QpTransport(type_) | op::kAtomicAcknowledge;
  uint8_t* bth = BuildHeaderLocked(f, op, false, attr_.dest_qp_num, psn, nullptr);
  const OpInfo& info = Opcode(op);
  reinterpret_cast<wire::Aeth*>(bth + info.aeth)->Set(wire::aeth::kAck, msn_);
  reinterpret_cast<wire::AtomicAckEth*>(bth + info.atomic_ack)->Set(orig);
  f.deferrable = deferrable;
  ch.Send(std::move(f));
}

// A request the responder cannot execute: NAK it and stop the QP (IBTA class C/D errors).
void Qp::ResponderErrorLocked(link::Channel& ch, uint8_t nak, uint32_t psn, ibv_event_type ev) {
  if (!Reliable()) return;  // UC drops silently
  SendAckLocked(ch, wire::aeth::kNak | nak, psn);
  EnterErrorLocked();
  RaiseAsync(ev);
}

namespace {

// An HCA's atomic lands in a page the application made read-only since registration, too
// (link/placement_guard.h). There it is a read and a write past the protection, not atomic against
// a same-host peer's direct atomic on that very word meanwhile. False when even that was refused.
bool ExecuteAtomic(uint8_t* host, bool compare_swap, uint64_t compare, uint64_t value,
                   uint64_t* orig) {
  auto* target = reinterpret_cast<uint64_t*>(host);
  const bool done = compare_swap ? link::GuardedCompareSwap(target, compare, value, orig)
                                 : link::GuardedFetchAdd(target, value, orig);
  if (done) return true;
  uint64_t now;
  if (!link::ReadIgnoringProtection(&now, host, sizeof now)) return false;
  const uint64_t next = compare_swap ? (now == compare ? value : now) : now + value;
  if (!link::WriteIgnoringProtection(host, &next, sizeof next)) return false;
  *orig = now;
  return true;
}

}  // namespace

void Qp::RxRequestHeader(link::Channel& ch, const Packet& p, link::RxTarget& t) {
  RxWork& w = WorkOf(t);
  const OpInfo& info = *p.info;
  uint8_t opcode = p.bth->opcode;
  if (OpTransport(opcode) != QpTransport(type_) || !ResponderActive(state_)) {
    SOFTRDMA_LOG("qp %#x: request dropped (opcode %#x, state %d)", qpn_, opcode, state_);
    return;
  }
  if (type_ == IBV_QPT_XRC_SEND) return;  // an initiator only: it executes no requests
  if (state_ == IBV_QPS_RTR && !comm_est_raised_) {
    comm_est_raised_ = true;
    RaiseAsync(IBV_EVENT_COMM_EST);
  }
  uint32_t psn = p.bth->psn();
  w.psn = psn;
  if (stopping_) {
    SOFTRDMA_LOG("qp %#x: psn %#x left to the process this target is handed to", qpn_, psn);
    return;
  }
  if (relay_.active && wire::PsnDiff(psn, relay_.psn) >= 0) {
    relay_.dropped = relay_.dropped || psn != relay_.psn;
    SOFTRDMA_LOG("qp %#x: psn %#x waits for the relayed message %#x", qpn_, psn, relay_.psn);
    return;
  }
  // An XRC target executes a request on behalf of the SRQ its XRCETH names, which must be of the
  // target's domain: that SRQ's PD checks every key, and its CQ gets the receive completion. The
  // registry's lock keeps the SRQ from being destroyed under us.
  std::unique_lock<std::mutex> xrc_lock;
  const Pd* key_pd = pd_;
  bool relay = false;  // a SEND for an SRQ of another process of the domain
  if (type_ == IBV_QPT_XRC_RECV) {
    xrc_lock = std::unique_lock<std::mutex>(hca_.xrc().mu());
    uint32_t srqn = p.ext<wire::XrcEth>(info.xrceth)->value();
    w.xrc_srq = hca_.xrc().FindSrqLocked(srqn, xrcd_.get());
    w.xrc_srqn = srqn;
    relay = !w.xrc_srq && RelayableLocked(srqn, p);
    if (!w.xrc_srq && !relay) {
      SOFTRDMA_LOG("qp %#x: no XRC SRQ %#x in its domain", qpn_, srqn);
      return ResponderErrorLocked(ch, wire::aeth::kNakInvalidRequest, psn, IBV_EVENT_QP_REQ_ERR);
    }
    if (w.xrc_srq) key_pd = w.xrc_srq->pd();
  }
  w.solicited = p.bth->solicited();
  // softrdma sends every message as one frame; split messages are not part of its protocol.
  if ((info.mask & kIsOnly) != kIsOnly)
    return ResponderErrorLocked(ch, wire::aeth::kNakInvalidRequest, psn, IBV_EVENT_QP_REQ_ERR);

  if (Reliable()) {
    int32_t d = wire::PsnDiff(psn, rq_psn_);
    if (d > 0) {
      // A gap: something before was dropped (e.g. sent before this QP reached RTR). Ask once for
      // a resend unless an RNR NAK already makes the requester rewind.
      if (!rnr_nak_outstanding_ && !seq_nak_sent_) {
        seq_nak_sent_ = true;
        SendAckLocked(*ResponseChannelLocked(ch), wire::aeth::kNak | wire::aeth::kNakPsnSeqError,
                      rq_psn_);
      }
      return;
    }
    if (d < 0) {
      // A retransmitted request we already executed: answer again, never execute twice, except
      // reads which are idempotent.
      if (info.mask & kIsAtomic) {
        for (const AtomicReplay& r : atomic_replay_)
          if (r.valid && r.psn == psn) SendAtomicAckLocked(ch, psn, r.orig);
        return;
      }
      if (!(info.mask & kIsRead)) {
        // Never past a relayed message still waiting for its owner's answer.
        uint32_t done = relay_.active ? relay_.psn : rq_psn_;
        SendAckLocked(ch, wire::aeth::kAck, (done - 1) & wire::kPsnMask);
        return;
      }
    }
    seq_nak_sent_ = false;
    rnr_nak_outstanding_ = false;
  } else {
    rq_psn_ = psn;  // UC: no retransmission, accept what arrives
  }
  bool duplicate_read = Reliable() && wire::PsnDiff(psn, rq_psn_) < 0;

  if (relay) return BeginRelayLocked(ch, p, t);

  // Checks that can refuse a request come before it takes a receive WQE.
  if (info.mask & kIsWrite) {
    const auto* reth = p.ext<wire::Reth>(info.reth);
    uint32_t len = reth->length();
    if (len != p.payload_len) {
      t.nseg = 0;
      w.kind = RxWork::kDrop;
      return ResponderErrorLocked(ch, wire::aeth::kNakInvalidRequest, psn, IBV_EVENT_QP_REQ_ERR);
    }
    if (!(attr_.qp_access_flags & IBV_ACCESS_REMOTE_WRITE)) {
      w.kind = RxWork::kDrop;
      return ResponderErrorLocked(ch, wire::aeth::kNakInvalidRequest, psn, IBV_EVENT_QP_REQ_ERR);
    }
    if (len > 0) {
      KeyCheck why;
      uint8_t* host =
          hca_.mrs().Resolve(reth->key(), key_pd, reth->addr(), len, IBV_ACCESS_REMOTE_WRITE, false,
                             &why, qpn_, nullptr, &mr_cache_);
      if (!host) {
        w.kind = RxWork::kDrop;
        return ResponderErrorLocked(ch, wire::aeth::kNakRemoteAccess, psn, IBV_EVENT_QP_ACCESS_ERR);
      }
      t.Add(host, len);
    }
    w.kind = RxWork::kWrite;
    w.wc_opcode = IBV_WC_RECV_RDMA_WITH_IMM;
    w.byte_len = len;
  }

  if (info.mask & kConsumesRecv) {
    RecvWqe r;
    if (!TakeRecvLocked(w.xrc_srq, &r)) {
      SOFTRDMA_LOG("qp %#x: no receive WQE for psn %#x", qpn_, psn);
      t.nseg = 0;
      w.kind = RxWork::kDrop;
      if (Reliable()) {
        rnr_nak_outstanding_ = true;
        SendAckLocked(ch, wire::aeth::kRnrNak | (attr_.min_rnr_timer & 0x1f), psn);
      }
      return;
    }
    w.has_recv = true;
    w.recv = r;
    w.wr_id = r.wr_id;
    w.recv_status = IBV_WC_SUCCESS;
    w.kind = RxWork::kRecv;
    if (info.has(kHasImm)) {
      std::memcpy(&w.imm, p.ext<uint8_t>(info.imm), 4);
      w.wc_flags |= IBV_WC_WITH_IMM;
    }
    if (info.has(kHasIeth)) {
      w.imm = p.ext<wire::Ieth>(info.ieth)->key();
      w.wc_flags |= IBV_WC_WITH_INV;
    }
    if (info.mask & kIsSend) {
      w.wc_opcode = IBV_WC_RECV;
      w.byte_len = p.payload_len;
      const Pd* pd = w.xrc_srq ? key_pd : srq_ ? srq_->pd() : pd_;
      uint64_t room = 0;
      KeyCheck why;
      for (uint32_t i = 0; i < r.num_sge; ++i) {
        const ibv_sge& s = r.sge[i];
        if (s.length == 0) continue;
        uint8_t* host = hca_.mrs().Resolve(s.lkey, pd, s.addr, s.length, IBV_ACCESS_LOCAL_WRITE,
                                           true, &why, 0, nullptr, &mr_cache_);
        if (!host) {
          w.recv_status = IBV_WC_LOC_PROT_ERR;
          w.nak = wire::aeth::kNakRemoteOperation;
          t.nseg = 0;
          break;
        }
        t.Add(host, s.length);
        room += s.length;
      }
      if (w.recv_status == IBV_WC_SUCCESS && p.payload_len > room) {
        w.recv_status = IBV_WC_LOC_LEN_ERR;
        w.nak = wire::aeth::kNakInvalidRequest;
        t.nseg = 0;
      }
    }
    // SEND_WITH_INV: the type 2 window the key names, bound through this QP, is invalidated
    // (as rxe: otherwise both sides complete with REM_INV_REQ_ERR).
    if (info.has(kHasIeth) && w.recv_status == IBV_WC_SUCCESS &&
        !hca_.mrs().InvalidateMw(w.imm, key_pd, qpn_)) {
      w.recv_status = IBV_WC_REM_INV_REQ_ERR;
      w.nak = wire::aeth::kNakInvalidRequest;
      t.nseg = 0;
    }
  }

  if (info.mask & kIsRead) {
    const auto* reth = p.ext<wire::Reth>(info.reth);
    uint32_t len = reth->length();
    if (!(attr_.qp_access_flags & IBV_ACCESS_REMOTE_READ))
      return ResponderErrorLocked(ch, wire::aeth::kNakInvalidRequest, psn, IBV_EVENT_QP_REQ_ERR);
    uint8_t* host = nullptr;
    if (len > 0) {
      KeyCheck why;
      host = hca_.mrs().Resolve(reth->key(), key_pd, reth->addr(), len, IBV_ACCESS_REMOTE_READ,
                                false, &why, qpn_, nullptr, &mr_cache_);
      // Pages unmapped or made inaccessible since registration: an on-demand region's page fault
      // (REM_ACCESS_ERR at the requester), not the end of this process in the response's copy.
      if (!host || !link::Readable(host, len))
        return ResponderErrorLocked(ch, wire::aeth::kNakRemoteAccess, psn, IBV_EVENT_QP_ACCESS_ERR);
    }
    if (!duplicate_read) {
      rq_psn_ = (psn + 1) & wire::kPsnMask;
      ++msn_;
    }
    SendReadResponseLocked(ch, psn, host, len, t.inbound_follows);
    return;
  }

  if (info.mask & kIsAtomic) {
    const auto* a = p.ext<wire::AtomicEth>(info.atomic_eth);
    if (!(attr_.qp_access_flags & IBV_ACCESS_REMOTE_ATOMIC) || (a->addr() & 7))
      return ResponderErrorLocked(ch, wire::aeth::kNakInvalidRequest, psn, IBV_EVENT_QP_REQ_ERR);
    KeyCheck why;
    uint8_t* host = hca_.mrs().Resolve(a->key(), key_pd, a->addr(), 8, IBV_ACCESS_REMOTE_ATOMIC,
                                       false, &why, qpn_, nullptr, &mr_cache_);
    if (!host)
      return ResponderErrorLocked(ch, wire::aeth::kNakRemoteAccess, psn, IBV_EVENT_QP_ACCESS_ERR);
    uint64_t orig;
    if (!ExecuteAtomic(host, (opcode & 0x1f) == op::kCompareSwap, a->compare_value(),
                       a->swap_add_value(), &orig))
      return ResponderErrorLocked(ch, wire::aeth::kNakRemoteAccess, psn, IBV_EVENT_QP_ACCESS_ERR);
    atomic_replay_[atomic_replay_next_++ % kMaxRdAtomic] = AtomicReplay{psn, orig, true};
    rq_psn_ = (psn + 1) & wire::kPsnMask;
    ++msn_;
    SendAtomicAckLocked(ch, psn, orig, t.inbound_follows);
    return;
  }

  rq_psn_ = (psn + 1) & wire::kPsnMask;
}

void Qp::RxUdHeader(link::Channel& ch, const Packet& p, link::RxTarget& t) {
  RxWork& w = WorkOf(t);
  const OpInfo& info = *p.info;
  if (OpTransport(p.bth->opcode) != op::kUd || !ResponderActive(state_) || !p.grh) {
    SOFTRDMA_LOG("qp %#x: UD frame dropped (opcode %#x, state %d)", qpn_, p.bth->opcode, state_);
    return;
  }
  const auto* deth = p.ext<wire::Deth>(info.deth);
  if (deth->qkey_value() != attr_.qkey) {  // Q_Key violation: silently dropped
    SOFTRDMA_LOG("qp %#x: UD frame dropped: qkey %#x, expected %#x", qpn_, deth->qkey_value(),
                 attr_.qkey);
    return;
  }
  RecvWqe r;
  if (!TakeRecvLocked(nullptr, &r)) {
    if (WaitForReceiveLocked(ch)) {
      t.wait = true;
      return;
    }
    SOFTRDMA_LOG("qp %#x: UD frame dropped: no receive WQE", qpn_);
    return;
  }
  w.kind = RxWork::kRecv;
  w.has_recv = true;
  w.recv = r;
  w.wr_id = r.wr_id;
  w.recv_status = IBV_WC_SUCCESS;
  w.wc_opcode = IBV_WC_RECV;
  w.solicited = p.bth->solicited();
  w.byte_len = p.payload_len + sizeof(wire::Grh);
  w.src_qp = deth->src_qpn();
  w.slid = p.lrh->slid_value();
  w.sl = p.lrh->sl();
  w.wc_flags = IBV_WC_GRH;
  if (info.has(kHasImm)) {
    std::memcpy(&w.imm, p.ext<uint8_t>(info.imm), 4);
    w.wc_flags |= IBV_WC_WITH_IMM;
  }
  // The receive buffer starts with the 40-byte GRH, then the payload.
  const Pd* pd = srq_ ? srq_->pd() : pd_;
  uint64_t room = 0;
  link::RxTarget segs;
  KeyCheck why;
  for (uint32_t i = 0; i < r.num_sge; ++i) {
    const ibv_sge& s = r.sge[i];
    if (s.length == 0) continue;
    uint8_t* host = hca_.mrs().Resolve(s.lkey, pd, s.addr, s.length, IBV_ACCESS_LOCAL_WRITE, true,
                                       &why, 0, nullptr, &mr_cache_);
    if (!host) {
      w.recv_status = IBV_WC_LOC_PROT_ERR;
      return;
    }
    segs.Add(host, s.length);
    room += s.length;
  }
  if (room < w.byte_len) {
    w.recv_status = IBV_WC_LOC_LEN_ERR;
    return;
  }
  const auto* grh = reinterpret_cast<const uint8_t*>(p.grh);
  size_t grh_left = sizeof(wire::Grh);
  for (int i = 0; i < segs.nseg; ++i) {
    auto* base = static_cast<uint8_t*>(segs.seg[i].iov_base);
    size_t len = segs.seg[i].iov_len;
    size_t c = grh_left < len ? grh_left : len;
    // Into pages the application may have made read-only (link/placement_guard.h).
    if (!link::PlaceGuarded(base, grh + (sizeof(wire::Grh) - grh_left), c)) t.refused = true;
    grh_left -= c;
    if (c < len) t.Add(base + c, len - c);
  }
}

void Qp::RxRequestEnd(link::Channel& ch, RxWork& w) {
  if (w.kind == RxWork::kDrop) return;
  if (w.kind == RxWork::kRelay) {
    if (relay_.active && relay_.psn == w.psn && state_ != IBV_QPS_ERR) StartRelayLocked(w);
    return;
  }
  // A failed message completes after every earlier one: release held completions and the ACK
  // owed for older PSNs before its error completion and NAK.
  if (w.nak != RxWork::kNoNak && state_ != IBV_QPS_ERR) FlushAckLocked();
  if (w.has_recv) {
    ibv_wc wc{};
    wc.wr_id = w.wr_id;
    wc.status = state_ == IBV_QPS_ERR && w.recv_status == IBV_WC_SUCCESS ? IBV_WC_WR_FLUSH_ERR
                                                                         : w.recv_status;
    wc.opcode = w.wc_opcode;
    wc.byte_len = w.byte_len;
    if (w.wc_flags & IBV_WC_WITH_INV)
      wc.invalidated_rkey = w.imm;
    else
      wc.imm_data = w.imm;
    wc.qp_num = qpn_;
    wc.src_qp = type_ == IBV_QPT_UD ? w.src_qp : attr_.dest_qp_num;
    wc.wc_flags = w.wc_flags;
    wc.slid = type_ == IBV_QPT_UD ? w.slid : av_.attr.dlid;
    wc.sl = type_ == IBV_QPT_UD ? w.sl : av_.attr.sl;
    if (Reliable() && wc.status == IBV_WC_SUCCESS && state_ != IBV_QPS_ERR)
      pending_cqes_.push_back(PendingCqe{wc, w.solicited, w.xrc_srqn});
    else
      PushRecvCompletionLocked(w.xrc_srqn, wc, w.solicited);
  }
  if (state_ == IBV_QPS_ERR) return;
  if (w.nak != RxWork::kNoNak) {
    if (Reliable()) {
      SendAckLocked(ch, wire::aeth::kNak | w.nak, w.psn);
      RaiseAsync(IBV_EVENT_QP_REQ_ERR);
    }
    EnterErrorLocked();
    return;
  }
  if (!Reliable()) return;
  ++msn_;
  ack_pending_ = true;
  ack_psn_ = w.psn;
  ResponseChannelLocked(ch);  // chosen now, for this ACK and every later response
  // Not while requests of ours wait for the peer's ACKs: in traffic both ways (ib_send_bw -b) a
  // full send queue waits for them, and the peer's, waiting for ours, posts no answer either.
  if (ack_defer_ && head_ == tail_) {
    // The application is expected to answer: completions are visible now (the ACK will follow
    // within kAckDeferNs, or with the answer), and the timer bounds the wait. Over shared memory
    // too, where a frame costs no system call: an ACK ahead of the answer let the peer's poll take
    // it and leave, and the answer then had to wake its progress thread (ib_write_lat --odp).
    ReleaseHeldCompletionsLocked();
    if (ack_deadline_ == INT64_MAX) ack_deadline_ = link::NowNs() + kAckDeferNs;
    RegisterTimerLocked(ack_deadline_, AckWakeNs(ack_deadline_));
    return;
  }
  if (!ack_queued_) {
    ack_queued_ = true;
    hca_.QueueAck(shared_from_this());
  }
}

}  // namespace softrdma::core
