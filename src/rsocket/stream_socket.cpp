#include "rsocket/stream_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "rsocket/fd_table.h"
#include "rsocket/util.h"

namespace softrdma::rsocket {
namespace {

constexpr uint32_t kMagic = 0x52534f43;  // "RSOC"
constexpr uint32_t kVersion = 1;
constexpr uint32_t kMaxChunk = 64 * 1024;
// Receive WRs of the peer kept for control messages: data never takes the last ones.
constexpr int64_t kCtrlReserve = 4;
constexpr int kCmTimeoutMs = 2000;
constexpr int kWaitSliceMs = 100;

// Immediate data: 4 bits of kind, 28 bits of value.
enum ImmKind : uint32_t { kImmData = 1, kImmCtrl = 2, kImmFin = 3 };
uint32_t Imm(ImmKind k, uint32_t v) {
  return (static_cast<uint32_t>(k) << 28) | (v & 0x0fffffff);
}

enum CtrlOp : uint32_t { kCtrlCredit = 1, kCtrlIoMap = 2, kCtrlIoUnmap = 3 };

// Work request ids: 8 bits of kind, 56 bits of value (the send ring position after the WR).
enum WrKind : uint64_t { kWrData = 1, kWrCtrl = 2, kWrRecv = 3 };
uint64_t WrId(WrKind k, uint64_t v) {
  return (static_cast<uint64_t>(k) << 56) | (v & ((1ull << 56) - 1));
}
WrKind KindOf(uint64_t wr_id) {
  return static_cast<WrKind>(wr_id >> 56);
}
uint64_t ValueOf(uint64_t wr_id) {
  return wr_id & ((1ull << 56) - 1);
}

// The local ACK timeout exponent: 4.096 us << 17 = 537 ms, so the 7 retries tolerate ~3.7 s of a
// peer that does not get the CPU (the CM default, 67 ms, gives up after 0.5 s on a loaded
// machine), while a frame that does need retransmitting stalls the stream for half a second only.
constexpr uint8_t kAckTimeout = 17;

void SetAckTimeout(rdma_cm_id* id) {
  uint8_t t = kAckTimeout;
  rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &t, sizeof t);
}

uint8_t* AllocBuffer(size_t len) {
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
}

// As librdmacm's own rsockets: a rejection is a refusal; another event that carries an errno
// (UNREACHABLE carries ECONNREFUSED where nothing listens on the port) gives it.
int CmErrno(const rdma_cm_event* e) {
  if (e->event != RDMA_CM_EVENT_REJECTED && e->status < 0) return -e->status;
  switch (e->event) {
    case RDMA_CM_EVENT_REJECTED:
    case RDMA_CM_EVENT_CONNECT_ERROR:
    case RDMA_CM_EVENT_ADDR_ERROR:
      return ECONNREFUSED;
    case RDMA_CM_EVENT_ROUTE_ERROR:
      return EHOSTUNREACH;
    case RDMA_CM_EVENT_UNREACHABLE:
      return ETIMEDOUT;
    default:
      return ECONNRESET;
  }
}

bool ParseConnInfo(const void* data, uint8_t len, ConnInfo* out) {
  if (!data || len < sizeof(ConnInfo)) return false;
  std::memcpy(out, data, sizeof(ConnInfo));
  return out->magic == kMagic && out->version == kVersion && out->rbuf_size >= 4096 &&
         out->nslots > 0 && out->rq_depth > static_cast<uint32_t>(kCtrlReserve);
}

}  // namespace

StreamSocket::StreamSocket(int family) : Socket(family, SOCK_STREAM) {}

StreamSocket::~StreamSocket() = default;

int StreamSocket::Init() {
  if (fd_ < 0) return -EMFILE;
  channel_ = rdma_create_event_channel();
  if (!channel_) return -errno;
  SetNonBlocking(channel_->fd);
  if (rdma_create_id(channel_, &id_, this, RDMA_PS_TCP)) {
    int e = errno;
    rdma_destroy_event_channel(channel_);
    channel_ = nullptr;
    return -e;
  }
  return 0;
}

// ---- connection setup ----

int StreamSocket::Bind(const sockaddr* addr, socklen_t len) {
  std::lock_guard<std::mutex> g(mu_);
  if (!addr) return -EFAULT;
  if (len < sizeof(sockaddr_in)) return -EINVAL;
  if (addr->sa_family != AF_INET && addr->sa_family != AF_INET6) return -EAFNOSUPPORT;
  if (addr->sa_family == AF_INET6 && len < sizeof(sockaddr_in6)) return -EINVAL;
  if (state_ != State::kIdle) return -EINVAL;
  ApplyBindOptionsLocked(id_);
  if (rdma_bind_addr(id_, const_cast<sockaddr*>(addr))) return -errno;
  state_ = State::kBound;
  return 0;
}

