// A queue pair: its state machine, its send and receive queues, and the three engines that move
// its messages (rxe's split): the requester turns send WQEs into request frames, the responder
// executes inbound requests and acknowledges them, the completer retires send WQEs on responses.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "link/biased_mutex.h"
#include "core/frame_receiver.h"
#include "core/limits.h"
#include "core/mr.h"
#include "core/opcode.h"
#include "core/recv_queue.h"
#include "core/recv_staging.h"
#include "core/wire.h"
#include "link/link.h"
#include "link/shared_windows.h"

namespace softrdma::core {

class Context;
class Cq;
class Hca;
struct Pd;
struct TargetRecord;
class TargetTable;

// A resolved destination: the channel that reaches it plus what GRH/LRH fields to put on frames.
struct AddressVector {
  std::shared_ptr<link::Channel> channel;
  ibv_ah_attr attr{};
};

// An address handle; the public struct comes first so an ibv_ah* converts back with one cast.
struct Ah {
  ibv_ah ibv;
  const Pd* pd;
  AddressVector av;
  static const Ah* From(const ibv_ah* ah) { return reinterpret_cast<const Ah*>(ah); }
};

// A parsed inbound frame; pointers are valid only during OnFrameHeader.
struct Packet {
  const wire::Lrh* lrh;
  const wire::Grh* grh;  // null when the frame carries none
  const wire::Bth* bth;
  const OpInfo* info;
  uint32_t payload_len;
  uint32_t rider_ack =
      link::kNoRiderAck;  // or the PSN an ACK riding on this RC request acknowledges
  template <typename T>
  const T* ext(uint8_t offset) const {
    return reinterpret_cast<const T*>(reinterpret_cast<const uint8_t*>(bth) + offset);
  }
};

// The structural check of an inbound frame's IB headers, before anything acts on them: an LRH,
// the GRH its LNH announces, a BTH with a known opcode, then exactly the extension headers that
// opcode has, and no payload where the opcode carries none. Fills `out` with pointers into `hdr`.
// False for anything a well-behaved peer never sends. Pure, so the fuzzer checks it directly
// (tests/fuzz/frame_decoder_fuzz.cpp); Hca::OnFrameHeader drops the connection when it fails.
bool ParseFrame(const uint8_t* hdr, size_t hdr_len, uint32_t payload_len, Packet* out);

struct SendWqe {
  uint64_t wr_id;
  ibv_wr_opcode opcode;
  unsigned send_flags;
  uint32_t imm_or_rkey;  // imm_data (network order) or invalidate_rkey
  uint64_t remote_addr;
  uint32_t rkey;
  uint64_t compare_add, swap;
  const Ah* ah;
  uint32_t remote_qpn, remote_qkey;
  uint32_t remote_srqn;  // XRC_SEND: the XRC SRQ the message is for
  uint32_t num_sge;
  ibv_sge* sge;         // this WQE's slice of the QP's SGE pool
  uint8_t* inline_buf;  // this WQE's slice of the inline pool, when IBV_SEND_INLINE
  uint32_t length;      // payload bytes (sum of SGEs or inline length)
  // IBV_WR_BIND_MW (rkey holds the new key, remote_addr the window's start).
  uint32_t mw_rkey, bind_mr_key;
  uint64_t bind_len;
  int bind_access;
  bool bind_type1;
  uint32_t psn;
  bool sent, done;
  ibv_wc_status status;
};

class Qp : public FrameReceiver, public std::enable_shared_from_this<Qp> {
 public:
  struct Init {
    ibv_qp_type type;
    const Pd* pd;
    Cq* send_cq;
    Cq* recv_cq;
    Srq* srq;
    std::shared_ptr<Xrcd> xrcd;  // XRC_RECV: the domain whose SRQs its messages reach
    ibv_qp_cap cap;
    bool sq_sig_all;
    ibv_qp* user_handle;
    // IBV_QP_CREATE_BLOCK_SELF_MCAST_LB: its multicast sends skip the members on its own HCA.
    bool block_self_mcast = false;
  };

  Qp(Context& ctx, uint32_t qpn, const Init& init);
  ~Qp();

  uint32_t qpn() const { return qpn_; }
  ibv_qp_type type() const { return type_; }
  const ibv_qp_cap& cap() const { return cap_; }
  Context& context() const { return ctx_; }

