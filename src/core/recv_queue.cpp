#include "core/recv_queue.h"

#include <algorithm>
#include <cerrno>

#include "core/context.h"
#include "core/limits.h"
#include "core/qp.h"

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
    if (HeldLocked() >= ring_.size()) {
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
  if (HeldLocked() >= ring_.size()) return;  // cannot happen: the WQE came from this ring
  head_ = Wrap(head_, ring_.size() - 1);
  ring_[head_] = w;
  ++count_;
}

bool RecvQueue::PushBack(const RecvWqe& w) {
  Guard g(*this);
  if (HeldLocked() >= ring_.size()) return false;
  ring_[Wrap(head_, count_)] = w;
  ++count_;
  return true;
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

bool Srq::CrossedLimitLocked() {
  const uint32_t limit = limit_.load(std::memory_order_relaxed);
  if (limit == 0 || HeldLocked() >= limit) return false;
  limit_.store(0, std::memory_order_relaxed);  // one event per arming, as ibv_modify_srq(3) says
  return true;
}

void Srq::RaiseLimitReached() {
  ibv_async_event e{};
  e.element.srq = static_cast<ibv_srq*>(user_handle_);
  e.event_type = IBV_EVENT_SRQ_LIMIT_REACHED;
  ctx_.RaiseAsync(e);
}

bool Srq::PopForQp(RecvWqe* out) {
  bool fire;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (count_ == 0) return false;
    *out = ring_[head_];
    head_ = Wrap(head_, 1);
    --count_;
    fire = CrossedLimitLocked();
  }
  if (fire) RaiseLimitReached();
  return true;
}

int Srq::PostAndOffer(const ibv_recv_wr* wr, const ibv_recv_wr** bad) {
  const int r = Post(wr, bad);
  // After Post's unlock: a Lend that found the SRQ short before it set wanted_ under that lock.
  if (!wanted_.load(std::memory_order_relaxed)) return r;
  wanted_.store(false, std::memory_order_relaxed);  // a Lend short from now on sets it again
  std::vector<std::shared_ptr<Qp>> offered;
  {
    std::lock_guard<std::mutex> g(users_mu_);
    for (const User& u : users_)
      if (std::shared_ptr<Qp> qp = u.qp.lock(); qp && qp->BorrowFellShort())
        offered.push_back(std::move(qp));
  }
  for (const std::shared_ptr<Qp>& qp : offered) qp->OfferSrqWqes();  // users_mu_ released first
  return r;
}

void Srq::Attach(const std::shared_ptr<Qp>& qp) {
  std::lock_guard<std::mutex> g(users_mu_);
  users_.push_back(User{qp.get(), qp});
  user_count_.store(static_cast<uint32_t>(users_.size()), std::memory_order_relaxed);
}

void Srq::Detach(const Qp* qp) {
  std::lock_guard<std::mutex> g(users_mu_);
  std::erase_if(users_, [qp](const User& u) { return u.id == qp; });
  user_count_.store(static_cast<uint32_t>(users_.size()), std::memory_order_relaxed);
}

uint32_t Srq::Lend(RecvQueue& into, uint32_t up_to, std::atomic<bool>* fell_short) {
  std::lock_guard<std::mutex> g(mu_);
  const uint32_t users = std::max(1u, user_count_.load(std::memory_order_relaxed));
  const uint32_t share = std::min(up_to, std::max(1u, capacity() / users));
  const uint32_t held = into.size();
  uint32_t lent = 0;
  for (; held + lent < share && count_ > 0; ++lent) {
    if (!into.PushBack(ring_[head_])) break;
    head_ = Wrap(head_, 1);
    --count_;
    lent_.fetch_add(1, std::memory_order_relaxed);
  }
  const bool short_of_share = held + lent < share;
  fell_short->store(short_of_share, std::memory_order_relaxed);
  if (short_of_share) wanted_.store(true, std::memory_order_relaxed);
  return lent;
}

void Srq::ConsumeLent(uint32_t n) {
  lent_.fetch_sub(n, std::memory_order_relaxed);
  if (limit_.load(std::memory_order_relaxed) == 0) return;  // not armed: no lock per message
  bool fire;
  {
    std::lock_guard<std::mutex> g(mu_);
    fire = CrossedLimitLocked();
  }
  if (fire) RaiseLimitReached();
}

void Srq::ReturnLent(const std::vector<RecvWqe>& unused) {
  std::lock_guard<std::mutex> g(mu_);
  for (auto it = unused.rbegin(); it != unused.rend(); ++it) {
    head_ = Wrap(head_, ring_.size() - 1);
    ring_[head_] = *it;
    ++count_;
    lent_.fetch_sub(1, std::memory_order_relaxed);
  }
}

bool Srq::Reclaim(const Qp* taker) {
  if (lent_.load(std::memory_order_relaxed) == 0) return false;
  bool any = false;
  std::lock_guard<std::mutex> g(users_mu_);
  for (const User& u : users_)
    if (u.id != taker)
      if (std::shared_ptr<Qp> qp = u.qp.lock()) any = qp->GiveBackSrqWqes() || any;
  return any;
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
    limit_.store(attr.srq_limit, std::memory_order_relaxed);
  }
  return 0;
}

void Srq::Query(ibv_srq_attr* attr) const {
  std::lock_guard<std::mutex> g(mu_);
  attr->max_wr = static_cast<uint32_t>(ring_.size());
  attr->max_sge = max_sge_;
  attr->srq_limit = limit_.load(std::memory_order_relaxed);
}

}  // namespace softrdma::core
