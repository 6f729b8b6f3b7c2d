// SENDs between same-host peers without frames (docs/architecture.md §12, "Direct SENDs"): an RC
// QP whose path is the shared-memory link publishes the head of its receive queue
// (link::DirectRecvQueue); the peer's requester takes a published WQE, places the message in its
// buffers and marks it done; the owner turns done WQEs into receive completions, in order. A
// message that cannot go so (nothing published, a buffer too small or not shared, anything
// outstanding on the sender's QP) takes the long way, where the responder takes WQEs from the same
// queue and answers with RNR NAKs and errors as ever.
#include <infiniband/verbs.h>

#include <cstring>

#include "core/cq.h"
#include "core/hca.h"
#include "core/limits.h"
#include "core/mr.h"
#include "core/qp.h"
#include "core/recv_staging.h"
#include "link/place.h"
#include "link/placement_guard.h"
#include "link/shared_windows.h"
#include "link/spin_pause.h"

namespace softrdma::core {
namespace {

using link::DirectRecvQueue;
using link::DirectRecvSlot;
using link::kDirectRecvLow;
using link::kDirectRecvSlots;
namespace dr = link::direct_recv;

DirectRecvSlot& SlotOf(DirectRecvQueue* q, uint32_t index) {
  return q->slots[index % kDirectRecvSlots];
}

// memcpy, without its call and size dispatch for what fits a slot (kInSlotBytes): the sender's copy
// of every small message into its slot, where they cost more than the copy.
void CopyBytes(uint8_t* to, const uint8_t* from, uint32_t n) {
  if (n > dr::kInSlotBytes) {
    std::memcpy(to, from, n);
    return;
  }
  for (; n >= 8; n -= 8, to += 8, from += 8) std::memcpy(to, from, 8);
  for (; n > 0; --n) *to++ = *from++;
}

}  // namespace

// Owner side. Every function here runs under the QP's lock.

void Qp::OpenDirectRecvLocked() {
  if (direct_rq_ || direct_rq_refused_ || type_ != IBV_QPT_RC || shut_down_) return;
  // An SRQ lends only WQEs of the QP's own PD: a sender checks the buffers against the PD the
  // endpoint names.
  if (srq_ ? srq_->pd() != pd_ : !rq_) return;
  if (state_ != IBV_QPS_RTR && state_ != IBV_QPS_RTS) return;
  if (!av_.channel || !av_.channel->direct()) return;  // not a same-host peer we reach directly
  if (!rq_) rq_ = std::make_unique<RecvQueue>(kDirectRecvSlots, srq_->max_sge(), false);
  DirectRecvQueue* q = link::SharedWindows::Get().ClaimRecvQueue(qpn_);
  if (!q) {
    direct_rq_refused_ = true;  // another QP's number shares the block: frames only
    return;
  }
  direct_rq_ = q;
  direct_posted_ = direct_collected_ = 0;
  direct_watch_ = hca_.AddDirectRecv(shared_from_this(), &SlotOf(q, 0).state, 0);
  next_direct_watch_.store(dr::Watch(&SlotOf(q, 0).state, 0), std::memory_order_relaxed);
  if (recv_cq_) direct_feed_ = recv_cq_->AddDirectFeed(this, dr::Watch(&SlotOf(q, 0).state, 0));
  q->counted.store(direct_watch_ < 0, std::memory_order_relaxed);  // before kRecvRight is granted
  RefillDirectRecvLocked(true);
  PublishEndpointLocked();
}

// Publishes the WQEs after those already published, while they fit and can be reached directly:
// at most kDirectRecvSges pieces, each in a region that is shared and writable locally.
void Qp::RefillDirectRecvMoreLocked(bool idle) {
  DirectRecvQueue* q = DirectRqLocked();
  const uint32_t published = direct_posted_ - direct_collected_;
  if (q && published > kDirectRecvSlots / 2) return;
  if (q && srq_) BorrowFromSrqLocked();
  const uint32_t queued = rq_->size();
  if (!q || queued == published) {  // nothing (more) to publish: nothing is due either
    SetRefillDueLocked(false);
    return;
  }
  // Where the application waits for this call (a poll that found a message, a post), the refill
  // is left to its next empty poll unless few are left: it writes slot lines the peer has just
  // written, and their transfers would delay the answer the application is about to send
  // (ib_send_lat: every fourth message paid four transfers of a cache line). Not for a QP that
  // borrows from an SRQ: its posts do not refill (Srq::wanted_), and the next empty poll of a
  // middleware busy with its own transfers came late (ucx_perftest tag_bw 64 KiB, rendezvous by
  // put: 5.3-14.6 -> 6.3-16.8 GB/s, senders waiting in vain for a refill 2,100-2,600 -> 720-1,530
  // per 30,000 messages; ib_send_lat --use-srq unchanged at 0.34 us).
  if (!idle && published > kDirectRecvLow && !srq_) {
    SetRefillDueLocked(true);
    return;
  }
  SetRefillDueLocked(false);
  while (direct_posted_ - direct_collected_ < kDirectRecvSlots &&
         direct_posted_ - direct_collected_ < queued) {
    const RecvWqe* w = rq_->At(direct_posted_ - direct_collected_);
    if (w->num_sge > link::kDirectRecvSges) break;
    DirectRecvSlot& s = SlotOf(q, direct_posted_);
    PublishedPiece& piece = published_[direct_posted_ % kDirectRecvSlots];
    piece.generation = hca_.mrs().generation();  // before the lookups it vouches for
    uint32_t n = 0;
    uint64_t total = 0;
    bool reachable = true;
    for (uint32_t i = 0; i < w->num_sge; ++i) {
      const ibv_sge& g = w->sge[i];
      if (g.length == 0) continue;
      uint64_t iova;
      bool reach;
      piece.host =
          hca_.mrs().ResolveRecvPiece(g.lkey, pd_, g.addr, g.length, &iova, &reach, &mr_cache_);
      if (!piece.host) break;  // the responder reports it (LOC_PROT_ERR), by frames
      piece.length = g.length;
      reachable = reachable && reach;
      s.sge[n++] = link::DirectRecvSge{iova, g.lkey, g.length};
      total += g.length;
    }
    if (n != NonEmptySges(*w)) break;
    if (n != 1) piece.host = nullptr;
    const uint32_t bit = 1u << (direct_posted_ % kDirectRecvSlots);
    staged_ &= ~bit;
    if (!reachable) {
      RecvStaging* staging = total <= RecvStaging::kSlotBytes ? StagingLocked() : nullptr;
      if (!staging) break;  // a piece the peer cannot reach: frames only
      s.sge[0] = link::DirectRecvSge{staging->SlotAddr(direct_posted_), staging->key(),
                                     static_cast<uint32_t>(total)};
      n = 1;
      staged_ |= bit;  // piece.host stays: the owner copies the message straight there
    }
    s.num_sge = n;
    // After the scatter list: a sender that sees the state reads the list it names.
    s.state.store(dr::State(dr::kPosted, direct_posted_), std::memory_order_release);
    ++direct_posted_;
  }
}

void Qp::SetRefillDueLocked(bool due) {
  if (due && !refill_due_) hca_.NoteRefillDue();
  refill_due_ = due;
}

bool Qp::TryRefillDirectRecvs() {
  std::unique_lock g(mu_, std::try_to_lock);
  if (!g.owns_lock()) return false;
  if (refill_due_) RefillDirectRecvLocked(true);
  return !refill_due_;
}

// Made once WQEs that would use it keep coming (kStagingDemand refills found one): a staging area
// costs 32 KiB and an arena move, and most QPs never receive more than a few messages into such
// buffers (1,000 QPs exchanging one message each: setup 56 -> 269 ms, 8 -> 23 KB per QP when every
// QP made one at its first WQE).
RecvStaging* Qp::StagingLocked() {
  if (!staging_ && !staging_refused_ && ++staging_demand_ >= kStagingDemand) {
    staging_ = RecvStaging::Make(hca_.mrs(), pd_);
    staging_refused_ = !staging_;
    if (staging_) hca_.NoteStaging(1);
  }
  return staging_.get();
}

void Qp::RestageDirectRecvs() {
  std::lock_guard g(mu_);
  if (!staged_ || !UnpublishDirectRecvsLocked()) return;  // false: a sender is placing one now
  RefillDirectRecvLocked(true);
}

// Copies a message the sender left in a staging slot or in its receive slot into `w`'s buffers
// (pages the application may have made read-only: link/placement_guard.h). False when a buffer of
// `w` is gone, or read-only with no way past: a region deregistered while a sender was placing into
// its staging slot (RestageDirectRecvs takes back the WQEs no sender holds) completes with
// LOC_PROT_ERR as on frames, only without moving the QP to the error state (the sender has
// completed already). The peer's byte_len is bounded by the WQE and `room`: a hostile one gets no
// byte outside them. Through the address `piece` resolved at publication while it holds, else by
// lookup.
bool Qp::CopyIntoWqeLocked(const uint8_t* from, uint32_t room, const RecvWqe& w,
                           const PublishedPiece& piece, uint32_t byte_len) {
  uint32_t left = byte_len < room ? byte_len : room;
  if (piece.host && left <= piece.length && piece.generation == hca_.mrs().generation())
    return link::PlaceGuarded(piece.host, from, left);
  for (uint32_t i = 0; i < w.num_sge && left > 0; ++i) {
    const ibv_sge& g = w.sge[i];
    if (g.length == 0) continue;
    const uint32_t c = g.length < left ? g.length : left;
    uint8_t* to =
        hca_.mrs().ResolveLocalCached(g.lkey, pd_, g.addr, c, IBV_ACCESS_LOCAL_WRITE, mr_cache_);
    if (!to) to = ResolveLocalPieceLocked(ibv_sge{g.addr, c, g.lkey}, IBV_ACCESS_LOCAL_WRITE);
    if (!to) return false;
    if (!link::PlaceGuarded(to, from, c)) return false;
    from += c;
    left -= c;
  }
  return true;
}

// Pollers watch the slot of the next WQE to complete.
void Qp::WatchNextLocked(DirectRecvQueue* q) {
  const std::atomic<uint32_t>* next = &SlotOf(q, direct_collected_).state;
  hca_.WatchDirectRecv(direct_watch_, next, direct_collected_);
  next_direct_watch_.store(dr::Watch(next, direct_collected_), std::memory_order_relaxed);
  if (recv_cq_) recv_cq_->WatchDirectFeed(direct_feed_, dr::Watch(next, direct_collected_));
}

uint32_t Qp::NonEmptySges(const RecvWqe& w) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < w.num_sge; ++i) n += w.sge[i].length != 0;
  return n;
}

