// Completion queues and completion channels.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <vector>

#include "core/event_queue.h"
#include "link/biased_mutex.h"

namespace softrdma::core {

class Context;
class Qp;

struct Cqe {
  ibv_wc wc;
  uint64_t timestamp_ns;  // CLOCK_MONOTONIC, for ibv_wc_read_completion_ts
  uint64_t wallclock_ns;  // CLOCK_REALTIME, for ibv_wc_read_completion_wallclock_ns
};

// Carries the user's CQ handle of each completion event (what ibv_get_cq_event returns).
struct CompChannel {
  EventQueue<void*> events;
};

class Cq {
 public:
  // `timestamps`: the CQ was created to report completion times (ibv_create_cq_ex with
  // IBV_WC_EX_WITH_COMPLETION_TIMESTAMP or _WALLCLOCK); only then is the clock read per completion.
  Cq(Context& ctx, uint32_t depth, CompChannel* channel, void* user_handle, bool timestamps)
      : ctx_(ctx),
        channel_(channel),
        user_handle_(user_handle),
        timestamps_(timestamps),
        ring_(depth + 1) {}

  // Adds a completion. On overflow the completion is lost, the CQ enters error and
  // IBV_EVENT_CQ_ERR is raised once; returns false.
  bool Push(const ibv_wc& wc, bool solicited);
  int Poll(int n, ibv_wc* out);
  // ibv_req_notify_cq: the next completion (or next solicited/error one) raises one event.
  int Arm(bool solicited_only);
  // Whether ibv_req_notify_cq asked for an event that has not come yet (read without the lock).
  bool Armed() const { return armed_.load(std::memory_order_relaxed) != kDisarmed; }
  int Resize(uint32_t depth);  // EINVAL when fewer slots than queued completions
  // Drops the queued completions of QP `qpn`: its sends' (`sends`) and its receives' (`receives`,
  // the opcodes with IBV_WC_RECV set). A QP moved to reset takes its unpolled completions with it.
  void Forget(uint32_t qpn, bool sends, bool receives);
  uint32_t depth() const { return static_cast<uint32_t>(ring_.size() - 1); }
  void* user_handle() const { return user_handle_; }
  CompChannel* channel() const { return channel_; }

  // Extended polling (ibv_cq_ex): takes the oldest completion into *out; false when none, or when
  // it is not `first` in its poll batch and announced itself with an event: that event's batch
  // starts with it (ibv_rc_pingpong -t -e looks once more after the first completion of each
  // event, and fails when a batch then finds nothing). The lock is held for the copy only: an
  // application posts work from inside its poll batch, and that work completes on this CQ.
  bool TakeOldest(Cqe* out, bool first);

  // Number of events raised for this CQ, for ibv_destroy_cq's wait on ibv_ack_cq_events.
  uint32_t events_reported() const { return events_reported_; }

  // QPs whose receive queue a same-host peer fills directly (direct_recv.cpp) and which complete
  // here. A poll looks at their watched slots without a lock and collects a done one into its
  // caller's array itself, under this CQ's lock and the QP's, not through the HCA's list and a
  // Push (two lock pairs and two thread-local lookups less per message). The caller holds the
  // QP's lock; a QP is removed before it goes. Add returns the feed, or -1 when all are taken
  // (the HCA's list still collects that QP's messages).
  static constexpr int kDirectFeeds = 4;
  int AddDirectFeed(Qp* qp, uint64_t watch);
  void RemoveDirectFeed(int feed);
  void WatchDirectFeed(int feed, uint64_t watch) {
    if (feed >= 0) feeds_[feed].watch.store(watch, std::memory_order_relaxed);
  }

 private:
  int PollLocked(int n, ibv_wc* out);
  bool DirectFeedReady() const;
  int PollDirectFeeds(int n, ibv_wc* out);
  Context& ctx_;
  CompChannel* channel_;
  void* user_handle_;
  const bool timestamps_;
  link::QueueMutex mu_;
  std::vector<Cqe> ring_;
  size_t head_ = 0, count_ = 0;
  size_t Next(size_t i) const { return i + 1 == ring_.size() ? 0 : i + 1; }
  // count_, for a poll to see an empty CQ without the lock (a busy poller's every look).
  std::atomic<size_t> queued_{0};
  // Completions ever taken from the ring, and the numbers (in that count) of those queued that
  // raised an event: where an extended poll batch ends (TakeOldest).
  uint64_t taken_ = 0;
  std::deque<uint64_t> announced_;
  void DropAnnouncedLocked() {
    while (!announced_.empty() && announced_.front() < taken_) announced_.pop_front();
  }
  enum ArmState : uint8_t { kDisarmed, kNext, kSolicited };
  // Written under mu_; an atomic so that Armed() reads it without the lock.
  std::atomic<ArmState> armed_{kDisarmed};
  ArmState ArmedLocked() const { return armed_.load(std::memory_order_relaxed); }
  void SetArmedLocked(ArmState a) { armed_.store(a, std::memory_order_relaxed); }
  bool overflowed_ = false;
  uint32_t events_reported_ = 0;
  struct DirectFeed {
    Qp* qp = nullptr;                // under mu_
    std::atomic<uint64_t> watch{0};  // link::direct_recv::Watch, read without a lock
  };
  DirectFeed feeds_[kDirectFeeds];
  // One past the last feed in use (under mu_; read without it), 0 when none: a poll looks at no
  // more (every look of a busy poller otherwise went through all kDirectFeeds).
  std::atomic<int> feed_end_{0};
  void UpdateFeedEndLocked();
  // A poll of this CQ runs the HCA's work and takes completions for it directly (cq.cpp,
  // PollTarget). Only a hint for Push: with two such polls at once, one may clear it while the
  // other runs, whose completions then go through the ring.
  std::atomic<bool> progressing_{false};
  static constexpr uint32_t kPollsPerProgress = 8;
  // Where the peers' messages all come directly, such a round finds nothing (ib_send_lat: ~50 ns
  // of every ~600 ns round trip went to it, and a message that landed meanwhile waited); frames
  // that start coming make the next round find work, which brings back the shorter rhythm.
  static constexpr uint32_t kPollsPerIdleProgress = 32;
  std::atomic<bool> progress_idle_{false};  // the last round found nothing (a hint: racy is fine)
  std::atomic<uint32_t> empty_polls_{0};
};

}  // namespace softrdma::core
