#include "rsocket/armed_cq.h"

#include <cerrno>

#include "rsocket/util.h"

namespace softrdma::rsocket {

namespace {

constexpr unsigned kAckBatch = 64;  // ibv_ack_cq_events takes a mutex: not once per event

}  // namespace

int ArmedCq::Create(ibv_context* ctx, int depth, void* cq_context) {
  channel_ = ibv_create_comp_channel(ctx);
  if (!channel_) return -errno;
  SetNonBlocking(channel_->fd);
  cq_ = ibv_create_cq(ctx, depth, cq_context, channel_, 0);
  if (!cq_) return -errno;
  return 0;
}

void ArmedCq::Destroy() {
  if (cq_) {
    if (unacked_) ibv_ack_cq_events(cq_, unacked_);
    unacked_ = 0;
    ibv_destroy_cq(cq_);
    cq_ = nullptr;
  }
  if (channel_) ibv_destroy_comp_channel(channel_);
  channel_ = nullptr;
  armed_ = false;
}

// Completion events exist only after an arm: no read (no system call) otherwise.
void ArmedCq::TakeEvent() {
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  while (armed_ && ibv_get_cq_event(channel_, &ev_cq, &ev_ctx) == 0) {
    armed_ = false;
    if (++unacked_ >= kAckBatch) {
      ibv_ack_cq_events(cq_, unacked_);
      unacked_ = 0;
    }
  }
}

void ArmedCq::Arm() {
  if (!cq_) return;
  ibv_req_notify_cq(cq_, 0);
  armed_ = true;
}

void ArmedCq::AddPollFd(std::vector<pollfd>* fds) const {
  if (channel_) fds->push_back({channel_->fd, POLLIN, 0});
}

}  // namespace softrdma::rsocket