// Turns the WQEs the peer marked done, in order, into receive completions.
void Qp::CollectDirectRecvsLocked() {
  if (DirectRecvQueue* q = DirectRqLocked()) CollectFromLocked(q);
}

// From `q`, the open block or one being closed (then nothing is published again). With `out`,
// at most `room` completions go there instead of to the CQ (Cq::PollDirectFeeds, which holds the
// CQ's lock); returns how many.
int Qp::CollectFromLocked(DirectRecvQueue* q, ibv_wc* out, int room) {
  int got = 0;
  bool any = false;
  while (direct_collected_ != direct_posted_ && (!out || got < room)) {
    DirectRecvSlot& s = SlotOf(q, direct_collected_);
    uint32_t st = s.state.load(std::memory_order_acquire);
    if (!dr::Is(st, dr::kDone, direct_collected_)) break;
    const RecvWqe* w = rq_->Front();
    if (!w) break;  // cannot happen: a published WQE stays queued until collected
    const uint32_t flags = (st >> 8) & 0xff;
    ibv_wc wc{};
    wc.status = IBV_WC_SUCCESS;
    const PublishedPiece& piece = published_[direct_collected_ % kDirectRecvSlots];
    if (flags & dr::kInSlot) {
      if (!CopyIntoWqeLocked(reinterpret_cast<const uint8_t*>(s.sge), dr::kInSlotBytes, *w, piece,
                             s.byte_len))
        wc.status = IBV_WC_LOC_PROT_ERR;
    } else if ((staged_ >> (direct_collected_ % kDirectRecvSlots) & 1) && !(flags & dr::kRdma) &&
               !CopyIntoWqeLocked(staging_->SlotBytes(direct_collected_), RecvStaging::kSlotBytes,
                                  *w, piece, s.byte_len)) {
      wc.status = IBV_WC_LOC_PROT_ERR;
    }
    wc.wr_id = w->wr_id;
    rq_->DropFront();
    if (srq_) srq_->ConsumeLent(1);  // before the completion: see Srq::ConsumeLent
    ++direct_collected_;
    any = true;
    wc.opcode = (flags & dr::kRdma) ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
    wc.byte_len = s.byte_len;
    if (flags & dr::kWithImm) {
      wc.wc_flags = IBV_WC_WITH_IMM;
      wc.imm_data = s.imm;
    }
    wc.qp_num = qpn_;
    wc.src_qp = attr_.dest_qp_num;
    wc.slid = av_.attr.dlid;
    wc.sl = av_.attr.sl;
    if (state_ == IBV_QPS_RTR && !comm_est_raised_) {
      comm_est_raised_ = true;
      RaiseAsync(IBV_EVENT_COMM_EST);
    }
    if (out)
      out[got++] = wc;
    else
      PushRecvCompletionLocked(0, wc, (flags & dr::kSolicited) != 0);
  }
  if (any) {
    RefillDirectRecvLocked(false);
    WatchNextLocked(q);
  }
  return got;
}

