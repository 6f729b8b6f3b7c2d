// Shared harness of the semantics suites (tests/semantics/*_test.cpp): opens softrdma0 through the
// public verbs API of our libibverbs, builds QPs the way the Debian tools do, polls with deadlines,
// and runs forked peers that open the device only after fork() (so they talk to the test process
// over the cross-process TCP link, not the in-process one).
//
// Nothing here uses gtest assertions except the VerbsTest fixture: the same helpers run inside
// forked children, which report through exit codes and pipes instead.
#pragma once

#include <infiniband/verbs.h>

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace semantics {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Upper bound for anything that must happen. Generous: the suite also runs under ASan on 2 cores.
inline constexpr milliseconds kWait{5000};
// How long we watch for something that must NOT happen (a CQE, an event). Short: it costs runtime.
inline constexpr milliseconds kQuiet{60};

inline constexpr int kAllAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                  IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

// ---- Small utilities --------------------------------------------------------------------------

inline void Backoff(int* spins) {
  if (++*spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(50));
}

// Polls `cq` until `n` completions arrived or `timeout` passed; returns what arrived (maybe fewer).
inline std::vector<ibv_wc> PollN(ibv_cq* cq, size_t n, milliseconds timeout = kWait) {
  std::vector<ibv_wc> out;
  auto deadline = Clock::now() + timeout;
  int spins = 0;
  while (out.size() < n) {
    ibv_wc wc[16];
    int want = static_cast<int>(std::min<size_t>(16, n - out.size()));
    int got = ibv_poll_cq(cq, want, wc);
    if (got < 0) break;
    out.insert(out.end(), wc, wc + got);
    if (got > 0) continue;
    if (Clock::now() >= deadline) break;
    Backoff(&spins);
  }
  return out;
}

// CPU time this process has used so far, user and system, in microseconds: tests that a wait
// sleeps compare two readings a second apart.
inline long ProcessCpuUs() {
  rusage r{};
  getrusage(RUSAGE_SELF, &r);
  auto us = [](const timeval& t) { return t.tv_sec * 1000000L + t.tv_usec; };
  return us(r.ru_utime) + us(r.ru_stime);
}

inline bool PollOne(ibv_cq* cq, ibv_wc* wc, milliseconds timeout = kWait) {
  auto v = PollN(cq, 1, timeout);
  if (v.empty()) return false;
  *wc = v[0];
  return true;
}

// Polls without PollN's back-off, whose 50 us sleeps make every answer of a ping-pong come after
// an owed ACK stopped waiting for it (ACK deferral; under a sanitizer's slowdown too).
inline bool SpinPollOne(ibv_cq* cq, ibv_wc* wc, milliseconds timeout = kWait) {
  auto deadline = Clock::now() + timeout;
  for (;;) {
    int n = ibv_poll_cq(cq, 1, wc);
    if (n != 0) return n == 1;
    if (Clock::now() >= deadline) return false;
  }
}

// Watches `cq` for `quiet` and returns everything that arrived (callers usually expect nothing).
inline std::vector<ibv_wc> Drain(ibv_cq* cq, milliseconds quiet = kQuiet) {
  std::vector<ibv_wc> out;
  auto deadline = Clock::now() + quiet;
  while (Clock::now() < deadline) {
    ibv_wc wc[16];
    int got = ibv_poll_cq(cq, 16, wc);
    if (got > 0) {
      out.insert(out.end(), wc, wc + got);
      continue;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return out;
}

// Opens the first (only) device, softrdma0; nullptr if there is none.
inline ibv_context* OpenFirstDevice() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list) return nullptr;
  ibv_context* ctx = n >= 1 ? ibv_open_device(list[0]) : nullptr;
  ibv_free_device_list(list);
  return ctx;
}

// True when `fd` becomes readable within `timeout`.
inline bool Readable(int fd, milliseconds timeout) {
  pollfd p{fd, POLLIN, 0};
  int r;
  do {
    r = ::poll(&p, 1, static_cast<int>(timeout.count()));
  } while (r < 0 && errno == EINTR);
  return r == 1 && (p.revents & POLLIN);
}

// Waits up to `timeout` for the context's async fd, then reads one event (caller acks it).
inline bool NextAsyncEvent(ibv_context* ctx, ibv_async_event* e, milliseconds timeout = kWait) {
  if (!Readable(ctx->async_fd, timeout)) return false;
  return ibv_get_async_event(ctx, e) == 0;
}

inline uint64_t WallclockNs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
}

