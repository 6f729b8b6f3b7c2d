// How long pollers stay off the socket lease (architecture §4) after a lease stranded frames: the
// poller that held it waited for them elsewhere (spinning on memory for an RDMA WRITE) while the
// progress thread, kept off the sockets, left them unread until the lease ran out (up to 1 ms).
#pragma once

#include <algorithm>
#include <cstdint>

namespace softrdma::link {

// The pause doubles, from 1 ms up to 100 ms, while leases keep stranding frames soon after they
// were taken (riostream polls once and spins: it strands at most one exchange in every 100 ms), and
// starts over after a lease that served its poller for 100 ms first. Ping-pong traffic strands a
// frame when one answer comes late (TCP ib_write_lat: the deferred ACK times out, and the answer
// finds the poller spinning on memory), every few hundred milliseconds; a fixed 100 ms pause kept
// it off the lease, a progress-thread wake-up per message, a third of the time.
class LeasePause {
 public:
  static constexpr int64_t kMinNs = 1'000'000;
  static constexpr int64_t kMaxNs = 100'000'000;
  static constexpr int64_t kProvenNs = 100'000'000;

  // A lease held for `held_ns` ended with frames unread: how long to take none.
  int64_t AfterStranding(int64_t held_ns) {
    pause_ns_ = held_ns >= kProvenNs ? kMinNs : std::min(pause_ns_ * 2, kMaxNs);
    return pause_ns_;
  }

 private:
  int64_t pause_ns_ = kMinNs / 2;  // the first stranding pauses for kMinNs
};

}  // namespace softrdma::link