int StreamSocket::Listen(int backlog) {
  std::lock_guard<std::mutex> g(mu_);
  if (state_ == State::kListening) return 0;
  if (state_ == State::kIdle) {
    sockaddr_storage any{};
    any.ss_family = static_cast<sa_family_t>(family_);
    ApplyBindOptionsLocked(id_);
    if (rdma_bind_addr(id_, reinterpret_cast<sockaddr*>(&any))) return -errno;
    state_ = State::kBound;
  }
  if (state_ != State::kBound) return -EINVAL;
  if (rdma_listen(id_, backlog > 0 ? backlog : 1)) return -errno;
  state_ = State::kListening;
  return 0;
}

int StreamSocket::Accept(sockaddr* addr, socklen_t* len) {
  std::unique_lock<std::mutex> lk(mu_);
  if (state_ != State::kListening) return -EINVAL;
  if (addr && !len) return -EFAULT;
  for (;;) {
    Progress();
    if (!requests_.empty()) break;
    if (NonBlocking(0)) return WouldBlock();
    Wait(lk, kWaitSliceMs);
    if (state_ != State::kListening) return -EINVAL;
  }
  Request req = requests_.front();
  requests_.pop_front();
  auto child = std::make_shared<StreamSocket>(family_);
  child->opts_ = opts_;
  int r = req.valid ? child->AdoptRequest(req) : -ECONNABORTED;
  if (r < 0) {
    if (!child->id_) {
      rdma_reject(req.id, nullptr, 0);
      rdma_destroy_id(req.id);
    }
    child->Close();
    return r == -ECONNABORTED ? r : -ECONNABORTED;
  }
  AddSocket(child);
  if (addr) {
    sockaddr* peer = rdma_get_peer_addr(child->id_);
    CopyAddrOut(peer, AddrLen(peer), addr, len);
  }
  return child->fd();
}

int StreamSocket::AdoptRequest(const Request& req) {
  std::lock_guard<std::mutex> g(mu_);
  if (fd_ < 0) return -EMFILE;
  channel_ = rdma_create_event_channel();
  if (!channel_) return -errno;
  SetNonBlocking(channel_->fd);
  if (rdma_migrate_id(req.id, channel_)) return -errno;
  id_ = req.id;
  id_->context = this;
  peer_ = req.peer;
  if (int r = SetupVerbs()) {
    rdma_reject(id_, nullptr, 0);
    return r;
  }
  ConnInfo mine = MyConnInfo();
  rdma_conn_param p = ConnParam(&mine);
  SetAckTimeout(id_);
  if (rdma_accept(id_, &p)) return -errno;
  state_ = State::kConnected;
  return 0;
}

int StreamSocket::Connect(const sockaddr* addr, socklen_t len) {
  std::unique_lock<std::mutex> lk(mu_);
  if (!addr) return -EFAULT;
  if (len < sizeof(sockaddr_in)) return -EINVAL;
  if (addr->sa_family != AF_INET && addr->sa_family != AF_INET6) return -EAFNOSUPPORT;
  if (addr->sa_family == AF_INET6 && len < sizeof(sockaddr_in6)) return -EINVAL;
  switch (state_) {
    case State::kConnected:
      return -EISCONN;
    case State::kResolvingAddr:
    case State::kResolvingRoute:
    case State::kConnecting:
      return -EALREADY;
    case State::kListening:
      return -EISCONN;
    case State::kFailed:
    case State::kClosed:
      return -EBADF;
    default:
      break;
  }
  if (rdma_resolve_addr(id_, nullptr, const_cast<sockaddr*>(addr), kCmTimeoutMs)) return -errno;
  state_ = State::kResolvingAddr;
  for (;;) {
    Progress();
    if (state_ == State::kConnected) return 0;
    if (state_ == State::kFailed) return -TakeError();
    if (NonBlocking(0)) return -EINPROGRESS;
    Wait(lk, kWaitSliceMs);
  }
}

// What each side tells the other in the CM private data: where its receive ring is.
ConnInfo StreamSocket::MyConnInfo() const {
  return ConnInfo{kMagic,
                  kVersion,
                  reinterpret_cast<uint64_t>(rbuf_),
                  reinterpret_cast<uint64_t>(rbuf_ + rbuf_size_),
                  rmr_->rkey,
                  rbuf_size_,
                  nslots_,
                  rq_depth_};
}

