// Queue pairs: creation (classic and extended), modify/query/destroy, posting, and the ibv_wr_*
// builders of ibv_qp_ex.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "abi/export.h"
#include "abi/verbs/objects.h"
#include "core/limits.h"

using namespace softrdma;
using namespace softrdma::abi;

namespace softrdma::abi {

namespace {

// The QP behind a handle, with the handle's fields every type has; nullptr and errno on failure.
VerbsQp* NewQp(ibv_context* ctx, core::Qp::Init init, void* qp_context) {
  auto* qp = new VerbsQp{};
  init.user_handle = &qp->ibv.qp_base;
  int err = 0;
  qp->core = CoreOf(ctx).hca().CreateQp(CoreOf(ctx), init, &err);
  if (!qp->core) {
    delete qp;
    errno = err;
    return nullptr;
  }
  ibv_qp& q = qp->ibv.qp_base;
  q.context = ctx;
  q.qp_context = qp_context;
  q.handle = qp->core->qpn();
  q.qp_num = qp->core->qpn();
  q.state = IBV_QPS_RESET;
  q.qp_type = init.type;
  pthread_mutex_init(&q.mutex, nullptr);
  pthread_cond_init(&q.cond, nullptr);
  return qp;
}

// The target half of XRC: no send or receive queue, no PD or CQ of its own; its messages reach the
// XRC SRQs of its domain.
ibv_qp* CreateXrcRecvQp(ibv_context* ctx, ibv_qp_init_attr_ex* a) {
  if (!(a->comp_mask & IBV_QP_INIT_ATTR_XRCD) || !a->xrcd) return Fail<ibv_qp>(EINVAL);
  if (a->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) return Fail<ibv_qp>(EINVAL);
  core::Qp::Init init{};
  init.type = IBV_QPT_XRC_RECV;
  init.xrcd = VerbsXrcd::From(a->xrcd)->core;
  VerbsQp* qp = NewQp(ctx, init, a->qp_context);
  if (!qp) return nullptr;
  if (int err = CoreOf(ctx).hca().PublishTarget(qp->core)) {
    qp->core->Shutdown();
    delete qp;
    return Fail<ibv_qp>(err);
  }
  a->cap = ibv_qp_cap{};
  qp->xrcd = VerbsXrcd::From(a->xrcd);
  ++qp->xrcd->users;
  return &qp->ibv.qp_base;
}

}  // namespace

// ibv_open_qp(3): another handle on an XRC target QP of the domain, this process's or another's.
ibv_qp* OpenQp(ibv_context* ctx, ibv_qp_open_attr* a) {
  if (!ctx || !a) return Fail<ibv_qp>(EINVAL);
  constexpr uint32_t kNeeded = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
  if (a->comp_mask >= IBV_QP_OPEN_ATTR_RESERVED) return Fail<ibv_qp>(EOPNOTSUPP);
  if ((a->comp_mask & kNeeded) != kNeeded || !a->xrcd || a->qp_type != IBV_QPT_XRC_RECV)
    return Fail<ibv_qp>(EINVAL);
  VerbsXrcd* x = VerbsXrcd::From(a->xrcd);
  int err = 0;
  std::shared_ptr<core::Qp> core =
      CoreOf(ctx).hca().OpenTarget(CoreOf(ctx), x->core, a->qp_num, &err);
  if (!core) return Fail<ibv_qp>(err);
  auto* qp = new VerbsQp{};
  qp->core = std::move(core);
  qp->xrcd = x;
  ++x->users;
  ibv_qp& q = qp->ibv.qp_base;
  q.context = ctx;
  q.qp_context = (a->comp_mask & IBV_QP_OPEN_ATTR_CONTEXT) ? a->qp_context : nullptr;
  q.handle = a->qp_num;
  q.qp_num = a->qp_num;
  ibv_qp_attr now{};
  ibv_qp_init_attr init{};
  qp->core->Query(&now, IBV_QP_STATE, &init);
  q.state = now.qp_state;
  q.qp_type = IBV_QPT_XRC_RECV;
  pthread_mutex_init(&q.mutex, nullptr);
  pthread_cond_init(&q.cond, nullptr);
  return &q;
}

ibv_qp* CreateQpEx(ibv_context* ctx, ibv_qp_init_attr_ex* a) {
  if (!ctx || !a) return Fail<ibv_qp>(EINVAL);
  constexpr uint32_t kSupportedMask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS |
                                      IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | IBV_QP_INIT_ATTR_XRCD;
  if (a->comp_mask & ~kSupportedMask) return Fail<ibv_qp>(EOPNOTSUPP);
  const uint32_t create_flags =
      (a->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) ? a->create_flags : 0;
  // Blocking multicast loopback means something for UD QPs only (mckey -l asks for it).
  if (create_flags & ~uint32_t{IBV_QP_CREATE_BLOCK_SELF_MCAST_LB} ||
      (create_flags && a->qp_type != IBV_QPT_UD))
    return Fail<ibv_qp>(EOPNOTSUPP);
  if (a->qp_type != IBV_QPT_RC && a->qp_type != IBV_QPT_UC && a->qp_type != IBV_QPT_UD &&
      a->qp_type != IBV_QPT_XRC_SEND && a->qp_type != IBV_QPT_XRC_RECV)
    return Fail<ibv_qp>(EOPNOTSUPP);
  if (a->qp_type == IBV_QPT_XRC_RECV) return CreateXrcRecvQp(ctx, a);
  if (!(a->comp_mask & IBV_QP_INIT_ATTR_PD) || !a->pd) return Fail<ibv_qp>(EINVAL);
  bool xrc_send = a->qp_type == IBV_QPT_XRC_SEND;
  if (xrc_send) {
    // The initiator half of XRC: a send queue only (receives go to the target's XRC SRQs).
    if (a->srq) return Fail<ibv_qp>(EINVAL);
    a->cap.max_recv_wr = a->cap.max_recv_sge = 0;
  }
  ibv_cq* recv_cq = xrc_send ? nullptr : a->recv_cq;
  if (!a->send_cq || (!recv_cq && !xrc_send)) return Fail<ibv_qp>(EINVAL);
  if (a->srq && a->qp_type == IBV_QPT_UC) return Fail<ibv_qp>(EINVAL);  // IBTA: no SRQ for UC
  ibv_qp_cap& cap = a->cap;
  if (cap.max_send_wr > core::kMaxQpWr || cap.max_send_sge > core::kMaxSge ||
      cap.max_inline_data > core::kMaxInlineData ||
      (!a->srq && (cap.max_recv_wr > core::kMaxQpWr || cap.max_recv_sge > core::kMaxSge)))
    return Fail<ibv_qp>(EINVAL);

  uint64_t send_ops = 0;
  if (a->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) {
    send_ops = a->send_ops_flags;
    constexpr uint64_t kOps = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
                              IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
                              IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
                              IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_SEND_WITH_INV |
                              IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV;
    // What each transport can carry (ibv_create_qp_ex(3): unsupported operations fail creation).
    constexpr uint64_t kUcOps = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
                                IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
                                IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV;
    constexpr uint64_t kUdOps = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
    uint64_t allowed = a->qp_type == IBV_QPT_RC || xrc_send ? kOps
                       : a->qp_type == IBV_QPT_UC           ? kUcOps
                                                            : kUdOps;
    if (send_ops & ~allowed) return Fail<ibv_qp>(EOPNOTSUPP);
  }

  if (a->srq) cap.max_recv_wr = cap.max_recv_sge = 0;
  // A send WQE holds at least its SGEs' worth of inline data, as rxe's does: rdma_xclient posts 16
  // inline bytes on a QP that asked for none and one SGE.
  cap.max_inline_data = std::min<uint32_t>(
      std::max<uint32_t>(cap.max_inline_data,
                         cap.max_send_sge * static_cast<uint32_t>(sizeof(ibv_sge))),
      core::kMaxInlineData);
  core::Qp::Init init{};
  init.type = a->qp_type;
  init.pd = &VerbsPd::From(a->pd)->core;
  init.send_cq = VerbsCq::From(a->send_cq)->core.get();
  init.recv_cq = recv_cq ? VerbsCq::From(recv_cq)->core.get() : nullptr;
  init.srq = a->srq ? VerbsSrq::From(a->srq)->core.get() : nullptr;
  init.cap = cap;
  init.sq_sig_all = a->sq_sig_all != 0;
  init.block_self_mcast = (create_flags & IBV_QP_CREATE_BLOCK_SELF_MCAST_LB) != 0;
  VerbsQp* qp = NewQp(ctx, init, a->qp_context);
  if (!qp) return nullptr;
  ibv_qp& q = qp->ibv.qp_base;
  q.pd = a->pd;
  q.send_cq = a->send_cq;
  q.recv_cq = recv_cq;
  q.srq = a->srq;
  ++VerbsPd::From(a->pd)->users;
  ++VerbsCq::From(a->send_cq)->users;
  if (recv_cq) ++VerbsCq::From(recv_cq)->users;
  if (a->srq) ++VerbsSrq::From(a->srq)->users;
  if (a->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) {
    qp->extended = true;
    InstallQpExOps(&qp->ibv, send_ops);
  }
  return &q;
}

int PostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  const ibv_send_wr* b = nullptr;
  int r = VerbsQp::From(qp)->core->PostSend(wr, &b);
  if (r && bad) *bad = const_cast<ibv_send_wr*>(b);
  return r;
}

int PostRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  const ibv_recv_wr* b = nullptr;
  int r = VerbsQp::From(qp)->core->PostRecv(wr, &b);
  if (r && bad) *bad = const_cast<ibv_recv_wr*>(b);
  return r;
}

}  // namespace softrdma::abi

SOFTRDMA_EXPORT ibv_qp* ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* attr) {
  if (!pd || !attr) return Fail<ibv_qp>(EINVAL);
  ibv_qp_init_attr_ex ex{};
  ex.qp_context = attr->qp_context;
  ex.send_cq = attr->send_cq;
  ex.recv_cq = attr->recv_cq;
  ex.srq = attr->srq;
  ex.cap = attr->cap;
  ex.qp_type = attr->qp_type;
  ex.sq_sig_all = attr->sq_sig_all;
  ex.comp_mask = IBV_QP_INIT_ATTR_PD;
  ex.pd = pd;
  ibv_qp* qp = CreateQpEx(pd->context, &ex);
  if (qp) attr->cap = ex.cap;
  return qp;
}

SOFTRDMA_EXPORT ibv_qp_ex* ibv_qp_to_qp_ex(ibv_qp* qp) {
  if (!qp) return nullptr;
  VerbsQp* q = VerbsQp::From(qp);
  return q->extended ? &q->ibv : nullptr;
}

