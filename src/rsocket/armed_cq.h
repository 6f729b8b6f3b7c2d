// The completion queue of an rsocket: one CQ for sends and receives, with a non-blocking
// completion channel that only ever holds an event after Arm() (rpoll, blocking waits). Both socket
// kinds drive theirs the same way: take the pending event, acknowledge events in batches, poll.
#pragma once

#include <infiniband/verbs.h>
#include <poll.h>

#include <vector>

namespace softrdma::rsocket {

class ArmedCq {
 public:
  ArmedCq() = default;
  ArmedCq(const ArmedCq&) = delete;
  ArmedCq& operator=(const ArmedCq&) = delete;
  ~ArmedCq() { Destroy(); }

  // 0, or -errno.
  int Create(ibv_context* ctx, int depth, void* cq_context);
  void Destroy();
  ibv_cq* cq() const { return cq_; }

  // Consumes the event an arm may have produced, then hands every completion to `handle`.
  // Returns how many completions there were.
  template <typename Handle>
  int Drain(Handle handle) {
    if (!cq_) return 0;
    TakeEvent();
    ibv_wc wc[kBatch];
    int total = 0;
    for (;;) {
      int n = ibv_poll_cq(cq_, kBatch, wc);
      if (n <= 0) break;
      total += n;
      for (int i = 0; i < n; ++i) handle(wc[i]);
      if (n < kBatch) break;
    }
    return total;
  }

  // Asks for an event on the next completion and adds the channel to the fds to wait on.
  void Arm();
  void AddPollFd(std::vector<pollfd>* fds) const;

 private:
  static constexpr int kBatch = 32;
  void TakeEvent();

  ibv_comp_channel* channel_ = nullptr;
  ibv_cq* cq_ = nullptr;
  bool armed_ = false;  // an event may be pending on channel_
  unsigned unacked_ = 0;
};

}  // namespace softrdma::rsocket