// The same connection parameters on both sides; `mine` must outlive the connect/accept call.
rdma_conn_param StreamSocket::ConnParam(const ConnInfo* mine) {
  rdma_conn_param p{};
  p.private_data = mine;
  p.private_data_len = sizeof *mine;
  p.responder_resources = 1;
  p.initiator_depth = 1;
  p.retry_count = 7;
  p.rnr_retry_count = 7;
  return p;
}

int StreamSocket::SetupVerbs() {
  ibv_context* ctx = id_->verbs;
  if (!ctx) return -ENODEV;
  pd_ = ibv_alloc_pd(ctx);
  if (!pd_) return -ENOMEM;
  sq_depth_ = opts_.sq_size;
  rq_depth_ = opts_.rq_size;
  if (int r = cq_.Create(ctx, static_cast<int>(sq_depth_ + rq_depth_ + 8), this)) return r;
  rbuf_size_ = opts_.rcvbuf;
  nslots_ = rq_depth_;
  size_t rlen = rbuf_size_ + static_cast<size_t>(nslots_) * sizeof(CtrlMsg);
  rbuf_ = AllocBuffer(rlen);
  if (!rbuf_) return -ENOMEM;
  rmr_ = ibv_reg_mr(pd_, rbuf_, rlen, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!rmr_) return -errno;
  sbuf_size_ = opts_.sndbuf;
  sbuf_ = AllocBuffer(sbuf_size_);
  if (!sbuf_) return -ENOMEM;
  smr_ = ibv_reg_mr(pd_, sbuf_, sbuf_size_, int{IBV_ACCESS_LOCAL_WRITE});
  if (!smr_) return -errno;
  ibv_qp_init_attr attr{};
  attr.send_cq = cq_.cq();
  attr.recv_cq = cq_.cq();
  attr.qp_type = IBV_QPT_RC;
  attr.sq_sig_all = 1;
  attr.cap.max_send_wr = sq_depth_;
  attr.cap.max_recv_wr = rq_depth_;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  attr.cap.max_inline_data = std::max<uint32_t>(opts_.inline_size, sizeof(CtrlMsg));
  if (rdma_create_qp(id_, pd_, &attr)) return -errno;
  qp_ = id_->qp;
  max_inline_ = std::min<uint32_t>(opts_.inline_size, attr.cap.max_inline_data);
  for (uint32_t i = 0; i < rq_depth_; ++i) {
    ibv_recv_wr wr{};
    ibv_recv_wr* bad = nullptr;
    wr.wr_id = WrId(kWrRecv, 0);
    if (ibv_post_recv(qp_, &wr, &bad)) return -ENOMEM;
  }
  return 0;
}

void StreamSocket::TeardownVerbs() {
  if (qp_) rdma_destroy_qp(id_);
  qp_ = nullptr;
  cq_.Destroy();
  for (IoMapping& m : local_maps_) ibv_dereg_mr(m.mr);
  local_maps_.clear();
  if (rmr_) ibv_dereg_mr(rmr_);
  rmr_ = nullptr;
  if (smr_) ibv_dereg_mr(smr_);
  smr_ = nullptr;
  if (rbuf_) munmap(rbuf_, rbuf_size_ + static_cast<size_t>(nslots_) * sizeof(CtrlMsg));
  rbuf_ = nullptr;
  if (sbuf_) munmap(sbuf_, sbuf_size_);
  sbuf_ = nullptr;
  if (pd_) ibv_dealloc_pd(pd_);
  pd_ = nullptr;
}

void StreamSocket::Fail(int err) {
  state_ = State::kFailed;
  so_error_ = err;
  err_ = err;
}

// ---- progress ----

void StreamSocket::Progress() {
  // A connected socket looks at its CM channel (disconnection) at most every millisecond: a
  // program spinning on a non-blocking call should not pay a system call per turn for it.
  auto now = std::chrono::steady_clock::now();
  if (state_ != State::kConnected || now - last_cm_check_ >= std::chrono::milliseconds(1)) {
    last_cm_check_ = now;
    DrainCm();
  }
  DrainCq();
  if (state_ == State::kConnected) {
    FlushCtrl();
    MaybeSendCredit();
  }
}

void StreamSocket::DrainCm() {
  if (!channel_) return;
  rdma_cm_event* e = nullptr;
  while (rdma_get_cm_event(channel_, &e) == 0) {
    ++events_seen_;
    HandleCmEvent(e);
  }
}