SOFTRDMA_EXPORT int ibv_modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask) {
  if (!qp || !attr) return EINVAL;
  return VerbsQp::From(qp)->core->Modify(*attr, attr_mask);
}

SOFTRDMA_EXPORT int ibv_query_qp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask,
                                 ibv_qp_init_attr* init_attr) {
  if (!qp || !attr) return EINVAL;
  return VerbsQp::From(qp)->core->Query(attr, attr_mask, init_attr);
}

SOFTRDMA_EXPORT int ibv_destroy_qp(ibv_qp* qp) {
  if (!qp) return EINVAL;
  VerbsQp* q = VerbsQp::From(qp);
  // An XRC target goes only with its last handle, here and in every process (ibv_open_qp(3)).
  if (!q->xrcd || CoreOf(qp->context).hca().CloseTarget(*q->core))
    q->core->Shutdown();
  else
    q->core->ForgetUserHandle(qp);
  CoreOf(qp->context).async_events().Purge([qp](const ibv_async_event& e) {
    switch (e.event_type) {
      case IBV_EVENT_CQ_ERR:
      case IBV_EVENT_SRQ_ERR:
      case IBV_EVENT_SRQ_LIMIT_REACHED:
      case IBV_EVENT_PORT_ACTIVE:
      case IBV_EVENT_PORT_ERR:
      case IBV_EVENT_DEVICE_FATAL:
        return false;
      default:
        return e.element.qp == qp;
    }
  });
  if (qp->pd) --VerbsPd::From(qp->pd)->users;
  if (qp->send_cq) --VerbsCq::From(qp->send_cq)->users;
  if (qp->recv_cq) --VerbsCq::From(qp->recv_cq)->users;
  if (qp->srq) --VerbsSrq::From(qp->srq)->users;
  if (q->xrcd) --q->xrcd->users;
  pthread_mutex_destroy(&qp->mutex);
  pthread_cond_destroy(&qp->cond);
  delete q;
  return 0;
}

SOFTRDMA_EXPORT int ibv_query_qp_data_in_order(ibv_qp* qp, ibv_wr_opcode /*op*/, uint32_t flags) {
  // Every link delivers a message's bytes in order, and the responder places them in order.
  if (!qp || flags) return 0;
  return 1;
}

SOFTRDMA_EXPORT int ibv_query_ece(ibv_qp*, ibv_ece*) {
  return EOPNOTSUPP;
}
SOFTRDMA_EXPORT int ibv_set_ece(ibv_qp*, ibv_ece*) {
  return EOPNOTSUPP;
}