inline std::string WcStr(const ibv_wc& wc) {
  return "wr_id=" + std::to_string(wc.wr_id) + " status=" + ibv_wc_status_str(wc.status) +
         " opcode=" + std::to_string(wc.opcode) + " byte_len=" + std::to_string(wc.byte_len);
}

inline ibv_qp_state StateOf(ibv_qp* qp) {
  ibv_qp_attr a{};
  ibv_qp_init_attr init{};
  if (ibv_query_qp(qp, &a, IBV_QP_STATE, &init)) return IBV_QPS_UNKNOWN;
  return a.qp_state;
}

// ---- Memory -----------------------------------------------------------------------------------

struct Buffer {
  std::unique_ptr<uint64_t[]> storage;  // 8-byte aligned, for atomics
  size_t len = 0;
  ibv_mr* mr = nullptr;
  uint8_t* data() const { return reinterpret_cast<uint8_t*>(storage.get()); }
  uint64_t addr(size_t off = 0) const { return reinterpret_cast<uintptr_t>(data()) + off; }
  uint32_t lkey() const { return mr->lkey; }
  uint32_t rkey() const { return mr->rkey; }
  uint64_t& u64(size_t index) const { return storage[index]; }
  ibv_sge Sge(size_t off, uint32_t length) const { return ibv_sge{addr(off), length, lkey()}; }
  void Fill(uint8_t v) const { std::memset(data(), v, len); }
};

// Whole pages of anonymous memory, registered: what a same-host peer on the shared-memory link
// reaches directly (smaller or partial-page regions stay private, and messages for them go by
// frames or through a staging area).
struct ShareableRegion {
  static constexpr size_t kBytes = 64 << 10;
  uint8_t* p = nullptr;
  ibv_mr* mr = nullptr;
  bool Make(ibv_pd* pd) {
    void* m = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return false;
    p = static_cast<uint8_t*>(m);
    mr = ibv_reg_mr(pd, p, kBytes, kAllAccess);
    return mr != nullptr;
  }
  ~ShareableRegion() { Free(); }
  void Free() {
    if (mr) ibv_dereg_mr(mr);
    if (p) munmap(p, kBytes);
    mr = nullptr;
    p = nullptr;
  }
  ibv_sge Sge(size_t off, uint32_t len) const {
    return ibv_sge{reinterpret_cast<uintptr_t>(p) + off, len, mr->lkey};
  }
};

// ---- Queue pairs ------------------------------------------------------------------------------

// How a QP is created and connected. The defaults are those of ibv_rc_pingpong, except timeouts
// short enough that error tests finish quickly.
struct QpOpts {
  ibv_qp_type type = IBV_QPT_RC;
  uint32_t max_send_wr = 128, max_recv_wr = 128, max_send_sge = 4, max_recv_sge = 4;
  uint32_t max_inline = 64;
  bool sq_sig_all = false;
  int cq_depth = 512;
  ibv_cq* send_cq = nullptr;  // null: a fresh CQ of cq_depth
  ibv_cq* recv_cq = nullptr;  // null: a fresh CQ of cq_depth
  ibv_srq* srq = nullptr;
  uint64_t send_ops_flags = 0;  // non-zero: ibv_create_qp_ex with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS
  uint32_t create_flags = 0;    // non-zero: ibv_create_qp_ex with IBV_QP_INIT_ATTR_CREATE_FLAGS
  int access = kAllAccess;
  uint8_t timeout = 14;  // 4.096 us * 2^14 = 67 ms
  uint8_t retry_cnt = 7;
  uint8_t rnr_retry = 7;
  uint8_t min_rnr_timer = 1;  // 0.01 ms
  uint8_t max_rd_atomic = 16;
  uint8_t max_dest_rd_atomic = 16;
  uint32_t qkey = 0x11111111;
  uint32_t psn = 0;
  bool use_gid = false;  // address the peer by GID (GRH) instead of by LID
};