void StreamSocket::HandleCmEvent(rdma_cm_event* e) {
  switch (e->event) {
    case RDMA_CM_EVENT_CONNECT_REQUEST: {
      Request r{e->id, {}, false};
      r.valid = ParseConnInfo(e->param.conn.private_data, e->param.conn.private_data_len, &r.peer);
      rdma_ack_cm_event(e);
      if (state_ == State::kListening) {
        requests_.push_back(r);
      } else {
        rdma_reject(r.id, nullptr, 0);
        rdma_destroy_id(r.id);
      }
      return;
    }
    case RDMA_CM_EVENT_ADDR_RESOLVED:
      rdma_ack_cm_event(e);
      if (state_ != State::kResolvingAddr) return;
      if (rdma_resolve_route(id_, kCmTimeoutMs)) {
        Fail(errno ? errno : EHOSTUNREACH);
        return;
      }
      state_ = State::kResolvingRoute;
      return;
    case RDMA_CM_EVENT_ROUTE_RESOLVED: {
      rdma_ack_cm_event(e);
      if (state_ != State::kResolvingRoute) return;
      if (int r = SetupVerbs()) {
        Fail(-r);
        return;
      }
      ConnInfo mine = MyConnInfo();
      rdma_conn_param p = ConnParam(&mine);
      SetAckTimeout(id_);
      if (rdma_connect(id_, &p)) {
        Fail(errno ? errno : ECONNREFUSED);
        return;
      }
      state_ = State::kConnecting;
      return;
    }
    case RDMA_CM_EVENT_ESTABLISHED: {
      if (state_ == State::kConnecting) {
        if (ParseConnInfo(e->param.conn.private_data, e->param.conn.private_data_len, &peer_)) {
          state_ = State::kConnected;
        } else {
          Fail(ECONNREFUSED);
        }
      }
      rdma_ack_cm_event(e);
      return;
    }
    case RDMA_CM_EVENT_DISCONNECTED:
      rdma_ack_cm_event(e);
      peer_gone_ = true;
      if (state_ == State::kConnecting) Fail(ECONNRESET);
      return;
    case RDMA_CM_EVENT_ADDR_ERROR:
    case RDMA_CM_EVENT_ROUTE_ERROR:
    case RDMA_CM_EVENT_CONNECT_ERROR:
    case RDMA_CM_EVENT_UNREACHABLE:
    case RDMA_CM_EVENT_REJECTED: {
      int err = CmErrno(e);
      rdma_ack_cm_event(e);
      if (state_ == State::kResolvingAddr || state_ == State::kResolvingRoute ||
          state_ == State::kConnecting) {
        Fail(err);
      }
      return;
    }
    default:
      rdma_ack_cm_event(e);
      return;
  }
}

void StreamSocket::DrainCq() {
  events_seen_ +=
      static_cast<uint64_t>(cq_.Drain([this](const ibv_wc& wc) { HandleCompletion(wc); }));
}

void StreamSocket::HandleCompletion(const ibv_wc& wc) {
  WrKind kind = KindOf(wc.wr_id);
  if (kind == kWrRecv) {
    if (wc.status != IBV_WC_SUCCESS) {
      if (!peer_gone_ && !err_ && state_ == State::kConnected) err_ = ECONNRESET;
      return;
    }
    ibv_recv_wr wr{};
    ibv_recv_wr* bad = nullptr;
    wr.wr_id = WrId(kWrRecv, 0);
    if (ibv_post_recv(qp_, &wr, &bad) == 0) ++reposted_;
    if (!(wc.wc_flags & IBV_WC_WITH_IMM)) return;
    uint32_t imm = ntohl(wc.imm_data);
    uint32_t value = imm & 0x0fffffff;
    switch (imm >> 28) {
      case kImmData:
        rx_total_ += value;
        break;
      case kImmFin:
        fin_rx_ = true;
        break;
      case kImmCtrl: {
        if (value >= nslots_) break;
        CtrlMsg m;
        std::memcpy(&m, rbuf_ + rbuf_size_ + static_cast<size_t>(value) * sizeof(CtrlMsg),
                    sizeof m);
        if (m.op == kCtrlCredit) {
          peer_consumed_ = std::max(peer_consumed_, m.a);
          peer_reposted_ = std::max(peer_reposted_, m.b);
        } else if (m.op == kCtrlIoMap) {
          remote_maps_.push_back({static_cast<off_t>(m.a), m.b, m.c, m.rkey, nullptr});
        } else if (m.op == kCtrlIoUnmap) {
          std::erase_if(remote_maps_,
                        [&](const IoMapping& r) { return r.offset == static_cast<off_t>(m.a); });
        }
        break;
      }
      default:
        break;
    }
    return;
  }
  if (sq_out_) --sq_out_;
  if (kind == kWrData) sbuf_tail_ = std::max(sbuf_tail_, ValueOf(wc.wr_id));
  if (wc.status != IBV_WC_SUCCESS && !err_) err_ = peer_gone_ ? EPIPE : ECONNRESET;
}

