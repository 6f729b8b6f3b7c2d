// Shared receive queues.
#include <cerrno>

#include "abi/export.h"
#include "abi/verbs/objects.h"
#include "core/limits.h"

using namespace softrdma;
using namespace softrdma::abi;

namespace softrdma::abi {

ibv_srq* CreateSrqEx(ibv_context* ctx, ibv_srq_init_attr_ex* a) {
  if (!ctx || !a) return Fail<ibv_srq>(EINVAL);
  constexpr uint32_t kMask =
      IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
  if (a->comp_mask & ~kMask) return Fail<ibv_srq>(EOPNOTSUPP);
  ibv_srq_type type = (a->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) ? a->srq_type : IBV_SRQT_BASIC;
  if (type != IBV_SRQT_BASIC && type != IBV_SRQT_XRC) return Fail<ibv_srq>(EOPNOTSUPP);
  if (!(a->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !a->pd) return Fail<ibv_srq>(EINVAL);
  // An XRC SRQ names its domain and the CQ of its receive completions (it has no QP of its own).
  bool xrc = type == IBV_SRQT_XRC;
  if (xrc && (!(a->comp_mask & IBV_SRQ_INIT_ATTR_XRCD) || !a->xrcd ||
              !(a->comp_mask & IBV_SRQ_INIT_ATTR_CQ) || !a->cq))
    return Fail<ibv_srq>(EINVAL);
  if (a->attr.max_wr < 1 || a->attr.max_wr > core::kMaxSrqWr || a->attr.max_sge > core::kMaxSge)
    return Fail<ibv_srq>(EINVAL);
  auto* srq = new VerbsSrq{};
  VerbsPd* pd = VerbsPd::From(a->pd);
  srq->core = std::make_unique<core::Srq>(CoreOf(ctx), &pd->core, a->attr.max_wr,
                                          a->attr.max_sge ? a->attr.max_sge : 1, &srq->ibv);
  if (xrc) {
    core::Hca& hca = CoreOf(ctx).hca();
    srq->xrcd = VerbsXrcd::From(a->xrcd);
    srq->cq = VerbsCq::From(a->cq);
    if (hca.xrc().AddSrq(hca.lid(), srq->core.get(), srq->xrcd->core, srq->cq->core.get()) == 0) {
      delete srq;
      return Fail<ibv_srq>(ENOMEM);
    }
    ++srq->xrcd->users;
    ++srq->cq->users;
  }
  ibv_srq& s = srq->ibv;
  s.context = ctx;
  s.srq_context = a->srq_context;
  s.pd = a->pd;
  pthread_mutex_init(&s.mutex, nullptr);
  pthread_cond_init(&s.cond, nullptr);
  ++pd->users;
  return &s;
}

int GetSrqNum(ibv_srq* srq, uint32_t* srq_num) {
  if (!srq || !srq_num) return EINVAL;
  uint32_t n = VerbsSrq::From(srq)->core->srqn();
  if (n == 0) return EINVAL;  // only XRC SRQs are named by number
  *srq_num = n;
  return 0;
}

int PostSrqRecv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  const ibv_recv_wr* b = nullptr;
  int r = VerbsSrq::From(srq)->core->PostAndOffer(wr, &b);
  if (r && bad) *bad = const_cast<ibv_recv_wr*>(b);
  return r;
}

}  // namespace softrdma::abi

SOFTRDMA_EXPORT ibv_srq* ibv_create_srq(ibv_pd* pd, ibv_srq_init_attr* attr) {
  if (!pd || !attr) return Fail<ibv_srq>(EINVAL);
  ibv_srq_init_attr_ex ex{};
  ex.srq_context = attr->srq_context;
  ex.attr = attr->attr;
  ex.comp_mask = IBV_SRQ_INIT_ATTR_PD;
  ex.pd = pd;
  return CreateSrqEx(pd->context, &ex);
}

SOFTRDMA_EXPORT int ibv_modify_srq(ibv_srq* srq, ibv_srq_attr* attr, int mask) {
  if (!srq || !attr) return EINVAL;
  return VerbsSrq::From(srq)->core->Modify(*attr, mask);
}

SOFTRDMA_EXPORT int ibv_query_srq(ibv_srq* srq, ibv_srq_attr* attr) {
  if (!srq || !attr) return EINVAL;
  VerbsSrq::From(srq)->core->Query(attr);
  return 0;
}

SOFTRDMA_EXPORT int ibv_destroy_srq(ibv_srq* srq) {
  if (!srq) return EINVAL;
  VerbsSrq* s = VerbsSrq::From(srq);
  if (s->users.load() > 0) return EBUSY;
  CoreOf(srq->context).async_events().Purge([srq](const ibv_async_event& e) {
    return (e.event_type == IBV_EVENT_SRQ_LIMIT_REACHED || e.event_type == IBV_EVENT_SRQ_ERR) &&
           e.element.srq == srq;
  });
  if (s->core->srqn() != 0) {
    CoreOf(srq->context).hca().xrc().RemoveSrq(s->core->srqn());
    --s->xrcd->users;
    --s->cq->users;
  }
  --VerbsPd::From(srq->pd)->users;
  pthread_mutex_destroy(&srq->mutex);
  pthread_cond_destroy(&srq->cond);
  delete s;
  return 0;
}