void Qp::CollectDirectRecvs() {
  std::lock_guard g(mu_);
  CollectDirectRecvsLocked();
}

int Qp::TryCollectDirectRecvsInto(ibv_wc* out, int room) {
  std::unique_lock g(mu_, std::try_to_lock);
  if (!g.owns_lock()) return 0;
  DirectRecvQueue* q = DirectRqLocked();
  return q ? CollectFromLocked(q, out, room) : 0;
}

// Taking the lock would revoke the bias of the application thread that polls this QP, at every
// batch end of the progress thread (ib_send_lat: all sixteen biases spent within a second), mostly
// for nothing: that thread collects the message itself, a fraction of a microsecond after it is
// done. So the lock is taken when the CQ is armed (its thread may sleep until the event a
// collection raises), or when the next slot has stayed done, uncollected, for kOwnerGraceNs since
// a collection first found it so; until then it is left (false), and the HCA comes back when the
// grace ends (Hca::OnTimers), sleeping meanwhile. Neither spinning nor sleeping here: the progress
// thread runs at real-time priority and may hold the polling thread's core, and its rounds serve
// other QPs' frames. The caller took the peers' count first: a slot done after this look counts
// again. The first form never took the lock while not armed and kept the count pending: the
// progress thread never slept, and took the core from the application (ib_send_lat -a hung).
bool Qp::CollectDirectRecvsKeepingBias() {
  if (link::BiasedElsewhere(mu_) && !(recv_cq_ && recv_cq_->Armed())) {
    const uint64_t watch = next_direct_watch_.load(std::memory_order_relaxed);
    if (watch != 0) {
      if (!dr::WatchSeesDone(watch)) return true;  // nothing to collect
      const int64_t now = link::NowNs();
      if (left_watch_.load(std::memory_order_relaxed) != watch) {
        left_watch_.store(watch, std::memory_order_relaxed);
        left_since_ns_.store(now, std::memory_order_relaxed);
        return false;
      }
      if (now - left_since_ns_.load(std::memory_order_relaxed) < kOwnerGraceNs) return false;
    }
  }
  CollectDirectRecvs();
  return true;
}

