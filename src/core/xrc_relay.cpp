#include "core/xrc_relay.h"

#include <cstring>

#include "core/cq.h"
#include "core/hca.h"
#include "core/log.h"
#include "core/qp_internal.h"
#include "core/xrc.h"

namespace softrdma::core {
namespace {

uint16_t SlotOf(uint32_t number) {
  return static_cast<uint16_t>(number >> kQpIndexBits);
}

// LRH + BTH + AETH, from the owner back to the target QP that relayed message `psn`.
void SendAnswer(link::Channel& ch, uint16_t own_lid, uint32_t tgt_qpn, uint32_t psn,
                uint8_t syndrome) {
  link::OutFrame f;
  auto* lrh = reinterpret_cast<wire::Lrh*>(f.hdr);
  lrh->Set(0, SlotOf(tgt_qpn), own_lid, false);
  auto* bth = reinterpret_cast<wire::Bth*>(f.hdr + sizeof(wire::Lrh));
  const OpInfo& info = Opcode(op::kXrcRelayAnswer);
  bth->Set(op::kXrcRelayAnswer, false, 0xffff, tgt_qpn, psn, false);
  reinterpret_cast<wire::Aeth*>(reinterpret_cast<uint8_t*>(bth) + info.aeth)->Set(syndrome, 0);
  f.hdr_len = static_cast<uint8_t>(sizeof(wire::Lrh) + info.length);
  ch.Send(std::move(f));
}

// One relayed message at its owner, from its header to its end.
class XrcDelivery final : public FrameReceiver {
 public:
  XrcDelivery(Hca& hca, uint32_t srqn, const wire::XrcRelayEth& r, uint32_t psn, uint32_t len)
      : hca_(hca), srqn_(srqn), relay_(r), psn_(psn), len_(len) {}

  // Takes a WQE of the SRQ and points `t` at its buffers; false when the message ends here (the
  // answer is sent).
  bool Begin(link::Channel& ch, link::RxTarget& t) {
    std::lock_guard<std::mutex> g(hca_.xrc().mu());
    Srq* srq = hca_.xrc().FindSrqLocked(srqn_, relay_.dev_value(), relay_.ino_value());
    if (!srq) {
      SOFTRDMA_LOG("relayed message for XRC SRQ %#x: not of its domain here", srqn_);
      SendAnswer(ch, hca_.lid(), relay_.tgt_qpn_value(), psn_,
                 wire::aeth::kNak | wire::aeth::kNakInvalidRequest);
      return false;
    }
    if (!srq->PopForQp(&recv_)) {
      SendAnswer(ch, hca_.lid(), relay_.tgt_qpn_value(), psn_, wire::aeth::kRnrNak);
      return false;
    }
    taken_ = true;
    uint64_t room = 0;
    KeyCheck why;
    for (uint32_t i = 0; i < recv_.num_sge; ++i) {
      const ibv_sge& s = recv_.sge[i];
      if (s.length == 0) continue;
      uint8_t* host = hca_.mrs().Resolve(s.lkey, srq->pd(), s.addr, s.length,
                                         IBV_ACCESS_LOCAL_WRITE, true, &why);
      if (!host) {
        Fail(IBV_WC_LOC_PROT_ERR, wire::aeth::kNakRemoteOperation, t);
        return true;
      }
      t.Add(host, s.length);
      room += s.length;
    }
    if (len_ > room) {
      Fail(IBV_WC_LOC_LEN_ERR, wire::aeth::kNakInvalidRequest, t);
    } else if ((relay_.flags & wire::XrcRelayEth::kInv) &&
               !hca_.mrs().InvalidateMw(Imm(), srq->pd(), relay_.tgt_qpn_value())) {
      Fail(IBV_WC_REM_INV_REQ_ERR, wire::aeth::kNakInvalidRequest, t);
    }
    return true;
  }

