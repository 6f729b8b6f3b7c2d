#include "rsocket/dgram_socket.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "link/running_thread.h"
#include "rsocket/util.h"

namespace softrdma::rsocket {
namespace {

constexpr uint32_t kMagic = 0x52534447;  // "RSDG"
constexpr uint32_t kGrh = 40;            // UD receives start with the GRH
constexpr uint32_t kMtu = 4096;          // the port's active MTU bounds a UD message
constexpr int kResolveTimeoutMs = 2000;
constexpr int kWaitSliceMs = 100;

// In front of every datagram: who sent it (as the sender sees itself) and to whom.
struct Header {
  uint32_t magic;
  uint16_t family;
  uint16_t port;  // network order
  uint8_t src[16];
};
constexpr uint32_t kMaxPayload = kMtu - sizeof(Header);

enum WrKind : uint64_t { kWrSend = 1, kWrRecv = 2 };

std::string AddrKey(const sockaddr* a) {
  if (a->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(a);
    return std::string("4") + std::string(reinterpret_cast<const char*>(&in->sin_port), 2) +
           std::string(reinterpret_cast<const char*>(&in->sin_addr), 4);
  }
  const auto* in6 = reinterpret_cast<const sockaddr_in6*>(a);
  return std::string("6") + std::string(reinterpret_cast<const char*>(&in6->sin6_port), 2) +
         std::string(reinterpret_cast<const char*>(&in6->sin6_addr), 16);
}

void FillHeader(const sockaddr* local, Header* h) {
  std::memset(h, 0, sizeof *h);
  h->magic = kMagic;
  h->family = local->sa_family;
  if (local->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(local);
    h->port = in->sin_port;
    std::memcpy(h->src, &in->sin_addr, 4);
  } else {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(local);
    h->port = in6->sin6_port;
    std::memcpy(h->src, &in6->sin6_addr, 16);
  }
}

sockaddr_storage FromHeader(const Header& h) {
  sockaddr_storage s{};
  if (h.family == AF_INET6) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&s);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = h.port;
    std::memcpy(&in6->sin6_addr, h.src, 16);
  } else {
    auto* in = reinterpret_cast<sockaddr_in*>(&s);
    in->sin_family = AF_INET;
    in->sin_port = h.port;
    std::memcpy(&in->sin_addr, h.src, 4);
  }
  return s;
}

bool IsWildcard(const sockaddr* a) {
  if (a->sa_family == AF_INET) {
    return reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr == htonl(INADDR_ANY);
  }
  const auto* in6 = reinterpret_cast<const sockaddr_in6*>(a);
  return IN6_IS_ADDR_UNSPECIFIED(&in6->sin6_addr);
}

int CheckAddr(const sockaddr* addr, socklen_t len) {
  if (!addr) return -EFAULT;
  if (len < sizeof(sockaddr_in)) return -EINVAL;
  if (addr->sa_family != AF_INET && addr->sa_family != AF_INET6) return -EAFNOSUPPORT;
  if (addr->sa_family == AF_INET6 && len < sizeof(sockaddr_in6)) return -EINVAL;
  return 0;
}

// Waits for the next CM event on a private channel.
rdma_cm_event* NextEvent(rdma_event_channel* ch, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    rdma_cm_event* e = nullptr;
    if (rdma_get_cm_event(ch, &e) == 0) return e;
    if (errno != EAGAIN && errno != EINTR) return nullptr;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    if (left <= 0) return nullptr;
    pollfd p{ch->fd, POLLIN, 0};
    poll(&p, 1, static_cast<int>(std::min<int64_t>(left, kWaitSliceMs)));
  }
}

// Answers SIDR requests for every bound datagram socket of the process, on its own thread: a
// sender resolving our address must not depend on our application calling into the library (it
// may be resolving towards us at that very moment, or be the same thread).
class SidrResponder {
 public:
  static SidrResponder& Get() {
    static SidrResponder* r = new SidrResponder;  // never destroyed: its thread runs to exit
    return *r;
  }
  void Add(rdma_event_channel* ch, uint32_t qp_num) {
    std::lock_guard<std::mutex> g(mu_);
    if (!started_) {
      epfd_ = epoll_create1(EPOLL_CLOEXEC);
      link::StartRunningThread([this] { Run(); }).detach();  // taking no signal of the program's
      started_ = true;
    }
    entries_[ch->fd] = {ch, qp_num};
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = ch->fd;
    epoll_ctl(epfd_, EPOLL_CTL_ADD, ch->fd, &ev);
  }
  // After Remove returns, the responder no longer touches the channel.
  void Remove(rdma_event_channel* ch) {
    std::lock_guard<std::mutex> g(mu_);
    epoll_ctl(epfd_, EPOLL_CTL_DEL, ch->fd, nullptr);
    entries_.erase(ch->fd);
  }