  // Control path (application threads).
  int Modify(const ibv_qp_attr& attr, int mask);
  int Query(ibv_qp_attr* attr, int mask, ibv_qp_init_attr* init);
  // `whole_batch` (ibv_wr_complete): refuse the entire chain if any WR of it would be refused,
  // instead of posting the WRs before the bad one as ibv_post_send does.
  // `type1_bind`: the one WR is ibv_bind_mw(3)'s bind of a type 1 window.
  int PostSend(const ibv_send_wr* wr, const ibv_send_wr** bad, bool whole_batch = false,
               bool type1_bind = false);
  int PostRecv(const ibv_recv_wr* wr, const ibv_recv_wr** bad);
  // Waits for inbound frames that target the QP to finish, then detaches it from the HCA.
  void Shutdown();
  // Its SRQ's (recv_queue.h): WQEs came, which this QP may borrow and publish (asked when its last
  // borrow found the SRQ short); and another QP found the SRQ empty, so what it borrowed and no
  // peer took goes back (false when nothing did, or its lock stayed taken).
  void OfferSrqWqes();
  static constexpr int kGiveBackTries = 256;  // pauses, a few microseconds in all
  bool GiveBackSrqWqes();
  bool BorrowFellShort() const { return srq_short_.load(std::memory_order_relaxed); }

  // Inbound frames (progress thread). RxHeader fills `t` with where the payload goes.
  void RxHeader(link::Channel& ch, const Packet& p, link::RxTarget& t);
  void RxEnd(link::Channel& ch, link::RxTarget& t) override;
  void RxAbort(link::RxTarget& t) override;
  // XRC_RECV: the SRQ's owner answered the message this target relayed to it (AETH syndrome).
  void OnRelayAnswer(uint32_t psn, uint8_t syndrome);
  // `ch` closed. When it was this QP's path to a peer whose slot moved to another process (a
  // shared XRC target handed over, xrc_targets.h), the path is resolved again (Repath).
  void OnChannelClosed(link::Channel& ch);
  // The destination's slot (for a new resolution) when `ch` was this QP's path.
  const ibv_ah_attr& path_attr() const { return av_.attr; }
  uint32_t dest_qpn() const { return attr_.dest_qp_num; }
  // Sends everything unacknowledged again on `ch`, or fails as on a lost connection (null).
  void Repath(std::shared_ptr<link::Channel> ch);
  // UD: the channel this QP's next datagram waits on has room again (Hca::AwaitRoom).
  void OnRoom();

  void FlushAck();
  // Turns the SENDs a same-host peer placed in this QP's receive buffers into completions.
  void CollectDirectRecvs();
  // The progress thread's collection: where an application thread holds the lock's bias, only
  // when the receive CQ is armed or the next slot stayed done for kOwnerGraceNs (see the .cpp);
  // false when it left a done slot to that thread for now.
  bool CollectDirectRecvsKeepingBias();
  // How long a done slot is left to the thread the QP's lock is biased to: a polling thread takes
  // it within a microsecond, or once it has its core back from the progress thread.
  static constexpr int64_t kOwnerGraceNs = 50'000;
  bool TryCollectDirectRecvs();  // false: the QP is busy, nothing was collected
  // Into the caller's array (Cq::PollDirectFeeds): how many; 0 also when the QP is busy.
  int TryCollectDirectRecvsInto(ibv_wc* out, int room);
  // Publishes the receive WQEs a collection left to an idle moment; false: the QP is busy.
  bool TryRefillDirectRecvs();  // false: busy, or still due
  void RestageDirectRecvs();    // Hca::RestageDirectRecvs
  // Runs expired timers; returns the next wake-up wanted (INT64_MAX: none) and sets `*due` to the
  // exact next deadline (at or before the wake-up: a deferred ACK's is checked by the passes that
  // run anyway, its wake-up is coarse).
  int64_t OnTimer(int64_t now_ns, int64_t* due);

  struct RxWork;  // per-inbound-frame state, qp_internal.h