bool Qp::TryCollectDirectRecvs() {
  std::unique_lock g(mu_, std::try_to_lock);
  if (!g.owns_lock()) return false;
  CollectDirectRecvsLocked();
  return true;
}

// The owner takes published WQEs [direct_collected_, to) itself, when the peer has taken none of
// them: by compare-and-swap of the count, as the peer takes them (a seal raised meanwhile is kept),
// and marks their slots taken back (a seal waits for taken slots that are not).
bool Qp::TakePublishedLocked(DirectRecvQueue* q, uint32_t to) {
  uint64_t t = q->taken.load(std::memory_order_acquire);
  do {
    if (dr::TakenCount(t) != direct_collected_) return false;  // the peer is placing one
  } while (!q->taken.compare_exchange_weak(t, dr::WithCount(t, to), std::memory_order_acq_rel));
  for (; direct_collected_ != to; ++direct_collected_)
    SlotOf(q, direct_collected_)
        .state.store(dr::State(dr::kTakenBack, direct_collected_), std::memory_order_release);
  WatchNextLocked(q);
  return true;
}

// The responder takes a WQE for a SEND that came as a frame. Published WQEs are taken by
// compare-and-swap, as the peer takes them; those the peer took come first.
bool Qp::TakeOwnRecvLocked(RecvWqe* out) {
  DirectRecvQueue* q = DirectRqLocked();
  if (!q) return PopOwnRecvLocked(out);
  CollectDirectRecvsLocked();
  if (dr::TakenCount(q->taken.load(std::memory_order_acquire)) != direct_collected_)
    return false;  // the peer is placing one: this SEND overtook it (the peer sent it after)
  if (direct_collected_ != direct_posted_ && !TakePublishedLocked(q, direct_collected_ + 1))
    return false;
  if (!PopOwnRecvLocked(out)) return false;
  RefillDirectRecvLocked(false);
  return true;
}

