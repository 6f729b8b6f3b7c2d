// The OFED 1.5 legacy XRC API (include/infiniband/ofed_xrc.h) as a thin layer on today's XRC:
// a domain is an ibv_xrcd, an XRC SRQ an ibv_create_srq_ex of type XRC, the receive QP an
// XRC_RECV QP, and a registration one handle on it (the creator's from ibv_create_qp_ex, each
// other's from ibv_open_qp), which the core keeps alive across processes (core/xrc_targets.h).
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "abi/export.h"
#include "abi/verbs/objects.h"
#include "infiniband/ofed_xrc.h"

using namespace softrdma::abi;

static_assert(offsetof(ibv_xrc_qp_init_attr, sq_sig_all) ==
                  offsetof(ibv_qp_init_attr, sq_sig_all) &&
              offsetof(ibv_xrc_qp_init_attr, xrc_domain) >= sizeof(ibv_qp_init_attr));

namespace {

struct LegacyDomain {
  ibv_xrc_domain pub;  // first: the handle converts back with one cast
  ibv_xrcd* xrcd;
  static LegacyDomain* From(ibv_xrc_domain* d) { return reinterpret_cast<LegacyDomain*>(d); }
};

// This process's registrations: (domain, receive QP number) -> its handle. The legacy calls name a
// QP by number, and a process holds at most one registration per QP.
std::mutex g_mu;
std::map<std::pair<ibv_xrc_domain*, uint32_t>, ibv_qp*>& Registrations() {
  static auto* m = new std::map<std::pair<ibv_xrc_domain*, uint32_t>, ibv_qp*>();
  return *m;
}

ibv_qp* Registered(ibv_xrc_domain* d, uint32_t qpn) {
  auto it = Registrations().find({d, qpn});
  return it == Registrations().end() ? nullptr : it->second;
}

// A handle for one call on a QP this process is not registered for (any process of the domain
// may modify or query it, as with the kernel's QP).
ibv_qp* OpenFor(ibv_xrc_domain* d, uint32_t qpn, int* err) {
  ibv_qp_open_attr a{};
  a.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
  a.qp_num = qpn;
  a.xrcd = LegacyDomain::From(d)->xrcd;
  a.qp_type = IBV_QPT_XRC_RECV;
  ibv_qp* qp = OpenQp(d->context, &a);
  if (!qp) *err = errno;
  return qp;
}

}  // namespace

SOFTRDMA_EXPORT ibv_xrc_domain* ibv_open_xrc_domain(ibv_context* context, int fd, int oflag) {
  if (!context) return Fail<ibv_xrc_domain>(EINVAL);
  ibv_xrcd_init_attr a{};
  a.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
  a.fd = fd;
  a.oflags = oflag;
  ibv_xrcd* x = OpenXrcd(context, &a);
  if (!x) return nullptr;
  auto* d = new LegacyDomain{};
  d->pub.context = context;
  d->pub.handle = VerbsXrcd::From(x)->core->id;
  d->xrcd = x;
  return &d->pub;
}

SOFTRDMA_EXPORT int ibv_close_xrc_domain(ibv_xrc_domain* d) {
  if (!d) return EINVAL;
  LegacyDomain* ld = LegacyDomain::From(d);
  if (int r = CloseXrcd(ld->xrcd)) return r;  // EBUSY while its SRQs and QPs exist
  delete ld;
  return 0;
}

SOFTRDMA_EXPORT ibv_srq* ibv_create_xrc_srq(ibv_pd* pd, ibv_xrc_domain* d, ibv_cq* xrc_cq,
                                            ibv_srq_init_attr* init) {
  if (!pd || !d || !xrc_cq || !init) return Fail<ibv_srq>(EINVAL);
  ibv_srq_init_attr_ex ex{};
  ex.srq_context = init->srq_context;
  ex.attr = init->attr;
  ex.comp_mask =
      IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
  ex.srq_type = IBV_SRQT_XRC;
  ex.pd = pd;
  ex.xrcd = LegacyDomain::From(d)->xrcd;
  ex.cq = xrc_cq;
  ibv_srq* srq = CreateSrqEx(pd->context, &ex);
  if (srq) init->attr = ex.attr;
  return srq;
}

