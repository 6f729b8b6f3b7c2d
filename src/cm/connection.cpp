// The CM state machine: what each rdma_* call and each received CM message does to an id, and
// the events it reports (rdma_cm(7), rdma_create_id(3), rdma_accept(3)).
#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "cm/cm.h"
#include "cm/ip_address.h"
#include "core/log.h"
#include "core/unpredictable.h"

namespace softrdma::cm {

namespace {

constexpr int kDefaultBacklog = 1024;  // what the kernel gives a backlog <= 0

bool IsUdPs(uint16_t ps) {
  return ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB;
}

bool IsUd(const CmId* id) {
  return id->pub.qp_type == IBV_QPT_UD;
}

// IB CM private data limits, as the kernel's rdma_cm applies them to a 36-byte CMA header:
// REQ 92, REP 196, REJ 148 (raised to 196 here, see docs/compatibility.md), SIDR REQ 216, SIDR REP
// 136.
size_t MaxConnectData(const CmId* id) {
  return IsUd(id) ? 180 : 56;
}
size_t MaxAcceptData(const CmId* id) {
  return IsUd(id) ? 136 : 196;
}

uint32_t RandomPsn() {
  return core::UnpredictableU32() & 0xffffff;
}

void EraseEventsOf(EventChannel* c, CmId* id, std::vector<CmEvent*>* out) {
  c->queue.Purge([&](CmEvent* e) {
    bool mine = e->pub.id == &id->pub || e->pub.listen_id == &id->pub;
    if (mine) out->push_back(e);
    return mine;
  });
}

}  // namespace

uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

namespace {

Cm* g_cm = nullptr;
std::once_flag g_cm_once;

}  // namespace

Cm& Cm::Get() {
  // Never destroyed: the service thread may outlive static destructors at exit.
  std::call_once(g_cm_once, [] {
    g_cm = new Cm;
    pthread_atfork(nullptr, nullptr, [] { Cm::AfterForkInChild(); });
  });
  return *g_cm;
}

// A fork()ed child has the parent's ids but not its service thread. It starts over with an empty
// connection manager (ids are per process, as kernel ones are not inherited usefully either),
// closing its copies of the parent's sockets and claims without removing the parent's files.
void Cm::AfterForkInChild() {
  Cm* old = g_cm;
  for (auto& [comm, id] : old->ids_) id->claim.ForgetAfterFork();
  old->presence_.ForgetAfterFork();
  PortClaim::ForgetHeldFilesAfterFork();
  for (Peer* p : old->peers_) {
    if (p->fd >= 0) close(p->fd);
  }
  for (const auto& [fd, id] : old->rendezvous_) close(fd);
  for (const auto& [fd, id] : old->probes_) close(fd);
  for (int fd : {old->listen_fd_, old->epoll_fd_, old->wake_fd_}) {
    if (fd >= 0) close(fd);
  }
  g_cm = new Cm;  // the old one is leaked on purpose: its lock may be held by a vanished thread
}

EventChannel* Cm::CreateChannel() {
  auto* c = new (std::nothrow) EventChannel;
  if (!c) {
    errno = ENOMEM;
    return nullptr;
  }
  if (!c->queue.ok()) {
    int e = errno;
    delete c;
    errno = e;
    return nullptr;
  }
  c->pub.fd = c->queue.fd();
  return c;
}

int Cm::DestroyChannel(EventChannel* c) {
  std::vector<CmEvent*> left;
  c->queue.Purge([&](CmEvent* e) {
    left.push_back(e);
    return true;
  });
  for (CmEvent* e : left) delete e;
  if (c->queue.Close()) delete c;
  return 0;
}

int Cm::CreateId(EventChannel* c, CmId** out, void* context, rdma_port_space ps, ibv_qp_type t) {
  if (!out) return EINVAL;
  if (ps != RDMA_PS_TCP && ps != RDMA_PS_UDP && ps != RDMA_PS_IB && ps != RDMA_PS_IPOIB) {
    return EINVAL;
  }
  auto* id = new (std::nothrow) CmId;
  if (!id) return ENOMEM;
  std::memset(&id->pub, 0, sizeof id->pub);
  if (!c) {
    c = CreateChannel();
    if (!c) {
      int e = errno;
      delete id;
      return e;
    }
    id->sync = true;
    id->owns_channel = true;
  }
  id->pub.channel = &c->pub;
  id->pub.context = context;
  id->pub.ps = ps;
  id->pub.qp_type = t;
  id->qkey = IsUdPs(ps) ? RDMA_UDP_QKEY : 0;
  std::lock_guard<std::mutex> g(mu);
  id->comm_id = ++next_comm_id_;
  if (id->comm_id == 0) id->comm_id = ++next_comm_id_;
  ids_[id->comm_id] = id;
  *out = id;
  return 0;
}

void Cm::AttachDevice(CmId* id) {
  if (!Context()) return;
  id->pub.verbs = ctx_;
  if (!id->pub.pd) id->pub.pd = pd_;
  id->pub.port_num = 1;
}

void Cm::FillRoute(CmId* id) {
  rdma_route& r = id->pub.route;
  if (id->has_src) ToSockaddr(id->src, &r.addr.src_storage);
  if (id->has_dst) ToSockaddr(id->dst, &r.addr.dst_storage);
  const ibv_gid& sgid = GidFor(id->src);
  std::memcpy(&r.addr.addr.ibaddr.sgid, &sgid, 16);
  if (id->remote_known) std::memcpy(&r.addr.addr.ibaddr.dgid, id->remote_gid, 16);
  r.addr.addr.ibaddr.pkey = htobe16(0xffff);
  ibv_sa_path_rec& p = id->path;
  std::memcpy(&p.sgid, &sgid, 16);
  if (id->remote_known) {
    std::memcpy(&p.dgid, id->remote_gid, 16);
    p.dlid = htobe16(id->remote_lid);
  }
  p.slid = htobe16(lid_);
  p.pkey = htobe16(0xffff);
  p.hop_limit = 64;
  p.traffic_class = id->tos;
  p.reversible = 1;
  p.numb_path = 1;
  p.mtu_selector = 2;
  p.mtu = IBV_MTU_4096;
  p.rate_selector = 2;
  p.rate = 3;
  p.packet_life_time_selector = 2;
  p.packet_life_time = 14;
  if (id->state != IdState::kIdle && id->state != IdState::kBound &&
      id->state != IdState::kAddrResolved && id->state != IdState::kListening) {
    r.path_rec = &id->path;
    r.num_paths = 1;
  }
}

void Cm::Report(CmId* id, rdma_cm_event_type type, int status, const std::vector<uint8_t>* data,
                CmId* listen, CmEvent** made) {
  auto* e = new CmEvent;
  std::memset(&e->pub, 0, sizeof e->pub);
  e->pub.id = &id->pub;
  e->pub.listen_id = listen ? &listen->pub : nullptr;
  e->pub.event = type;
  e->pub.status = status;
  uint8_t len = 0;
  if (data && !data->empty()) {
    len = static_cast<uint8_t>(std::min(data->size(), kMaxPrivateData));
    std::memcpy(e->private_data, data->data(), len);
  }
  if (IsUd(id)) {
    e->pub.param.ud.private_data = len ? e->private_data : nullptr;
    e->pub.param.ud.private_data_len = len;
  } else {
    e->pub.param.conn.private_data = len ? e->private_data : nullptr;
    e->pub.param.conn.private_data_len = len;
  }
  if (made) {
    *made = e;  // the caller completes it, then queues it (QueueEvent)
    return;
  }
  QueueEvent(e);
}

void QueueEvent(CmEvent* e) {
  rdma_cm_id* owner = e->pub.listen_id ? e->pub.listen_id : e->pub.id;
  ToChannel(owner->channel)->queue.Push(e);
}

// Synchronous ids (rdma_create_id with a NULL channel): wait for the event the call produced,
// keep it in id->event, and turn its status into the call's result (as rdma-core does).
int Cm::CompleteSync(CmId* id, std::unique_lock<std::mutex>* lk) {
  if (!id->sync) return 0;
  if (id->pub.event) {
    delete reinterpret_cast<CmEvent*>(id->pub.event);
    id->pub.event = nullptr;
  }
  EventChannel* c = ToChannel(id->pub.channel);
  lk->unlock();
  CmEvent* e = nullptr;
  int err = c->queue.Pop(&e);
  lk->lock();
  if (err) return err;
  id->pub.event = &e->pub;
  if (e->pub.status) {
    if (e->pub.event == RDMA_CM_EVENT_REJECTED) return ECONNREFUSED;
    return e->pub.status < 0 ? -e->pub.status : e->pub.status;
  }
  return 0;
}

int Cm::DestroyId(CmId* id) {
  std::unique_lock<std::mutex> lk(mu);
  Disarm(id);
  // Tell the peer, as the kernel does when an id goes away mid-connection.
  if (id->peer) {
    switch (id->state) {
      case IdState::kConnected:
      case IdState::kConnectResponse:
      case IdState::kAcceptSent:
        Send(id->peer, EncodeBare(MsgType::kDreq, id->comm_id, id->remote_comm_id));
        break;
      case IdState::kRequestReceived:
      case IdState::kConnecting:
        Send(id->peer, EncodeRej(id->comm_id, id->remote_comm_id, Rej{kRejConsumer, {}}));
        break;
      default:
        break;
    }
  }
  DetachPeer(id);
  if (id->listener) {
    if (id->state == IdState::kRequestReceived) --id->listener->pending;
    id->listener->children.erase(id);
    id->listener = nullptr;
  }
  for (CmId* child : id->children) child->listener = nullptr;
  id->children.clear();
  CloseRendezvous(id);
  CancelProbe(id);
  if (id->state == IdState::kListening) {
    auto it = listeners_.find({static_cast<uint16_t>(id->pub.ps), id->src.port});
    if (it != listeners_.end()) {
      it->second.erase(id);
      if (it->second.empty()) listeners_.erase(it);
    }
  }
  ids_.erase(id->comm_id);
  // Queued events that name this id go with it; a connection request that nobody took is
  // refused and its id destroyed, as the kernel does for a listener that goes away.
  std::vector<CmEvent*> gone;
  EraseEventsOf(ToChannel(id->pub.channel), id, &gone);
  std::vector<CmId*> orphans;
  for (CmEvent* e : gone) {
    if (e->pub.event == RDMA_CM_EVENT_CONNECT_REQUEST && e->pub.id != &id->pub) {
      orphans.push_back(ToId(e->pub.id));
    }
    delete e;
  }
  // Events handed out before the purge are counted (see GetEvent); none can be handed out after.
  acked_.wait(lk, [id] { return id->events_acked >= id->events_reported.load(); });
  if (id->pub.event) delete reinterpret_cast<CmEvent*>(id->pub.event);
  EventChannel* own = id->owns_channel ? ToChannel(id->pub.channel) : nullptr;
  lk.unlock();
  for (CmId* o : orphans) DestroyId(o);
  if (own) DestroyChannel(own);
  delete id;
  return 0;
}

void Cm::DetachPeer(CmId* id) {
  if (id->peer) {
    id->peer->ids.erase(id);
    id->peer = nullptr;
  }
}

int Cm::BindAddr(CmId* id, const sockaddr* addr) {
  std::lock_guard<std::mutex> g(mu);
  Addr a;
  if (!addr) return EINVAL;
  if (!FromSockaddr(addr, &a)) return EAFNOSUPPORT;
  if (id->state != IdState::kIdle) return EINVAL;
  if (!IsAnyIp(a) && !IsLocalIp(a)) return EADDRNOTAVAIL;
  if (a.port != 0) {
    if (int err = id->claim.Claim(static_cast<uint16_t>(id->pub.ps), a, id->reuse_addr)) {
      return err;
    }
  } else {
    a.port = EphemeralPort();
  }
  id->src = a;
  id->has_src = true;
  id->state = IdState::kBound;
  AttachDevice(id);
  FillRoute(id);
  return 0;
}

int Cm::ResolveAddr(CmId* id, const sockaddr* src, const sockaddr* dst, int timeout_ms) {
  std::unique_lock<std::mutex> lk(mu);
  Addr d;
  if (!dst) return EINVAL;
  if (!FromSockaddr(dst, &d)) return EAFNOSUPPORT;
  if (id->state != IdState::kIdle && id->state != IdState::kBound &&
      id->state != IdState::kAddrResolved) {
    return EINVAL;
  }
  if (id->state == IdState::kIdle) {
    Addr s;
    if (src && src->sa_family != AF_UNSPEC) {
      if (!FromSockaddr(src, &s)) return EAFNOSUPPORT;
      if (!IsAnyIp(s) && !IsLocalIp(s)) return EADDRNOTAVAIL;
    } else {
      s = Addr{};
      s.family = d.family;
      std::memcpy(s.ip, d.ip, 12);  // IPv4-mapped prefix for IPv4
    }
    if (s.port != 0) {
      if (int err = id->claim.Claim(static_cast<uint16_t>(id->pub.ps), s, id->reuse_addr)) {
        return err;
      }
    } else {
      s.port = EphemeralPort();
    }
    id->src = s;
    id->has_src = true;
    id->state = IdState::kBound;
  }
  id->dst = d;
  id->has_dst = true;
  AttachDevice(id);
  bool multicast = d.family == 4 ? (d.ip[12] & 0xf0) == 0xe0 : d.ip[0] == 0xff;
  if (IsAnyIp(id->src)) {
    // The source is the address the kernel would route from; loopback answers loopback.
    if (IsLocalIp(d)) {
      uint16_t port = id->src.port;
      id->src = d;
      id->src.port = port;
    } else if (auto r = RouteSource(d)) {
      uint16_t port = id->src.port;
      id->src = *r;
      id->src.port = port;
    } else if (!multicast) {
      FillRoute(id);
      Report(id, RDMA_CM_EVENT_ADDR_ERROR, -ENETUNREACH, nullptr);
      return CompleteSync(id, &lk);
    }
  }
  FillRoute(id);
  if (!multicast && !KnownHost(d)) {
    // No process of this host owns that address. Another host may answer on the port (the
    // probe); if none does, the error comes when the caller's timeout runs out, like an ARP
    // request nobody answers.
    Arm(id, TimerKind::kAddrError, timeout_ms > 0 ? static_cast<uint64_t>(timeout_ms) : 0,
        -ETIMEDOUT);
    StartProbe(id);
    return CompleteSync(id, &lk);
  }
  id->state = IdState::kAddrResolved;
  Report(id, RDMA_CM_EVENT_ADDR_RESOLVED, 0, nullptr);
  return CompleteSync(id, &lk);
}

int Cm::ResolveRoute(CmId* id, int /*timeout_ms*/) {
  std::unique_lock<std::mutex> lk(mu);
  if (id->state != IdState::kAddrResolved) return EINVAL;
  id->state = IdState::kRouteResolved;
  FillRoute(id);
  Report(id, RDMA_CM_EVENT_ROUTE_RESOLVED, 0, nullptr);
  return CompleteSync(id, &lk);
}

int Cm::Listen(CmId* id, int backlog) {
  std::lock_guard<std::mutex> g(mu);
  if (id->state == IdState::kIdle) {
    Addr any;
    any.family = 4;
    std::memcpy(any.ip, "\0\0\0\0\0\0\0\0\0\0\xff\xff", 12);
    id->src = any;
    id->has_src = true;
    id->state = IdState::kBound;
    AttachDevice(id);
  }
  if (id->state != IdState::kBound) return EINVAL;
  if (!id->claim.held()) {
    // Bound without a port: take a free ephemeral one now that others must find it.
    int err = EADDRINUSE;
    for (int tries = 0; tries < 64 && err == EADDRINUSE; ++tries) {
      if (tries) id->src.port = EphemeralPort();
      err = id->claim.Claim(static_cast<uint16_t>(id->pub.ps), id->src, id->reuse_addr);
    }
    if (err) return err;
  }
  if (!StartService()) return EADDRNOTAVAIL;
  if (!id->claim.Publish(service_port_)) return EIO;
  id->backlog = backlog > 0 ? backlog : kDefaultBacklog;
  id->state = IdState::kListening;
  listeners_[{static_cast<uint16_t>(id->pub.ps), id->src.port}].insert(id);
  OpenRendezvous(id);
  FillRoute(id);
  return 0;
}

int Cm::GetRequest(CmId* listen, CmId** out) {
  std::unique_lock<std::mutex> lk(mu);
  if (!listen->sync || !out) return EINVAL;
  if (listen->pub.event) {
    delete reinterpret_cast<CmEvent*>(listen->pub.event);
    listen->pub.event = nullptr;
  }
  EventChannel* c = ToChannel(listen->pub.channel);
  lk.unlock();
  CmEvent* e = nullptr;
  int err = c->queue.Pop(&e);
  lk.lock();
  if (err) return err;
  int ret = 0;
  if (e->pub.event == RDMA_CM_EVENT_REJECTED) {
    ret = ECONNREFUSED;
  } else if (e->pub.status) {
    ret = e->pub.status < 0 ? -e->pub.status : e->pub.status;
  } else if (e->pub.event != RDMA_CM_EVENT_CONNECT_REQUEST) {
    ret = EINVAL;
  }
  if (ret) {
    listen->pub.event = &e->pub;
    return ret;
  }
  CmId* child = ToId(e->pub.id);
  if (listen->ep_qp_init_attr) {
    ibv_qp_init_attr attr = *listen->ep_qp_init_attr;
    ibv_qp_init_attr_ex ex{};
    std::memcpy(&ex, &attr, sizeof attr);
    ex.comp_mask = IBV_QP_INIT_ATTR_PD;
    ex.pd = listen->pub.pd;
    lk.unlock();
    int r = CreateQp(child, &ex);
    lk.lock();
    if (r) {
      listen->pub.event = &e->pub;
      return r;
    }
  }
  child->pub.event = &e->pub;
  *out = child;
  return 0;
}

// This side's end of a REQ or REP: the id's QP (or the one the application names in `param`), the
// values it offers, its private data.
ConnEnd Cm::LocalEnd(CmId* id, const rdma_conn_param* param, uint32_t ece_vendor_id) {
  ConnEnd e;
  if (id->pub.qp) {
    e.qpn = id->pub.qp->qp_num;
    e.flags = id->pub.qp->srq ? kFlagSrq : 0;
  } else if (param) {
    e.qpn = param->qp_num & 0xffffff;
    e.flags = param->srq ? kFlagSrq : 0;
  }
  e.psn = id->psn;
  std::memcpy(e.gid, &GidFor(id->src), 16);
  e.lid = lid_;
  e.responder_resources = id->responder_resources;
  e.initiator_depth = id->initiator_depth;
  e.flow_control = param ? param->flow_control : 1;
  e.rnr_retry_count = param ? std::min<uint8_t>(param->rnr_retry_count, 7) : 7;
  e.ece_vendor_id = ece_vendor_id;
  e.ece_options = id->local_ece.options;
  e.qkey = id->qkey;
  if (param && param->private_data_len) {
    const auto* p = static_cast<const uint8_t*>(param->private_data);
    e.private_data.assign(p, p + param->private_data_len);
  }
  return e;
}

// What the peer's end of a REQ or REP tells this side.
void Cm::LearnPeer(CmId* id, uint32_t peer_comm_id, const ConnEnd& e) {
  id->remote_comm_id = peer_comm_id;
  id->remote_known = true;
  id->remote_qpn = e.qpn;
  id->remote_psn = e.psn;
  std::memcpy(id->remote_gid, e.gid, 16);
  id->remote_lid = e.lid;
  // Seen from this side: what the peer may read from us is what it initiates, and the reverse.
  id->remote_responder_resources = e.initiator_depth;
  id->remote_initiator_depth = e.responder_resources;
  // As in IB CM, each side says how often the other's QP retries its RNR NAKs.
  id->rnr_retry_count = e.rnr_retry_count;
  id->remote_ece.vendor_id = e.ece_vendor_id;
  id->remote_ece.options = e.ece_options;
}

// The connection parameters an event reports about the peer's end.
static void FillConnParam(rdma_conn_param* c, const CmId* id, const ConnEnd& e) {
  c->responder_resources = id->remote_responder_resources;
  c->initiator_depth = id->remote_initiator_depth;
  c->flow_control = e.flow_control;
  c->rnr_retry_count = e.rnr_retry_count;
  c->srq = (e.flags & kFlagSrq) ? 1 : 0;
  c->qp_num = e.qpn;
}

int Cm::Connect(CmId* id, const rdma_conn_param* param) {
  std::unique_lock<std::mutex> lk(mu);
  if (id->state != IdState::kRouteResolved && id->state != IdState::kAddrResolved) return EINVAL;
  if (param && param->private_data_len &&
      (!param->private_data || param->private_data_len > MaxConnectData(id))) {
    return EINVAL;
  }
  const ibv_device_attr& dev = device_attr_;
  if (id->pub.ps == RDMA_PS_TCP) {
    if (!id->pub.qp && !param) return EINVAL;
    if (param && param->responder_resources != RDMA_MAX_RESP_RES &&
        param->responder_resources > dev.max_qp_rd_atom) {
      return EINVAL;
    }
    if (param && param->initiator_depth != RDMA_MAX_INIT_DEPTH &&
        param->initiator_depth > dev.max_qp_init_rd_atom) {
      return EINVAL;
    }
  }
  id->initiator_depth = static_cast<uint8_t>(param && param->initiator_depth != RDMA_MAX_INIT_DEPTH
                                                 ? param->initiator_depth
                                                 : std::min(dev.max_qp_init_rd_atom, 255));
  id->responder_resources = static_cast<uint8_t>(
      param && param->responder_resources != RDMA_MAX_RESP_RES ? param->responder_resources
                                                               : std::min(dev.max_qp_rd_atom, 255));
  id->retry_count = param ? std::min<uint8_t>(param->retry_count, 7) : 7;
  id->psn = RandomPsn();

  Req r;
  r.port_space = static_cast<uint16_t>(id->pub.ps);
  r.qp_type = static_cast<uint8_t>(id->pub.qp_type);
  r.retry_count = id->retry_count;
  r.src = id->src;
  r.dst = id->dst;
  r.end = LocalEnd(id, param, id->local_ece.vendor_id);

  id->pending_req = std::make_unique<Req>(std::move(r));
  id->listener_deadline_ns = NowNs() + kListenerGraceMs * 1000000ull;
  id->state = IdState::kConnecting;
  SendRequest(id, &lk);
  return CompleteSync(id, &lk);
}

// Sends the id's REQ to the process that listens for its destination. A listener that is not
// there yet is looked for again every few milliseconds for kListenerGraceMs: programs such as
// perftest -R open their data listener just after the client learns of the server, and an
// address resolved in microseconds would otherwise race it.
void Cm::SendRequest(CmId* id, std::unique_lock<std::mutex>* lk) {
  auto service = FindListener(static_cast<uint16_t>(id->pub.ps), id->dst);
  Peer* peer = nullptr;
  if (!service && StartService()) {
    // Not in the run directory: another host's listener, or one with a run directory of its
    // own, on its rendezvous port if it is there.
    if (auto other = RendezvousOf(id->dst)) {
      peer = PeerFor(*other, lk);
      if (peer) service = other;
    }
  }
  if (!service) {
    if (NowNs() < id->listener_deadline_ns) {
      Arm(id, TimerKind::kListenerWait, kListenerPollMs, 0);
      return;
    }
    SOFTRDMA_LOG("cm: nothing listens on %s port %u (port space 0x%x)", IpText(id->dst).c_str(),
                 id->dst.port, static_cast<unsigned>(id->pub.ps));
    id->state = IdState::kFailed;
    id->pending_req.reset();
    Report(id, RDMA_CM_EVENT_UNREACHABLE, -ECONNREFUSED, nullptr);
    return;
  }
  if (!peer) peer = StartService() ? PeerFor(*service, lk) : nullptr;
  if (!peer) {
    id->state = IdState::kFailed;
    id->pending_req.reset();
    Report(id, RDMA_CM_EVENT_UNREACHABLE, -EHOSTUNREACH, nullptr);
    return;
  }
  id->peer = peer;
  peer->ids.insert(id);
  Arm(id, TimerKind::kConnect, kReqTimeoutMs, -ETIMEDOUT);
  Send(peer, EncodeReq(id->comm_id, *id->pending_req));
  id->sent_req = std::move(id->pending_req);
}

CmId* Cm::FindListenerFor(const Req& r) {
  auto it = listeners_.find({r.port_space, r.dst.port});
  if (it == listeners_.end()) return nullptr;
  CmId* wildcard = nullptr;
  for (CmId* l : it->second) {
    if (IsAnyIp(l->src)) {
      if (l->src.family == 6 ? !(l->afonly && r.dst.family == 4) : r.dst.family == 4) {
        wildcard = l;
      }
    } else if (SameIp(l->src, r.dst) || (IsLoopbackIp(l->src) && IsLoopbackIp(r.dst))) {
      return l;
    }
  }
  return wildcard;
}

void Cm::OnReq(Peer* p, const Message& m) {
  const Req& r = m.req;
  CmId* listen = FindListenerFor(r);
  if (!listen) {
    Send(p, EncodeRej(0, m.sender_id, Rej{kRejNoListener, {}}));
    return;
  }
  if (listen->pending >= listen->backlog) {
    Send(p, EncodeRej(0, m.sender_id, Rej{kRejBacklogFull, {}}));
    return;
  }
  auto* child = new CmId;
  std::memset(&child->pub, 0, sizeof child->pub);
  if (listen->sync) {
    // A synchronous listener's new ids are synchronous too (rdma_get_request), each with its own
    // channel; the request itself is reported on the listener's.
    EventChannel* c = CreateChannel();
    if (!c) {
      delete child;
      Send(p, EncodeRej(0, m.sender_id, Rej{kRejBacklogFull, {}}));
      return;
    }
    child->pub.channel = &c->pub;
    child->sync = true;
    child->owns_channel = true;
  } else {
    child->pub.channel = listen->pub.channel;
  }
  child->pub.context = listen->pub.context;
  child->pub.ps = listen->pub.ps;
  // In RDMA_PS_IB the request says what the connection is; an XRC initiator reaches a target.
  child->pub.qp_type = listen->pub.ps != RDMA_PS_IB    ? listen->pub.qp_type
                       : r.qp_type == IBV_QPT_XRC_SEND ? IBV_QPT_XRC_RECV
                                                       : static_cast<ibv_qp_type>(r.qp_type);
  child->qkey = listen->qkey;
  child->pub.pd = listen->pub.pd;
  child->tos = listen->tos;
  child->ack_timeout = listen->ack_timeout;
  child->ack_timeout_set = listen->ack_timeout_set;
  child->comm_id = ++next_comm_id_;
  if (child->comm_id == 0) child->comm_id = ++next_comm_id_;
  ids_[child->comm_id] = child;
  child->peer = p;
  p->ids.insert(child);
  child->src = r.dst;
  child->dst = r.src;
  child->has_src = child->has_dst = true;
  LearnPeer(child, m.sender_id, r.end);
  // Unless the accept says otherwise, this side offers what the request asked for.
  child->responder_resources = child->remote_responder_resources;
  child->initiator_depth = child->remote_initiator_depth;
  // Chosen now, not at the accept: an application that made its own QP brings it to RTS with
  // rdma_init_qp_attr before rdma_accept (rping -q), and the REP must carry the PSN it started.
  child->psn = RandomPsn();
  child->retry_count = r.retry_count;
  child->listener = listen;
  listen->children.insert(child);
  ++listen->pending;
  AttachDevice(child);
  child->state = IdState::kRequestReceived;
  FillRoute(child);
  child->pub.route.path_rec = &child->path;
  child->pub.route.num_paths = 1;

  CmEvent* e = nullptr;
  Report(child, RDMA_CM_EVENT_CONNECT_REQUEST, 0, &r.end.private_data, listen, &e);
  if (IsUd(child)) {
    e->pub.param.ud.qp_num = r.end.qpn;
    e->pub.param.ud.qkey = r.end.qkey;
  } else {
    FillConnParam(&e->pub.param.conn, child, r.end);
    e->pub.param.conn.retry_count = r.retry_count;
  }
  QueueEvent(e);
}

int Cm::Accept(CmId* id, const rdma_conn_param* param) {
  std::unique_lock<std::mutex> lk(mu);
  if (id->state != IdState::kRequestReceived) return EINVAL;
  if (param && param->private_data_len &&
      (!param->private_data || param->private_data_len > MaxAcceptData(id))) {
    return EINVAL;
  }
  const ibv_device_attr& dev = device_attr_;
  if (!IsUd(id)) {
    if (id->pub.ps == RDMA_PS_TCP && !id->pub.qp && !param) return EINVAL;
    if (param && param->responder_resources != RDMA_MAX_RESP_RES &&
        param->responder_resources > dev.max_qp_rd_atom) {
      return EINVAL;
    }
    if (param && param->initiator_depth != RDMA_MAX_INIT_DEPTH &&
        (param->initiator_depth > dev.max_qp_init_rd_atom ||
         param->initiator_depth > id->remote_initiator_depth)) {
      return EINVAL;
    }
  }
  // Unset values (NULL or the RDMA_MAX_* markers) take the request's, adjusted to the device.
  id->responder_resources =
      static_cast<uint8_t>(param && param->responder_resources != RDMA_MAX_RESP_RES
                               ? param->responder_resources
                               : std::min<int>(id->remote_responder_resources, dev.max_qp_rd_atom));
  id->initiator_depth = static_cast<uint8_t>(
      param && param->initiator_depth != RDMA_MAX_INIT_DEPTH
          ? param->initiator_depth
          : std::min<int>(id->remote_initiator_depth, dev.max_qp_init_rd_atom));
  if (!id->peer) {
    // The requester's process went away before the answer.
    id->state = IdState::kFailed;
    if (id->listener) --id->listener->pending;
    Report(id, RDMA_CM_EVENT_CONNECT_ERROR, -ECONNRESET, nullptr);
    return IsUd(id) ? ECONNRESET : CompleteSync(id, &lk);
  }
  if (!IsUd(id)) {
    if (int err = ModifyToRtrRts(id)) return err;
  }
  Rep rep;
  rep.end = LocalEnd(id, param, id->remote_ece.vendor_id);  // the requester's vendor, answered
  if (id->listener) --id->listener->pending;
  Send(id->peer, EncodeRep(id->comm_id, id->remote_comm_id, rep));
  if (IsUd(id)) {
    id->state = IdState::kConnected;
    return 0;
  }
  id->state = IdState::kAcceptSent;
  return CompleteSync(id, &lk);
}

int Cm::Reject(CmId* id, const void* data, uint8_t len, uint32_t reason) {
  std::lock_guard<std::mutex> g(mu);
  if (len && !data) return EINVAL;
  if (len > MaxAcceptData(id)) return EINVAL;
  if (id->state != IdState::kRequestReceived) return EINVAL;
  Rej rej{reason, {}};
  if (len)
    rej.private_data.assign(static_cast<const uint8_t*>(data),
                            static_cast<const uint8_t*>(data) + len);
  if (id->peer) Send(id->peer, EncodeRej(id->comm_id, id->remote_comm_id, rej));
  if (id->listener) --id->listener->pending;
  id->state = IdState::kFailed;
  DetachPeer(id);
  return 0;
}

int Cm::Establish(CmId* id) {
  std::lock_guard<std::mutex> g(mu);
  if (id->state != IdState::kConnectResponse || !id->peer) return EINVAL;
  Send(id->peer, EncodeBare(MsgType::kRtu, id->comm_id, id->remote_comm_id));
  id->state = IdState::kConnected;
  return 0;
}

int Cm::Notify(CmId* id, ibv_event_type ev) {
  std::lock_guard<std::mutex> g(mu);
  if (ev != IBV_EVENT_COMM_EST) return EINVAL;
  // Traffic arrived before the RTU: the connection is up (as ib_cm_notify does).
  if (id->state == IdState::kAcceptSent) OnRtu(id);
  return 0;
}

int Cm::Disconnect(CmId* id) {
  std::unique_lock<std::mutex> lk(mu);
  switch (id->state) {
    case IdState::kConnected:
    case IdState::kConnectResponse:
    case IdState::kAcceptSent:
      ModifyToError(id);
      if (!id->peer) {
        id->state = IdState::kDisconnected;
        ReportDisconnected(id);
        return CompleteSync(id, &lk);
      }
      Send(id->peer, EncodeBare(MsgType::kDreq, id->comm_id, id->remote_comm_id));
      id->state = IdState::kDisconnectSent;
      Arm(id, TimerKind::kDisconnect, kDreqTimeoutMs, 0);
      return CompleteSync(id, &lk);
    case IdState::kDisconnectSent:
      return CompleteSync(id, &lk);
    case IdState::kDisconnected:
      ModifyToError(id);
      // A synchronous id still holding the peer's DISCONNECTED takes it; otherwise done.
      if (id->sync && ToChannel(id->pub.channel)->queue.size() > 0) return CompleteSync(id, &lk);
      return 0;
    case IdState::kRequestReceived:
      if (id->peer)
        Send(id->peer, EncodeRej(id->comm_id, id->remote_comm_id, Rej{kRejConsumer, {}}));
      if (id->listener) --id->listener->pending;
      id->state = IdState::kFailed;
      DetachPeer(id);
      return 0;
    case IdState::kConnecting:
      ModifyToError(id);
      return 0;
    case IdState::kFailed:
      ModifyToError(id);
      return 0;
    default:
      return EINVAL;
  }
}

int Cm::MigrateId(CmId* id, EventChannel* to) {
  std::unique_lock<std::mutex> lk(mu);
  if (id->sync && !to) return EINVAL;
  bool sync = false;
  if (!to) {
    to = CreateChannel();
    if (!to) return errno;
    sync = true;
  }
  EventChannel* from = ToChannel(id->pub.channel);
  std::vector<CmEvent*> moving;
  EraseEventsOf(from, id, &moving);
  for (CmEvent* e : moving) {
    // A request not read yet takes its new id along: rdma-core makes that id on the listener's
    // channel when the request is read, so its later events come where the request did.
    CmId* child = ToId(e->pub.id);
    if (e->pub.listen_id == &id->pub && child != id && !child->owns_channel) {
      child->pub.channel = &to->pub;
    }
    to->queue.Push(e);
  }
  EventChannel* drop = nullptr;
  if (id->owns_channel) {
    if (id->pub.event) {
      delete reinterpret_cast<CmEvent*>(id->pub.event);
      id->pub.event = nullptr;
    }
    drop = from;
  }
  id->pub.channel = &to->pub;
  id->sync = sync;
  id->owns_channel = sync;
  lk.unlock();
  if (drop) DestroyChannel(drop);
  return 0;
}

int Cm::SetOption(CmId* id, int level, int name, const void* val, size_t len) {
  std::lock_guard<std::mutex> g(mu);
  if (!val) return EINVAL;
  if (level == RDMA_OPTION_ID) {
    switch (name) {
      case RDMA_OPTION_ID_TOS:
        if (len != sizeof(uint8_t)) return EINVAL;
        id->tos = *static_cast<const uint8_t*>(val);
        FillRoute(id);
        return 0;
      case RDMA_OPTION_ID_REUSEADDR:
        if (len != sizeof(int)) return EINVAL;
        if (id->state != IdState::kIdle) return EINVAL;
        id->reuse_addr = *static_cast<const int*>(val) != 0;
        return 0;
      case RDMA_OPTION_ID_AFONLY:
        if (len != sizeof(int)) return EINVAL;
        if (id->state != IdState::kIdle) return EINVAL;
        id->afonly = *static_cast<const int*>(val) != 0;
        return 0;
      case RDMA_OPTION_ID_ACK_TIMEOUT:
        if (len != sizeof(uint8_t)) return EINVAL;
        id->ack_timeout = std::min<uint8_t>(*static_cast<const uint8_t*>(val), 31);
        id->ack_timeout_set = true;
        return 0;
      default:
        return ENOSYS;
    }
  }
  if (level == RDMA_OPTION_IB && name == RDMA_OPTION_IB_PATH) {
    // Path records given by the application (rdma_create_ep with ai_route): the route is ours
    // to decide in software, so they are checked and then stand in for rdma_resolve_route.
    if (len == 0 || len % sizeof(ibv_path_data) != 0) return EINVAL;
    if (id->state != IdState::kAddrResolved) return EINVAL;
    id->state = IdState::kRouteResolved;
    FillRoute(id);
    Report(id, RDMA_CM_EVENT_ROUTE_RESOLVED, 0, nullptr);
    return 0;
  }
  return ENOSYS;
}

int Cm::GetEvent(EventChannel* c, rdma_cm_event** out) {
  if (!out) return EINVAL;
  CmEvent* e = nullptr;
  // Counted while the queue is locked: DestroyId purges the queue before it reads the count, so
  // an event is either purged or counted, never handed out with its id freed.
  int err = c->queue.Pop(&e, [](CmEvent* taken) {
    rdma_cm_id* owner = taken->pub.listen_id ? taken->pub.listen_id : taken->pub.id;
    taken->counted_on = ToId(owner);
    taken->counted_on->events_reported.fetch_add(1);
  });
  if (err) return err;
  *out = &e->pub;
  return 0;
}

int Cm::AckEvent(rdma_cm_event* e) {
  if (!e) return EINVAL;
  auto* ev = reinterpret_cast<CmEvent*>(e);
  if (ev->counted_on) {
    std::lock_guard<std::mutex> g(mu);
    ++ev->counted_on->events_acked;
    acked_.notify_all();
  }
  delete ev;
  return 0;
}

int Cm::SetLocalEce(CmId* id, const ibv_ece* ece) {
  std::lock_guard<std::mutex> g(mu);
  if (id->pub.qp || !ece || !ece->vendor_id || ece->comp_mask) return EINVAL;
  id->local_ece.vendor_id = ece->vendor_id;
  id->local_ece.options = ece->options;
  return 0;
}

int Cm::GetRemoteEce(CmId* id, ibv_ece* ece) {
  std::lock_guard<std::mutex> g(mu);
  if (id->pub.qp || !ece) return EINVAL;
  ece->vendor_id = id->remote_ece.vendor_id;
  ece->options = id->remote_ece.options;
  ece->comp_mask = 0;
  return 0;
}

// ---- messages from the peer (service thread, under mu) ----

void Cm::OnMessage(Peer* p, const Message& m) {
  if (m.type == MsgType::kReq) {
    OnReq(p, m);
    return;
  }
  auto it = ids_.find(m.receiver_id);
  if (it == ids_.end() && m.type == MsgType::kRej && m.receiver_id == 0) {
    // A REJ from a requester that never learnt our id (its REQ timed out, or its id was
    // destroyed, before our REP): it names its request by its own id.
    for (CmId* c : p->ids) {
      if (c->remote_comm_id == m.sender_id) it = ids_.find(c->comm_id);
    }
  }
  // Messages for ids that are gone, or that do not belong to this channel's connection, are
  // stale (the id was destroyed) and dropped.
  if (it == ids_.end() || it->second->peer != p ||
      (it->second->remote_comm_id != 0 && it->second->remote_comm_id != m.sender_id)) {
    if (m.type == MsgType::kDreq) Send(p, EncodeBare(MsgType::kDrep, 0, m.sender_id));
    return;
  }
  CmId* id = it->second;
  switch (m.type) {
    case MsgType::kRep:
      OnRep(id, m);
      break;
    case MsgType::kRtu:
      OnRtu(id);
      break;
    case MsgType::kRej:
      OnRej(id, m);
      break;
    case MsgType::kDreq:
      OnDreq(id);
      break;
    case MsgType::kDrep:
      OnDrep(id);
      break;
    default:
      break;
  }
}

void Cm::OnRep(CmId* id, const Message& m) {
  if (id->state != IdState::kConnecting) return;
  Disarm(id);
  const ConnEnd& r = m.rep.end;
  LearnPeer(id, m.sender_id, r);
  // What we may have outstanding is bounded by what the peer will serve.
  id->initiator_depth = std::min(id->initiator_depth, r.responder_resources);
  FillRoute(id);
  CmEvent* e = nullptr;
  if (IsUd(id)) {
    if (m.rep.status != 0) {
      id->state = IdState::kFailed;
      Report(id, RDMA_CM_EVENT_UNREACHABLE, static_cast<int>(m.rep.status), &r.private_data);
      return;
    }
    id->state = IdState::kConnected;
    Report(id, RDMA_CM_EVENT_ESTABLISHED, 0, &r.private_data, nullptr, &e);
    rdma_ud_param& u = e->pub.param.ud;
    u.qp_num = r.qpn;
    u.qkey = r.qkey;
    u.ah_attr.is_global = 1;
    std::memcpy(&u.ah_attr.grh.dgid, r.gid, 16);
    u.ah_attr.grh.hop_limit = 64;
    u.ah_attr.grh.traffic_class = id->tos;
    u.ah_attr.dlid = r.lid;
    u.ah_attr.port_num = 1;
    QueueEvent(e);
    return;
  }
  if (!id->pub.qp) {
    id->state = IdState::kConnectResponse;
    Report(id, RDMA_CM_EVENT_CONNECT_RESPONSE, 0, &r.private_data, nullptr, &e);
    FillConnParam(&e->pub.param.conn, id, r);
    QueueEvent(e);
    return;
  }
  if (ModifyToRtrRts(id) != 0) {
    Send(id->peer, EncodeRej(id->comm_id, id->remote_comm_id, Rej{kRejConsumer, {}}));
    id->state = IdState::kFailed;
    ModifyToError(id);
    Report(id, RDMA_CM_EVENT_CONNECT_ERROR, -EINVAL, nullptr);
    return;
  }
  Send(id->peer, EncodeBare(MsgType::kRtu, id->comm_id, id->remote_comm_id));
  id->state = IdState::kConnected;
  Report(id, RDMA_CM_EVENT_ESTABLISHED, 0, &r.private_data, nullptr, &e);
  FillConnParam(&e->pub.param.conn, id, r);
  QueueEvent(e);
}

void Cm::OnRtu(CmId* id) {
  if (id->state != IdState::kAcceptSent) return;
  id->state = IdState::kConnected;
  Report(id, RDMA_CM_EVENT_ESTABLISHED, 0, nullptr);
}

void Cm::OnRej(CmId* id, const Message& m) {
  if (id->state == IdState::kRequestReceived) {
    // The requester gave up before we answered: the request is rejected (as IB CM reports a REJ
    // in REQ_RCVD), no longer counts against the backlog, and can no longer be accepted.
    if (id->listener) --id->listener->pending;
    id->state = IdState::kFailed;
    DetachPeer(id);
    Report(id, RDMA_CM_EVENT_REJECTED, static_cast<int>(m.rej.reason), &m.rej.private_data);
    return;
  }
  if (id->state != IdState::kConnecting && id->state != IdState::kAcceptSent) return;
  Disarm(id);
  if (m.rej.reason == kRejNoListener && id->state == IdState::kConnecting && id->sent_req &&
      NowNs() < id->listener_deadline_ns) {
    // The process we reached has no listener there yet, as when SendRequest finds none: asked
    // again every few ms for the rest of kListenerGraceMs. perftest -R's client connects for its
    // data while the server moves from its handshake listener to the next (rdmacm_tools_hosts:
    // UNREACHABLE in about 1 run of 3).
    DetachPeer(id);
    id->pending_req = std::move(id->sent_req);
    Arm(id, TimerKind::kListenerWait, kListenerPollMs, 0);
    return;
  }
  id->state = IdState::kFailed;
  ModifyToError(id);
  DetachPeer(id);
  if (m.rej.reason == kRejNoListener) {
    Report(id, RDMA_CM_EVENT_UNREACHABLE, -ECONNREFUSED, nullptr);
  } else {
    Report(id, RDMA_CM_EVENT_REJECTED, static_cast<int>(m.rej.reason), &m.rej.private_data);
  }
}

void Cm::OnDreq(CmId* id) {
  if (id->peer) Send(id->peer, EncodeBare(MsgType::kDrep, id->comm_id, id->remote_comm_id));
  switch (id->state) {
    case IdState::kConnected:
    case IdState::kConnectResponse:
    case IdState::kAcceptSent:
    case IdState::kDisconnectSent:
      Disarm(id);
      id->state = IdState::kDisconnected;
      DetachPeer(id);
      ReportDisconnected(id);
      break;
    default:
      break;
  }
}

void Cm::OnDrep(CmId* id) {
  if (id->state != IdState::kDisconnectSent) return;
  Disarm(id);
  id->state = IdState::kDisconnected;
  DetachPeer(id);
  ReportDisconnected(id);
}

void Cm::OnPeerLost(Peer* p) {
  std::set<CmId*> ids;
  ids.swap(p->ids);
  for (CmId* id : ids) {
    id->peer = nullptr;
    switch (id->state) {
      case IdState::kConnecting:
        Disarm(id);
        id->state = IdState::kFailed;
        ModifyToError(id);
        Report(id, RDMA_CM_EVENT_UNREACHABLE, -ECONNRESET, nullptr);
        break;
      case IdState::kAcceptSent:
        id->state = IdState::kFailed;
        ModifyToError(id);
        Report(id, RDMA_CM_EVENT_CONNECT_ERROR, -ECONNRESET, nullptr);
        break;
      case IdState::kConnected:
      case IdState::kConnectResponse:
      case IdState::kDisconnectSent:
        Disarm(id);
        id->state = IdState::kDisconnected;
        ReportDisconnected(id);
        break;
      default:
        break;  // a request not yet answered fails when it is (Accept)
    }
  }
}

// DISCONNECTED, then (asynchronous ids) TIMEWAIT_EXIT once the connection's time-wait is over,
// as the IB CM reports it. Synchronous ids get no time-wait event: no call of theirs waits for it.
void Cm::ReportDisconnected(CmId* id) {
  id->state = IdState::kDisconnected;
  Report(id, RDMA_CM_EVENT_DISCONNECTED, 0, nullptr);
  if (!id->sync) Arm(id, TimerKind::kTimewait, kTimewaitMs, 0);
}

void Cm::OnTimer(CmId* id) {
  TimerKind kind = id->timer;
  int status = id->timer_status;
  Disarm(id);
  switch (kind) {
    case TimerKind::kAddrError:
      CancelProbe(id);
      Report(id, RDMA_CM_EVENT_ADDR_ERROR, status, nullptr);
      break;
    case TimerKind::kConnect:
      if (id->state != IdState::kConnecting) break;
      if (id->peer) {
        Send(id->peer, EncodeRej(id->comm_id, id->remote_comm_id, Rej{kRejConsumer, {}}));
      }
      DetachPeer(id);
      id->state = IdState::kFailed;
      ModifyToError(id);
      Report(id, RDMA_CM_EVENT_UNREACHABLE, status, nullptr);
      break;
    case TimerKind::kListenerWait:
      if (id->state == IdState::kConnecting && id->pending_req) SendRequest(id, nullptr);
      break;
    case TimerKind::kDisconnect:
      if (id->state != IdState::kDisconnectSent) break;
      id->state = IdState::kDisconnected;
      DetachPeer(id);
      ReportDisconnected(id);
      break;
    case TimerKind::kTimewait:
      Report(id, RDMA_CM_EVENT_TIMEWAIT_EXIT, 0, nullptr);
      break;
    case TimerKind::kNone:
      break;
  }
}

}  // namespace softrdma::cm