  void RxEnd(link::Channel& ch, link::RxTarget&) override {
    ibv_wc wc{};
    wc.wr_id = recv_.wr_id;
    wc.status = status_;
    wc.opcode = IBV_WC_RECV;
    wc.byte_len = len_;
    if (relay_.flags & wire::XrcRelayEth::kInv) {
      wc.invalidated_rkey = Imm();
      wc.wc_flags |= IBV_WC_WITH_INV;
    } else if (relay_.flags & wire::XrcRelayEth::kImm) {
      std::memcpy(&wc.imm_data, relay_.imm, 4);
      wc.wc_flags |= IBV_WC_WITH_IMM;
    }
    wc.qp_num = relay_.tgt_qpn_value();
    wc.src_qp = relay_.src_qpn_value();
    wc.slid = relay_.slid_value();
    wc.sl = relay_.sl;
    {
      std::lock_guard<std::mutex> g(hca_.xrc().mu());
      Srq* srq = hca_.xrc().FindSrqLocked(srqn_, relay_.dev_value(), relay_.ino_value());
      if (srq && srq->cq()) srq->cq()->Push(wc, relay_.flags & wire::XrcRelayEth::kSolicited);
    }
    // After the completion: once the initiator learns the message arrived, so may its receiver.
    SendAnswer(ch, hca_.lid(), relay_.tgt_qpn_value(), psn_,
               nak_ == kNoNak ? wire::aeth::kAck : static_cast<uint8_t>(wire::aeth::kNak | nak_));
  }

  void RxAbort(link::RxTarget&) override {
    if (!taken_ || status_ != IBV_WC_SUCCESS) return;
    std::lock_guard<std::mutex> g(hca_.xrc().mu());
    if (Srq* srq = hca_.xrc().FindSrqLocked(srqn_, relay_.dev_value(), relay_.ino_value()))
      srq->PushFront(recv_);  // the target never heard back: the initiator sends it again
  }

 private:
  static constexpr uint8_t kNoNak = 0xff;
  uint32_t Imm() const { return wire::Load32(relay_.imm); }
  void Fail(ibv_wc_status st, uint8_t nak, link::RxTarget& t) {
    status_ = st;
    nak_ = nak;
    t.nseg = 0;  // the payload is read and discarded
  }