// What a peer needs to connect to a QP (exchanged out of band, as the pingpongs do).
struct Remote {
  uint32_t qpn = 0;
  uint16_t lid = 0;
  ibv_gid gid{};
  uint32_t psn = 0;
};

struct Qp {
  ibv_qp* qp = nullptr;
  ibv_cq* scq = nullptr;
  ibv_cq* rcq = nullptr;
  QpOpts opts;
  uint32_t qpn() const { return qp->qp_num; }
  ibv_qp_ex* ex() const { return ibv_qp_to_qp_ex(qp); }
};

// The masks the Debian tools use (ibv_rc_pingpong, ibv_uc_pingpong, ibv_ud_pingpong).
inline int InitMask(ibv_qp_type t) {
  return IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
         (t == IBV_QPT_UD ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS);
}
inline int RtrMask(ibv_qp_type t) {
  switch (t) {
    case IBV_QPT_RC:
    case IBV_QPT_XRC_RECV:
      return IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    case IBV_QPT_UC:
    case IBV_QPT_XRC_SEND:
      return IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
    default:
      return IBV_QP_STATE;
  }
}
inline int RtsMask(ibv_qp_type t) {
  if (t == IBV_QPT_RC || t == IBV_QPT_XRC_SEND)
    return IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
           IBV_QP_MAX_QP_RD_ATOMIC;
  if (t == IBV_QPT_XRC_RECV) return IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN;
  return IBV_QP_STATE | IBV_QP_SQ_PSN;
}

// Every attribute filled with a valid value, so that only the mask decides what a modify means.
inline ibv_qp_attr FullAttr(const QpOpts& o, const Remote& r, ibv_qp_state state) {
  ibv_qp_attr a{};
  a.qp_state = state;
  a.pkey_index = 0;
  a.port_num = 1;
  a.qp_access_flags = o.access;
  a.qkey = o.qkey;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = r.qpn;
  a.rq_psn = r.psn;
  a.sq_psn = o.psn;
  a.max_dest_rd_atomic = o.max_dest_rd_atomic;
  a.max_rd_atomic = o.max_rd_atomic;
  a.min_rnr_timer = o.min_rnr_timer;
  a.timeout = o.timeout;
  a.retry_cnt = o.retry_cnt;
  a.rnr_retry = o.rnr_retry;
  a.ah_attr.dlid = r.lid;
  a.ah_attr.port_num = 1;
  a.ah_attr.sl = 0;
  if (o.use_gid) {
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = r.gid;
    a.ah_attr.grh.sgid_index = 0;
    a.ah_attr.grh.hop_limit = 1;
  }
  return a;
}

inline int ToInit(ibv_qp* qp, const QpOpts& o) {
  ibv_qp_attr a = FullAttr(o, Remote{}, IBV_QPS_INIT);
  return ibv_modify_qp(qp, &a, InitMask(o.type));
}
inline int ToRtr(ibv_qp* qp, const QpOpts& o, const Remote& r) {
  ibv_qp_attr a = FullAttr(o, r, IBV_QPS_RTR);
  return ibv_modify_qp(qp, &a, RtrMask(o.type));
}
inline int ToRts(ibv_qp* qp, const QpOpts& o) {
  ibv_qp_attr a = FullAttr(o, Remote{}, IBV_QPS_RTS);
  return ibv_modify_qp(qp, &a, RtsMask(o.type));
}
inline int ToErr(ibv_qp* qp) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  return ibv_modify_qp(qp, &a, IBV_QP_STATE);
}
// RESET -> INIT -> RTR -> RTS (UD ignores `r`). Returns the first failure's errno.
inline int BringUp(ibv_qp* qp, const QpOpts& o, const Remote& r) {
  if (int e = ToInit(qp, o)) return e;
  if (int e = ToRtr(qp, o, r)) return e;
  return ToRts(qp, o);
}

// ---- Posting ------------------------------------------------------------------------------------

struct SendArgs {
  ibv_wr_opcode opcode = IBV_WR_SEND;
  uint64_t wr_id = 0;
  unsigned flags = IBV_SEND_SIGNALED;
  std::vector<ibv_sge> sges;
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  uint64_t compare_add = 0, swap = 0;
  uint32_t imm = 0;  // host order; converted to network order
  ibv_ah* ah = nullptr;
  uint32_t remote_qpn = 0, remote_qkey = 0;
};