// The head of rq_; with an SRQ, what it lent first, then its own head.
bool Qp::PopOwnRecvLocked(RecvWqe* out) {
  if (!srq_) return rq_->Pop(out);
  if (!rq_->Pop(out)) return PopSrqLocked(out);
  srq_->ConsumeLent(1);
  return true;
}

bool Qp::PopSrqLocked(RecvWqe* out) {
  return srq_->PopForQp(out) || (srq_->Reclaim(this) && srq_->PopForQp(out));
}

// Fills rq_ with what the SRQ lends, up to what can be published.
void Qp::BorrowFromSrqLocked() {
  srq_->Lend(*rq_, kDirectRecvSlots, &srq_short_);
}

void Qp::OfferSrqWqes() {
  std::lock_guard g(mu_);
  if (direct_rq_)
    RefillDirectRecvLocked(false);
  else
    OpenDirectRecvLocked();
}

// Called by another QP's responder, which holds its own lock and the SRQ's users lock: this lock
// is only tried, a few times (its holder may be waiting for the users lock; a QP that waits for
// another's lock while holding its own could wait for one waiting for it).
bool Qp::GiveBackSrqWqes() {
  std::unique_lock g(mu_, std::defer_lock);
  for (int tries = 0; !g.try_lock(); ++tries) {
    if (tries == kGiveBackTries) return false;
    link::SpinPause();
  }
  if (!rq_ || rq_->size() == 0 || !UnpublishDirectRecvsLocked()) return false;
  std::vector<RecvWqe> unused = rq_->Drain();  // unpublished now: every peer's take fails
  srq_->ReturnLent(unused);
  return true;
}

// Takes back every published WQE the peer has not taken: from now on they are the owner's (the
// peer's compare-and-swap fails), unpublished and still queued. False when the peer is placing one.
bool Qp::UnpublishDirectRecvsLocked() {
  DirectRecvQueue* q = DirectRqLocked();
  if (!q) return true;
  CollectDirectRecvsLocked();
  return TakePublishedLocked(q, direct_posted_);
}

// A WQE the responder took goes back to the head of the queue (RxAbort): the published ones
// behind it are taken back first, so that what is published stays the head of the queue.
void Qp::ReturnRecvLocked(const RecvWqe& w) {
  if (!UnpublishDirectRecvsLocked()) return;  // cannot happen: see TakeOwnRecvLocked
  rq_->PushFront(w);
  RefillDirectRecvLocked(true);
}