  // XRC_RECV QPs other processes may hold (xrc_targets.h, xrc_sharing.cpp).
  // Handles on it in this process (ibv_create_qp_ex, then one per ibv_open_qp).
  std::atomic<int> handles{1};
  void AttachTarget(TargetTable* table, TargetRecord* record);
  TargetTable* target_table() const { return target_table_.load(std::memory_order_acquire); }
  // A change made elsewhere (a modify through another process's handle, this process named as
  // the new server) waits to be taken up, or this process does not serve it: cheap enough for
  // every inbound request.
  bool TargetChanged() const;
  // Takes up the record's change; false when this process is not to execute the target's
  // requests (another process serves it, or it no longer exists anywhere).
  bool SyncTarget();
  // At exit: the PSN a successor serving this target expects next; serves no more here.
  uint32_t StopServing();
  // `handle` is destroyed while other handles keep the QP: events no longer name it.
  void ForgetUserHandle(const ibv_qp* handle);

 private:
  // qp.cpp: state machine and queues.
  int ApplyAttrs(const ibv_qp_attr& attr, int mask);
  void EnterErrorLocked();
  void ResetLocked();
  void SetStateLocked(ibv_qp_state s);
  // Same-host peers may run one-sided operations on this QP's regions while it is RTS.
  void PublishEndpointLocked();
  // An RDMA WRITE, READ, atomic or SEND done on the peer's memory directly; false: take the long
  // way.
  bool TryDirectLocked(SendWqe& w);
  uint8_t* ResolveLocalPieceLocked(const ibv_sge& s, int access);
  uint8_t* ResolveLocalPieceFullyLocked(const ibv_sge& s, int access);
  // A work request posted to an empty send queue and done so at once, without entering the queue;
  // false: it enters the queue as ever.
  bool TryPostDirectLocked(const ibv_send_wr& wr);
  bool TryPostDirectSendLocked(const ibv_send_wr& wr, link::PeerWindows* peer);
  // The same for a lone atomic whose local piece the MR cache answers: no WQE is made of it.
  bool TryPostDirectAtomicLocked(const ibv_send_wr& wr, link::PeerWindows* peer);
  // And for a lone RDMA WRITE or READ of one piece, inline (a WRITE) or whose local key the MR
  // cache answers.
  bool TryPostDirectRdmaLocked(const ibv_send_wr& wr, link::PeerWindows* peer);
  // The send completion of a work request one of those did (signaled, or failed), as the queue's.
  void PushDirectCompletionLocked(const ibv_send_wr& wr, uint32_t length, ibv_wc_status status);
  // Copies an inline work request's pieces into `into` (their total checked against
  // max_inline_data by the caller) and returns their length. Empty pieces are skipped: they may
  // have no buffer at all, and a QP without inline room has no `into`.
  static uint32_t GatherInline(const ibv_send_wr& wr, uint8_t* into) {
    uint32_t at = 0;
    for (int i = 0; i < wr.num_sge; ++i) {
      const ibv_sge& g = wr.sg_list[i];
      if (g.length == 0) continue;
      std::memcpy(into + at, reinterpret_cast<const void*>(g.addr), g.length);
      at += g.length;
    }
    return at;
  }