inline int Post(ibv_qp* qp, const SendArgs& s, ibv_send_wr** bad_out = nullptr) {
  std::vector<ibv_sge> sges = s.sges;
  ibv_send_wr wr{};
  wr.wr_id = s.wr_id;
  wr.opcode = s.opcode;
  wr.send_flags = s.flags;
  wr.sg_list = sges.empty() ? nullptr : sges.data();
  wr.num_sge = static_cast<int>(sges.size());
  wr.imm_data = htonl(s.imm);
  if (s.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || s.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
    wr.wr.atomic.remote_addr = s.remote_addr;
    wr.wr.atomic.rkey = s.rkey;
    wr.wr.atomic.compare_add = s.compare_add;
    wr.wr.atomic.swap = s.swap;
  } else if (s.ah) {
    wr.wr.ud.ah = s.ah;
    wr.wr.ud.remote_qpn = s.remote_qpn;
    wr.wr.ud.remote_qkey = s.remote_qkey;
  } else {
    wr.wr.rdma.remote_addr = s.remote_addr;
    wr.wr.rdma.rkey = s.rkey;
  }
  ibv_send_wr* bad = nullptr;
  int r = ibv_post_send(qp, &wr, &bad);
  if (bad_out) *bad_out = bad;
  return r;
}

inline int PostSendMsg(ibv_qp* qp, const Buffer& b, size_t off, uint32_t len, uint64_t wr_id,
                       unsigned flags = IBV_SEND_SIGNALED) {
  SendArgs s;
  s.wr_id = wr_id;
  s.flags = flags;
  if (len) s.sges = {b.Sge(off, len)};
  return Post(qp, s);
}

inline int PostRdma(ibv_qp* qp, ibv_wr_opcode op, const Buffer& local, size_t off, uint32_t len,
                    uint64_t raddr, uint32_t rkey, uint64_t wr_id,
                    unsigned flags = IBV_SEND_SIGNALED) {
  SendArgs s;
  s.opcode = op;
  s.wr_id = wr_id;
  s.flags = flags;
  if (len) s.sges = {local.Sge(off, len)};
  s.remote_addr = raddr;
  s.rkey = rkey;
  return Post(qp, s);
}

// An application spinning on memory reads what the HCA writes (here our own progress thread)
// outside the program's synchronization, as ib_write_lat does: ThreadSanitizer is told not to
// judge that read (it reported the race the tests are made of).
__attribute__((noinline, no_sanitize("thread"))) inline uint8_t Peek(const uint8_t* p) {
  return *reinterpret_cast<const volatile uint8_t*>(p);
}

// One signaled work request of one piece named by address and key, not by a harness Buffer (an
// offset into device memory, memory that regions on demand cover).
inline int PostPiece(ibv_qp* qp, ibv_wr_opcode op, ibv_sge piece, uint64_t raddr, uint32_t rkey,
                     uint64_t wr_id) {
  SendArgs s;
  s.opcode = op;
  s.wr_id = wr_id;
  s.sges = {piece};
  s.remote_addr = raddr;
  s.rkey = rkey;
  return Post(qp, s);
}

inline int PostAtomic(ibv_qp* qp, ibv_wr_opcode op, const Buffer& local, size_t off, uint64_t raddr,
                      uint32_t rkey, uint64_t compare_add, uint64_t swap, uint64_t wr_id,
                      unsigned flags = IBV_SEND_SIGNALED) {
  SendArgs s;
  s.opcode = op;
  s.wr_id = wr_id;
  s.flags = flags;
  s.sges = {local.Sge(off, 8)};
  s.remote_addr = raddr;
  s.rkey = rkey;
  s.compare_add = compare_add;
  s.swap = swap;
  return Post(qp, s);
}