int64_t StreamSocket::WrCredit() const {
  return static_cast<int64_t>(peer_.rq_depth + peer_reposted_) - static_cast<int64_t>(imm_sent_);
}

uint64_t StreamSocket::PeerRingFree() const {
  uint64_t used = tx_bytes_ - peer_consumed_;
  return used >= peer_.rbuf_size ? 0 : peer_.rbuf_size - used;
}

bool StreamSocket::CanSendCtrl() const {
  return qp_ && !err_ && !peer_gone_ && sq_out_ < sq_depth_ && WrCredit() > 0;
}

bool StreamSocket::CanSendData() const {
  return state_ == State::kConnected && !err_ && !peer_gone_ && !shut_wr_ && ctrl_queue_.empty() &&
         sq_out_ < sq_depth_ && WrCredit() > kCtrlReserve && PeerRingFree() > 0 &&
         sbuf_head_ - sbuf_tail_ < sbuf_size_;
}

int StreamSocket::PostWrite(ibv_wr_opcode op, uint64_t wr_id, const void* local, uint32_t len,
                            uint32_t lkey, bool inl, uint64_t raddr, uint32_t rkey, uint32_t imm) {
  ibv_sge sge{reinterpret_cast<uint64_t>(local), len, lkey};
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  wr.wr_id = wr_id;
  wr.opcode = op;
  wr.sg_list = len ? &sge : nullptr;
  wr.num_sge = len ? 1 : 0;
  wr.send_flags = IBV_SEND_SIGNALED | (inl ? IBV_SEND_INLINE : 0);
  wr.wr.rdma.remote_addr = raddr;
  wr.wr.rdma.rkey = rkey;
  if (op == IBV_WR_RDMA_WRITE_WITH_IMM) wr.imm_data = htonl(imm);
  int r = ibv_post_send(qp_, &wr, &bad);
  if (r) return -r;
  ++sq_out_;
  if (op == IBV_WR_RDMA_WRITE_WITH_IMM) ++imm_sent_;
  return 0;
}

int StreamSocket::SendCtrlNow(const CtrlMsg& m) {
  uint32_t slot = ctrl_seq_++ % peer_.nslots;
  return PostWrite(IBV_WR_RDMA_WRITE_WITH_IMM, WrId(kWrCtrl, 0), &m, sizeof m, 0, true,
                   peer_.slots_addr + static_cast<uint64_t>(slot) * sizeof(CtrlMsg), peer_.rkey,
                   Imm(kImmCtrl, slot));
}

void StreamSocket::FlushCtrl() {
  while (!ctrl_queue_.empty() && CanSendCtrl()) {
    if (SendCtrlNow(ctrl_queue_.front())) return;
    ctrl_queue_.pop_front();
  }
  if (shut_wr_ && !fin_sent_ && ctrl_queue_.empty() && CanSendCtrl()) {
    if (PostWrite(IBV_WR_RDMA_WRITE_WITH_IMM, WrId(kWrCtrl, 0), nullptr, 0, 0, false,
                  peer_.slots_addr, peer_.rkey, Imm(kImmFin, 0)) == 0) {
      fin_sent_ = true;
    }
  }
}

void StreamSocket::MaybeSendCredit() {
  uint64_t bytes_due = consumed_ - credited_bytes_;
  uint64_t wrs_due = reposted_ - credited_wrs_;
  if (bytes_due < rbuf_size_ / 2 && wrs_due < rq_depth_ / 2) return;
  if (!CanSendCtrl()) return;
  CtrlMsg m{kCtrlCredit, 0, consumed_, reposted_, 0};
  if (SendCtrlNow(m) == 0) {
    credited_bytes_ = consumed_;
    credited_wrs_ = reposted_;
  }
}

bool StreamSocket::ArmLocked(std::vector<pollfd>* fds) {
  cq_.Arm();
  uint64_t before = events_seen_;
  last_cm_check_ = {};  // look at the CM channel now
  Progress();
  if (events_seen_ != before) return false;
  cq_.AddPollFd(fds);
  if (channel_) fds->push_back({channel_->fd, POLLIN, 0});
  return true;
}

