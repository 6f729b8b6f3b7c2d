#include "core/recv_queue.h"

#include <cerrno>

#include "core/context.h"
#include "core/limits.h"

namespace softrdma::core {

int RecvQueue::Post(const ibv_recv_wr* wr, const ibv_recv_wr** bad) {
  Guard g(*this);
  for (; wr; wr = wr->next) {
    // A count without a list is refused, as post_send does, instead of read through NULL.
    if (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > max_sge_ ||
        (wr->num_sge > 0 && !wr->sg_list)) {
      *bad = wr;
      return EINVAL;
    }
    if (count_ == ring_.size()) {
      *bad = wr;
      return ENOMEM;
    }
    RecvWqe& w = ring_[Wrap(head_, count_)];
    w.wr_id = wr->wr_id;
    w.num_sge = static_cast<uint32_t>(wr->num_sge);
    for (int i = 0; i < wr->num_sge; ++i) w.sge[i] = wr->sg_list[i];
    ++count_;
  }
  return 0;
}

bool RecvQueue::Pop(RecvWqe* out) {
  Guard g(*this);
  if (count_ == 0) return false;
  *out = ring_[head_];
  head_ = Wrap(head_, 1);
  --count_;
  return true;
}

const RecvWqe* RecvQueue::Front() const {
  Guard g(*this);
  return count_ ? &ring_[head_] : nullptr;
}

void RecvQueue::DropFront() {
  Guard g(*this);
  if (count_ == 0) return;
  head_ = Wrap(head_, 1);
  --count_;
}

const RecvWqe* RecvQueue::At(uint32_t i) const {
  Guard g(*this);
  return &ring_[Wrap(head_, i)];
}

void RecvQueue::PushFront(const RecvWqe& w) {
  Guard g(*this);
  if (count_ == ring_.size()) return;  // cannot happen: the WQE came from this ring
  head_ = Wrap(head_, ring_.size() - 1);
  ring_[head_] = w;
  ++count_;
}

std::vector<RecvWqe> RecvQueue::Drain() {
  Guard g(*this);
  std::vector<RecvWqe> out;
  out.reserve(count_);
  while (count_ > 0) {
    out.push_back(ring_[head_]);
    head_ = Wrap(head_, 1);
    --count_;
  }
  return out;
}

uint32_t RecvQueue::size() const {
  Guard g(*this);
  return static_cast<uint32_t>(count_);
}

bool Srq::PopForQp(RecvWqe* out) {
  bool fire = false;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (count_ == 0) return false;
    *out = ring_[head_];
    head_ = Wrap(head_, 1);
    --count_;
    if (limit_ != 0 && count_ < limit_) {
      limit_ = 0;  // one event per arming, as ibv_modify_srq(3) says
      fire = true;
    }
  }
  if (fire) {
    ibv_async_event e{};
    e.element.srq = static_cast<ibv_srq*>(user_handle_);
    e.event_type = IBV_EVENT_SRQ_LIMIT_REACHED;
    ctx_.RaiseAsync(e);
  }
  return true;
}

int Srq::Modify(const ibv_srq_attr& attr, int mask) {
  std::lock_guard<std::mutex> g(mu_);
  if (mask & ~(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT)) return EINVAL;
  if (mask & IBV_SRQ_MAX_WR) {
    // Resizing needs device support that we do not advertise (IBV_DEVICE_SRQ_RESIZE).
    return EINVAL;
  }
  if (mask & IBV_SRQ_LIMIT) {
    if (attr.srq_limit > ring_.size()) return EINVAL;
    limit_ = attr.srq_limit;
  }
  return 0;
}

void Srq::Query(ibv_srq_attr* attr) const {
  std::lock_guard<std::mutex> g(mu_);
  attr->max_wr = static_cast<uint32_t>(ring_.size());
  attr->max_sge = max_sge_;
  attr->srq_limit = limit_;
}

}  // namespace softrdma::core