inline int PostRecvSge(ibv_qp* qp, const ibv_sge& sge, uint64_t wr_id) {
  ibv_sge copy = sge;
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &copy;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return ibv_post_recv(qp, &wr, &bad);
}
inline int PostRecv(ibv_qp* qp, const Buffer& b, size_t off, uint32_t len, uint64_t wr_id) {
  return PostRecvSge(qp, b.Sge(off, len), wr_id);
}
inline int PostSrqRecvSge(ibv_srq* srq, const ibv_sge& sge, uint64_t wr_id) {
  ibv_sge copy = sge;
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &copy;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return ibv_post_srq_recv(srq, &wr, &bad);
}
inline int PostSrqRecv(ibv_srq* srq, const Buffer& b, size_t off, uint32_t len, uint64_t wr_id) {
  return PostSrqRecvSge(srq, b.Sge(off, len), wr_id);
}

// ---- Resources --------------------------------------------------------------------------------

// An opened softrdma0 and everything created through it, destroyed in dependency order. Used by
// the fixture and by forked children alike (so it reports failures as nullptr / errno only).
class Verbs {
 public:
  Verbs() = default;
  Verbs(const Verbs&) = delete;
  Verbs& operator=(const Verbs&) = delete;
  ~Verbs() { Close(); }

  bool Open() {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    if (!list) return false;
    for (int i = 0; i < n && !ctx; ++i)
      if (std::strcmp(ibv_get_device_name(list[i]), "softrdma0") == 0)
        ctx = ibv_open_device(list[i]);
    ibv_free_device_list(list);
    if (!ctx) return false;
    pd = ibv_alloc_pd(ctx);
    if (!pd) return false;
    if (ibv_query_port(ctx, 1, &port)) return false;
    if (ibv_query_gid(ctx, 1, 0, &gid)) return false;
    return true;
  }

  void Close() {
    for (ibv_ah* ah : ahs_) ibv_destroy_ah(ah);
    ahs_.clear();
    for (auto& q : qps_) ibv_destroy_qp(q->qp);
    qps_.clear();
    for (ibv_srq* s : srqs_) ibv_destroy_srq(s);
    srqs_.clear();
    for (auto& b : bufs_) ibv_dereg_mr(b->mr);
    bufs_.clear();
    for (ibv_cq* cq : cqs_) ibv_destroy_cq(cq);
    cqs_.clear();
    for (ibv_comp_channel* ch : channels_) ibv_destroy_comp_channel(ch);
    channels_.clear();
    if (pd) ibv_dealloc_pd(pd);
    pd = nullptr;
    if (ctx) ibv_close_device(ctx);
    ctx = nullptr;
  }

  ibv_cq* NewCq(int depth = 512, ibv_comp_channel* ch = nullptr, void* cq_context = nullptr) {
    ibv_cq* cq = ibv_create_cq(ctx, depth, cq_context, ch, 0);
    if (cq) cqs_.push_back(cq);
    return cq;
  }
  // Extended CQ; destroyed like any other (ibv_cq_ex_to_cq).
  ibv_cq_ex* NewCqEx(uint64_t wc_flags, int depth = 512, ibv_comp_channel* ch = nullptr) {
    ibv_cq_init_attr_ex a{};
    a.cqe = static_cast<uint32_t>(depth);
    a.wc_flags = wc_flags;
    a.channel = ch;
    ibv_cq_ex* cq = ibv_create_cq_ex(ctx, &a);
    if (cq) cqs_.push_back(ibv_cq_ex_to_cq(cq));
    return cq;
  }
  ibv_comp_channel* NewChannel() {
    ibv_comp_channel* ch = ibv_create_comp_channel(ctx);
    if (ch) channels_.push_back(ch);
    return ch;
  }
  Buffer* NewBuffer(size_t len, int access = kAllAccess) {
    auto b = std::make_unique<Buffer>();
    b->storage.reset(new uint64_t[(len + 7) / 8]());
    b->len = len;
    b->mr = ibv_reg_mr(pd, b->data(), len, access);
    if (!b->mr) return nullptr;
    bufs_.push_back(std::move(b));
    return bufs_.back().get();
  }
  ibv_srq* NewSrq(uint32_t max_wr, uint32_t max_sge = 1) {
    ibv_srq_init_attr a{};
    a.attr.max_wr = max_wr;
    a.attr.max_sge = max_sge;
    ibv_srq* s = ibv_create_srq(pd, &a);
    if (s) srqs_.push_back(s);
    return s;
  }
  ibv_ah* NewAh(const ibv_ah_attr& attr) {
    ibv_ah_attr copy = attr;
    ibv_ah* ah = ibv_create_ah(pd, &copy);
    if (ah) ahs_.push_back(ah);
    return ah;
  }
  ibv_ah* AdoptAh(ibv_ah* ah) {
    if (ah) ahs_.push_back(ah);
    return ah;
  }
  // An AH that reaches `r` (by GID when `use_gid`, else by LID).
  ibv_ah* AhTo(const Remote& r, bool use_gid) {
    ibv_ah_attr a{};
    a.dlid = r.lid;
    a.port_num = 1;
    if (use_gid) {
      a.is_global = 1;
      a.grh.dgid = r.gid;
      a.grh.sgid_index = 0;
      a.grh.hop_limit = 1;
    }
    return NewAh(a);
  }

