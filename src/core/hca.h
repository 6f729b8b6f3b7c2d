// The software HCA of this process: identity (slot, LID, GIDs), the QP and MR tables shared by
// every opened context, and the FrameSink that routes inbound frames to QPs. One per process; a
// fork()ed child gets a fresh one on its next open.
#pragma once

#include <infiniband/verbs.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <optional>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/addressing.h"
#include "core/mr.h"
#include "core/multicast.h"
#include "core/qp.h"
#include "core/xrc.h"
#include "core/xrc_targets.h"
#include "link/endpoint.h"
#include "link/fast_mutex.h"
#include "link/shared_windows.h"

namespace softrdma::core {

class Hca final : public link::FrameSink, public std::enable_shared_from_this<Hca> {
 public:
  // The process's HCA, created on first use. nullptr (and *err) when the endpoint cannot start.
  static std::shared_ptr<Hca> Get(std::string* err);
  ~Hca() override;

  uint16_t lid() const { return slots_.slot(); }
  const std::vector<ibv_gid>& gids() const { return gids_; }
  uint64_t node_guid() const { return node_guid_; }
  MrTable& mrs() { return mrs_; }
  XrcRegistry& xrc() { return xrc_; }
  uint32_t NewPdHandle() { return ++pd_handles_; }

  // `qpn` non-zero: a replica of another process's shared XRC target, under that number.
  std::shared_ptr<Qp> CreateQp(Context& ctx, const Qp::Init& init, int* err, uint32_t qpn = 0);
  void RemoveQp(uint32_t qpn);
  std::shared_ptr<Qp> FindQp(uint32_t qpn);
  // FindQp for a frame that came on `ch`, remembering the answer on the channel.
  std::shared_ptr<Qp> FindQpFor(link::Channel& ch, uint32_t qpn);

  // Finds the channel that reaches the node addressed by `attr` (and `qpn` when no GRH/LID).
  // `datagram`: the channel carries UD traffic, which may take the UDP link.
  std::shared_ptr<link::Channel> Resolve(const ibv_ah_attr& attr, uint32_t qpn,
                                         bool datagram = false);

  // The channel to the process holding `slot` (reused; made again once closed), or nullptr.
  // `datagram`: for UD traffic, as in Resolve.
  std::shared_ptr<link::Channel> ChannelToSlot(uint16_t slot, bool datagram = false);

  // XRC targets shared between processes (xrc_targets.h; xrc_sharing.cpp).
  SharedTargets& targets() { return targets_; }
  // A new XRC_RECV QP of a domain opened through a file enters the domain's table, this process
  // holding it and serving it. 0 or an errno value.
  int PublishTarget(const std::shared_ptr<Qp>& qp);
  // ibv_open_qp(3): one more handle on target `qpn` of `xrcd`. nullptr and *err: EINVAL when the
  // domain has no such target.
  std::shared_ptr<Qp> OpenTarget(Context& ctx, const std::shared_ptr<Xrcd>& xrcd, uint32_t qpn,
                                 int* err);
  // One handle on a target is destroyed: true when the QP goes now. It stays while this
  // process serves it for holders elsewhere.
  bool CloseTarget(Qp& qp);
  // At exit: what this process serves goes to a holder still alive, with the slots that reach it.
  void HandOverTargets();
  // A sender's path broke: true when the slot it addressed now reaches another process (the
  // holder a shared target was handed to).
  bool PeerSlotMoved(const link::Channel& closed, const ibv_ah_attr& attr, uint32_t dest_qpn);
  // Resolves `qp`'s path again on the progress thread, then calls its Repath.
  void QueueRepath(std::shared_ptr<Qp> qp);
  // A UD sender waits for room on `ch` (link::Channel::AwaitRoom): true when it must, and then
  // `qp` hears OnRoom once there is. The caller holds the QP's lock.
  bool AwaitRoom(Qp& qp, const std::shared_ptr<link::Channel>& ch);

  McastRegistry& mcast() { return mcast_; }
  // One channel and member QPN per QP attached to `mgid` anywhere on the host.
  std::vector<std::pair<std::shared_ptr<link::Channel>, uint32_t>> McastTargets(
      const ibv_gid& mgid);