void StreamSocket::Wait(std::unique_lock<std::mutex>& lk, int timeout_ms) {
  std::vector<pollfd> fds;
  if (!ArmLocked(&fds)) return;
  lk.unlock();
  poll(fds.data(), fds.size(), timeout_ms);
  lk.lock();
}

// ---- data ----

int StreamSocket::ConnError() const {
  if (err_) return err_;
  if (peer_gone_) return EPIPE;
  return 0;
}

ssize_t StreamSocket::SendChunk(const iovec* iov, int iovcnt, size_t skip, size_t len, bool to_ring,
                                uint64_t raddr, uint32_t rkey) {
  if (sq_out_ >= sq_depth_) return 0;
  size_t n = std::min<size_t>(len, kMaxChunk);
  uint64_t roff = 0;
  if (to_ring) {
    if (!CanSendData()) return 0;
    roff = tx_bytes_ % peer_.rbuf_size;
    n = std::min<size_t>({n, PeerRingFree(), peer_.rbuf_size - roff});
    raddr = peer_.rbuf_addr + roff;
    rkey = peer_.rkey;
  }
  ibv_wr_opcode op = to_ring ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
  uint32_t imm = Imm(kImmData, static_cast<uint32_t>(n));
  int r;
  if (n <= max_inline_) {
    uint8_t tmp[1024];
    GatherFrom(iov, iovcnt, skip, tmp, n);
    r = PostWrite(op, WrId(kWrData, sbuf_head_), tmp, static_cast<uint32_t>(n), 0, true, raddr,
                  rkey, imm);
  } else {
    uint64_t used = sbuf_head_ - sbuf_tail_;
    uint64_t soff = sbuf_head_ % sbuf_size_;
    n = std::min<size_t>({n, sbuf_size_ - used, sbuf_size_ - soff});
    if (n == 0) return 0;
    imm = Imm(kImmData, static_cast<uint32_t>(n));
    GatherFrom(iov, iovcnt, skip, sbuf_ + soff, n);
    r = PostWrite(op, WrId(kWrData, sbuf_head_ + n), sbuf_ + soff, static_cast<uint32_t>(n),
                  smr_->lkey, false, raddr, rkey, imm);
    if (r == 0) sbuf_head_ += n;
  }
  if (r) return r;
  if (to_ring) tx_bytes_ += n;
  return static_cast<ssize_t>(n);
}

ssize_t StreamSocket::Send(const iovec* iov, int iovcnt, int flags, const sockaddr*, socklen_t) {
  std::unique_lock<std::mutex> lk(mu_);
  size_t total = IovTotal(iov, iovcnt);
  for (;;) {
    Progress();
    if (state_ == State::kConnected) break;
    if (state_ == State::kFailed) return -(err_ ? err_ : EPIPE);
    if (state_ != State::kResolvingAddr && state_ != State::kResolvingRoute &&
        state_ != State::kConnecting) {
      return -ENOTCONN;
    }
    if (NonBlocking(flags)) return WouldBlock();
    Wait(lk, kWaitSliceMs);
  }
  size_t sent = 0;
  for (;;) {
    if (shut_wr_) return sent ? static_cast<ssize_t>(sent) : -EPIPE;
    if (int e = ConnError()) return sent ? static_cast<ssize_t>(sent) : -e;
    if (sent == total) return static_cast<ssize_t>(sent);
    while (sent < total) {
      ssize_t n = SendChunk(iov, iovcnt, sent, total - sent, true, 0, 0);
      if (n < 0) return sent ? static_cast<ssize_t>(sent) : n;
      if (n == 0) break;
      sent += static_cast<size_t>(n);
    }
    if (sent == total) return static_cast<ssize_t>(sent);
    if (NonBlocking(flags)) return sent ? static_cast<ssize_t>(sent) : WouldBlock();
    Wait(lk, kWaitSliceMs);
    Progress();
  }
}