  // direct_recv.cpp: SENDs between same-host peers without frames. `local`/`lens`: the gathered
  // local pieces (inline ones at the caller's addresses; none when `w` holds its inline data).
  static constexpr int64_t kPostedWaitNs = 10'000;
  static bool AwaitPosted(const link::DirectRecvSlot& s, uint32_t index);
  bool TryDirectSendLocked(SendWqe& w, link::PeerWindows* peer, uint8_t* const* local,
                           const uint32_t* lens, uint32_t n);
  bool TryDirectSmallSendLocked(const SendWqe& w, link::PeerWindows* peer, uint8_t* const* local,
                                const uint32_t* lens, uint32_t n);
  bool TakeWqeLocked(link::DirectRecvQueue* q, uint64_t taken);
  void MarkSlotDoneLocked(const SendWqe& w, link::PeerWindows* peer, link::DirectRecvQueue* q,
                          uint32_t t, uint32_t flags);
  // Inline, as the refill's common answer and ResumeWaitingLocked's: each direct message passes
  // them several times (together ~100 instructions of a ~1,000-instruction round of ib_send_lat).
  link::DirectRecvQueue* DirectRqLocked() const {
    return direct_rq_ && link::SharedWindows::Get().Owns(direct_rq_) ? direct_rq_ : nullptr;
  }
  void OpenDirectRecvLocked();
  // `idle`: the application is not waiting for this call (else only a low queue is refilled now,
  // the rest at the next empty poll: Hca::RefillDirectRecvs). Refilled when half is taken, not per
  // WQE: the slots' lines then move to the peer once for several messages.
  void RefillDirectRecvLocked(bool idle) {
    if (direct_posted_ - direct_collected_ > link::kDirectRecvSlots / 2 && DirectRqLocked()) return;
    RefillDirectRecvMoreLocked(idle);
  }
  void RefillDirectRecvMoreLocked(bool idle);
  void SetRefillDueLocked(bool due);
  void CollectDirectRecvsLocked();
  int CollectFromLocked(link::DirectRecvQueue* q, ibv_wc* out = nullptr, int room = 0);
  void WatchNextLocked(link::DirectRecvQueue* q);
  bool UnpublishDirectRecvsLocked();
  bool TakePublishedLocked(link::DirectRecvQueue* q, uint32_t to);
  void CloseDirectRecvLocked();
  // The own receive queue's next WQE, for a SEND that came as a frame; and back when it failed.
  bool TakeOwnRecvLocked(RecvWqe* out);
  bool PopOwnRecvLocked(RecvWqe* out);
  // With an SRQ, rq_ holds the WQEs it lent this QP (Srq::Lend), the head of what it publishes.
  void BorrowFromSrqLocked();
  // The SRQ's head; when it is empty, what the other QPs borrowed comes back first (Srq::Reclaim).
  bool PopSrqLocked(RecvWqe* out);
  void ReturnRecvLocked(const RecvWqe& w);
  static uint32_t NonEmptySges(const RecvWqe& w);
  int ValidateWr(const ibv_send_wr& wr, bool type1_bind = false) const;
  // Binds and invalidations run when the requester reaches them, without a frame.
  ibv_wc_status RunLocalOpLocked(const SendWqe& w);
  void PushCompletionLocked(Cq* cq, const ibv_wc& wc, bool solicited);
  void ForgetCompletionsLocked();
  void RaiseAsync(ibv_event_type type);

  // requester.cpp
  void RunRequesterLocked();
  ibv_wc_status SendWqeLocked(SendWqe& w);
  uint8_t* BuildHeaderLocked(link::OutFrame& f, uint8_t opcode, bool solicited, uint32_t dqpn,
                             uint32_t psn, const AddressVector* ud_av);
  void ArmRetransmitLocked();

  // completer.cpp
  void RxResponseHeader(link::Channel& ch, const Packet& p, link::RxTarget& t);
  // The send WQE a response with `psn` answers; false when it answers nothing in flight.
  bool AnsweredWqeLocked(uint32_t psn, uint64_t* idx);
  // An ACK that rode on a request (link::kLinkFlagAck), handled as an ACK frame before it.
  void RxRiderAckLocked(uint32_t psn);
  // A positive ACK of the send WQE at `idx` (and all before it), from a frame or a rider.
  void AckedThroughLocked(uint64_t idx);
  void RxResponseEnd(RxWork& w);
  void RefusedPlacementLocked(RxWork& w);
  void CompleteSendWqeLocked(SendWqe& w, ibv_wc_status st);
  // The send completion of a finished WQE, when it is signaled or failed.
  void PushSendCompletionLocked(const SendWqe& w);
  // Whether send work that ended with `status` completes: errors always do, even unsignaled (IBTA
  // 10.7.3.1); successes when signaled, or on a QP that signals all.
  bool CompletesLocked(ibv_wc_status status, unsigned send_flags) const {
    return status != IBV_WC_SUCCESS || sq_sig_all_ || (send_flags & IBV_SEND_SIGNALED);
  }
  void RetireLocked();
  void AckUpToLocked(size_t idx_exclusive);
  void FailHeadLocked(size_t idx, ibv_wc_status st);
  int64_t RetransmitTimerLocked(int64_t now);

