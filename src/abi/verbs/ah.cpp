// Address handles and multicast attachment.
#include <arpa/inet.h>

#include <cerrno>
#include <cstring>

#include "abi/export.h"
#include "abi/verbs/objects.h"
#include "core/limits.h"

using namespace softrdma;
using namespace softrdma::abi;

SOFTRDMA_EXPORT ibv_ah* ibv_create_ah(ibv_pd* pd, ibv_ah_attr* attr) {
  if (!pd || !attr) return Fail<ibv_ah>(EINVAL);
  core::Hca& hca = CoreOf(pd->context).hca();
  if (attr->port_num != 0 && attr->port_num != core::kPortNum) return Fail<ibv_ah>(EINVAL);
  if (attr->is_global && attr->grh.sgid_index >= hca.gids().size()) return Fail<ibv_ah>(EINVAL);
  auto* ah = new Ah{};
  ah->ibv.context = pd->context;
  ah->ibv.pd = pd;
  ah->pd = &VerbsPd::From(pd)->core;
  ah->av.attr = *attr;
  // A destination nobody answers for still gets a handle: UD sends to it are simply lost.
  // Multicast destinations are resolved per send, to the group's members (core/multicast.h).
  if (!(attr->is_global && core::IsMulticastGid(attr->grh.dgid))) {
    ah->av.channel = hca.Resolve(*attr, 0, /*datagram=*/true);
  }
  ++VerbsPd::From(pd)->users;
  return &ah->ibv;
}

SOFTRDMA_EXPORT int ibv_destroy_ah(ibv_ah* ah) {
  if (!ah) return EINVAL;
  --VerbsPd::From(ah->pd)->users;
  delete const_cast<Ah*>(Ah::From(ah));
  return 0;
}

SOFTRDMA_EXPORT int ibv_init_ah_from_wc(ibv_context* context, uint8_t port_num, ibv_wc* wc,
                                        ibv_grh* grh, ibv_ah_attr* ah_attr) {
  if (!context || !wc || !ah_attr) {
    errno = EINVAL;
    return -1;
  }
  *ah_attr = ibv_ah_attr{};
  ah_attr->dlid = static_cast<uint16_t>(wc->slid);
  ah_attr->sl = wc->sl;
  ah_attr->src_path_bits = wc->dlid_path_bits;
  ah_attr->port_num = port_num;
  if (wc->wc_flags & IBV_WC_GRH) {
    if (!grh) {
      errno = EINVAL;
      return -1;
    }
    ah_attr->is_global = 1;
    std::memcpy(ah_attr->grh.dgid.raw, grh->sgid.raw, 16);
    uint32_t vtf = ntohl(grh->version_tclass_flow);
    ah_attr->grh.flow_label = vtf & 0xfffff;
    ah_attr->grh.traffic_class = static_cast<uint8_t>(vtf >> 20);
    ah_attr->grh.hop_limit = 0xff;
    // Answer from the GID the request was sent to; a sender that did not know ours used index 0.
    const auto& gids = CoreOf(context).hca().gids();
    for (size_t i = 0; i < gids.size(); ++i)
      if (std::memcmp(gids[i].raw, grh->dgid.raw, 16) == 0)
        ah_attr->grh.sgid_index = static_cast<uint8_t>(i);
  }
  return 0;
}

SOFTRDMA_EXPORT ibv_ah* ibv_create_ah_from_wc(ibv_pd* pd, ibv_wc* wc, ibv_grh* grh,
                                              uint8_t port_num) {
  if (!pd) return Fail<ibv_ah>(EINVAL);
  ibv_ah_attr attr;
  if (ibv_init_ah_from_wc(pd->context, port_num, wc, grh, &attr)) return nullptr;
  return ibv_create_ah(pd, &attr);
}

// A UD QP joins a multicast group of the host (core/multicast.h); other QP types cannot.
SOFTRDMA_EXPORT int ibv_attach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t /*lid*/) {
  if (!qp || !gid || qp->qp_type != IBV_QPT_UD) return EINVAL;
  return CoreOf(qp->context).hca().mcast().Attach(*gid, qp->qp_num);
}

SOFTRDMA_EXPORT int ibv_detach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t /*lid*/) {
  if (!qp || !gid || qp->qp_type != IBV_QPT_UD) return EINVAL;
  return CoreOf(qp->context).hca().mcast().Detach(*gid, qp->qp_num);
}