ssize_t StreamSocket::Recv(const iovec* iov, int iovcnt, int flags, sockaddr* from,
                           socklen_t* fromlen) {
  std::unique_lock<std::mutex> lk(mu_);
  size_t want = IovTotal(iov, iovcnt);
  size_t got = 0;
  for (;;) {
    Progress();
    if (state_ == State::kConnected) break;
    if (state_ == State::kFailed) return -(err_ ? err_ : ENOTCONN);
    if (state_ != State::kResolvingAddr && state_ != State::kResolvingRoute &&
        state_ != State::kConnecting) {
      return -ENOTCONN;
    }
    if (NonBlocking(flags)) return WouldBlock();
    Wait(lk, kWaitSliceMs);
  }
  if (from && fromlen) {
    sockaddr* peer = rdma_get_peer_addr(id_);
    CopyAddrOut(peer, AddrLen(peer), from, fromlen);
  }
  if (want == 0) return 0;
  for (;;) {
    if (shut_rd_) return static_cast<ssize_t>(got);
    uint64_t avail = rx_total_ - consumed_ - ((flags & MSG_PEEK) ? got : 0);
    if (avail) {
      size_t n = std::min<uint64_t>(avail, want - got);
      uint64_t start = consumed_ + ((flags & MSG_PEEK) ? got : 0);
      size_t pos = start % rbuf_size_;
      size_t first = std::min<size_t>(n, rbuf_size_ - pos);
      ScatterTo(iov, iovcnt, got, rbuf_ + pos, first);
      if (n > first) ScatterTo(iov, iovcnt, got + first, rbuf_, n - first);
      got += n;
      if (!(flags & MSG_PEEK)) {
        consumed_ += n;
        MaybeSendCredit();
      }
      if (got == want || !(flags & MSG_WAITALL) || (flags & MSG_PEEK)) {
        return static_cast<ssize_t>(got);
      }
      continue;
    }
    if (fin_rx_ || peer_gone_) return static_cast<ssize_t>(got);
    if (err_) return got ? static_cast<ssize_t>(got) : -err_;
    if (NonBlocking(flags)) return got ? static_cast<ssize_t>(got) : WouldBlock();
    Wait(lk, kWaitSliceMs);
    Progress();
  }
}

int StreamSocket::Shutdown(int how) {
  std::lock_guard<std::mutex> g(mu_);
  if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR) return -EINVAL;
  Progress();
  if (state_ != State::kConnected) return -ENOTCONN;
  if (how == SHUT_RD || how == SHUT_RDWR) shut_rd_ = true;
  if (how == SHUT_WR || how == SHUT_RDWR) {
    shut_wr_ = true;
    FlushCtrl();
  }
  return 0;
}

void StreamSocket::WaitSendsDone(std::unique_lock<std::mutex>& lk, int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    Progress();
    if ((fin_sent_ && sq_out_ == 0) || err_ || peer_gone_) break;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    Wait(lk, static_cast<int>(std::min<int64_t>(left.count(), kWaitSliceMs)));
  }
}

void StreamSocket::Close() {
  std::unique_lock<std::mutex> lk(mu_);
  if (state_ == State::kConnected) {
    shut_wr_ = true;
    int linger_ms = opts_.linger.l_onoff ? opts_.linger.l_linger * 1000 : 5000;
    WaitSendsDone(lk, linger_ms);
    if (!peer_gone_) rdma_disconnect(id_);
  }
  for (Request& r : requests_) {
    rdma_reject(r.id, nullptr, 0);
    rdma_destroy_id(r.id);
  }
  requests_.clear();
  TeardownVerbs();
  if (id_) rdma_destroy_id(id_);
  id_ = nullptr;
  if (channel_) rdma_destroy_event_channel(channel_);
  channel_ = nullptr;
  state_ = State::kClosed;
}

// ---- names ----

int StreamSocket::GetSockName(sockaddr* addr, socklen_t* len) {
  std::lock_guard<std::mutex> g(mu_);
  if (!addr || !len) return -EFAULT;
  sockaddr* local = id_ ? rdma_get_local_addr(id_) : nullptr;
  sockaddr_storage none{};
  none.ss_family = static_cast<sa_family_t>(family_);
  if (!local || local->sa_family == 0) local = reinterpret_cast<sockaddr*>(&none);
  CopyAddrOut(local, AddrLen(local), addr, len);
  return 0;
}

int StreamSocket::GetPeerName(sockaddr* addr, socklen_t* len) {
  std::lock_guard<std::mutex> g(mu_);
  if (!addr || !len) return -EFAULT;
  if (state_ != State::kConnected) return -ENOTCONN;
  sockaddr* peer = rdma_get_peer_addr(id_);
  CopyAddrOut(peer, AddrLen(peer), addr, len);
  return 0;
}

// ---- iomap ----