  // responder.cpp
  void RxRequestHeader(link::Channel& ch, const Packet& p, link::RxTarget& t);
  void RxRequestEnd(link::Channel& ch, RxWork& w);
  void RxUdHeader(link::Channel& ch, const Packet& p, link::RxTarget& t);
  bool TakeRecvLocked(Srq* xrc_srq, RecvWqe* out);
  // Completes `wc` on the receive CQ, or on the CQ of XRC SRQ `xrc_srqn` unless it is gone.
  void PushRecvCompletionLocked(uint32_t xrc_srqn, const ibv_wc& wc, bool solicited);
  void SendAckLocked(link::Channel& ch, uint8_t syndrome, uint32_t psn);
  void FlushAckLocked();
  void ReleaseHeldCompletionsLocked();
  const std::shared_ptr<link::Channel>& ResponseChannelLocked(link::Channel& arrival);
  // `deferrable`: more requests of the peer's are already read (RxTarget::inbound_follows), and
  // their answers may leave together (OutFrame::deferrable).
  void SendReadResponseLocked(link::Channel& ch, uint32_t psn, uint8_t* src, uint32_t len,
                              bool deferrable = false);
  void SendAtomicAckLocked(link::Channel& ch, uint32_t psn, uint64_t orig, bool deferrable = false);
  void ResponderErrorLocked(link::Channel& ch, uint8_t nak, uint32_t psn, ibv_event_type ev);
  // XRC_RECV: a SEND for an SRQ of another process of the domain goes there (xrc_relay.cpp).
  bool RelayableLocked(uint32_t srqn, const Packet& p) const;
  void BeginRelayLocked(link::Channel& ch, const Packet& p, link::RxTarget& t);
  void StartRelayLocked(const RxWork& w);

  // RC semantics (PSNs, ACKs, retransmission): RC and both halves of XRC.
  bool Reliable() const {
    return type_ == IBV_QPT_RC || type_ == IBV_QPT_XRC_SEND || type_ == IBV_QPT_XRC_RECV;
  }

  Context& ctx_;
  Hca& hca_;
  const uint32_t qpn_;
  const ibv_qp_type type_;
  const Pd* pd_;
  Cq* send_cq_;
  Cq* recv_cq_;
  Srq* srq_;
  std::shared_ptr<Xrcd> xrcd_;
  ibv_qp_cap cap_;
  const bool sq_sig_all_;
  const bool block_self_mcast_;
  ibv_qp* user_handle_;

  link::QueueMutex mu_;
  MrTable::Cache mr_cache_;              // under mu_: the local keys of the direct paths
  link::PeerWindows::Memo window_memo_;  // under mu_: the peer's window the direct path used last
  link::PeerWindows::Memo recv_window_memo_;  // under mu_: the same, for direct SENDs' buffers
  // A shared XRC target: its record in the domain's table (null otherwise).
  // Set once the QP is in the HCA's table and read per inbound frame without mu_.
  std::atomic<TargetTable*> target_table_{nullptr};
  std::atomic<TargetRecord*> target_record_{nullptr};
  std::atomic<uint32_t> target_generation_{0};
  // This process executes its requests (else a handle's replica). Read without mu_ per frame.
  std::atomic<bool> serving_{false};
  bool stopping_ = false;  // handing it over at exit: takes no new request
  // The requester's path broke, and its peer's slot moved: nothing is sent, and nothing fails
  // for want of a path, until Repath.
  bool repath_pending_ = false;
  // True when the closed path `ch` leads on to wherever its peer's slot moved (Repath follows).
  bool RepathIfMovedLocked(const link::Channel& ch);
  void PublishTargetLocked(int mask);
  void AdoptTargetLocked(bool with_psn);
  ibv_qp_state state_ = IBV_QPS_RESET;
  ibv_qp_attr attr_{};  // as last set by ibv_modify_qp
  AddressVector av_;    // connected peer (RC/UC)
  bool shut_down_ = false;
  int rx_active_ = 0;  // inbound frames between header and end