  Hca& hca_;
  const uint32_t srqn_;
  const wire::XrcRelayEth relay_;
  const uint32_t psn_, len_;
  RecvWqe recv_{};
  bool taken_ = false;
  ibv_wc_status status_ = IBV_WC_SUCCESS;
  uint8_t nak_ = kNoNak;
};

}  // namespace

void ReceiveXrcRelay(Hca& hca, link::Channel& ch, const Packet& p, link::RxTarget& t) {
  uint32_t srqn = p.ext<wire::XrcEth>(p.info->xrceth)->value();
  const auto* r = p.ext<wire::XrcRelayEth>(p.info->relay);
  // A relay comes from another process's target: one naming ours (the in-process link's
  // included) is not one.
  if (SlotOf(r->tgt_qpn_value()) == hca.lid()) return;
  auto d = std::make_shared<XrcDelivery>(hca, srqn, *r, p.bth->psn(), p.payload_len);
  if (d->Begin(ch, t)) t.hold = std::static_pointer_cast<FrameReceiver>(d);
}

// ---- The target's side ---------------------------------------------------------------------

bool Qp::RelayableLocked(uint32_t srqn, const Packet& p) const {
  return xrcd_ && xrcd_->shared() && (p.info->mask & kIsSend) && SlotOf(srqn) != hca_.lid() &&
         SlotOf(srqn) != 0 && p.payload_len <= kMaxRelayBytes;
}

// The request's header: it is held here (payload, the relay's headers) until it has gone to the
// SRQ's owner and been answered.
void Qp::BeginRelayLocked(link::Channel& ch, const Packet& p, link::RxTarget& t) {
  RxWork& w = WorkOf(t);
  const OpInfo& info = *p.info;
  relay_.active = true;
  relay_.psn = w.psn;
  relay_.reply = ResponseChannelLocked(ch);
  relay_.payload.assign(p.payload_len, 0);
  if (p.payload_len > 0) t.Add(relay_.payload.data(), p.payload_len);
  std::memcpy(relay_.header, p.ext<uint8_t>(info.xrceth), sizeof(wire::XrcEth));
  auto* r = reinterpret_cast<wire::XrcRelayEth*>(relay_.header + sizeof(wire::XrcEth));
  wire::Store64(r->dev, xrcd_->dev);
  wire::Store64(r->ino, xrcd_->ino);
  wire::Store32(r->tgt_qpn, qpn_);
  wire::Store32(r->src_qpn, attr_.dest_qp_num);
  r->flags = w.solicited ? wire::XrcRelayEth::kSolicited : 0;
  if (info.has(kHasImm)) {
    std::memcpy(r->imm, p.ext<uint8_t>(info.imm), 4);
    r->flags |= wire::XrcRelayEth::kImm;
  } else if (info.has(kHasIeth)) {
    wire::Store32(r->imm, p.ext<wire::Ieth>(info.ieth)->key());
    r->flags |= wire::XrcRelayEth::kInv;
  }
  r->sl = av_.attr.sl;
  wire::Store16(r->slid, av_.attr.dlid);
  w.kind = RxWork::kRelay;
  rq_psn_ = (w.psn + 1) & wire::kPsnMask;
}

void Qp::StartRelayLocked(const RxWork& w) {
  uint16_t slot = SlotOf(w.xrc_srqn);
  relay_.owner = hca_.ChannelToSlot(slot);
  if (!relay_.owner) {
    SOFTRDMA_LOG("qp %#x: XRC SRQ %#x names no process", qpn_, w.xrc_srqn);
    relay_.active = false;
    relay_.payload.clear();
    return ResponderErrorLocked(*relay_.reply, wire::aeth::kNakInvalidRequest, w.psn,
                                IBV_EVENT_QP_REQ_ERR);
  }
  FlushAckLocked();  // what came before is acknowledged in order, ahead of this message
  link::OutFrame f;
  auto* lrh = reinterpret_cast<wire::Lrh*>(f.hdr);
  lrh->Set(av_.attr.sl, slot, hca_.lid(), false);
  auto* bth = reinterpret_cast<wire::Bth*>(f.hdr + sizeof(wire::Lrh));
  const OpInfo& info = Opcode(op::kXrcRelaySend);
  bth->Set(op::kXrcRelaySend, w.solicited, 0xffff, qpn_, w.psn, false);
  std::memcpy(reinterpret_cast<uint8_t*>(bth) + info.xrceth, relay_.header, sizeof relay_.header);
  f.hdr_len = static_cast<uint8_t>(sizeof(wire::Lrh) + info.length);
  if (!relay_.payload.empty()) f.AddPayload(relay_.payload.data(), relay_.payload.size());
  f.payload_outlives_send = false;  // the QP may go before the link writes it: copied then
  relay_.owner->Send(std::move(f));
}

void Qp::OnRelayAnswer(uint32_t psn, uint8_t syndrome) {
  std::lock_guard g(mu_);
  if (shut_down_ || !relay_.active || psn != relay_.psn) return;
  relay_.active = false;
  relay_.payload.clear();
  std::shared_ptr<link::Channel> reply = std::move(relay_.reply);
  relay_.owner.reset();
  bool dropped = relay_.dropped;
  relay_.dropped = false;
  if (state_ == IBV_QPS_ERR || !reply) return;
  if (wire::aeth::IsAck(syndrome)) {
    ++msn_;
    if (dropped) {
      // Acknowledges this message and has the initiator resend the ones dropped meanwhile now,
      // not after its retransmission timer (a 4-client ibv_xsrq_pingpong took 12 s instead of 1).
      FlushAckLocked();
      seq_nak_sent_ = true;
      SendAckLocked(*reply, wire::aeth::kNak | wire::aeth::kNakPsnSeqError,
                    (psn + 1) & wire::kPsnMask);
      return;
    }
    ack_pending_ = true;
    ack_psn_ = psn;
    FlushAckLocked();
  } else if (wire::aeth::IsRnr(syndrome)) {
    // Not executed: the initiator sends it again after its RNR wait, and it is relayed anew.
    rq_psn_ = psn;
    rnr_nak_outstanding_ = true;
    SendAckLocked(*reply, wire::aeth::kRnrNak | (attr_.min_rnr_timer & 0x1f), psn);
  } else {
    ResponderErrorLocked(*reply, syndrome & 0x1f, psn, IBV_EVENT_QP_REQ_ERR);
  }
}

}  // namespace softrdma::core