// Closes the queue to the peer and collects what it placed; WQEs it took and never finished (it
// died inside) go back to the queue, to be flushed or used by frames. What an SRQ lent goes back to
// the SRQ, unflushed: it was lent to be published.
void Qp::CloseDirectRecvLocked() {
  DirectRecvQueue* q = DirectRqLocked();
  direct_rq_ = nullptr;  // in a fork child, the parent's: left alone
  direct_rq_refused_ = false;
  if (recv_cq_) recv_cq_->RemoveDirectFeed(direct_feed_);  // also a fork child's (q is null there)
  direct_feed_ = -1;
  next_direct_watch_.store(0, std::memory_order_relaxed);
  if (q) {
    PublishEndpointLocked();  // no kRecvRight: no sender takes a WQE once the queue is sealed
    link::SharedWindows::SealRecvQueue(q);
    CollectFromLocked(q);
    link::SharedWindows::Get().ReleaseRecvQueue(q);
    SetRefillDueLocked(false);
    hca_.RemoveDirectRecv(this, direct_watch_);
    direct_watch_ = -1;
  }
  if (srq_ && rq_) srq_->ReturnLent(rq_->Drain());
}

// A sender that took every WQE a polling owner published waits a moment for its refill (when it
// reposts, or at its next poll): a sender faster than its receiver otherwise took a frame every
// eighth message (rstream 64 B), and then waited for that frame's ACK. An owner with nothing more
// to post costs kPostedWaitNs once.
bool Qp::AwaitPosted(const DirectRecvSlot& s, uint32_t index) {
  const int64_t until = link::NowNs() + kPostedWaitNs;
  for (int i = 1;; ++i) {
    link::SpinPause();
    if (dr::Is(s.state.load(std::memory_order_acquire), dr::kPosted, index)) return true;
    if (i % 16 == 0 && link::NowNs() > until) return false;
  }
}

// ibv_post_send's own way for a SEND to a same-host peer, the message of every request-response
// exchange: the checks of ValidateWr and TryDirectLocked that a SEND needs, without a second
// dispatch on the opcode or the generic work request copy. Anything it refuses takes the general
// way, which reports it. Runs under the QP's lock, the send queue empty, the QP in RTS.
bool Qp::TryPostDirectSendLocked(const ibv_send_wr& wr, link::PeerWindows* peer) {
  if (wr.num_sge < 0 || static_cast<uint32_t>(wr.num_sge) > cap_.max_send_sge ||
      (wr.num_sge > 0 && !wr.sg_list))
    return false;
  SendWqe w;
  w.wr_id = wr.wr_id;
  w.opcode = wr.opcode;
  w.send_flags = wr.send_flags;
  w.imm_or_rkey = wr.imm_data;
  uint8_t* local[kMaxSge];
  uint32_t lens[kMaxSge];
  uint32_t n = 0;
  uint64_t length = 0;
  // Inline pieces are placed straight from the caller's memory, as it is copied before the post
  // returns; their keys are not looked at (ibv_post_send(3)).
  const bool inline_data = wr.send_flags & IBV_SEND_INLINE;
  for (int i = 0; i < wr.num_sge; ++i) {
    const ibv_sge& g = wr.sg_list[i];
    length += g.length;
    if (g.length == 0) continue;
    local[n] = inline_data ? reinterpret_cast<uint8_t*>(g.addr) : ResolveLocalPieceLocked(g, 0);
    if (!local[n]) return false;
    lens[n++] = g.length;
  }
  w.sge = wr.sg_list;
  w.num_sge = static_cast<uint32_t>(wr.num_sge);
  if (length == 0 || length > kMaxMsgSize || (inline_data && length > cap_.max_inline_data))
    return false;
  w.length = static_cast<uint32_t>(length);
  if ((w.length > dr::kInSlotBytes || !TryDirectSmallSendLocked(w, peer, local, lens, n)) &&
      !TryDirectSendLocked(w, peer, local, lens, n))
    return false;
  w.status = IBV_WC_SUCCESS;
  PushSendCompletionLocked(w);
  return true;
}