  // Runs inbound work on the calling thread (an application polling an empty CQ). A fork child
  // that uses its parent's objects reaches an HCA without an endpoint: nothing arrives there.
  // SENDs placed by same-host peers are collected first (direct_recv.cpp).
  bool Progress(bool wait = false) {
    if (CollectDirectRecvs() && !wait) return true;
    if (RefillDue()) RefillDirectRecvs();
    return endpoint_ && endpoint_->PollOnce(wait);
  }
  // A receive queue's refill was left to an idle moment (Qp::RefillDirectRecvLocked): the next
  // empty poll tries them all. A flag, not a count of such queues: the count's locked
  // read-modify-write was on the path of every message a poll collected.
  void NoteRefillDue() { refill_due_.store(true, std::memory_order_relaxed); }
  bool RefillDue() const { return refill_due_.load(std::memory_order_relaxed); }
  void RefillDirectRecvs();
  // QPs whose receive queue same-host peers may fill (direct_recv.cpp). Pollers watch the next
  // slot of the first kWatchedRecvQueues, without a lock (a slot pointer that went stale costs one
  // collection: the table is never unmapped); the others are found by the peers' count of slots
  // done, one cache line more per message. Add returns the watch entry, or -1.
  static constexpr int kWatchedRecvQueues = 4;
  int AddDirectRecv(std::shared_ptr<Qp> qp, const std::atomic<uint32_t>* next_state,
                    uint32_t index);
  void RemoveDirectRecv(const Qp* qp, int watch);
  // After a region was deregistered or changed: WQEs published staged (recv_staging.h) whose
  // buffers it held are taken back and published again only if they still resolve, so that a
  // SEND for them takes the long way and fails there, for the sender too, as on a NIC.
  void RestageDirectRecvs();
  // QPs that made a staging area: deregistrations look at no QP while there are none.
  void NoteStaging(int delta) { staging_qps_.fetch_add(delta, std::memory_order_relaxed); }
  // `index`: the WQE count the slot is done for (its state's upper half).
  void WatchDirectRecv(int watch, const std::atomic<uint32_t>* next_state, uint32_t index) {
    if (watch >= 0)
      watched_[watch].store(link::direct_recv::Watch(next_state, index), std::memory_order_relaxed);
  }
  // Turns what peers placed into completions; false when they placed nothing. `catch_up`: also
  // when only the peers' count says so (the progress thread's rounds: the consumer's sleep waits
  // for the count, which polls that find completions through the watch do not take).
  bool CollectDirectRecvs(bool catch_up = false, bool wait = false) {
    if (!DirectRecvsReady() && !(catch_up && link::SharedWindows::Get().RecvsPending()))
      return false;
    return CollectDirectRecvsSlow(catch_up || unwatched_.load(std::memory_order_relaxed) > 0, wait);
  }
  bool DirectRecvsReady() const {
    for (const auto& w : watched_)
      if (link::direct_recv::WatchSeesDone(w.load(std::memory_order_relaxed))) return true;
    return unwatched_.load(std::memory_order_relaxed) > 0 &&
           link::SharedWindows::Get().RecvsPending();
  }
  // An application thread armed a CQ to sleep until its event (see link::Endpoint).
  void PollerMaySleep() {
    if (endpoint_) endpoint_->PollerMaySleep();
  }
  void CompletionsTaken() {
    if (endpoint_) endpoint_->CompletionsTaken();
  }
  // Resumes a channel that held a datagram for a receive WQE, from an application thread holding
  // no lock of ours: delivered on this thread where it can be. Not in a fork child, whose
  // channels are its parent's (Resume only rings the parent's progress thread).
  void ResumeHeld(link::Channel& ch) {
    if (endpoint_)
      ch.ResumeHere();
    else
      ch.Resume();
  }
  // See link::Endpoint::WaitAlongside; without an endpoint (a fork child) the read waits alone.
  int WaitAlongside(int fd) { return endpoint_ ? endpoint_->WaitAlongside(fd) : 0; }
  // See link::Endpoint::SecureQueuedPayloads.
  void SecureQueuedPayloads() {
    if (endpoint_) endpoint_->SecureQueuedPayloads();
  }
  bool WaitTxIdle(int64_t max_ns) { return !endpoint_ || endpoint_->WaitTxIdle(max_ns); }

  // Progress-thread services for QPs.
  // Puts `qp` on the timer list; its timers are due at `due` (CLOCK_MONOTONIC ns) at the latest.
  void ArmTimer(const std::shared_ptr<Qp>& qp, int64_t due, int64_t wake);  // any thread
  // A timer of a QP already on the list is due at `due` (OnTimers skips its pass until then); the
  // progress thread need not wake before `wake` for it.
  void NoteTimerDue(int64_t due, int64_t wake);
  void NoteTimerDue(int64_t due) { NoteTimerDue(due, due); }
  void QueueAck(const std::shared_ptr<Qp>& qp);  // progress thread
  void DisarmTimer(Qp* qp);                      // caller holds the QP's lock