off_t StreamSocket::IoMap(void* buf, size_t len, int prot, int, off_t offset) {
  std::lock_guard<std::mutex> g(mu_);
  if (!buf || !len) return -EINVAL;
  if (prot != PROT_WRITE) return -EINVAL;
  if (state_ != State::kConnected) return -ENOTCONN;
  if (offset == -1) {
    offset = next_iomap_offset_;
  } else if (offset < 0) {
    return -EINVAL;
  }
  for (const IoMapping& m : local_maps_) {
    if (offset < m.offset + static_cast<off_t>(m.len) &&
        m.offset < offset + static_cast<off_t>(len)) {
      return -EINVAL;
    }
  }
  ibv_mr* mr = ibv_reg_mr(pd_, buf, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!mr) return -errno;
  local_maps_.push_back({offset, reinterpret_cast<uint64_t>(buf), len, mr->rkey, mr});
  next_iomap_offset_ = std::max<off_t>(next_iomap_offset_, offset + static_cast<off_t>(len));
  ctrl_queue_.push_back(
      {kCtrlIoMap, mr->rkey, static_cast<uint64_t>(offset), reinterpret_cast<uint64_t>(buf), len});
  FlushCtrl();
  return offset;
}

int StreamSocket::IoUnmap(void* buf, size_t len) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = std::find_if(local_maps_.begin(), local_maps_.end(), [&](const IoMapping& m) {
    return m.addr == reinterpret_cast<uint64_t>(buf) && m.len == len;
  });
  if (it == local_maps_.end()) return -EINVAL;
  if (state_ == State::kConnected) {
    ctrl_queue_.push_back({kCtrlIoUnmap, 0, static_cast<uint64_t>(it->offset), 0, 0});
    FlushCtrl();
  }
  ibv_dereg_mr(it->mr);
  local_maps_.erase(it);
  return 0;
}

ssize_t StreamSocket::IoWrite(const void* buf, size_t count, off_t offset, int flags) {
  std::unique_lock<std::mutex> lk(mu_);
  if (state_ != State::kConnected) return -ENOTCONN;
  if (count == 0) return 0;
  if (!buf) return -EFAULT;
  iovec iov{const_cast<void*>(buf), count};
  size_t sent = 0;
  for (;;) {
    Progress();
    if (shut_wr_) return sent ? static_cast<ssize_t>(sent) : -EPIPE;
    if (int e = ConnError()) return sent ? static_cast<ssize_t>(sent) : -e;
    off_t at = offset + static_cast<off_t>(sent);
    auto it = std::find_if(remote_maps_.begin(), remote_maps_.end(), [&](const IoMapping& m) {
      return at >= m.offset && at < m.offset + static_cast<off_t>(m.len);
    });
    if (it == remote_maps_.end()) return sent ? static_cast<ssize_t>(sent) : -EINVAL;
    size_t room = static_cast<size_t>(it->offset + static_cast<off_t>(it->len) - at);
    size_t limit = std::min(count, sent + room);
    while (sent < limit && ctrl_queue_.empty()) {
      uint64_t raddr = it->addr + static_cast<uint64_t>(at - it->offset);
      ssize_t n = SendChunk(&iov, 1, sent, limit - sent, false, raddr, it->rkey);
      if (n < 0) return sent ? static_cast<ssize_t>(sent) : n;
      if (n == 0) break;
      sent += static_cast<size_t>(n);
      at += n;
    }
    if (sent == count || sent == limit) return static_cast<ssize_t>(sent);
    if (NonBlocking(flags)) return sent ? static_cast<ssize_t>(sent) : WouldBlock();
    Wait(lk, kWaitSliceMs);
  }
}

// ---- poll ----

short StreamSocket::ReadinessLocked(short events) {
  short r = 0;
  switch (state_) {
    case State::kListening:
      if (!requests_.empty()) r |= POLLIN;
      break;
    case State::kConnected: {
      if (rx_total_ != consumed_ || fin_rx_ || peer_gone_ || shut_rd_ || err_) r |= POLLIN;
      if (CanSendData() || err_ || peer_gone_) r |= POLLOUT;
      // As TCP: the peer's close makes the socket readable (data, then EOF); POLLHUP only once
      // both directions are down, so a poller still reads what the peer sent last.
      if ((fin_rx_ || peer_gone_) && shut_wr_) r |= POLLHUP;
      if (err_) r |= POLLERR;
      break;
    }
    case State::kFailed:
      r |= POLLOUT | POLLERR | POLLHUP;
      break;
    case State::kIdle:
    case State::kBound:
    case State::kClosed:
      r |= POLLHUP;
      break;
    default:
      break;
  }
  return static_cast<short>(r & (events | POLLERR | POLLHUP));
}

short StreamSocket::Readiness(short events) {
  std::lock_guard<std::mutex> g(mu_);
  Progress();
  return ReadinessLocked(events);
}

bool StreamSocket::Arm(std::vector<pollfd>* fds) {
  std::lock_guard<std::mutex> g(mu_);
  return ArmLocked(fds);
}

}  // namespace softrdma::rsocket
