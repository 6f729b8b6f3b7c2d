// The requester: turns send WQEs into request frames, in order, honouring fences, the
// outstanding read/atomic budget and RNR back-off. Runs inline in ibv_post_send and again from the
// completer when a response frees the way.
#include <algorithm>
#include <cstddef>

#include "core/context.h"
#include "core/cq.h"
#include "core/hca.h"
#include "core/limits.h"
#include "core/log.h"
#include "core/qp.h"
#include "link/placement_guard.h"

namespace softrdma::core {
namespace {

struct WrMapping {
  uint8_t bth_op;  // without the transport bits
  bool read_or_atomic;
};

WrMapping MapWr(ibv_wr_opcode op) {
  switch (op) {
    case IBV_WR_SEND:
      return {op::kSendOnly, false};
    case IBV_WR_SEND_WITH_IMM:
      return {op::kSendOnlyImm, false};
    case IBV_WR_SEND_WITH_INV:
      return {op::kSendOnlyInv, false};
    case IBV_WR_RDMA_WRITE:
      return {op::kWriteOnly, false};
    case IBV_WR_RDMA_WRITE_WITH_IMM:
      return {op::kWriteOnlyImm, false};
    case IBV_WR_RDMA_READ:
      return {op::kReadRequest, true};
    case IBV_WR_ATOMIC_CMP_AND_SWP:
      return {op::kCompareSwap, true};
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
      return {op::kFetchAdd, true};
    default:
      return {0xff, false};
  }
}

// How long the requester waits for a response before it retransmits. The IBTA period is floored
// and stretched by the bytes in flight: over TCP a large message is acknowledged only once it has
// been fully received, so the spec's per-packet period would fire spuriously.
constexpr int64_t kRetransmitFloorNs = 20'000'000;

int64_t RetransmitPeriodNs(uint8_t timeout, uint64_t bytes_in_flight) {
  if (timeout == 0) return INT64_MAX;
  int64_t spec = int64_t{4096} << std::min<int>(timeout, 31);
  return std::max<int64_t>(spec, kRetransmitFloorNs) + static_cast<int64_t>(bytes_in_flight);
}

}  // namespace

uint8_t* Qp::BuildHeaderLocked(link::OutFrame& f, uint8_t opcode, bool solicited, uint32_t dqpn,
                               uint32_t psn, const AddressVector* ud_av) {
  uint32_t payload_len = f.payload_len;
  uint8_t* p = f.hdr;
  const ibv_ah_attr& ah = ud_av ? ud_av->attr : av_.attr;
  auto* lrh = reinterpret_cast<wire::Lrh*>(p);
  lrh->Set(ah.sl, ah.dlid, hca_.lid(), ud_av != nullptr);
  p += sizeof(wire::Lrh);
  if (ud_av) {
    // UD receivers get a GRH in front of the data (and ibv_create_ah_from_wc reads it back).
    const auto& gids = hca_.gids();
    uint8_t sidx = ah.is_global && ah.grh.sgid_index < gids.size() ? ah.grh.sgid_index : 0;
    static const uint8_t kZero[16] = {};
    auto* grh = reinterpret_cast<wire::Grh*>(p);
    // PayLen: what follows the GRH (transport headers, payload, the 4-byte ICRC of RoCE).
    uint16_t pay_len = static_cast<uint16_t>(Opcode(opcode).length + payload_len + 4);
    grh->Set(ah.grh.traffic_class, ah.grh.flow_label, pay_len, ah.is_global ? ah.grh.hop_limit : 64,
             gids[sidx].raw, ah.is_global ? ah.grh.dgid.raw : kZero);
    p += sizeof(wire::Grh);
  }
  auto* bth = reinterpret_cast<wire::Bth*>(p);
  bth->Set(opcode, solicited, 0xffff, dqpn, psn, Reliable());
  f.hdr_len = static_cast<uint8_t>(p - f.hdr + Opcode(opcode).length);
  return p;
}

ibv_wc_status Qp::SendWqeLocked(SendWqe& w) {
  WrMapping m = MapWr(w.opcode);
  uint8_t opcode = QpTransport(type_) | m.bth_op;
  const OpInfo& info = Opcode(opcode);
  if (!info.valid()) return IBV_WC_LOC_QP_OP_ERR;

  // Connected QPs take their path's connection at the first frame (link::Channel::Settle).
  if (type_ != IBV_QPT_UD && av_.channel && !av_.channel->settled())
    av_.channel = av_.channel->Settle();
  const AddressVector* av = &av_;
  uint32_t dqpn = attr_.dest_qp_num;
  if (type_ == IBV_QPT_UD) {
    av = w.ah ? &w.ah->av : nullptr;
    dqpn = w.remote_qpn;
    if (w.length > kMtuBytes) return IBV_WC_LOC_LEN_ERR;
  } else if (w.length > kMaxMsgSize) {
    return IBV_WC_LOC_LEN_ERR;
  }

  link::OutFrame f;
  // Local memory checks happen before anything leaves: a bad lkey is the sender's error.
  KeyCheck why;
  if (info.has(kHasPayload)) {
    if (w.num_sge == 0 && w.length > 0) {
      f.AddPayload(w.inline_buf, w.length);
    } else {
      for (uint32_t i = 0; i < w.num_sge; ++i) {
        const ibv_sge& s = w.sge[i];
        if (s.length == 0) continue;
        uint8_t* host = hca_.mrs().Resolve(s.lkey, pd_, s.addr, s.length, 0, true, &why, 0, nullptr,
                                           &mr_cache_);
        // Pages the application unmapped or made inaccessible since it registered them: the
        // send would fault (a TCP send fails with EFAULT, the connection with it) or, in one
        // process, the responder would blame itself. The sender's error, as an on-demand
        // region's page fault.
        if (!host || !link::Readable(host, s.length)) return IBV_WC_LOC_PROT_ERR;
        f.AddPayload(host, s.length);
      }
    }
  } else if (m.read_or_atomic) {
    if ((info.mask & kIsAtomic) && (w.num_sge != 1 || w.sge[0].length != 8))
      return IBV_WC_LOC_LEN_ERR;
    for (uint32_t i = 0; i < w.num_sge; ++i) {
      const ibv_sge& s = w.sge[i];
      if (s.length == 0) continue;
      if (!hca_.mrs().Resolve(s.lkey, pd_, s.addr, s.length, IBV_ACCESS_LOCAL_WRITE, true, &why, 0,
                              nullptr, &mr_cache_))
        return IBV_WC_LOC_PROT_ERR;
    }
  }

  uint32_t psn = sq_psn_;
  sq_psn_ = (sq_psn_ + 1) & wire::kPsnMask;
  w.psn = psn;
  w.sent = true;
  if (m.read_or_atomic) ++rd_outstanding_;

  bool multicast = type_ == IBV_QPT_UD && av && dqpn == kMulticastQpn && av->attr.is_global &&
                   IsMulticastGid(av->attr.grh.dgid);
  if (!multicast && (!av || !av->channel || av->channel->closed())) {
    SOFTRDMA_LOG("qp %#x: no path to qpn %#x, message %s", qpn_, dqpn,
                 Reliable() ? "fails" : "lost");
    // Unreliable transports lose the message silently; RC reports the dead path.
    return Reliable() ? IBV_WC_RETRY_EXC_ERR : IBV_WC_SUCCESS;
  }

  uint8_t* bth = BuildHeaderLocked(f, opcode, w.send_flags & IBV_SEND_SOLICITED, dqpn, psn,
                                   type_ == IBV_QPT_UD ? av : nullptr);
  if (info.has(kHasXrcEth)) reinterpret_cast<wire::XrcEth*>(bth + info.xrceth)->Set(w.remote_srqn);
  if (info.has(kHasDeth)) {
    uint32_t qkey = (w.remote_qkey & 0x80000000u) ? attr_.qkey : w.remote_qkey;
    reinterpret_cast<wire::Deth*>(bth + info.deth)->Set(qkey, qpn_);
  }
  if (info.has(kHasReth))
    reinterpret_cast<wire::Reth*>(bth + info.reth)->Set(w.remote_addr, w.rkey, w.length);
  if (info.has(kHasAtomicEth)) {
    bool cas = w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP;
    reinterpret_cast<wire::AtomicEth*>(bth + info.atomic_eth)
        ->Set(w.remote_addr, w.rkey, cas ? w.swap : w.compare_add, cas ? w.compare_add : 0);
  }
  if (info.has(kHasImm)) std::memcpy(bth + info.imm, &w.imm_or_rkey, 4);
  if (info.has(kHasIeth)) reinterpret_cast<wire::Ieth*>(bth + info.ieth)->Set(w.imm_or_rkey);

  f.payload_outlives_send = Reliable();
  f.datagram = type_ == IBV_QPT_UD;
  f.awaited_in_memory = w.opcode == IBV_WR_RDMA_WRITE;
  f.deferrable = Reliable() && next_ - head_ >= kDeferrableInFlight;
  if (Reliable() && ack_pending_ && ack_channel_ == av->channel) {
    // An ACK owed to the peer leaves with this request, in one write: riding on it where the peer
    // reads that, else as a frame of its own before it.
    ack_pending_ = false;
    ack_deadline_ = INT64_MAX;
    ack_defer_ = true;
    if (type_ == IBV_QPT_RC && av->channel->carries_acks()) {
      f.rider_ack = ack_psn_;
      av->channel->Send(std::move(f));
    } else {
      link::OutFrame ack;
      uint8_t op = op::kRc | op::kAcknowledge;
      uint8_t* abth = BuildHeaderLocked(ack, op, false, attr_.dest_qp_num, ack_psn_, nullptr);
      reinterpret_cast<wire::Aeth*>(abth + Opcode(op).aeth)->Set(wire::aeth::kAck, msn_);
      av->channel->SendPair(std::move(ack), std::move(f));
    }
    ReleaseHeldCompletionsLocked();
    return IBV_WC_SUCCESS;
  }
  if (Reliable() && !ack_defer_ && link::NowNs() - ack_sent_ns_ < kReplyWindowNs)
    ack_defer_ = true;  // this request answers what we just acknowledged: ping-pong traffic
  if (multicast) {
    // One copy per member QP; each names its receiver, the GRH keeps the group's GID.
    size_t dest_at = static_cast<size_t>(bth - f.hdr) + offsetof(wire::Bth, dest_qp);
    for (auto& [channel, member] : hca_.McastTargets(av->attr.grh.dgid)) {
      if (channel->closed()) continue;
      if (block_self_mcast_ && member >> kQpIndexBits == qpn_ >> kQpIndexBits) continue;
      link::OutFrame copy = f;
      wire::Store24(copy.hdr + dest_at + 1, member);
      channel->Send(std::move(copy));
    }
    return IBV_WC_SUCCESS;
  }
  av->channel->Send(std::move(f));
  return IBV_WC_SUCCESS;
}

void Qp::RunRequesterLocked() {
  if (state_ != IBV_QPS_RTS || shut_down_) return;
  while (next_ < tail_) {
    if (rnr_resume_at_ != 0) return;
    SendWqe& w = SqAt(next_);
    if (w.done) {
      ++next_;
      continue;
    }
    if (w.opcode == IBV_WR_BIND_MW || w.opcode == IBV_WR_LOCAL_INV) {
      // Local operations wait for everything before them (responses map PSNs onto the WQEs in
      // flight one to one, and a bind must not change a key a request in flight still uses).
      if (head_ != next_) return;
      uint64_t idx = next_;
      ibv_wc_status st = RunLocalOpLocked(w);
      if (st != IBV_WC_SUCCESS) {
        FailHeadLocked(idx, st);
        return;
      }
      w.sent = w.done = true;
      w.status = IBV_WC_SUCCESS;
      ++next_;
      RetireLocked();
      continue;
    }
    bool rd = MapWr(w.opcode).read_or_atomic;
    if (Reliable()) {
      if ((w.send_flags & IBV_SEND_FENCE) && rd_outstanding_ > 0) return;
      if (rd && rd_outstanding_ >= std::max<uint32_t>(attr_.max_rd_atomic, 1)) return;
      // Behind a frame in flight nothing goes direct (it would overtake the frame), so a stream
      // that took a frame once, for want of a published receive WQE, kept taking frames as long
      // as it kept coming (rstream 64 B on the shared-memory link: 3-23 us per message in most
      // runs, against 0.9-1.5 direct). What follows such a frame waits for its ACK instead.
      if (hold_for_direct_ && head_ != next_) return;
      hold_for_direct_ = false;
      if (type_ == IBV_QPT_RC && TryDirectLocked(w)) {
        w.sent = w.done = true;  // w.status: TryDirectLocked's
        ++next_;
        if (w.status != IBV_WC_SUCCESS) return EnterErrorLocked();
        RetireLocked();
        continue;
      }
    }
    // A datagram waits while its channel is backlogged (link::kDatagramBacklogBytes).
    if (type_ == IBV_QPT_UD && w.ah && w.ah->av.channel) {
      if (room_wait_until_ != 0) return;
      if (hca_.AwaitRoom(*this, w.ah->av.channel)) {
        room_wait_until_ = link::NowNs() + kRoomWaitNs;
        RegisterTimerLocked(room_wait_until_);
        return;
      }
    }
    // A path that broke because its peer's slot moved on is found again, not failed.
    if (av_.channel && av_.channel->closed() && RepathIfMovedLocked(*av_.channel)) return;
    if (repath_pending_) return;
    uint64_t idx = next_;
    ibv_wc_status st = SendWqeLocked(w);
    if (st != IBV_WC_SUCCESS) {
      // A dead path fails the oldest request still unanswered, as the channel's closing and the
      // retransmit timer do: this post may see the path closed before the closing reaches us.
      FailHeadLocked(st == IBV_WC_RETRY_EXC_ERR ? head_ : idx, st);
      return;
    }
    ++next_;
    if (Reliable()) {
      ArmRetransmitLocked();  // after ++next_: the period counts this message's bytes too
    } else {
      w.done = true;
      RetireLocked();
    }
  }
}

void Qp::ArmRetransmitLocked() {
  if (retransmit_deadline_ != INT64_MAX || attr_.timeout == 0) return;
  uint64_t bytes = 0;
  for (uint64_t i = head_; i < next_; ++i) bytes += SqAt(i).length;
  last_arm_ns_ = link::NowNs();
  retransmit_deadline_ = last_arm_ns_ + RetransmitPeriodNs(attr_.timeout, bytes);
  RegisterTimerLocked(retransmit_deadline_);
}

int64_t Qp::RetransmitTimerLocked(int64_t now) {
  if (!Reliable() || head_ == next_ || (state_ != IBV_QPS_RTS && state_ != IBV_QPS_SQD)) {
    retransmit_deadline_ = INT64_MAX;
    return INT64_MAX;
  }
  if (retransmit_deadline_ == INT64_MAX || now < retransmit_deadline_) return retransmit_deadline_;
  // No answer: a peer whose slot moved to another process (a shared XRC target handed over) may
  // still hold the old path open while it exits; the new path is taken instead of retrying.
  if (repath_pending_ || (av_.channel && RepathIfMovedLocked(*av_.channel)))
    return retransmit_deadline_ = now + kRetransmitFloorNs;  // Repath resends
  if (retry_left_ <= 0) {
    FailHeadLocked(head_, IBV_WC_RETRY_EXC_ERR);
    return INT64_MAX;
  }
  --retry_left_;
  SOFTRDMA_LOG("qp %#x: no answer in time, sending again from psn %#x", qpn_, SqAt(head_).psn);
  // Go back to the oldest unacknowledged WQE and send everything again with the same PSNs.
  next_ = head_;
  sq_psn_ = SqAt(head_).psn;
  rd_outstanding_ = 0;
  retransmit_deadline_ = INT64_MAX;
  RunRequesterLocked();
  return retransmit_deadline_;
}

ibv_wc_status Qp::RunLocalOpLocked(const SendWqe& w) {
  if (w.opcode == IBV_WR_LOCAL_INV)
    return hca_.mrs().InvalidateMw(w.imm_or_rkey, pd_, 0) ? IBV_WC_SUCCESS : IBV_WC_LOC_QP_OP_ERR;
  MrTable::Bind b{};
  b.mw_rkey = w.mw_rkey;
  b.new_rkey = w.rkey;
  b.pd = pd_;
  b.qpn = qpn_;
  b.mr_key = w.bind_mr_key;
  b.addr = w.remote_addr;
  b.length = w.bind_len;
  b.access = w.bind_access;
  b.type1 = w.bind_type1;
  return hca_.mrs().BindMw(b);
}

}  // namespace softrdma::core
