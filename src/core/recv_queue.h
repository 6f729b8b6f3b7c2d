// Receive work queues: a QP's own RQ, or a shared receive queue (SRQ) many QPs draw from.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace softrdma::core {

class Context;
class Cq;
struct Pd;
class Qp;
struct Xrcd;

struct RecvWqe {
  uint64_t wr_id;
  uint32_t num_sge;
  ibv_sge sge[32];
};

class RecvQueue {
 public:
  // `shared`: several QPs take from it (an SRQ), so it locks itself; a QP's own queue is guarded
  // by the QP's lock, and a receive costs no lock more.
  RecvQueue(uint32_t max_wr, uint32_t max_sge, bool shared = true)
      : shared_(shared), max_sge_(max_sge), ring_(max_wr) {}

  // ibv_post_recv semantics: EINVAL for too many SGEs, ENOMEM when full; *bad names the first
  // request not queued.
  int Post(const ibv_recv_wr* wr, const ibv_recv_wr** bad);
  bool Pop(RecvWqe* out);
  // The head WQE without copying it out (its 32 SGEs are half a kilobyte), and its removal; the
  // caller keeps the queue from changing in between.
  const RecvWqe* Front() const;
  void DropFront();
  // The i-th queued WQE (i < size()); the caller keeps the queue from changing meanwhile.
  const RecvWqe* At(uint32_t i) const;
  // Returns a WQE taken by a message that never completed (its connection died mid-frame, or
  // the request was refused after the WQE was taken): the next message uses it, as on hardware
  // where an unfinished message leaves the WQE at the head of the queue.
  void PushFront(const RecvWqe& w);
  // Queues a WQE posted elsewhere (an SRQ's, lent: Srq::Lend) behind the others; false when full.
  bool PushBack(const RecvWqe& w);
  // Takes every queued WQE (for flushing).
  std::vector<RecvWqe> Drain();
  uint32_t size() const;
  uint32_t capacity() const { return static_cast<uint32_t>(ring_.size()); }
  uint32_t max_sge() const { return max_sge_; }

 protected:
  class Guard {
   public:
    explicit Guard(const RecvQueue& q) : mu_(q.shared_ ? &q.mu_ : nullptr) {
      if (mu_) mu_->lock();
    }
    ~Guard() {
      if (mu_) mu_->unlock();
    }
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;

   private:
    std::mutex* mu_;
  };
  const bool shared_;
  mutable std::mutex mu_;
  uint32_t max_sge_;
  std::vector<RecvWqe> ring_;
  size_t head_ = 0, count_ = 0;
  // WQEs an SRQ lent to a QP (Srq::Lend): no longer in the ring, still counted against its
  // capacity and its limit until consumed or returned. Consumed without the lock
  // (Srq::ConsumeLent), before the completion is seen: a post that follows it finds the room.
  std::atomic<uint32_t> lent_{0};
  size_t HeldLocked() const { return count_ + lent_.load(std::memory_order_relaxed); }
  // Index i positions after `from`, for i < ring size (a division per WQE costs more than the
  // rest of taking one).
  size_t Wrap(size_t from, size_t i) const {
    size_t at = from + i;
    return at >= ring_.size() ? at - ring_.size() : at;
  }
};

class Srq : public RecvQueue {
 public:
  Srq(Context& ctx, const Pd* pd, uint32_t max_wr, uint32_t max_sge, void* user_handle)
      : RecvQueue(max_wr, max_sge), ctx_(ctx), pd_(pd), user_handle_(user_handle) {}

  // Pops and raises IBV_EVENT_SRQ_LIMIT_REACHED when the armed limit is crossed.
  bool PopForQp(RecvWqe* out);

  // ibv_post_srq_recv: queues, then offers what came to the QPs whose last borrow (below) found the
  // SRQ short.
  int PostAndOffer(const ibv_recv_wr* wr, const ibv_recv_wr** bad);
  // The QPs that take from this SRQ may borrow WQEs to publish them to a same-host peer, whose
  // SENDs then land without frames (direct_recv.cpp): a sender cannot take from a queue other QPs
  // take from too. Each borrows up to its share of the depth. Lent WQEs stay the SRQ's for
  // ibv_post_srq_recv's room and for the limit until a message consumes them, and a QP that finds
  // the SRQ empty takes back what the others hold unused (Reclaim): no QP goes without a WQE while
  // another holds one idle.
  void Attach(const std::shared_ptr<Qp>& qp);
  void Detach(const Qp* qp);
  // Moves WQEs into `into` (a borrowing QP's, under its lock) until it holds `up_to` or the QP's
  // share; how many. `fell_short` (the QP's) says whether the SRQ had fewer: the next post is
  // offered to it.
  uint32_t Lend(RecvQueue& into, uint32_t up_to, std::atomic<bool>* fell_short);
  // `n` lent WQEs took messages (the limit may fire); called before their completions are pushed,
  // so that a post made on seeing one finds the room.
  void ConsumeLent(uint32_t n);
  // Lent WQEs no message took come back to the head of the SRQ, in their order.
  void ReturnLent(const std::vector<RecvWqe>& unused);
  // `taker` (under its lock) found the SRQ empty: the other users give back what they borrowed and
  // no peer has taken. Whether any came back.
  bool Reclaim(const Qp* taker);
  int Modify(const ibv_srq_attr& attr, int mask);
  void Query(ibv_srq_attr* attr) const;
  const Pd* pd() const { return pd_; }
  void* user_handle() const { return user_handle_; }
  Context& context() const { return ctx_; }

  // XRC SRQs: the domain, the CQ their receive completions go to, and the number senders name.
  void MakeXrc(std::shared_ptr<Xrcd> xrcd, Cq* cq, uint32_t srqn) {
    xrcd_ = std::move(xrcd);
    cq_ = cq;
    srqn_ = srqn;
  }
  const Xrcd* xrcd() const { return xrcd_.get(); }
  Cq* cq() const { return cq_; }
  uint32_t srqn() const { return srqn_; }

 private:
  Context& ctx_;
  const Pd* pd_;
  void* user_handle_;
  std::atomic<uint32_t> limit_{0};  // 0 = disarmed; written under mu_
  // Under mu_: the armed limit is crossed (it disarms); the caller raises the event, unlocked.
  bool CrossedLimitLocked();
  void RaiseLimitReached();
  // Guards users_. Taken under a QP's lock (Reclaim), so never held while waiting for one.
  std::mutex users_mu_;
  struct User {
    const Qp* id;
    std::weak_ptr<Qp> qp;
  };
  std::vector<User> users_;
  std::atomic<uint32_t> user_count_{0};  // written under users_mu_; read by Lend for the share
  // Some borrower's last Lend found fewer WQEs than it had room for: the next post is offered to
  // such borrowers. Otherwise a post costs no more than the post (borrowers refill as messages
  // consume).
  std::atomic<bool> wanted_{false};
  std::shared_ptr<Xrcd> xrcd_;
  Cq* cq_ = nullptr;
  uint32_t srqn_ = 0;
};

}  // namespace softrdma::core