// The small SEND of a request-response exchange: its bytes go into the slot (kInSlot) of a WQE
// whose first buffer holds them. TryDirectSendLocked's checks for that case only, without its
// scatter list copy and loops (ib_send_lat 2 B: ~5%, though only ~65 instructions fewer).
// False, before taking the WQE, for anything else: TryDirectSendLocked then decides.
bool Qp::TryDirectSmallSendLocked(const SendWqe& w, link::PeerWindows* peer, uint8_t* const* local,
                                  const uint32_t* lens, uint32_t n) {
  const uint32_t dqpn = attr_.dest_qp_num;
  uint64_t taken;
  DirectRecvQueue* q = peer->OpenRecvQueue(dqpn, &taken);
  if (!q) return false;
  const uint32_t t = dr::TakenCount(taken);
  DirectRecvSlot& s = SlotOf(q, t);
  if (!dr::Is(s.state.load(std::memory_order_acquire), dr::kPosted, t)) return false;
  const uint32_t nsge = s.num_sge;
  const link::DirectRecvSge first = s.sge[0];
  // The sources are read only once the WQE is taken, too late to refuse one the application took
  // away (unmapped, PROT_NONE) since it registered it: they are probed first, and the long way
  // then fails the request (requester.cpp). After the slot's state was read, not before, so that
  // the probe runs while that line comes from the polling peer (ib_send_lat, fast placement,
  // against no probe: 1.016 probed first, 0.995-1.008 probed here). TryDirectSendLocked alike.
  if (nsge - 1 >= link::kDirectRecvSges || first.len < w.length ||
      !peer->Reach(first.key, dqpn, first.addr, w.length, link::kRecvRight, &recv_window_memo_) ||
      !link::Readable(local, lens, n) || !TakeWqeLocked(q, taken))
    return false;
  auto* into = reinterpret_cast<uint8_t*>(s.sge);  // the owner no longer reads it: it is taken
  for (uint32_t i = 0; i < n; into += lens[i], ++i) CopyBytes(into, local[i], lens[i]);
  MarkSlotDoneLocked(w, peer, q, t, dr::kInSlot);
  return true;
}

// Takes WQE TakenCount(taken) of `q`, unless another taker came first.
bool Qp::TakeWqeLocked(DirectRecvQueue* q, uint64_t taken) {
  uint64_t expected = taken;
  return q->taken.compare_exchange_strong(expected, dr::WithCount(taken, dr::TakenCount(taken) + 1),
                                          std::memory_order_acq_rel);
}

// The sender's last step: slot `t` of `q` says done, with `w`'s length, immediate and flags.
void Qp::MarkSlotDoneLocked(const SendWqe& w, link::PeerWindows* peer, DirectRecvQueue* q,
                            uint32_t t, uint32_t flags) {
  DirectRecvSlot& s = SlotOf(q, t);
  s.byte_len = w.length;
  if (w.opcode == IBV_WR_SEND_WITH_IMM || w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
    s.imm = w.imm_or_rkey;
    flags |= dr::kWithImm;
  }
  if (w.send_flags & IBV_SEND_SOLICITED) flags |= dr::kSolicited;
  // Sequentially consistent, as the count: a consumer that declares itself asleep and then looks
  // sees the slot done, or NudgeIfAsleep sees its declaration.
  s.state.store(dr::State(dr::kDone, t, flags), std::memory_order_seq_cst);
  next_direct_slot_.store(&SlotOf(q, t + 1), std::memory_order_relaxed);
  if (q->counted.load(std::memory_order_relaxed)) peer->NoteRecvDone();
  av_.channel->NudgeIfAsleep();
}