  // Send queue: WQEs [head_, next_) are sent and wait for responses, [next_, tail_) wait to be
  // sent. Indices grow forever; the slot is index % depth.
  std::vector<SendWqe> sq_;  // a power of two of slots, at least sq_depth_
  uint32_t sq_depth_ = 1;    // WQEs the queue holds (max_send_wr)
  SendWqe& SqAt(uint64_t index) { return sq_[index & (sq_.size() - 1)]; }
  std::vector<ibv_sge> sge_pool_;
  std::vector<uint8_t> inline_pool_;
  uint64_t head_ = 0, next_ = 0, tail_ = 0;
  // A request sent while this many are in flight before it is part of a stream (ib_write_bw keeps
  // 128): the link may write it together with those that follow (link::OutFrame::deferrable).
  // Request-response traffic keeps one or two in flight and is never held.
  static constexpr uint64_t kDeferrableInFlight = 4;
  uint32_t sq_psn_ = 0;
  uint32_t rd_outstanding_ = 0;
  int retry_left_ = 0, rnr_left_ = 0;
  int64_t retransmit_deadline_ = INT64_MAX;
  int64_t rnr_resume_at_ = 0;  // non-zero while waiting out an RNR NAK
  // A message went as a frame only because the same-host peer, which polls, had not published a
  // receive WQE in time: what follows waits for its ACK instead of following it as frames.
  bool hold_for_direct_ = false;
  uint32_t awaited_wqe_ = ~0u;  // the peer's WQE count a sender last waited for (AwaitPosted)
  // The peer's receive slot the next direct SEND writes (after the last one's), read without the
  // lock: PostSend asks for its line before it takes the lock and checks the request, so that
  // the line's transfer from the polling peer overlaps them (ib_send_lat shm ~4% less). Only
  // ever prefetched, which never faults: a stale one (a closed queue, an unmapped table) is
  // harmless.
  std::atomic<const void*> next_direct_slot_{nullptr};
  // UD: non-zero while the next datagram waits for room on its channel (Hca::AwaitRoom); at this
  // time it is tried again even if no room notice came.
  int64_t room_wait_until_ = 0;
  static constexpr int64_t kRoomWaitNs = 1'000'000;
  bool drained_event_pending_ = false;
  bool timer_registered_ = false;
  // Puts this QP on the HCA's timer list (OnTimer then runs), unless it is there, and tells it
  // that a deadline of this QP falls at `due`.
  void RegisterTimerLocked(int64_t due) { RegisterTimerLocked(due, due); }
  void RegisterTimerLocked(int64_t due, int64_t wake);
  // When the progress thread wakes for a deferred ACK due at `deadline`: coarsely, since ping-pong
  // traffic moves the deadline with every message and the passes that run anyway check it.
  static int64_t AckWakeNs(int64_t deadline) { return (deadline / 1'000'000 + 2) * 1'000'000; }
  // Inbound frames begun, and when the last began on the coarse clock (a precise clock read per
  // frame was 2 % of ib_send_lat): what Shutdown needs to tell traffic still coming from none.
  uint64_t rx_frames_ = 0;
  int64_t last_rx_coarse_ns_ = INT64_MIN / 2;
  static constexpr int64_t kDrainQuietNs = 2'000'000;
  static constexpr int64_t kDrainMaxNs = 50'000'000;
  // How long a destroy waits for queued outbound frames to reach their sockets.
  static constexpr int64_t kTxFlushMaxNs = 1'000'000'000;
  int64_t last_arm_ns_ = 0;
  // How long an idle QP keeps its place among the timers (a first retransmit after a quiet spell
  // may fire up to this much late; frames arriving meanwhile re-evaluate timers anyway).
  static constexpr int64_t kTimerLingerNs = 100'000'000;
  friend class Hca;

