// The function tables inline code in <infiniband/verbs.h> jumps through. Ops called blindly are
// always set; optional ops left null make the inline wrappers return EOPNOTSUPP.
#include <cerrno>

#include "abi/verbs/objects.h"

#undef ibv_query_port
struct _compat_ibv_port_attr;
extern "C" int ibv_query_port(ibv_context*, uint8_t, _compat_ibv_port_attr*);

namespace softrdma::abi {
namespace {

int BindMw(ibv_qp*, ibv_mw*, ibv_mw_bind*) {
  return EOPNOTSUPP;
}
int DeallocMw(ibv_mw*) {
  return EOPNOTSUPP;
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
  ops.bind_mw = BindMw;
  ops.dealloc_mw = DeallocMw;
  vctx->query_port = QueryPortEx;
  vctx->query_device_ex = QueryDeviceEx;
  vctx->create_cq_ex = CreateCqEx;
  vctx->create_qp_ex = CreateQpEx;
  vctx->create_srq_ex = CreateSrqEx;
}

}  // namespace softrdma::abi