// Requester side: a SEND placed in the peer's receive buffers, or an RDMA WRITE with immediate
// placed in the window it names, which takes a receive WQE as a SEND does and leaves its buffers
// alone. Runs under the sender QP's lock.
bool Qp::TryDirectSendLocked(SendWqe& w, link::PeerWindows* peer, uint8_t* const* local,
                             const uint32_t* lens, uint32_t n) {
  const uint32_t dqpn = attr_.dest_qp_num;
  // Once it took a WQE from `taken` as read here, before any check, the sender may write into the
  // windows its checks passed: a withdrawal seals the queue, then waits for taken WQEs to be done
  // (SharedWindows::Withdraw).
  uint64_t taken;
  DirectRecvQueue* q = peer->OpenRecvQueue(dqpn, &taken);
  if (!q) return false;
  // Whether the WQE is published is the slot's to say (its state names the WQE's count).
  const uint32_t t = dr::TakenCount(taken);
  DirectRecvSlot& s = SlotOf(q, t);
  // The slot is read, then written. Without -mprfchw this is a read prefetch (prefetcht0), not an
  // exclusive one; prefetchw measured no better (ib_send_lat 0.987): the polling owner takes the
  // line back before the write either way.
  __builtin_prefetch(&s, 1);
  if (!dr::Is(s.state.load(std::memory_order_acquire), dr::kPosted, t)) {
    // A sleeping owner refills when it wakes: frames then, one after the other, as ever.
    const bool polls = av_.channel->PeerPolls();
    const bool waited = awaited_wqe_ == t;  // the requester trying the WQE a post waited for
    awaited_wqe_ = t;
    if (!polls || waited || !AwaitPosted(s, t)) {
      hold_for_direct_ = polls;  // see RunRequesterLocked
      return false;
    }
  }
  uint8_t* dst[link::kDirectRecvSges];
  uint32_t cap[link::kDirectRecvSges];
  uint32_t pieces = 0;
  const bool rdma = w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
  bool in_slot = false;
  if (rdma) {
    pieces = 1;
    // Checked like a WRITE's window, and kept by the seal like the receive buffers below.
    cap[0] = w.length;
    dst[0] = w.length ? peer->Reach(w.rkey, dqpn, w.remote_addr, w.length, IBV_ACCESS_REMOTE_WRITE)
                      : nullptr;
    if (w.length && !dst[0]) return false;  // the responder NAKs it (REM_ACCESS_ERR)
  } else {
    // The slot's scatter list, read once: the owner may rewrite it if it takes the slot back.
    link::DirectRecvSge sge[link::kDirectRecvSges];
    const uint32_t nsge = s.num_sge;
    if (nsge > link::kDirectRecvSges) return false;
    std::memcpy(sge, s.sge, sizeof sge);
    uint32_t left = w.length;
    for (uint32_t i = 0; i < nsge && left > 0; ++i) {
      cap[pieces] = sge[i].len < left ? sge[i].len : left;
      dst[pieces] = peer->Reach(sge[i].key, dqpn, sge[i].addr, cap[pieces], link::kRecvRight,
                                &recv_window_memo_);
      if (!dst[pieces]) return false;  // the responder reports it (LOC_PROT_ERR there)
      left -= cap[pieces++];
    }
    if (left > 0) return false;  // too small: LOC_LEN_ERR by the long way
    // Checked as if placed in the buffers (a window withdrawn at a deregistration fails it here),
    // but the owner copies it there (CollectFromLocked).
    in_slot = w.length <= dr::kInSlotBytes;
  }
  if (!link::Readable(local, lens, n) || !TakeWqeLocked(q, taken))
    return false;  // sources probed first: see TryDirectSmallSendLocked

  // Scatter the payload (inline, or gathered from the local pieces) into the peer's buffers.
  uint32_t di = 0, doff = 0;
  auto put = [&](const uint8_t* src, uint32_t len) {
    while (len > 0) {
      uint32_t c = len < cap[di] - doff ? len : cap[di] - doff;
      link::PlaceBytes(dst[di] + doff, src, c);
      src += c;
      len -= c;
      doff += c;
      if (doff == cap[di]) {
        ++di;
        doff = 0;
      }
    }
  };
  if (in_slot) {
    // Over the scatter list, which the owner no longer reads: the slot is taken.
    auto* into = reinterpret_cast<uint8_t*>(s.sge);
    if (w.num_sge == 0) {
      CopyBytes(into, w.inline_buf, w.length);
    } else {
      for (uint32_t i = 0; i < n; into += lens[i], ++i) CopyBytes(into, local[i], lens[i]);
    }
  } else if (w.length > 0) {
    if (pieces == 1 && (w.num_sge == 0 || n == 1)) {
      link::PlaceBytes(dst[0], w.num_sge == 0 ? w.inline_buf : local[0], w.length);  // most SENDs
    } else if (w.num_sge == 0) {
      put(w.inline_buf, w.length);
    } else {
      for (uint32_t i = 0; i < n; ++i) put(local[i], lens[i]);
    }
  }
  MarkSlotDoneLocked(w, peer, q, t, rdma ? dr::kRdma : in_slot ? dr::kInSlot : 0);
  return true;
}

}  // namespace softrdma::core
