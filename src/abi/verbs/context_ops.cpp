// The function tables inline code in <infiniband/verbs.h> jumps through. Ops called blindly are
// always set; optional ops left null make the inline wrappers return EOPNOTSUPP.
#include <cerrno>

#include "abi/verbs/objects.h"

#undef ibv_query_port
struct _compat_ibv_port_attr;
extern "C" int ibv_query_port(ibv_context*, uint8_t, _compat_ibv_port_attr*);

namespace softrdma::abi {
namespace {

ibv_mw* AllocMw(ibv_pd* pd, ibv_mw_type type) {
  if (!pd || (type != IBV_MW_TYPE_1 && type != IBV_MW_TYPE_2)) return Fail<ibv_mw>(EINVAL);
  VerbsPd* p = VerbsPd::From(pd);
  auto* mw = new VerbsMw{};
  mw->ibv.context = pd->context;
  mw->ibv.pd = pd;
  mw->ibv.type = type;
  mw->ibv.rkey = CoreOf(pd->context).hca().mrs().AllocMw(&p->core, type == IBV_MW_TYPE_1 ? 1 : 2);
  mw->ibv.handle = mw->ibv.rkey >> 8;
  ++p->users;
  return &mw->ibv;
}

int DeallocMw(ibv_mw* mw) {
  if (!mw) return EINVAL;
  CoreOf(mw->context).hca().mrs().FreeMw(mw->handle << 8);
  --VerbsPd::From(mw->pd)->users;
  delete VerbsMw::From(mw);
  return 0;
}

// ibv_bind_mw(3): a type 1 bind is a work request on `qp`; the new key is in mw->rkey at once.
// (The inline wrapper has checked the type and the region's PD.)
int BindMw(ibv_qp* qp, ibv_mw* mw, ibv_mw_bind* mb) {
  if (!qp || !mw || !mb) return EINVAL;
  ibv_send_wr wr{};
  wr.wr_id = mb->wr_id;
  wr.opcode = IBV_WR_BIND_MW;
  wr.send_flags = mb->send_flags;
  wr.bind_mw.mw = mw;
  wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
  wr.bind_mw.bind_info = mb->bind_info;
  const ibv_send_wr* bad = nullptr;
  int r = VerbsQp::From(qp)->core->PostSend(&wr, &bad, false, /*type1_bind=*/true);
  if (r == 0) mw->rkey = wr.bind_mw.rkey;
  return r;
}

}  // namespace

void InstallContextOps(verbs_context* vctx) {
  ibv_context_ops& ops = vctx->context.ops;
  ops._compat_query_device = ibv_query_device;
  ops._compat_query_port = ibv_query_port;
  ops.poll_cq = PollCq;
  ops.req_notify_cq = ReqNotifyCq;
  ops.post_send = PostSend;
  ops.post_recv = PostRecv;
  ops.post_srq_recv = PostSrqRecv;
  ops.alloc_mw = AllocMw;
  ops.bind_mw = BindMw;
  ops.dealloc_mw = DeallocMw;
  vctx->query_port = QueryPortEx;
  vctx->query_device_ex = QueryDeviceEx;
  vctx->advise_mr = AdviseMr;
  vctx->alloc_dm = AllocDm;
  vctx->free_dm = FreeDm;
  vctx->reg_dm_mr = RegDmMr;
  vctx->create_cq_ex = CreateCqEx;
  vctx->create_qp_ex = CreateQpEx;
  vctx->open_qp = OpenQp;
  vctx->create_srq_ex = CreateSrqEx;
  vctx->get_srq_num = GetSrqNum;
  vctx->open_xrcd = OpenXrcd;
  vctx->close_xrcd = CloseXrcd;
}

}  // namespace softrdma::abi
