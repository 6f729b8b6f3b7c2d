#include "core/cq.h"

#include <time.h>

#include <cerrno>

#include "core/context.h"
#include "core/hca.h"
#include "core/qp.h"
#include "link/shared_windows.h"
#include "link/spin_pause.h"

namespace softrdma::core {
namespace {

// The ibv_poll_cq this thread is in, while it runs inbound work (Hca::Progress): completions the
// work makes for that CQ while the CQ is empty go straight into the caller's array, instead of
// into the ring and out again under a second lock.
struct PollTarget {
  const Cq* cq;
  ibv_wc* out;
  int room;
  int got;
};
// The general TLS model (a library call per access), not initial-exec: that asks for static TLS,
// which a library loaded by dlopen (UCX's uct_ib) may not get (test abi_dlopen).
thread_local PollTarget* t_poll_target = nullptr;

}  // namespace

bool Cq::Push(const ibv_wc& wc, bool solicited) {
  bool notify = false, overflow = false;
  {
    std::lock_guard g(mu_);
    if (overflowed_) return false;
    // Only while nothing is queued (it would come first) and nobody waits for an event. The
    // thread-local is read last: it costs a library call, which most pushes (a send completion
    // made by ibv_post_send) need not pay.
    if (count_ == 0 && ArmedLocked() == kDisarmed && !timestamps_ &&
        progressing_.load(std::memory_order_relaxed)) {
      if (PollTarget* t = t_poll_target; t && t->cq == this && t->got < t->room) {
        t->out[t->got++] = wc;
        return true;
      }
    }
    if (count_ == ring_.size() - 1) {
      overflowed_ = true;
      overflow = true;
    } else {
      size_t at = head_ + count_;
      Cqe& e = ring_[at >= ring_.size() ? at - ring_.size() : at];
      e.wc = wc;
      // The completion timestamp counts on a clock that never steps (hca_core_clock is 1 GHz);
      // the wallclock reading is the real time of day. Two clock readings per completion were 3 %
      // of ib_write_bw's time at 64 KiB: CQs that cannot report them skip them.
      if (timestamps_) {
        timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        e.timestamp_ns = uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
        clock_gettime(CLOCK_REALTIME, &ts);
        e.wallclock_ns = uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
      }
      ++count_;
      queued_.store(count_, std::memory_order_release);
      const ArmState armed = ArmedLocked();
      if (armed == kNext || (armed == kSolicited && (solicited || wc.status != IBV_WC_SUCCESS))) {
        SetArmedLocked(kDisarmed);
        notify = channel_ != nullptr;
        if (notify) {
          ++events_reported_;
          DropAnnouncedLocked();
          announced_.push_back(taken_ + count_ - 1);
        }
      }
    }
  }
  if (overflow) {
    ibv_async_event e{};
    e.element.cq = static_cast<ibv_cq*>(user_handle_);
    e.event_type = IBV_EVENT_CQ_ERR;
    ctx_.RaiseAsync(e);
    return false;
  }
  if (notify) channel_->events.Push(user_handle_);
  return true;
}

int Cq::Poll(int n, ibv_wc* out) {
  if (n > 0 && feed_end_.load(std::memory_order_relaxed) > 0) {
    if (DirectFeedReady()) {
      if (int got = PollDirectFeeds(n, out); got > 0) {
        ctx_.hca().CompletionsTaken();
        return got;
      }
    } else if (!queued_.load(std::memory_order_acquire)) {
      // The rest of the HCA's work (frames, the lease) runs at every kPollsPerProgress-th empty
      // poll only (kPollsPerIdleProgress-th while the last such round found nothing), or at once
      // when a receive queue waits for its refill: a poll that runs it takes several times as long
      // as the look above, and a message that lands meanwhile waits for its end. A count, not a
      // sequence: pollers racing on it only make the rhythm uneven.
      const uint32_t k = empty_polls_.load(std::memory_order_relaxed);
      empty_polls_.store(k + 1, std::memory_order_relaxed);
      const uint32_t every = progress_idle_.load(std::memory_order_relaxed) ? kPollsPerIdleProgress
                                                                            : kPollsPerProgress;
      if (k % every != 0 && !ctx_.hca().RefillDue()) {
        // The application calls again at once: one pause per empty look leaves the core to a
        // peer on its sibling hyperthread (ib_send_lat there 0.26 -> 0.25 us). A pause is ~7 ns
        // here, which a message landing meanwhile waits for: eight cost more than they gave.
        link::SpinPause();
        return 0;
      }
    }
  }
  int got = queued_.load(std::memory_order_acquire) ? PollLocked(n, out) : 0;
  if (got == 0 && n > 0) {
    PollTarget target{this, out, n, 0};
    t_poll_target = &target;
    progressing_.store(true, std::memory_order_relaxed);
    bool worked = ctx_.hca().Progress();
    progressing_.store(false, std::memory_order_relaxed);
    if (progress_idle_.load(std::memory_order_relaxed) == worked)
      progress_idle_.store(!worked, std::memory_order_relaxed);
    t_poll_target = nullptr;
    got = target.got;
    if (worked && got < n) got += PollLocked(n - got, out + got);
  }
  if (got > 0) ctx_.hca().CompletionsTaken();
  return got;
}

bool Cq::TakeOldest(Cqe* out, bool first) {
  std::lock_guard g(mu_);
  if (count_ == 0) return false;
  DropAnnouncedLocked();
  if (!first && !announced_.empty() && announced_.front() == taken_) return false;
  *out = ring_[head_];
  head_ = Next(head_);
  --count_;
  ++taken_;
  queued_.store(count_, std::memory_order_release);
  return true;
}

int Cq::PollLocked(int n, ibv_wc* out) {
  std::lock_guard g(mu_);
  int got = 0;
  while (got < n && count_ > 0) {
    out[got++] = ring_[head_].wc;
    head_ = Next(head_);
    --count_;
  }
  taken_ += static_cast<uint64_t>(got);
  queued_.store(count_, std::memory_order_release);
  return got;
}

int Cq::AddDirectFeed(Qp* qp, uint64_t watch) {
  std::lock_guard g(mu_);
  for (int i = 0; i < kDirectFeeds; ++i)
    if (!feeds_[i].qp) {
      feeds_[i].qp = qp;
      feeds_[i].watch.store(watch, std::memory_order_relaxed);
      UpdateFeedEndLocked();
      return i;
    }
  return -1;
}

void Cq::RemoveDirectFeed(int feed) {
  if (feed < 0) return;
  std::lock_guard g(mu_);  // a poll uses the QP under it only
  feeds_[feed].qp = nullptr;
  feeds_[feed].watch.store(0, std::memory_order_relaxed);
  UpdateFeedEndLocked();
}

void Cq::UpdateFeedEndLocked() {
  int end = kDirectFeeds;
  while (end > 0 && !feeds_[end - 1].qp) --end;
  feed_end_.store(end, std::memory_order_relaxed);
}

bool Cq::DirectFeedReady() const {
  const int end = feed_end_.load(std::memory_order_relaxed);
  for (int i = 0; i < end; ++i)
    if (link::direct_recv::WatchSeesDone(feeds_[i].watch.load(std::memory_order_relaxed)))
      return true;
  return false;
}

// Straight into the caller's array only as Push would put it there (nothing queued that would
// come first, nobody waiting for an event, no clock to read). A QP's lock is only tried: it comes
// before this CQ's; a busy QP is left to the HCA's collection or the next poll. Under the QP's
// lock nothing else completes its receives, so nothing of that QP can be in the ring meanwhile.
int Cq::PollDirectFeeds(int n, ibv_wc* out) {
  std::lock_guard g(mu_);
  if (count_ != 0 || ArmedLocked() != kDisarmed || timestamps_ || overflowed_) return 0;
  int got = 0;
  const int end = feed_end_.load(std::memory_order_relaxed);
  for (int i = 0; i < end && got < n; ++i)
    if (Qp* qp = feeds_[i].qp) got += qp->TryCollectDirectRecvsInto(out + got, n - got);
  return got;
}

int Cq::Arm(bool solicited_only) {
  {
    std::lock_guard g(mu_);
    // A later "any completion" request widens an earlier solicited-only one, never the reverse.
    if (!solicited_only)
      SetArmedLocked(kNext);
    else if (ArmedLocked() == kDisarmed)
      SetArmedLocked(kSolicited);
  }
  ctx_.hca().PollerMaySleep();
  return 0;
}

void Cq::Forget(uint32_t qpn, bool sends, bool receives) {
  std::lock_guard g(mu_);
  DropAnnouncedLocked();
  // The events announced with kept completions keep announcing them, at their new numbers.
  std::deque<uint64_t> announced;
  auto next_announced = announced_.begin();
  size_t kept = 0;
  for (size_t i = 0; i < count_; ++i) {
    const Cqe e = ring_[(head_ + i) % ring_.size()];
    const bool was_announced = next_announced != announced_.end() && *next_announced == taken_ + i;
    if (was_announced) ++next_announced;
    const bool receive = (e.wc.opcode & IBV_WC_RECV) != 0;
    if (e.wc.qp_num == qpn && (receive ? receives : sends)) continue;
    if (was_announced) announced.push_back(taken_ + kept);
    ring_[(head_ + kept) % ring_.size()] = e;
    ++kept;
  }
  announced_.swap(announced);
  count_ = kept;
  queued_.store(count_, std::memory_order_release);
}

int Cq::Resize(uint32_t depth) {
  std::lock_guard g(mu_);
  if (depth < count_) return EINVAL;
  std::vector<Cqe> fresh(depth + 1);
  for (size_t i = 0; i < count_; ++i) fresh[i] = ring_[(head_ + i) % ring_.size()];
  ring_.swap(fresh);
  head_ = 0;
  return 0;
}

}  // namespace softrdma::core