  Qp* NewQp(const QpOpts& o) {
    auto q = std::make_unique<Qp>();
    q->opts = o;
    q->scq = o.send_cq ? o.send_cq : NewCq(o.cq_depth);
    q->rcq = o.recv_cq ? o.recv_cq : NewCq(o.cq_depth);
    if (!q->scq || !q->rcq) return nullptr;
    ibv_qp_init_attr_ex a{};
    a.qp_type = o.type;
    a.send_cq = q->scq;
    a.recv_cq = q->rcq;
    a.srq = o.srq;
    a.sq_sig_all = o.sq_sig_all;
    a.cap.max_send_wr = o.max_send_wr;
    a.cap.max_recv_wr = o.srq ? 0 : o.max_recv_wr;
    a.cap.max_send_sge = o.max_send_sge;
    a.cap.max_recv_sge = o.srq ? 0 : o.max_recv_sge;
    a.cap.max_inline_data = o.max_inline;
    a.comp_mask = IBV_QP_INIT_ATTR_PD;
    a.pd = pd;
    if (o.create_flags) {
      a.comp_mask |= IBV_QP_INIT_ATTR_CREATE_FLAGS;
      a.create_flags = o.create_flags;
    }
    if (o.send_ops_flags) {
      a.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
      a.send_ops_flags = o.send_ops_flags;
    }
    q->qp = ibv_create_qp_ex(ctx, &a);
    if (!q->qp) return nullptr;
    qps_.push_back(std::move(q));
    return qps_.back().get();
  }
  // Destroys a QP before the rest (a peer that vanishes).
  int DestroyQp(Qp* q) {
    for (auto it = qps_.begin(); it != qps_.end(); ++it) {
      if (it->get() == q) {
        int r = ibv_destroy_qp(q->qp);
        qps_.erase(it);
        return r;
      }
    }
    return ENOENT;
  }

  Remote RemoteOf(const Qp* q) const {
    Remote r;
    r.qpn = q->qpn();
    r.lid = port.lid;
    r.gid = gid;
    r.psn = q->opts.psn;
    return r;
  }

  // Creates and connects two QPs of this device (the in-process link). UD QPs are only brought up.
  bool NewPair(const QpOpts& oa, const QpOpts& ob, Qp** a, Qp** b) {
    *a = NewQp(oa);
    *b = NewQp(ob);
    if (!*a || !*b) return false;
    return BringUp((*a)->qp, oa, RemoteOf(*b)) == 0 && BringUp((*b)->qp, ob, RemoteOf(*a)) == 0;
  }

  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_port_attr port{};
  ibv_gid gid{};

 private:
  std::vector<ibv_ah*> ahs_;
  std::vector<std::unique_ptr<Qp>> qps_;
  std::vector<ibv_srq*> srqs_;
  std::vector<std::unique_ptr<Buffer>> bufs_;
  std::vector<ibv_cq*> cqs_;
  std::vector<ibv_comp_channel*> channels_;
};