// ---- ibv_qp_ex builders: collect the WRs of one wr_start..wr_complete batch, post them as one
// chain so the batch is accepted or refused as a whole.
struct VerbsQp::Builder {
  struct Item {
    ibv_send_wr wr;
    std::vector<ibv_sge> sges;
    std::vector<uint8_t> inline_data;
  };
  std::vector<Item> items;
  int error = 0;
};

namespace {

VerbsQp* Q(ibv_qp_ex* q) {
  return VerbsQp::From(q);
}

VerbsQp::Builder::Item* Last(ibv_qp_ex* q) {
  auto& b = *Q(q)->builder;
  return b.items.empty() ? nullptr : &b.items.back();
}

ibv_send_wr* NewWr(ibv_qp_ex* q, ibv_wr_opcode op) {
  auto& b = *Q(q)->builder;
  b.items.emplace_back();
  ibv_send_wr& wr = b.items.back().wr;
  wr = ibv_send_wr{};
  wr.wr_id = q->wr_id;
  wr.send_flags = q->wr_flags;
  wr.opcode = op;
  return &wr;
}

void WrStart(ibv_qp_ex* q) {
  auto& b = Q(q)->builder;
  if (!b) b = std::make_unique<VerbsQp::Builder>();
  b->items.clear();
  b->error = 0;
}

int WrComplete(ibv_qp_ex* q) {
  auto& b = *Q(q)->builder;
  if (b.error) {
    int e = b.error;
    b.items.clear();
    return e;
  }
  if (b.items.empty()) return 0;
  for (size_t i = 0; i < b.items.size(); ++i) {
    auto& it = b.items[i];
    if (!it.inline_data.empty()) {
      it.sges.assign(1, ibv_sge{reinterpret_cast<uintptr_t>(it.inline_data.data()),
                                static_cast<uint32_t>(it.inline_data.size()), 0});
      it.wr.send_flags |= IBV_SEND_INLINE;
    }
    it.wr.sg_list = it.sges.empty() ? nullptr : it.sges.data();
    it.wr.num_sge = static_cast<int>(it.sges.size());
    it.wr.next = i + 1 < b.items.size() ? &b.items[i + 1].wr : nullptr;
  }
  const ibv_send_wr* bad = nullptr;
  int r = Q(q)->core->PostSend(&b.items[0].wr, &bad, /*whole_batch=*/true);
  b.items.clear();
  return r;
}

void WrAbort(ibv_qp_ex* q) {
  if (Q(q)->builder) Q(q)->builder->items.clear();
}

void WrSend(ibv_qp_ex* q) {
  NewWr(q, IBV_WR_SEND);
}
void WrSendImm(ibv_qp_ex* q, __be32 imm) {
  NewWr(q, IBV_WR_SEND_WITH_IMM)->imm_data = imm;
}
void WrSendInv(ibv_qp_ex* q, uint32_t rkey) {
  NewWr(q, IBV_WR_SEND_WITH_INV)->invalidate_rkey = rkey;
}
void WrRdmaWrite(ibv_qp_ex* q, uint32_t rkey, uint64_t addr) {
  ibv_send_wr* wr = NewWr(q, IBV_WR_RDMA_WRITE);
  wr->wr.rdma.rkey = rkey;
  wr->wr.rdma.remote_addr = addr;
}
void WrRdmaWriteImm(ibv_qp_ex* q, uint32_t rkey, uint64_t addr, __be32 imm) {
  ibv_send_wr* wr = NewWr(q, IBV_WR_RDMA_WRITE_WITH_IMM);
  wr->wr.rdma.rkey = rkey;
  wr->wr.rdma.remote_addr = addr;
  wr->imm_data = imm;
}
void WrRdmaRead(ibv_qp_ex* q, uint32_t rkey, uint64_t addr) {
  ibv_send_wr* wr = NewWr(q, IBV_WR_RDMA_READ);
  wr->wr.rdma.rkey = rkey;
  wr->wr.rdma.remote_addr = addr;
}
void WrCmpSwp(ibv_qp_ex* q, uint32_t rkey, uint64_t addr, uint64_t compare, uint64_t swap) {
  ibv_send_wr* wr = NewWr(q, IBV_WR_ATOMIC_CMP_AND_SWP);
  wr->wr.atomic.rkey = rkey;
  wr->wr.atomic.remote_addr = addr;
  wr->wr.atomic.compare_add = compare;
  wr->wr.atomic.swap = swap;
}
void WrFetchAdd(ibv_qp_ex* q, uint32_t rkey, uint64_t addr, uint64_t add) {
  ibv_send_wr* wr = NewWr(q, IBV_WR_ATOMIC_FETCH_AND_ADD);
  wr->wr.atomic.rkey = rkey;
  wr->wr.atomic.remote_addr = addr;
  wr->wr.atomic.compare_add = add;
}
void WrUnsupported(ibv_qp_ex* q) {
  if (Q(q)->builder) Q(q)->builder->error = EOPNOTSUPP;
}
void WrBindMw(ibv_qp_ex* q, ibv_mw* mw, uint32_t rkey, const ibv_mw_bind_info* info) {
  ibv_send_wr* wr = NewWr(q, IBV_WR_BIND_MW);
  wr->bind_mw.mw = mw;
  wr->bind_mw.rkey = rkey;
  if (info) wr->bind_mw.bind_info = *info;
}
void WrLocalInv(ibv_qp_ex* q, uint32_t rkey) {
  NewWr(q, IBV_WR_LOCAL_INV)->invalidate_rkey = rkey;
}
void WrSendTso(ibv_qp_ex* q, void*, uint16_t, uint16_t) {
  WrUnsupported(q);
}
void WrAtomicWrite(ibv_qp_ex* q, uint32_t, uint64_t, const void*) {
  WrUnsupported(q);
}
void WrSetXrcSrqn(ibv_qp_ex* q, uint32_t remote_srqn) {
  if (q->qp_base.qp_type != IBV_QPT_XRC_SEND) return WrUnsupported(q);
  if (auto* it = Last(q)) it->wr.qp_type.xrc.remote_srqn = remote_srqn;
}

void WrSetUdAddr(ibv_qp_ex* q, ibv_ah* ah, uint32_t qpn, uint32_t qkey) {
  if (auto* it = Last(q)) {
    it->wr.wr.ud.ah = ah;
    it->wr.wr.ud.remote_qpn = qpn;
    it->wr.wr.ud.remote_qkey = qkey;
  }
}
void WrSetSge(ibv_qp_ex* q, uint32_t lkey, uint64_t addr, uint32_t length) {
  if (auto* it = Last(q)) it->sges.assign(1, ibv_sge{addr, length, lkey});
}
void WrSetSgeList(ibv_qp_ex* q, size_t n, const ibv_sge* list) {
  if (auto* it = Last(q)) it->sges.assign(list, list + n);
}
void WrSetInlineData(ibv_qp_ex* q, void* addr, size_t length) {
  if (auto* it = Last(q)) {
    auto* p = static_cast<uint8_t*>(addr);
    it->inline_data.assign(p, p + length);
  }
}
void WrSetInlineDataList(ibv_qp_ex* q, size_t n, const ibv_data_buf* bufs) {
  if (auto* it = Last(q)) {
    it->inline_data.clear();
    for (size_t i = 0; i < n; ++i) {
      auto* p = static_cast<uint8_t*>(bufs[i].addr);
      it->inline_data.insert(it->inline_data.end(), p, p + bufs[i].length);
    }
  }
}

}  // namespace

