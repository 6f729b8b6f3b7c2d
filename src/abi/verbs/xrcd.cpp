// XRC domains (ibv_open_xrcd / ibv_close_xrcd; both are inline in verbs.h and reach us through
// the context's ops).
#include <cerrno>

#include "abi/verbs/objects.h"

namespace softrdma::abi {

ibv_xrcd* OpenXrcd(ibv_context* ctx, ibv_xrcd_init_attr* a) {
  if (!ctx || !a) return Fail<ibv_xrcd>(EINVAL);
  if (a->comp_mask >= IBV_XRCD_INIT_ATTR_RESERVED) return Fail<ibv_xrcd>(EOPNOTSUPP);
  // As rdma-core's command layer: the file and the flags are both required.
  if (!(a->comp_mask & IBV_XRCD_INIT_ATTR_FD) || !(a->comp_mask & IBV_XRCD_INIT_ATTR_OFLAGS))
    return Fail<ibv_xrcd>(EINVAL);
  int err = 0;
  std::shared_ptr<core::Xrcd> d = CoreOf(ctx).hca().xrc().Open(a->fd, a->oflags, &err);
  if (!d) return Fail<ibv_xrcd>(err);
  auto* x = new VerbsXrcd{};
  x->ibv.context = ctx;
  x->core = std::move(d);
  return &x->ibv;
}

int CloseXrcd(ibv_xrcd* xrcd) {
  if (!xrcd) return EINVAL;
  VerbsXrcd* x = VerbsXrcd::From(xrcd);
  if (x->users.load() > 0) return EBUSY;
  delete x;
  return 0;
}

}  // namespace softrdma::abi