// Each test opens its own context: async events of one test never reach another.
// An XRC initiator (sending with `send_cq`) and an XRC target of `xrcd`, both of `v`, created and
// connected to each other; the initiator gives up after `retry_cnt` retries. 0 or an errno value.
inline int NewXrcPair(Verbs& v, ibv_xrcd* xrcd, ibv_cq* send_cq, uint8_t retry_cnt,
                      ibv_qp** send_qp, ibv_qp** recv_qp) {
  ibv_qp_init_attr_ex ini{};
  ini.qp_type = IBV_QPT_XRC_SEND;
  ini.comp_mask = IBV_QP_INIT_ATTR_PD;
  ini.pd = v.pd;
  ini.send_cq = send_cq;
  ini.cap.max_send_wr = 16;
  ini.cap.max_send_sge = 1;
  *send_qp = ibv_create_qp_ex(v.ctx, &ini);
  if (!*send_qp) return errno;
  ibv_qp_init_attr_ex tgt{};
  tgt.qp_type = IBV_QPT_XRC_RECV;
  tgt.comp_mask = IBV_QP_INIT_ATTR_XRCD;
  tgt.xrcd = xrcd;
  *recv_qp = ibv_create_qp_ex(v.ctx, &tgt);
  if (!*recv_qp) return errno;
  QpOpts so;
  so.type = IBV_QPT_XRC_SEND;
  so.retry_cnt = retry_cnt;
  QpOpts ro;
  ro.type = IBV_QPT_XRC_RECV;
  if (int e = BringUp(*recv_qp, ro, Remote{(*send_qp)->qp_num, v.port.lid, v.gid, 0})) return e;
  return BringUp(*send_qp, so, Remote{(*recv_qp)->qp_num, v.port.lid, v.gid, 0});
}

class VerbsTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(v.Open()) << "cannot open softrdma0: " << strerror(errno); }
  void TearDown() override { v.Close(); }

  // A connected pair on the in-process link; fails the test if anything refuses.
  void Pair(const QpOpts& oa, const QpOpts& ob, Qp** a, Qp** b) {
    ASSERT_TRUE(v.NewPair(oa, ob, a, b)) << strerror(errno);
  }
  void Pair(const QpOpts& o, Qp** a, Qp** b) { Pair(o, o, a, b); }
  Buffer* Buf(size_t len, int access = kAllAccess) {
    Buffer* b = v.NewBuffer(len, access);
    EXPECT_NE(b, nullptr);
    return b;
  }

  Verbs v;
};

// ---- Forked peers -----------------------------------------------------------------------------