  // Receive side.
  std::unique_ptr<RecvQueue> rq_;
  // The head of rq_ published for a same-host peer's SENDs (direct_recv.cpp): WQEs
  // [direct_collected_, direct_posted_) of the block's count are rq_'s first ones.
  link::DirectRecvQueue* direct_rq_ = nullptr;
  bool direct_rq_refused_ = false;
  std::atomic<bool> srq_short_{false};  // Srq::Lend's: this QP's last borrow found the SRQ short
  // Published WQEs whose buffers peers cannot reach name a slot of staging_ (recv_staging.h);
  // staged_ has a bit per slot so published. staging_ is made once kStagingDemand refills wanted
  // it (StagingLocked); refused: it could not be.
  std::unique_ptr<RecvStaging> staging_;
  bool staging_refused_ = false;
  static constexpr uint32_t kStagingDemand = 64;
  uint32_t staging_demand_ = 0;
  uint32_t staged_ = 0;
  RecvStaging* StagingLocked();
  // The one piece of a published WQE (by slot), resolved at publication, so that a message that
  // came in its slot or its staging buffer is copied without a lookup while no region was removed
  // or changed since (MrTable::generation); staged or not. host nullptr: several pieces.
  struct PublishedPiece {
    uint8_t* host = nullptr;
    uint32_t length = 0;
    uint64_t generation = 0;
  };
  // Copies a message left in a staging or receive slot into `w`'s buffers; false when one is gone.
  bool CopyIntoWqeLocked(const uint8_t* from, uint32_t room, const RecvWqe& w,
                         const PublishedPiece& piece, uint32_t byte_len);
  PublishedPiece published_[link::kDirectRecvSlots];
  bool refill_due_ = false;  // Hca::refill_due_ was set when it became true
  int direct_watch_ = -1;    // its entry in the HCA's watched receive queues, if it has one
  int direct_feed_ = -1;     // its entry in recv_cq_'s direct feeds, if it has one
  // What WatchNextLocked watches, for a look without the lock (CollectDirectRecvsKeepingBias).
  std::atomic<uint64_t> next_direct_watch_{0};
  // The done slot CollectDirectRecvsKeepingBias last left to the polling thread, and since when.
  std::atomic<uint64_t> left_watch_{0};
  std::atomic<int64_t> left_since_ns_{0};
  uint32_t direct_posted_ = 0, direct_collected_ = 0;
  static constexpr int64_t kDatagramWaitNs = 5'000'000;
  int64_t datagram_wait_since_ = 0;  // non-zero: a datagram waits (or waited) for a WQE
  std::vector<std::weak_ptr<link::Channel>> waiting_channels_;
  // A datagram that finds no receive WQE: true when it waits in `ch` for one (up to
  // kDatagramWaitNs; ibv_post_recv resumes the channel). A sender faster than its receiver then
  // meets a full ring instead of losing what the receiver would take a moment later, as a socket
  // buffer holds datagrams for its reader.
  bool WaitForReceiveLocked(link::Channel& ch);
  void ResumeWaitingLocked() {
    if (!waiting_channels_.empty()) ResumeWaitingChannelsLocked();
  }
  void ResumeWaitingChannelsLocked();
  [[gnu::cold]] void ResumeHeldHere();
  void FlushRecvQueueLocked();
  uint32_t rq_psn_ = 0;
  uint32_t msn_ = 0;
  bool rnr_nak_outstanding_ = false;
  bool seq_nak_sent_ = false;
  bool comm_est_raised_ = false;
  bool ack_pending_ = false;
  bool ack_queued_ = false;  // in the HCA's list of QPs to flush at the batch's end, once
  uint32_t ack_psn_ = 0;
  // Adaptive ACK deferral. Where the application answers each message (ping-pong), an ACK waits
  // up to kAckDeferNs for the answer and leaves in the same write, saving a TCP segment and a
  // wake-up on each side. A QP learns it is in that pattern when a request follows an ACK within
  // kReplyWindowNs, and unlearns it when a deferred ACK times out; one-way traffic keeps prompt
  // ACKs, and so does a QP whose own requests wait for ACKs (RxRequestEnd). Measured on
  // ib_write_lat: see the commit introducing it.
  static constexpr int64_t kAckDeferNs = 30'000;
  static constexpr int64_t kReplyWindowNs = 30'000;
  bool ack_defer_ = false;
  int64_t ack_deadline_ = INT64_MAX;
  int64_t ack_sent_ns_ = 0;
  // RC receive completions wait here until the ACK that covers them has been handed to the
  // link: once an application sees a completion it may destroy the QP or exit, and the sender
  // must still learn that the message arrived.
  struct PendingCqe {
    ibv_wc wc;
    bool solicited;
    uint32_t xrc_srqn;  // non-zero: complete on this XRC SRQ's CQ, if it still exists
  };
  std::vector<PendingCqe> pending_cqes_;
  std::shared_ptr<link::Channel> ack_channel_;
  struct AtomicReplay {
    uint32_t psn;
    uint64_t orig;
    bool valid;
  };
  // As deep as max_dest_rd_atomic can be, so any retransmitted atomic still finds its result.
  AtomicReplay atomic_replay_[kMaxRdAtomic] = {};
  unsigned atomic_replay_next_ = 0;

  // XRC_RECV: the message relayed to its SRQ's owner and not answered yet. One at a time: later
  // requests are dropped meanwhile, and the answer's acknowledgement asks for them again (a PSN
  // sequence NAK after it), so ACKs stay in PSN order without holding later messages here.
  struct Relay {
    bool active = false;
    bool dropped = false;  // later requests came meanwhile
    uint32_t psn = 0;
    std::shared_ptr<link::Channel> owner;  // the SRQ owner's process
    std::shared_ptr<link::Channel> reply;  // the initiator's
    std::vector<uint8_t> payload;
    uint8_t header[sizeof(wire::XrcEth) + sizeof(wire::XrcRelayEth)] = {};
  };
  Relay relay_;
};

}  // namespace softrdma::core
