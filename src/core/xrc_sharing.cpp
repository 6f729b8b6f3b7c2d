// XRC targets held by several processes (ibv_open_qp, the legacy ibv_reg_xrc_rcv_qp): handles,
// the domain table's record, and the hand-over to a holder when the serving process exits.
// See xrc_targets.h and docs/architecture.md §13.
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>

#include "core/hca.h"
#include "core/log.h"
#include "core/xrc_targets.h"

namespace softrdma::core {
namespace {

// How long an exiting server waits for the answer to a message it relayed.
constexpr int64_t kRelayAnswerWaitNs = 2'000'000'000;

uint16_t SlotOf(uint32_t qpn) {
  return static_cast<uint16_t>(qpn >> kQpIndexBits);
}

}  // namespace

// ---- Qp side.

void Qp::AttachTarget(TargetTable* table, TargetRecord* record) {
  std::lock_guard g(mu_);
  target_record_ = record;
  target_generation_ = record->generation.load(std::memory_order_acquire);
  serving_ = record->server_pid == getpid();
  target_table_.store(table, std::memory_order_release);
  if (!serving_) AdoptTargetLocked(false);
}

bool Qp::TargetChanged() const {
  const TargetRecord* r = target_record_.load(std::memory_order_relaxed);
  return !serving_.load(std::memory_order_relaxed) ||
         r->generation.load(std::memory_order_acquire) != target_generation_ ||
         r->qpn.load(std::memory_order_relaxed) != qpn_;
}

bool Qp::SyncTarget() {
  std::lock_guard g(mu_);
  TargetTable& table = *target_table();
  TargetTable::Guard tg(table);
  TargetRecord* r = table.FindLocked(qpn_);
  if (!r) {
    // Its last holder let go: no more requests here. A message we relayed is still answered (and
    // acknowledged) first; until then we go on serving, so that the exit waits for it.
    if (!relay_.active) serving_ = false;
    return false;
  }
  target_record_ = r;
  target_generation_ = r->generation.load(std::memory_order_relaxed);
  bool takes_over = !serving_ && r->server_pid == getpid();
  serving_ = r->server_pid == getpid();
  if (!serving_) return false;  // another process serves it: requests here are not ours
  AdoptTargetLocked(takes_over);
  if (takes_over) SOFTRDMA_LOG("qp %#x: serving the shared XRC target from psn %#x", qpn_, rq_psn_);
  return true;
}

void Qp::AdoptTargetLocked(bool with_psn) {
  const TargetRecord& r = *target_record_.load(std::memory_order_relaxed);
  ibv_qp_attr a = r.attr;
  // The path to the initiator is found again on demand (responses go where requests came from).
  AddressVector keep = av_;
  attr_ = a;
  av_ = keep;
  av_.attr = a.ah_attr;
  state_ = a.qp_state;
  if (with_psn) {
    rq_psn_ = r.epsn;
    ack_channel_.reset();
  }
}

void Qp::PublishTargetLocked(int mask) {
  TargetTable& table = *target_table();
  TargetTable::Guard tg(table);
  TargetRecord* r = table.FindLocked(qpn_);
  if (!r) return;
  r->attr = attr_;
  r->attr.qp_state = state_;
  r->attr.rq_psn = rq_psn_;
  r->attr_mask |= mask;
  target_generation_ = r->generation.fetch_add(1, std::memory_order_acq_rel) + 1;
}

uint32_t Qp::StopServing() {
  std::unique_lock g(mu_);
  // A message handed to its SRQ's process is answered before we go (bounded): the successor
  // must not take it again from the initiator and deliver it twice. Requests meanwhile wait.
  stopping_ = true;
  const int64_t deadline = link::NowNs() + kRelayAnswerWaitNs;
  while (relay_.active && link::NowNs() < deadline) {
    g.unlock();
    hca_.Progress(true);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    g.lock();
  }
  FlushAckLocked();
  serving_ = false;
  shut_down_ = true;  // nothing more executes here: the successor answers from this PSN on
  // Still unanswered (its owner stalled): counted as not received, the initiator sends it again.
  return relay_.active ? relay_.psn : rq_psn_;
}

void Qp::ForgetUserHandle(const ibv_qp* handle) {
  std::lock_guard g(mu_);
  if (user_handle_ == handle) user_handle_ = nullptr;
}

// ---- HCA side.

int Hca::PublishTarget(const std::shared_ptr<Qp>& qp) {
  TargetTable* t = targets_.TableOf(*qp->xrcd_);
  if (!qp->xrcd_->shared()) return 0;  // a private domain: no other process can name it
  if (!t) return ENOMEM;
  TargetRecord* r;
  {
    TargetTable::Guard g(*t);
    r = t->AddLocked(qp->qpn());
    if (!r) return ENOMEM;
    r->server_slot = slots_.slot();
    t->AddHolderLocked(r, slots_.slot());
  }
  qp->AttachTarget(t, r);
  return 0;
}

std::shared_ptr<Qp> Hca::OpenTarget(Context& ctx, const std::shared_ptr<Xrcd>& xrcd, uint32_t qpn,
                                    int* err) {
  *err = EINVAL;
  if (std::shared_ptr<Qp> mine = FindQp(qpn)) {
    // Ours already (created here, opened before, or served for others).
    const Xrcd* d = mine->xrcd_.get();
    if (mine->type() != IBV_QPT_XRC_RECV || !d ||
        (d != xrcd.get() && !(d->shared() && d->dev == xrcd->dev && d->ino == xrcd->ino)))
      return nullptr;
    if (TargetTable* t = mine->target_table()) {
      TargetTable::Guard g(*t);
      TargetRecord* r = t->FindLocked(qpn);
      if (!r || t->AddHolderLocked(r, slots_.slot()) < 0) return nullptr;
    }
    ++mine->handles;
    return mine;
  }
  TargetTable* t = targets_.TableOf(*xrcd);
  if (!t) return nullptr;
  TargetRecord* r;
  {
    TargetTable::Guard g(*t);
    r = t->FindLocked(qpn);
    if (!r) return nullptr;
    if (!ProcessAlive(r->server_pid)) {
      // Its server was killed before it could hand the target over: gone with it.
      t->EraseLocked(r);
      return nullptr;
    }
    if (t->AddHolderLocked(r, slots_.slot()) < 0) {
      *err = ENOMEM;
      return nullptr;
    }
    // Taken while the record holds us: the slot cannot be freed between the two.
    slots_.Hold(SlotOf(qpn));
  }
  Qp::Init init{};
  init.type = IBV_QPT_XRC_RECV;
  init.xrcd = xrcd;
  std::shared_ptr<Qp> qp = CreateQp(ctx, init, err, qpn);
  if (!qp) {
    {
      TargetTable::Guard g(*t);
      if (TargetRecord* again = t->FindLocked(qpn)) t->ReleaseLocked(again);
    }
    slots_.Release(SlotOf(qpn));
    return nullptr;
  }
  qp->AttachTarget(t, r);
  return qp;
}

bool Hca::CloseTarget(Qp& qp) {
  const int left_here = --qp.handles;
  TargetTable* t = qp.target_table();
  if (!t) return left_here == 0;
  TargetTable::Guard g(*t);
  TargetRecord* r = t->FindLocked(qp.qpn());
  if (!r) return left_here == 0;
  const int left = t->ReleaseLocked(r);
  if (left_here > 0) return false;
  if (left == 0) {
    t->EraseLocked(r);
    return true;
  }
  return r->server_pid != getpid();  // we serve it: it stays, for the holders elsewhere
}

void Hca::HandOverTargets() {
  std::vector<std::shared_ptr<Qp>> all;
  {
    std::shared_lock<std::shared_mutex> g(qp_mu_);
    for (auto& [qpn, qp] : qps_)
      if (qp->target_table()) all.push_back(qp);
  }
  // A slot reaches one process: every target of a slot goes to the same successor.
  std::map<uint16_t, TargetRecord::Holder> moved;
  for (auto& qp : all) {
    TargetTable* t = qp->target_table();
    const uint16_t slot = SlotOf(qp->qpn());
    bool served = false;
    {
      TargetTable::Guard g(*t);
      TargetRecord* r = t->FindLocked(qp->qpn());
      // No record: the last holder elsewhere let go while we serve. What we relayed is still
      // answered first: its receiver may have completed it, and its sender must hear so.
      served = r ? r->server_pid == getpid() : qp->serving_.load(std::memory_order_relaxed);
      if (!served && !r) continue;
    }
    // Stops the QP outside the table's lock (the QP's lock comes first).
    uint32_t epsn = served ? qp->StopServing() : 0;
    TargetTable::Guard g(*t);
    TargetRecord* r = t->FindLocked(qp->qpn());
    if (!r) continue;
    if (t->ReleaseLocked(r, /*all_of_ours=*/true) == 0) {
      t->EraseLocked(r);
      continue;
    }
    if (!served) continue;
    const TargetRecord::Holder* next = nullptr;
    if (auto it = moved.find(slot); it != moved.end()) {
      for (auto& h : r->holders)
        if (h.pid == it->second.pid) next = &h;
    } else {
      next = t->SuccessorLocked(r);
    }
    if (!next) {
      SOFTRDMA_LOG("qp %#x: no holder of the shared XRC target can take slot %u: gone", qp->qpn(),
                   slot);
      t->EraseLocked(r);
      continue;
    }
    r->epsn = epsn;
    r->server_pid = next->pid;
    r->server_slot = next->slot;
    moved.emplace(slot, *next);
  }
  for (auto& [slot, to] : moved) {
    bool ok = slots_.HandOver(slot, to.slot);
    SOFTRDMA_LOG("slot %u handed to slot %u with its shared XRC targets: %s", slot, to.slot,
                 ok ? "done" : "failed");
  }
}

bool Hca::PeerSlotMoved(const link::Channel& closed, const ibv_ah_attr& attr, uint32_t dest_qpn) {
  uint16_t slot = DestinationSlot(attr, dest_qpn);
  if (slot == slots_.slot()) return false;
  ibv_gid gid{};
  static_assert(sizeof gid.raw == sizeof closed.peer_id().bytes);
  std::memcpy(gid.raw, closed.peer_id().bytes, sizeof gid.raw);
  auto was = ParseGid(gid);
  auto now = slots_.Lookup(slot);
  return was && now && now->addr.port != was->port;
}

}  // namespace softrdma::core