SOFTRDMA_EXPORT uint32_t ibv_xrc_srq_num(ibv_srq* srq) {
  uint32_t n = 0;
  if (!srq || GetSrqNum(srq, &n) != 0) return 0;
  return n;
}

SOFTRDMA_EXPORT ibv_qp* ibv_create_xrc_qp(ibv_pd* pd, ibv_xrc_qp_init_attr* attr) {
  if (!pd || !attr) return Fail<ibv_qp>(EINVAL);
  // The send QP needs no domain today (its SRQs are named per work request): the attributes
  // before xrc_domain are today's ibv_qp_init_attr.
  ibv_qp_init_attr a;
  std::memcpy(&a, attr, sizeof a);
  ibv_qp* qp = ibv_create_qp(pd, &a);
  if (qp) attr->cap = a.cap;
  return qp;
}

SOFTRDMA_EXPORT int ibv_create_xrc_rcv_qp(ibv_xrc_qp_init_attr* init, uint32_t* xrc_rcv_qpn) {
  if (!init || !init->xrc_domain || !xrc_rcv_qpn) return EINVAL;
  ibv_xrc_domain* d = init->xrc_domain;
  ibv_qp_init_attr_ex ex{};
  ex.qp_type = IBV_QPT_XRC_RECV;
  ex.comp_mask = IBV_QP_INIT_ATTR_XRCD;
  ex.xrcd = LegacyDomain::From(d)->xrcd;
  ibv_qp* qp = CreateQpEx(d->context, &ex);
  if (!qp) return errno;
  std::lock_guard<std::mutex> g(g_mu);
  Registrations()[{d, qp->qp_num}] = qp;
  *xrc_rcv_qpn = qp->qp_num;
  return 0;
}

SOFTRDMA_EXPORT int ibv_modify_xrc_rcv_qp(ibv_xrc_domain* d, uint32_t qpn, ibv_qp_attr* attr,
                                          int attr_mask) {
  if (!d || !attr) return EINVAL;
  std::lock_guard<std::mutex> g(g_mu);
  if (ibv_qp* qp = Registered(d, qpn)) return ibv_modify_qp(qp, attr, attr_mask);
  int err = 0;
  ibv_qp* qp = OpenFor(d, qpn, &err);
  if (!qp) return err;
  int r = ibv_modify_qp(qp, attr, attr_mask);
  ibv_destroy_qp(qp);
  return r;
}

SOFTRDMA_EXPORT int ibv_query_xrc_rcv_qp(ibv_xrc_domain* d, uint32_t qpn, ibv_qp_attr* attr,
                                         int attr_mask, ibv_qp_init_attr* init) {
  if (!d || !attr) return EINVAL;
  std::lock_guard<std::mutex> g(g_mu);
  if (ibv_qp* qp = Registered(d, qpn)) return ibv_query_qp(qp, attr, attr_mask, init);
  int err = 0;
  ibv_qp* qp = OpenFor(d, qpn, &err);
  if (!qp) return err;
  int r = ibv_query_qp(qp, attr, attr_mask, init);
  ibv_destroy_qp(qp);
  return r;
}

SOFTRDMA_EXPORT int ibv_reg_xrc_rcv_qp(ibv_xrc_domain* d, uint32_t qpn) {
  if (!d) return EINVAL;
  std::lock_guard<std::mutex> g(g_mu);
  if (Registered(d, qpn)) return 0;  // registered already: one registration per process
  int err = 0;
  ibv_qp* qp = OpenFor(d, qpn, &err);
  if (!qp) return err;
  Registrations()[{d, qpn}] = qp;
  return 0;
}

SOFTRDMA_EXPORT int ibv_unreg_xrc_rcv_qp(ibv_xrc_domain* d, uint32_t qpn) {
  if (!d) return EINVAL;
  std::lock_guard<std::mutex> g(g_mu);
  ibv_qp* qp = Registered(d, qpn);
  if (!qp) return EINVAL;
  Registrations().erase({d, qpn});
  return ibv_destroy_qp(qp);
}
