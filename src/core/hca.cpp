#include "core/hca.h"

#include <arpa/inet.h>
#include <pthread.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "core/context.h"
#include "core/limits.h"
#include "core/log.h"
#include "core/qp_internal.h"
#include "core/run_directory.h"
#include "core/xrc_relay.h"
#include "link/biased_mutex.h"
#include "link/sanitizers.h"
#include "link/shared_memory.h"
#include "link/shared_windows.h"

namespace softrdma::core {
namespace {

std::mutex g_mu;
std::shared_ptr<Hca>* g_instance = nullptr;  // process lifetime; replaced in a fork() child
std::once_flag g_atfork_once;

}  // namespace

std::shared_ptr<Hca> Hca::Get(std::string* err) {
  std::call_once(g_atfork_once,
                 [] { pthread_atfork(&Hca::ForkPrepare, &Hca::ForkParent, &Hca::ForkChild); });
  std::lock_guard<std::mutex> g(g_mu);
  if (g_instance) return *g_instance;
  std::shared_ptr<Hca> hca(new Hca());
  if (!hca->Start(err)) return nullptr;
  link::PrepareBiasInBackground();  // QPs' and CQs' locks (link/biased_mutex.h)
  // Never destroyed: the progress thread may still run while the process exits.
  g_instance = new std::shared_ptr<Hca>(hca);
  static bool registered = false;
  if (!registered) {
    registered = true;
    atexit([] {
      std::lock_guard<std::mutex> lk(g_mu);
      if (!g_instance) return;
      (*g_instance)->HandOverTargets();
      (*g_instance)->mcast_.LeaveAllAtExit();
      (*g_instance)->slots_.~SlotRegistry();
      TidyRunDirectory();  // after every file of ours, and the CM's if its handler ran first
    });
  }
  return hca;
}

// The child gets a copy of memory as the parent's threads left it. A progress thread caught inside
// an allocation leaves the allocator's lock held in the child for good wherever the allocator does
// not guard fork() itself (the sanitizers' allocators do not): the child's own progress thread then
// blocked on its first allocation, and the child's messages were never served. So the fork waits
// until the progress thread is between batches of work, and keeps it there until the copy is made.
void Hca::ForkPrepare() {
  g_mu.lock();  // nor is an HCA being built meanwhile
  if (g_instance && (*g_instance)->endpoint_) (*g_instance)->endpoint_->HoldForFork();
  // After the progress thread: it may be waiting to look a region up.
  link::SharedMemory::Get().HoldForFork();
}

void Hca::ForkParent() {
  link::SharedMemory::Get().ResumeAfterFork();
  if (g_instance && (*g_instance)->endpoint_) (*g_instance)->endpoint_->ResumeAfterFork();
  g_mu.unlock();
}

void Hca::ForkChild() {
  // The child has none of the parent's threads; it must not touch the parent's connections or
  // slot. Its next ibv_open_device builds a fresh HCA (rdma-core likewise needs a new context).
  link::SharedMemory::Get().ResumeInForkChild();
  if (g_instance) {
    if ((*g_instance)->endpoint_) (*g_instance)->endpoint_->ResumeAfterFork();
    (*g_instance)->AbandonAfterFork();
    KeepOnPurpose(g_instance);
    g_instance = nullptr;  // the old HCA is leaked on purpose
  }
  g_mu.unlock();  // ForkPrepare took it on this very thread
}

void Hca::AbandonAfterFork() {
  // Registered memory the parent shares with its peers becomes the child's own copy.
  link::SharedMemory::Get().AfterForkInChild();
  link::SharedWindows::Get().AfterForkInChild();
  // The receive queues peers fill are the parent's: nothing here collects from them.
  for (auto& w : watched_) w.store(0, std::memory_order_relaxed);
  unwatched_.store(0, std::memory_order_relaxed);
  if (endpoint_) {
    link::Endpoint* abandoned = endpoint_.release();
    KeepOnPurpose(abandoned);
    abandoned->Abandon();
  }
  slots_.ForgetAfterFork();
  mcast_.ForgetAfterFork();
}

Hca::~Hca() = default;

bool Hca::Start(std::string* err) {
  ips_ = LocalIpv4Addresses();
  const char* ud_link = getenv("SOFTRDMA_UD_LINK");
  ud_over_udp_ = ud_link && std::string(ud_link) == "udp";
  auto publish = [this, err](uint16_t port) -> std::optional<link::NodeId> {
    if (!slots_.Claim(port, ips_, err)) return std::nullopt;
    for (uint32_t ip : ips_) gids_.push_back(MakeGid({ip, port, slots_.slot()}));
    // EUI-64 style: a locally administered prefix, then the slot and the endpoint's port.
    node_guid_ = 0x02534f4600000000ull | (uint64_t{slots_.slot()} << 16) | port;
    link::NodeId id;
    std::memcpy(id.bytes, gids_[0].raw, sizeof id.bytes);
    return id;
  };
  endpoint_ = link::Endpoint::Start(*this, publish, err);
  return endpoint_ != nullptr;
}

std::shared_ptr<Qp> Hca::CreateQp(Context& ctx, const Qp::Init& init, int* err, uint32_t qpn) {
  std::unique_lock<std::shared_mutex> g(qp_mu_);
  if (qps_.size() >= kMaxQp || (qpn && qps_.count(qpn))) {
    *err = qpn ? EEXIST : ENOMEM;
    return nullptr;
  }
  if (!qpn)
    qpn = NextFreeNumber(slots_.slot(), &next_qp_index_,
                         [this](uint32_t n) { return qps_.count(n) != 0; });
  auto qp = std::make_shared<Qp>(ctx, qpn, init);
  qps_.emplace(qpn, qp);
  g.unlock();
  if (init.srq && init.srq->srqn() == 0) init.srq->Attach(qp);  // Qp::Shutdown detaches it
  return qp;
}

void Hca::RemoveQp(uint32_t qpn) {
  std::shared_ptr<Qp> keep;  // destroyed outside the lock
  {
    std::unique_lock<std::shared_mutex> g(qp_mu_);
    auto it = qps_.find(qpn);
    if (it == qps_.end()) return;
    keep = std::move(it->second);
    mcast_.DetachAll(qpn);
    qps_.erase(it);
    qps_generation_.fetch_add(1, std::memory_order_release);
  }
  // A replica of another process's shared XRC target held that process's slot (xrc_targets.h).
  uint16_t slot = static_cast<uint16_t>(qpn >> kQpIndexBits);
  if (keep->target_table() && slot != slots_.slot()) slots_.Release(slot);
  std::lock_guard<std::mutex> g(timer_mu_);
  timer_qps_.erase(keep);
}

std::shared_ptr<Qp> Hca::FindQp(uint32_t qpn) {
  std::shared_lock<std::shared_mutex> g(qp_mu_);
  auto it = qps_.find(qpn);
  return it == qps_.end() ? nullptr : it->second;
}

// A connection mostly carries frames for one QP: its memo saves the table's read lock, the hash
// lookup and a reference count pair per frame (two frames per TCP ib_write_lat message).
std::shared_ptr<Qp> Hca::FindQpFor(link::Channel& ch, uint32_t qpn) {
  link::Channel::SinkMemo& memo = ch.sink_memo();
  const uint64_t generation = qps_generation_.load(std::memory_order_acquire);
  if (memo.key == qpn && memo.generation == generation) {
    if (std::shared_ptr<void> known = memo.target.lock())
      return std::static_pointer_cast<Qp>(known);
  }
  std::shared_ptr<Qp> qp = FindQp(qpn);
  if (qp) {
    memo.target = qp;
    memo.key = qpn;
    memo.generation = generation;
  }
  return qp;
}

std::shared_ptr<link::Channel> Hca::Resolve(const ibv_ah_attr& attr, uint32_t qpn, bool datagram) {
  if (!endpoint_) return nullptr;  // a fork child using its parent's objects: see Progress()
  std::optional<link::PeerAddr> addr;
  bool self = false;
  bool same_host = false;  // the peer is in our network namespace: shared memory may reach it
  if (attr.is_global) {
    if (auto f = ParseGid(attr.grh.dgid)) {
      same_host =
          f->ip == INADDR_LOOPBACK || std::find(ips_.begin(), ips_.end(), f->ip) != ips_.end();
      self = same_host && f->port == endpoint_->port();
      addr = link::PeerAddr{f->ip, f->port};
    }
  }
  uint32_t slot = attr.dlid ? attr.dlid : qpn >> kQpIndexBits;
  if (!addr && !self) {
    self = slot == slots_.slot();
    if (!self) {
      if (auto peer = slots_.Lookup(static_cast<uint16_t>(slot))) {
        addr = peer->addr;
        same_host = peer->same_netns;
        // A slot handed to us with the shared XRC targets we serve (xrc_targets.h).
        self = same_host && peer->addr.port == endpoint_->port();
      }
    }
  }
  if (self) {
    SOFTRDMA_LOG("lid %u qpn %#x: this process, in-process link", slot, qpn);
    return endpoint_->Loopback();
  }
  if (!addr) {
    SOFTRDMA_LOG("lid %u qpn %#x: no such slot, unreachable", slot, qpn);
    return nullptr;
  }
  bool udp = datagram && ud_over_udp_;
  if (same_host && !udp) {
    if (auto ch = endpoint_->ConnectShm(addr->port)) {
      SOFTRDMA_LOG("lid %u qpn %#x: shm link to port %u", slot, qpn, addr->port);
      return ch;
    }
  }
  SOFTRDMA_LOG("lid %u qpn %#x: %s link to %u.%u.%u.%u:%u", slot, qpn, udp ? "udp" : "tcp",
               addr->ip >> 24, (addr->ip >> 16) & 255, (addr->ip >> 8) & 255, addr->ip & 255,
               addr->port);
  return udp ? endpoint_->Datagram(*addr) : endpoint_->Connect(*addr, !datagram);
}

std::vector<std::pair<std::shared_ptr<link::Channel>, uint32_t>> Hca::McastTargets(
    const ibv_gid& mgid) {
  std::vector<std::pair<std::shared_ptr<link::Channel>, uint32_t>> out;
  for (uint32_t qpn : mcast_.Members(mgid))
    if (auto ch = ChannelToSlot(static_cast<uint16_t>(qpn >> kQpIndexBits), true))
      out.emplace_back(std::move(ch), qpn);
  return out;
}

void Hca::ArmTimer(const std::shared_ptr<Qp>& qp, int64_t due, int64_t wake) {
  {
    std::lock_guard<std::mutex> g(timer_mu_);
    timer_qps_.insert(qp);
  }
  // Listed before noted, and noted before the wake-up: a pass that skips has then not missed it.
  NoteTimerDue(due, wake);
  if (endpoint_) endpoint_->Wake();
}

namespace {
void LowerTo(std::atomic<int64_t>& a, int64_t v) {
  int64_t cur = a.load(std::memory_order_relaxed);
  while (v < cur && !a.compare_exchange_weak(cur, v, std::memory_order_acq_rel)) {
  }
}
}  // namespace

void Hca::NoteTimerDue(int64_t due, int64_t wake) {
  LowerTo(timers_due_, due);
  LowerTo(timers_next_, wake);
}

void Hca::QueueAck(const std::shared_ptr<Qp>& qp) {
  ack_qps_.push_back(qp);
}

bool ParseFrame(const uint8_t* hdr, size_t hdr_len, uint32_t payload_len, Packet* out) {
  // The headers the opcode promises are exactly what arrived.
  if (!hdr || hdr_len < sizeof(wire::Lrh) + sizeof(wire::Bth)) return false;
  Packet p{};
  p.lrh = reinterpret_cast<const wire::Lrh*>(hdr);
  size_t at = sizeof(wire::Lrh);
  // LNH 0 (raw) and 1 (IP, non-IBA) never carry IB transport: not ours to interpret.
  if ((p.lrh->sl_lnh & 3) < wire::Lrh::kLnhLocal) return false;
  if (p.lrh->has_grh()) {
    if (hdr_len < at + sizeof(wire::Grh) + sizeof(wire::Bth)) return false;
    p.grh = reinterpret_cast<const wire::Grh*>(hdr + at);
    at += sizeof(wire::Grh);
  }
  p.bth = reinterpret_cast<const wire::Bth*>(hdr + at);
  p.info = &Opcode(p.bth->opcode);
  p.payload_len = payload_len;
  if (!p.info->valid() || at + p.info->length != hdr_len ||
      (payload_len > 0 && !p.info->has(kHasPayload)))
    return false;
  *out = p;
  return true;
}

void Hca::OnFrameHeader(link::Channel& ch, const uint8_t* hdr, size_t hdr_len, uint32_t payload_len,
                        link::RxTarget& t, uint32_t rider_ack) {
  Packet p{};
  if (!ParseFrame(hdr, hdr_len, payload_len, &p)) {
    ++malformed_;
    return ch.Abort();
  }
  // An ACK rides only on an RC request (its QP answers requests of the QP the request is for).
  p.rider_ack = rider_ack;
  if (rider_ack != link::kNoRiderAck &&
      (OpTransport(p.bth->opcode) != op::kRc || (p.info->mask & (kIsResponse | kIsRelay)))) {
    ++malformed_;
    return ch.Abort();
  }
  // A datagram link has no hello and no connection to answer on: it carries UD traffic only, so
  // whoever can reach the UDP port cannot drive RC/UC QPs through it.
  if (ch.is_datagram() && OpTransport(p.bth->opcode) != op::kUd) {
    ++malformed_;
    return;
  }
  if (p.info->mask & kIsRelay) {
    if (p.bth->opcode == op::kXrcRelaySend) return ReceiveXrcRelay(*this, ch, p, t);
    if (std::shared_ptr<Qp> qp = FindQp(p.bth->qpn()))
      qp->OnRelayAnswer(p.bth->psn(), p.ext<wire::Aeth>(p.info->aeth)->syndrome);
    return;
  }
  std::shared_ptr<Qp> qp = FindQpFor(ch, p.bth->qpn());
  if (!qp) {  // like a real HCA: frames for unknown QPs vanish
    SOFTRDMA_LOG("frame for unknown qp %#x dropped", p.bth->qpn());
    return;
  }
  if (qp->target_table() && qp->TargetChanged() && !qp->SyncTarget()) {
    // No handle on it anywhere any more (kept while it serves: a relayed message's answer finds it)
    if (qp->handles.load() == 0 && !qp->serving_.load(std::memory_order_relaxed))
      RemoveQp(qp->qpn());
    return;
  }
  Qp* receiver = qp.get();
  t.hold = std::static_pointer_cast<FrameReceiver>(std::move(qp));
  receiver->RxHeader(ch, p, t);
}

// `hold` is always set as a FrameReceiver, so the cast back is exact.
void Hca::OnFrameEnd(link::Channel& ch, link::RxTarget& t) {
  if (t.hold) static_cast<FrameReceiver*>(t.hold.get())->RxEnd(ch, t);
}

void Hca::OnFrameAbort(link::Channel&, link::RxTarget& t) {
  if (t.hold) static_cast<FrameReceiver*>(t.hold.get())->RxAbort(t);
}

// Resolving reads the slot's file: once per process reached, not once per message.
std::shared_ptr<link::Channel> Hca::ChannelToSlot(uint16_t slot, bool datagram) {
  std::lock_guard<std::mutex> g(slot_channels_mu_);
  std::shared_ptr<link::Channel>& ch = slot_channels_[uint32_t{slot} | uint32_t{datagram} << 16];
  if (!ch || ch->closed()) {
    ibv_ah_attr a{};
    a.dlid = slot;
    ch = Resolve(a, uint32_t{slot} << kQpIndexBits, datagram);
  }
  return ch;
}

void Hca::OnChannelClosed(link::Channel& ch) {
  std::vector<std::shared_ptr<Qp>> all;
  {
    std::shared_lock<std::shared_mutex> g(qp_mu_);
    all.reserve(qps_.size());
    for (auto& [qpn, qp] : qps_) all.push_back(qp);
  }
  for (auto& qp : all) qp->OnChannelClosed(ch);
  OnChannelRoom(ch);  // its datagram senders stop waiting (and lose what they send, as UD does)
}

bool Hca::AwaitRoom(Qp& qp, const std::shared_ptr<link::Channel>& ch) {
  if (!ch->AwaitRoom()) return false;  // the usual case, without the registry's lock
  std::lock_guard<std::mutex> g(room_mu_);
  room_waiters_[ch.get()].push_back(qp.weak_from_this());
  // The room may have come, and been announced, before the registration: ask again now that a
  // notice would find us (a waiter that goes on at once is told later, which OnRoom ignores).
  return ch->AwaitRoom();
}

void Hca::OnChannelRoom(link::Channel& ch) {
  std::vector<std::weak_ptr<Qp>> waiters;
  {
    std::lock_guard<std::mutex> g(room_mu_);
    auto it = room_waiters_.find(&ch);
    if (it == room_waiters_.end()) return;
    waiters.swap(it->second);
    room_waiters_.erase(it);
  }
  for (auto& w : waiters)
    if (std::shared_ptr<Qp> qp = w.lock()) qp->OnRoom();
}

void Hca::QueueRepath(std::shared_ptr<Qp> qp) {
  {
    std::lock_guard<std::mutex> g(repath_mu_);
    repath_qps_.push_back(std::move(qp));
  }
  NoteTimerDue(0);
  // Resolved from the timer pass, outside the link's close handling and the QP's lock.
  if (endpoint_) endpoint_->Wake();
}

int Hca::AddDirectRecv(std::shared_ptr<Qp> qp, const std::atomic<uint32_t>* next_state,
                       uint32_t index) {
  std::lock_guard g(direct_mu_);
  direct_qps_.push_back(std::move(qp));
  for (int i = 0; i < kWatchedRecvQueues; ++i)
    if (!watched_[i].load(std::memory_order_relaxed)) {
      watched_[i].store(link::direct_recv::Watch(next_state, index), std::memory_order_relaxed);
      return i;
    }
  unwatched_.fetch_add(1, std::memory_order_relaxed);
  return -1;
}

void Hca::RestageDirectRecvs() {
  if (staging_qps_.load(std::memory_order_relaxed) == 0) return;
  std::vector<std::shared_ptr<Qp>> qps;
  {
    std::lock_guard g(direct_mu_);  // not held into a QP's lock: it comes after them
    qps = direct_qps_;
  }
  for (auto& qp : qps) qp->RestageDirectRecvs();
}

void Hca::RemoveDirectRecv(const Qp* qp, int watch) {
  std::lock_guard g(direct_mu_);
  if (watch >= 0)
    watched_[watch].store(0, std::memory_order_relaxed);
  else
    unwatched_.fetch_sub(1, std::memory_order_relaxed);
  for (size_t i = 0; i < direct_qps_.size(); ++i)
    if (direct_qps_[i].get() == qp) {
      direct_qps_[i] = std::move(direct_qps_.back());
      direct_qps_.pop_back();
      return;
    }
}

bool Hca::CollectDirectRecvsSlow(bool count, bool wait) {
  // The count first, then the slots: a slot done after this load counts again.
  if (count) link::SharedWindows::Get().TakeRecvsDone();
  if (!wait) {
    // A QP's lock comes before direct_mu_: under it, QPs are only tried. One that is busy is
    // collected by a later poll (its watched slot still says done; the count is kept pending).
    std::lock_guard g(direct_mu_);
    bool all = true;
    for (auto& qp : direct_qps_) all = qp->TryCollectDirectRecvs() && all;
    if (!all) link::SharedWindows::Get().KeepRecvsPending();
    return true;
  }
  // Copied, to wait for each QP's lock. Kept per thread: a collection allocates nothing.
  thread_local std::vector<std::shared_ptr<Qp>> qps;
  {
    std::lock_guard g(direct_mu_);
    qps = direct_qps_;
  }
  bool left = false;
  for (auto& qp : qps) left = !qp->CollectDirectRecvsKeepingBias() || left;
  qps.clear();
  if (left) {
    // Looked at again once the grace ends (OnTimers); the earliest recheck stands.
    const int64_t at = link::NowNs() + Qp::kOwnerGraceNs;
    int64_t none = 0;
    if (direct_recheck_at_.compare_exchange_strong(none, at, std::memory_order_relaxed)) {
      NoteTimerDue(at);
      if (endpoint_ && !endpoint_->OnProgressThread()) endpoint_->Wake();
    }
  }
  return true;
}

void Hca::RefillDirectRecvs() {
  // Cleared before the QPs are looked at: a QP that falls due after its look sets it again.
  refill_due_.store(false, std::memory_order_relaxed);
  std::lock_guard g(direct_mu_);  // a QP's lock comes first: QPs are only tried
  bool left = false;
  for (auto& qp : direct_qps_) left = !qp->TryRefillDirectRecvs() || left;
  if (left) refill_due_.store(true, std::memory_order_relaxed);
}

void Hca::OnBatchEnd() {
  CollectDirectRecvs(true, true);  // the progress thread, woken by a peer's nudge, or a poller
  if (ack_qps_.empty()) return;
  // Both vectors keep their capacity: a batch allocates nothing.
  std::vector<std::shared_ptr<Qp>>& batch = ack_batch_;
  batch.swap(ack_qps_);
  for (auto& qp : batch) qp->FlushAck();
  batch.clear();
}

int64_t Hca::OnTimers(int64_t now) {
  if (const int64_t at = direct_recheck_at_.load(std::memory_order_relaxed); at != 0 && now >= at) {
    direct_recheck_at_.store(0, std::memory_order_relaxed);
    CollectDirectRecvsSlow(false, true);  // what its polling thread left since is taken now
  }
  if (now < timers_due_.load(std::memory_order_acquire))
    return timers_next_.load(std::memory_order_relaxed);
  // Reset before the pass: a deadline noted from here on survives it, and one noted before was
  // set before, so the pass sees it.
  timers_due_.store(INT64_MAX, std::memory_order_seq_cst);
  timers_next_.store(INT64_MAX, std::memory_order_seq_cst);
  std::vector<std::shared_ptr<Qp>> repath;
  {
    std::lock_guard<std::mutex> g(repath_mu_);
    repath.swap(repath_qps_);
  }
  for (auto& qp : repath) {
    // By slot, not by GID: the GID names the port of the process that left.
    ibv_ah_attr a{};
    a.dlid = DestinationSlot(qp->path_attr(), qp->dest_qpn());
    qp->Repath(Resolve(a, qp->dest_qpn()));
  }
  std::vector<std::shared_ptr<Qp>>& armed = timer_scratch_;  // kept: no allocation per batch
  {
    std::lock_guard<std::mutex> g(timer_mu_);
    if (timer_qps_.empty()) return timers_next_.load(std::memory_order_relaxed);
    armed.assign(timer_qps_.begin(), timer_qps_.end());
  }
  int64_t next = INT64_MAX, due = INT64_MAX;
  for (auto& qp : armed) {
    int64_t qp_due;
    int64_t d = qp->OnTimer(now, &qp_due);
    if (d < next) next = d;
    if (qp_due < due) due = qp_due;
  }
  armed.clear();
  NoteTimerDue(due, next);
  return timers_next_.load(std::memory_order_relaxed);
}

void Hca::DisarmTimer(Qp* qp) {
  std::lock_guard<std::mutex> g(timer_mu_);
  for (auto it = timer_qps_.begin(); it != timer_qps_.end(); ++it) {
    if (it->get() == qp) {
      timer_qps_.erase(it);
      return;
    }
  }
}

}  // namespace softrdma::core