// Blocking full read/write on a pipe (children use these; the parent uses the timed variants).
inline bool WriteAll(int fd, const void* p, size_t n) {
  auto* c = static_cast<const uint8_t*>(p);
  while (n > 0) {
    ssize_t w = ::write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}
inline bool ReadAll(int fd, void* p, size_t n) {
  auto* c = static_cast<uint8_t*>(p);
  while (n > 0) {
    ssize_t r = ::read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// A child process running `body(to_parent_fd, from_parent_fd)`; its return value is the exit code.
// The child is forked before it opens the device, so it gets its own HCA and talks to this
// process over TCP. It is killed and reaped when this object dies, whatever path the test took,
// and it kills itself if the parent dies or after a watchdog period.
// Whether this process runs with the shared-memory link off (SOFTRDMA_LINK=tcp): the tests of that
// link then skip instead of failing.
inline bool ShmLinkOff() {
  const char* link = getenv("SOFTRDMA_LINK");
  return link && std::string(link) == "tcp";
}
constexpr const char* kShmLinkOff = "the shared-memory link is off here (SOFTRDMA_LINK=tcp)";

// In a forked child before it opens its device: "tcp" keeps same-host peers off shared memory
// (the child listens on no shared-memory socket, so neither side can reach the other that way).
inline void ForceLink(const char* link) {
  if (std::string(link) == "tcp")
    setenv("SOFTRDMA_LINK", "tcp", 1);
  else
    unsetenv("SOFTRDMA_LINK");
}

class ForkedPeer {
 public:
  using Body = std::function<int(int to_parent, int from_parent)>;

  ForkedPeer() = default;
  ForkedPeer(const ForkedPeer&) = delete;
  ForkedPeer& operator=(const ForkedPeer&) = delete;
  ~ForkedPeer() { Kill(); }

  bool Start(const Body& body) {
    int up[2], down[2];
    if (pipe2(up, O_CLOEXEC) != 0) return false;
    if (pipe2(down, O_CLOEXEC) != 0) {
      close(up[0]);
      close(up[1]);
      return false;
    }
    // A child that exits early must make Send() fail, not kill the test process.
    signal(SIGPIPE, SIG_IGN);
    fflush(nullptr);
    pid_ = fork();
    if (pid_ < 0) {
      for (int fd : {up[0], up[1], down[0], down[1]}) close(fd);
      return false;
    }
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      alarm(60);  // a watchdog in case the parent hangs without dying
      close(up[0]);
      close(down[1]);
      int code = body(up[1], down[0]);
      _exit(code);  // no atexit handlers, no gtest teardown in the child
    }
    close(up[1]);
    close(down[0]);
    from_child_ = up[0];
    to_child_ = down[1];
    return true;
  }

  bool Send(const void* p, size_t n) { return WriteAll(to_child_, p, n); }
  template <typename T>
  bool Send(const T& v) {
    return Send(&v, sizeof v);
  }

  // Reads exactly `n` bytes or fails at the deadline (or when the child closed its end).
  bool Recv(void* p, size_t n, milliseconds timeout = kWait) {
    auto* c = static_cast<uint8_t*>(p);
    auto deadline = Clock::now() + timeout;
    while (n > 0) {
      auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
      if (left.count() <= 0 || !Readable(from_child_, left)) return false;
      ssize_t r = ::read(from_child_, c, n);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
      c += r;
      n -= static_cast<size_t>(r);
    }
    return true;
  }
  template <typename T>
  bool Recv(T* v, milliseconds timeout = kWait) {
    return Recv(v, sizeof *v, timeout);
  }

  // Waits for the child to exit by itself; returns its wait status or -1 at the deadline.
  int Wait(milliseconds timeout = kWait) {
    auto deadline = Clock::now() + timeout;
    while (pid_ > 0) {
      int st = 0;
      pid_t r = waitpid(pid_, &st, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        CloseFds();
        return st;
      }
      if (r < 0) break;
      if (Clock::now() >= deadline) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return -1;
  }

  // SIGKILL and reap; idempotent.
  void Kill() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      int st;
      while (waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
      }
      pid_ = -1;
    }
    CloseFds();
  }

  pid_t pid() const { return pid_; }

 private:
  void CloseFds() {
    if (from_child_ >= 0) close(from_child_);
    if (to_child_ >= 0) close(to_child_);
    from_child_ = to_child_ = -1;
  }
  pid_t pid_ = -1;
  int from_child_ = -1, to_child_ = -1;
};

// Child-side helpers around a pipe pair.
struct ChildPipe {
  int up, down;
  template <typename T>
  bool Send(const T& v) const {
    return WriteAll(up, &v, sizeof v);
  }
  template <typename T>
  bool Recv(T* v) const {
    return ReadAll(down, v, sizeof *v);
  }
};

// A child's end of a connection with its parent: the device opened, one QP and a buffer of
// `bytes`, the QPs' addresses swapped over the pipe (the child's sent first) and the QP brought up.
struct ChildQp {
  Verbs v;
  Qp* q = nullptr;
  Buffer* b = nullptr;
  // 0, or the child's exit code for the step that failed: 10 open, 11 create, 12 swap, 13 bring-up.
  int Connect(const ChildPipe& p, const QpOpts& o, size_t bytes) {
    if (!v.Open()) return 10;
    q = v.NewQp(o);
    b = v.NewBuffer(bytes);
    if (!q || !b) return 11;
    Remote theirs;
    if (!p.Send(v.RemoteOf(q)) || !p.Recv(&theirs)) return 12;
    return BringUp(q->qp, o, theirs) ? 13 : 0;
  }
};

// The parent's end of ChildQp::Connect: starts `peer` on `body`, swaps QP numbers with it and
// brings `a` (on `v`) up. Fails the calling test on any step.
inline void StartAndConnect(Verbs& v, ForkedPeer& peer, const ForkedPeer::Body& body, Qp* a,
                            const QpOpts& o) {
  ASSERT_TRUE(peer.Start(body));
  Remote theirs;
  ASSERT_TRUE(peer.Recv(&theirs));
  ASSERT_TRUE(peer.Send(v.RemoteOf(a)));
  ASSERT_EQ(BringUp(a->qp, o, theirs), 0);
}

}  // namespace semantics