  // FrameSink.
  void OnFrameHeader(link::Channel& ch, const uint8_t* hdr, size_t hdr_len, uint32_t payload_len,
                     link::RxTarget& t, uint32_t rider_ack) override;
  void OnFrameEnd(link::Channel& ch, link::RxTarget& t) override;
  void OnFrameAbort(link::Channel& ch, link::RxTarget& t) override;
  void OnChannelClosed(link::Channel& ch) override;
  void OnChannelRoom(link::Channel& ch) override;
  void OnBatchEnd() override;
  // A slot left to the thread that polls its QP (Qp::CollectDirectRecvsKeepingBias) is no work
  // until the recheck: the progress thread sleeps until then.
  bool DirectWorkPending() override {
    return (DirectRecvsReady() && direct_recheck_at_.load(std::memory_order_relaxed) == 0) ||
           link::SharedWindows::Get().RecvsPending();
  }
  int64_t OnTimers(int64_t now_ns) override;

  // Frames dropped because they were malformed (diagnostics and tests).
  uint64_t malformed_frames() const { return malformed_.load(); }

 private:
  Hca() = default;
  bool Start(std::string* err);
  void AbandonAfterFork();
  // pthread_atfork handlers: the progress thread is held out of its work across fork().
  static void ForkPrepare();
  static void ForkParent();
  static void ForkChild();

  SlotRegistry slots_;
  std::vector<uint32_t> ips_;
  bool ud_over_udp_ = false;  // SOFTRDMA_UD_LINK=udp
  std::vector<ibv_gid> gids_;
  uint64_t node_guid_ = 0;
  std::unique_ptr<link::Endpoint> endpoint_;
  MrTable mrs_;
  XrcRegistry xrc_;
  SharedTargets targets_;
  std::mutex room_mu_;  // after a QP's lock, before a channel's
  std::unordered_map<const link::Channel*, std::vector<std::weak_ptr<Qp>>> room_waiters_;
  std::mutex repath_mu_;
  std::vector<std::shared_ptr<Qp>> repath_qps_;  // paths to resolve again (progress thread)
  McastRegistry mcast_;
  std::mutex slot_channels_mu_;
  // By slot, plus 1 << 16 for datagram channels.
  std::unordered_map<uint32_t, std::shared_ptr<link::Channel>> slot_channels_;
  std::atomic<uint32_t> pd_handles_{0};

  std::shared_mutex qp_mu_;
  // Counts removals from qps_: a channel's memo of a QP (FindQpFor) from before one is not used.
  std::atomic<uint64_t> qps_generation_{1};
  std::unordered_map<uint32_t, std::shared_ptr<Qp>> qps_;
  uint32_t next_qp_index_ = 1;

  std::mutex timer_mu_;
  std::set<std::shared_ptr<Qp>> timer_qps_;
  std::vector<std::shared_ptr<Qp>> ack_qps_;        // progress thread only
  std::vector<std::shared_ptr<Qp>> ack_batch_;      // OnBatchEnd's scratch
  std::vector<std::shared_ptr<Qp>> timer_scratch_;  // OnTimers' (under the link's progress mutex)
  // The earliest instant a pass over timer_qps_ may find work (a QP's exact deadline, a repath),
  // and the wake-up the last pass asked for, lowered by the deadlines noted since. A pass runs
  // after every batch of inbound work: before this instant it is skipped (it took the timer and
  // repath mutexes and every listed QP's lock: ~280 cycles of each TCP ib_write_lat message).
  std::atomic<int64_t> timers_due_{0};
  std::atomic<int64_t> timers_next_{INT64_MAX};
  std::atomic<uint64_t> malformed_{0};

  // `count`: take the peers' count too (it costs a cache line the peers write). `wait`: wait for
  // each QP's lock (else a busy QP is left to a later call).
  bool CollectDirectRecvsSlow(bool count, bool wait);
  link::FastMutex direct_mu_;  // after a QP's lock
  std::vector<std::shared_ptr<Qp>> direct_qps_;
  std::atomic<uint64_t> watched_[kWatchedRecvQueues] = {};
  std::atomic<int> unwatched_{0};
  // When slots left to their polling threads are looked at again (CLOCK_MONOTONIC ns); 0: none.
  std::atomic<int64_t> direct_recheck_at_{0};
  std::atomic<bool> refill_due_{false};
  std::atomic<int> staging_qps_{0};
};

}  // namespace softrdma::core