 private:
  struct Entry {
    rdma_event_channel* ch;
    uint32_t qp_num;
  };
  void Run() {
    epoll_event evs[16];
    for (;;) {
      int n = epoll_wait(epfd_, evs, 16, 1000);
      std::lock_guard<std::mutex> g(mu_);
      for (int i = 0; i < n; ++i) {
        auto it = entries_.find(evs[i].data.fd);
        if (it == entries_.end()) continue;
        rdma_cm_event* e = nullptr;
        while (rdma_get_cm_event(it->second.ch, &e) == 0) {
          if (e->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
            rdma_ack_cm_event(e);
            continue;
          }
          rdma_cm_id* req = e->id;
          rdma_ack_cm_event(e);
          rdma_conn_param p{};
          p.qp_num = it->second.qp_num;
          rdma_accept(req, &p);
          rdma_destroy_id(req);
        }
      }
    }
  }
  std::mutex mu_;
  bool started_ = false;
  int epfd_ = -1;
  std::unordered_map<int, Entry> entries_;
};

}  // namespace

DgramSocket::DgramSocket(int family) : Socket(family, SOCK_DGRAM) {}

DgramSocket::~DgramSocket() = default;

int DgramSocket::SetupVerbs() {
  if (qp_) return 0;
  int n = 0;
  devices_ = rdma_get_devices(&n);
  if (!devices_ || n < 1) return -ENODEV;
  ctx_ = devices_[0];
  pd_ = ibv_alloc_pd(ctx_);
  if (!pd_) return -ENOMEM;
  sq_depth_ = opts_.sq_size;
  rq_depth_ = opts_.rq_size;
  slot_size_ = kGrh + kMtu;
  if (int r = cq_.Create(ctx_, static_cast<int>(sq_depth_ + rq_depth_ + 8), this)) return r;
  size_t rlen = static_cast<size_t>(rq_depth_) * slot_size_;
  size_t slen = static_cast<size_t>(sq_depth_) * slot_size_;
  void* r = mmap(nullptr, rlen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  void* s = mmap(nullptr, slen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (r == MAP_FAILED || s == MAP_FAILED) return -ENOMEM;
  rbuf_ = static_cast<uint8_t*>(r);
  sbuf_ = static_cast<uint8_t*>(s);
  rmr_ = ibv_reg_mr(pd_, rbuf_, rlen, int{IBV_ACCESS_LOCAL_WRITE});
  smr_ = ibv_reg_mr(pd_, sbuf_, slen, int{IBV_ACCESS_LOCAL_WRITE});
  if (!rmr_ || !smr_) return -errno;
  ibv_qp_init_attr attr{};
  attr.send_cq = cq_.cq();
  attr.recv_cq = cq_.cq();
  attr.qp_type = IBV_QPT_UD;
  attr.sq_sig_all = 1;
  attr.cap.max_send_wr = sq_depth_;
  attr.cap.max_recv_wr = rq_depth_;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  qp_ = ibv_create_qp(pd_, &attr);
  if (!qp_) return -errno;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = 1;
  a.qkey = RDMA_UDP_QKEY;
  if (ibv_modify_qp(qp_, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY)) {
    return -errno;
  }
  a = {};
  a.qp_state = IBV_QPS_RTR;
  if (ibv_modify_qp(qp_, &a, IBV_QP_STATE)) return -errno;
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 0;
  if (ibv_modify_qp(qp_, &a, IBV_QP_STATE | IBV_QP_SQ_PSN)) return -errno;
  for (uint32_t i = 0; i < rq_depth_; ++i) {
    if (int e = PostRecv(i)) return e;
  }
  return 0;
}

int DgramSocket::PostRecv(uint32_t slot) {
  ibv_sge sge{reinterpret_cast<uint64_t>(rbuf_ + static_cast<size_t>(slot) * slot_size_),
              slot_size_, rmr_->lkey};
  ibv_recv_wr wr{};
  ibv_recv_wr* bad = nullptr;
  wr.wr_id = (kWrRecv << 56) | slot;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  return ibv_post_recv(qp_, &wr, &bad) ? -ENOMEM : 0;
}

int DgramSocket::BindLocked(const sockaddr* addr) {
  if (bound_) return -EINVAL;
  if (int e = SetupVerbs()) return e;
  channel_ = rdma_create_event_channel();
  if (!channel_) return -errno;
  SetNonBlocking(channel_->fd);
  if (rdma_create_id(channel_, &id_, this, RDMA_PS_UDP)) return -errno;
  ApplyBindOptionsLocked(id_);
  if (rdma_bind_addr(id_, const_cast<sockaddr*>(addr))) return -errno;
  if (rdma_listen(id_, 64)) return -errno;
  SidrResponder::Get().Add(channel_, qp_->qp_num);
  bound_ = true;
  return 0;
}

int DgramSocket::Bind(const sockaddr* addr, socklen_t len) {
  std::lock_guard<std::mutex> g(mu_);
  if (int e = CheckAddr(addr, len)) return e;
  return BindLocked(addr);
}

int DgramSocket::Connect(const sockaddr* addr, socklen_t len) {
  std::lock_guard<std::mutex> g(mu_);
  if (int e = CheckAddr(addr, len)) return e;
  if (!bound_) {
    sockaddr_storage any{};
    any.ss_family = static_cast<sa_family_t>(family_);
    if (int e = BindLocked(reinterpret_cast<sockaddr*>(&any))) return e;
  }
  int err = 0;
  if (!FindDest(addr, &err)) return -err;
  std::memcpy(&peer_, addr, std::min<size_t>(len, sizeof peer_));
  connected_ = true;
  return 0;
}

int DgramSocket::Resolve(const sockaddr* dst, Dest* out) {
  rdma_event_channel* ch = rdma_create_event_channel();
  if (!ch) return ENOMEM;
  SetNonBlocking(ch->fd);
  rdma_cm_id* tid = nullptr;
  if (rdma_create_id(ch, &tid, nullptr, RDMA_PS_UDP)) {
    rdma_destroy_event_channel(ch);
    return ENOMEM;
  }
  sockaddr* local = rdma_get_local_addr(id_);
  sockaddr* src = (local && !IsWildcard(local)) ? local : nullptr;
  auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(3 * kResolveTimeoutMs);
  int err = ECONNREFUSED;
  rdma_cm_event* e = nullptr;
  if (rdma_resolve_addr(tid, src, const_cast<sockaddr*>(dst), kResolveTimeoutMs) == 0 &&
      (e = NextEvent(ch, deadline)) != nullptr) {
    bool ok = e->event == RDMA_CM_EVENT_ADDR_RESOLVED;
    rdma_ack_cm_event(e);
    if (ok && rdma_resolve_route(tid, kResolveTimeoutMs) == 0 &&
        (e = NextEvent(ch, deadline)) != nullptr) {
      ok = e->event == RDMA_CM_EVENT_ROUTE_RESOLVED;
      rdma_ack_cm_event(e);
      rdma_conn_param p{};
      if (ok && rdma_connect(tid, &p) == 0 && (e = NextEvent(ch, deadline)) != nullptr) {
        if (e->event == RDMA_CM_EVENT_ESTABLISHED) {
          ibv_ah_attr ah = e->param.ud.ah_attr;
          out->ah = ibv_create_ah(pd_, &ah);
          out->qpn = e->param.ud.qp_num;
          out->qkey = e->param.ud.qkey;
          sockaddr* l = rdma_get_local_addr(tid);
          std::memcpy(&out->local, l, AddrLen(l));
          // Our port is the bound socket's, not the resolver's.
          sockaddr* mine = rdma_get_local_addr(id_);
          if (mine->sa_family == AF_INET && out->local.ss_family == AF_INET) {
            reinterpret_cast<sockaddr_in*>(&out->local)->sin_port =
                reinterpret_cast<sockaddr_in*>(mine)->sin_port;
          } else if (mine->sa_family == AF_INET6 && out->local.ss_family == AF_INET6) {
            reinterpret_cast<sockaddr_in6*>(&out->local)->sin6_port =
                reinterpret_cast<sockaddr_in6*>(mine)->sin6_port;
          } else {
            std::memcpy(&out->local, mine, AddrLen(mine));
          }
          err = out->ah ? 0 : ENOMEM;
        }
        rdma_ack_cm_event(e);
      }
    }
  }
  rdma_destroy_id(tid);
  rdma_destroy_event_channel(ch);
  return err;
}

DgramSocket::Dest* DgramSocket::FindDest(const sockaddr* dst, int* err) {
  std::string key = AddrKey(dst);
  auto it = dests_.find(key);
  if (it != dests_.end()) return &it->second;
  Dest d;
  *err = Resolve(dst, &d);
  if (*err) return nullptr;
  return &dests_.emplace(key, d).first->second;
}

// ---- progress ----

void DgramSocket::Progress() {
  DrainCq();
}

void DgramSocket::DrainCq() {
  events_seen_ += static_cast<uint64_t>(cq_.Drain([this](const ibv_wc& w) { OnCompletion(w); }));
}

void DgramSocket::OnCompletion(const ibv_wc& w) {
  if ((w.wr_id >> 56) == kWrSend) {
    ++sq_tail_;
    return;
  }
  uint32_t slot = static_cast<uint32_t>(w.wr_id & 0xffffffff);
  uint8_t* p = rbuf_ + static_cast<size_t>(slot) * slot_size_;
  Header h;
  if (w.status != IBV_WC_SUCCESS || w.byte_len < kGrh + sizeof h) {
    if (w.status == IBV_WC_SUCCESS) PostRecv(slot);
    return;
  }
  std::memcpy(&h, p + kGrh, sizeof h);
  if (h.magic != kMagic) {
    PostRecv(slot);
    return;
  }
  Arrival a{slot, w.byte_len - kGrh - static_cast<uint32_t>(sizeof h), FromHeader(h)};
  // Learn the way back to the sender from the datagram itself.
  std::string key = AddrKey(reinterpret_cast<sockaddr*>(&a.from));
  if (!dests_.count(key) && (w.wc_flags & IBV_WC_GRH)) {
    Dest d;
    d.ah = ibv_create_ah_from_wc(pd_, const_cast<ibv_wc*>(&w), reinterpret_cast<ibv_grh*>(p), 1);
    d.qpn = w.src_qp;
    d.qkey = RDMA_UDP_QKEY;
    sockaddr* mine = rdma_get_local_addr(id_);
    std::memcpy(&d.local, mine, AddrLen(mine));
    if (d.ah) dests_.emplace(key, d);
  }
  arrivals_.push_back(a);
}

bool DgramSocket::ArmLocked(std::vector<pollfd>* fds) {
  cq_.Arm();
  uint64_t before = events_seen_;
  Progress();
  if (events_seen_ != before) return false;
  cq_.AddPollFd(fds);
  return true;
}

void DgramSocket::Wait(std::unique_lock<std::mutex>& lk, int timeout_ms) {
  std::vector<pollfd> fds;
  if (!ArmLocked(&fds)) return;
  lk.unlock();
  poll(fds.data(), fds.size(), timeout_ms);
  lk.lock();
}

// ---- data ----

ssize_t DgramSocket::Send(const iovec* iov, int iovcnt, int flags, const sockaddr* to,
                          socklen_t tolen) {
  std::unique_lock<std::mutex> lk(mu_);
  if (shut_wr_) return -EPIPE;
  if (to) {
    if (int e = CheckAddr(to, tolen)) return e;
  } else if (connected_) {
    to = reinterpret_cast<const sockaddr*>(&peer_);
  } else {
    return -EDESTADDRREQ;
  }
  size_t len = IovTotal(iov, iovcnt);
  if (len > kMaxPayload) return -EMSGSIZE;
  if (!bound_) {
    sockaddr_storage any{};
    any.ss_family = static_cast<sa_family_t>(family_);
    if (int e = BindLocked(reinterpret_cast<sockaddr*>(&any))) return e;
  }
  int err = 0;
  Dest* d = FindDest(to, &err);
  if (!d) {
    // Nobody answers at that address: like UDP, the datagram is simply lost.
    return static_cast<ssize_t>(len);
  }
  for (;;) {
    Progress();
    if (sq_head_ - sq_tail_ < sq_depth_) break;
    if (NonBlocking(flags)) return WouldBlock();
    Wait(lk, kWaitSliceMs);
  }
  uint32_t slot = static_cast<uint32_t>(sq_head_ % sq_depth_);
  uint8_t* p = sbuf_ + static_cast<size_t>(slot) * slot_size_;
  Header h;
  FillHeader(reinterpret_cast<const sockaddr*>(&d->local), &h);
  std::memcpy(p, &h, sizeof h);
  GatherFrom(iov, iovcnt, 0, p + sizeof h, len);
  ibv_sge sge{reinterpret_cast<uint64_t>(p), static_cast<uint32_t>(sizeof h + len), smr_->lkey};
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  wr.wr_id = kWrSend << 56;
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.ud.ah = d->ah;
  wr.wr.ud.remote_qpn = d->qpn;
  wr.wr.ud.remote_qkey = d->qkey;
  if (int r = ibv_post_send(qp_, &wr, &bad)) return -r;
  ++sq_head_;
  return static_cast<ssize_t>(len);
}

ssize_t DgramSocket::Recv(const iovec* iov, int iovcnt, int flags, sockaddr* from,
                          socklen_t* fromlen) {
  std::unique_lock<std::mutex> lk(mu_);
  if (!bound_) return NonBlocking(flags) ? WouldBlock() : -EINVAL;
  for (;;) {
    Progress();
    if (!arrivals_.empty()) break;
    if (shut_rd_) return 0;
    if (NonBlocking(flags)) return WouldBlock();
    Wait(lk, kWaitSliceMs);
  }
  Arrival a = arrivals_.front();
  size_t want = IovTotal(iov, iovcnt);
  size_t n = std::min<size_t>(want, a.len);
  const uint8_t* p = rbuf_ + static_cast<size_t>(a.slot) * slot_size_ + kGrh + sizeof(Header);
  ScatterTo(iov, iovcnt, 0, p, n);
  if (from && fromlen) {
    CopyAddrOut(reinterpret_cast<sockaddr*>(&a.from), AddrLen(reinterpret_cast<sockaddr*>(&a.from)),
                from, fromlen);
  }
  if (!(flags & MSG_PEEK)) {
    arrivals_.pop_front();
    PostRecv(a.slot);
  }
  return static_cast<ssize_t>((flags & MSG_TRUNC) ? a.len : n);
}

int DgramSocket::Shutdown(int how) {
  std::lock_guard<std::mutex> g(mu_);
  if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR) return -EINVAL;
  if (!connected_) return -ENOTCONN;
  if (how != SHUT_WR) shut_rd_ = true;
  if (how != SHUT_RD) shut_wr_ = true;
  return 0;
}

void DgramSocket::Close() {
  std::unique_lock<std::mutex> lk(mu_);
  // Let posted datagrams leave before the QP goes (bounded).
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (qp_ && sq_tail_ != sq_head_ && std::chrono::steady_clock::now() < deadline) {
    Wait(lk, 10);
  }
  if (bound_) SidrResponder::Get().Remove(channel_);
  if (id_) rdma_destroy_id(id_);
  id_ = nullptr;
  if (channel_) rdma_destroy_event_channel(channel_);
  channel_ = nullptr;
  for (auto& [k, d] : dests_) {
    if (d.ah) ibv_destroy_ah(d.ah);
  }
  dests_.clear();
  if (qp_) ibv_destroy_qp(qp_);
  qp_ = nullptr;
  cq_.Destroy();
  if (rmr_) ibv_dereg_mr(rmr_);
  if (smr_) ibv_dereg_mr(smr_);
  rmr_ = smr_ = nullptr;
  if (rbuf_) munmap(rbuf_, static_cast<size_t>(rq_depth_) * slot_size_);
  if (sbuf_) munmap(sbuf_, static_cast<size_t>(sq_depth_) * slot_size_);
  rbuf_ = sbuf_ = nullptr;
  if (pd_) ibv_dealloc_pd(pd_);
  pd_ = nullptr;
  if (devices_) rdma_free_devices(devices_);
  devices_ = nullptr;
}

int DgramSocket::GetSockName(sockaddr* addr, socklen_t* len) {
  std::lock_guard<std::mutex> g(mu_);
  if (!addr || !len) return -EFAULT;
  sockaddr_storage none{};
  none.ss_family = static_cast<sa_family_t>(family_);
  sockaddr* local = id_ ? rdma_get_local_addr(id_) : reinterpret_cast<sockaddr*>(&none);
  CopyAddrOut(local, AddrLen(local), addr, len);
  return 0;
}

int DgramSocket::GetPeerName(sockaddr* addr, socklen_t* len) {
  std::lock_guard<std::mutex> g(mu_);
  if (!addr || !len) return -EFAULT;
  if (!connected_) return -ENOTCONN;
  sockaddr* p = reinterpret_cast<sockaddr*>(&peer_);
  CopyAddrOut(p, AddrLen(p), addr, len);
  return 0;
}

short DgramSocket::Readiness(short events) {
  std::lock_guard<std::mutex> g(mu_);
  Progress();
  short r = 0;
  if (!arrivals_.empty() || shut_rd_) r |= POLLIN;
  if (!shut_wr_ && (!qp_ || sq_head_ - sq_tail_ < sq_depth_)) r |= POLLOUT;
  return static_cast<short>(r & (events | POLLERR | POLLHUP));
}

bool DgramSocket::Arm(std::vector<pollfd>* fds) {
  std::lock_guard<std::mutex> g(mu_);
  return ArmLocked(fds);
}

}  // namespace softrdma::rsocket