namespace softrdma::abi {
void InstallQpExOps(ibv_qp_ex* q, uint64_t /*send_ops_flags*/) {
  // Every builder is set, whatever send_ops_flags said: a builder the QP type cannot execute
  // makes wr_complete fail instead of jumping through a null pointer.
  q->wr_start = WrStart;
  q->wr_complete = WrComplete;
  q->wr_abort = WrAbort;
  q->wr_send = WrSend;
  q->wr_send_imm = WrSendImm;
  q->wr_send_inv = WrSendInv;
  q->wr_send_tso = WrSendTso;
  q->wr_rdma_write = WrRdmaWrite;
  q->wr_rdma_write_imm = WrRdmaWriteImm;
  q->wr_rdma_read = WrRdmaRead;
  q->wr_atomic_cmp_swp = WrCmpSwp;
  q->wr_atomic_fetch_add = WrFetchAdd;
  q->wr_bind_mw = WrBindMw;
  q->wr_local_inv = WrLocalInv;
  q->wr_atomic_write = WrAtomicWrite;
  q->wr_set_ud_addr = WrSetUdAddr;
  q->wr_set_xrc_srqn = WrSetXrcSrqn;
  q->wr_set_inline_data = WrSetInlineData;
  q->wr_set_inline_data_list = WrSetInlineDataList;
  q->wr_set_sge = WrSetSge;
  q->wr_set_sge_list = WrSetSgeList;
  q->comp_mask = 0;
}
}  // namespace softrdma::abi
