// librdmacm.so.1: the rdma_* entry points. Argument checks and translation only; the behaviour is
// in src/cm. Failures return -1 with errno set, as rdma-core's do.
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "abi/export.h"
#include "cm/addrinfo.h"
#include "cm/cm.h"

using softrdma::cm::Cm;
using softrdma::cm::CmId;
using softrdma::cm::ToChannel;
using softrdma::cm::ToId;

namespace {

int Result(int err) {
  if (err == 0) return 0;
  errno = err;
  return -1;
}

ibv_qp_type DefaultQpType(rdma_port_space ps) {
  return ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB ? IBV_QPT_UD : IBV_QPT_RC;
}

}  // namespace

SOFTRDMA_EXPORT rdma_event_channel* rdma_create_event_channel(void) {
  auto* c = Cm::Get().CreateChannel();
  return c ? &c->pub : nullptr;
}

SOFTRDMA_EXPORT void rdma_destroy_event_channel(rdma_event_channel* channel) {
  if (channel) Cm::Get().DestroyChannel(ToChannel(channel));
}

SOFTRDMA_EXPORT int rdma_create_id(rdma_event_channel* channel, rdma_cm_id** id, void* context,
                                   rdma_port_space ps) {
  CmId* out = nullptr;
  int err = Cm::Get().CreateId(channel ? ToChannel(channel) : nullptr, &out, context, ps,
                               DefaultQpType(ps));
  if (!err) *id = &out->pub;
  return Result(err);
}

SOFTRDMA_EXPORT int rdma_destroy_id(rdma_cm_id* id) {
  if (!id) return Result(EINVAL);
  return Result(Cm::Get().DestroyId(ToId(id)));
}

SOFTRDMA_EXPORT int rdma_bind_addr(rdma_cm_id* id, sockaddr* addr) {
  if (!id) return Result(EINVAL);
  return Result(Cm::Get().BindAddr(ToId(id), addr));
}

SOFTRDMA_EXPORT int rdma_resolve_addr(rdma_cm_id* id, sockaddr* src_addr, sockaddr* dst_addr,
                                      int timeout_ms) {
  if (!id) return Result(EINVAL);
  return Result(Cm::Get().ResolveAddr(ToId(id), src_addr, dst_addr, timeout_ms));
}

SOFTRDMA_EXPORT int rdma_resolve_route(rdma_cm_id* id, int timeout_ms) {
  if (!id) return Result(EINVAL);
  return Result(Cm::Get().ResolveRoute(ToId(id), timeout_ms));
}

SOFTRDMA_EXPORT int rdma_create_qp_ex(rdma_cm_id* id, ibv_qp_init_attr_ex* qp_init_attr) {
  if (!id || !qp_init_attr) return Result(EINVAL);
  return Result(Cm::Get().CreateQp(ToId(id), qp_init_attr));
}

SOFTRDMA_EXPORT int rdma_create_qp(rdma_cm_id* id, ibv_pd* pd, ibv_qp_init_attr* qp_init_attr) {
  if (!id || !qp_init_attr) return Result(EINVAL);
  ibv_qp_init_attr_ex ex{};
  std::memcpy(&ex, qp_init_attr, sizeof *qp_init_attr);
  ex.comp_mask = IBV_QP_INIT_ATTR_PD;
  ex.pd = pd;
  int err = Cm::Get().CreateQp(ToId(id), &ex);
  if (!err) std::memcpy(qp_init_attr, &ex, sizeof *qp_init_attr);
  return Result(err);
}

SOFTRDMA_EXPORT void rdma_destroy_qp(rdma_cm_id* id) {
  if (id) Cm::Get().DestroyQp(ToId(id));
}

SOFTRDMA_EXPORT int rdma_create_srq_ex(rdma_cm_id* id, ibv_srq_init_attr_ex* attr) {
  if (!id || !attr) return Result(EINVAL);
  return Result(Cm::Get().CreateSrq(ToId(id), attr));
}

SOFTRDMA_EXPORT int rdma_create_srq(rdma_cm_id* id, ibv_pd* pd, ibv_srq_init_attr* attr) {
  if (!id || !attr) return Result(EINVAL);
  ibv_srq_init_attr_ex ex{};
  std::memcpy(&ex, attr, sizeof *attr);
  ex.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
  // An XRC target's SRQ is an XRC SRQ (rdma_xserver names neither type nor domain).
  ex.srq_type = id->qp_type == IBV_QPT_XRC_RECV ? IBV_SRQT_XRC : IBV_SRQT_BASIC;
  ex.pd = pd;
  int err = Cm::Get().CreateSrq(ToId(id), &ex);
  if (!err) std::memcpy(attr, &ex, sizeof *attr);
  return Result(err);
}

SOFTRDMA_EXPORT void rdma_destroy_srq(rdma_cm_id* id) {
  if (id) Cm::Get().DestroySrq(ToId(id));
}

SOFTRDMA_EXPORT int rdma_connect(rdma_cm_id* id, rdma_conn_param* conn_param) {
  if (!id) return Result(EINVAL);
  return Result(Cm::Get().Connect(ToId(id), conn_param));
}

SOFTRDMA_EXPORT int rdma_establish(rdma_cm_id* id) {
  if (!id) return Result(EINVAL);
  return Result(Cm::Get().Establish(ToId(id)));
}

SOFTRDMA_EXPORT int rdma_listen(rdma_cm_id* id, int backlog) {
  if (!id) return Result(EINVAL);
  return Result(Cm::Get().Listen(ToId(id), backlog));
}

SOFTRDMA_EXPORT int rdma_get_request(rdma_cm_id* listen, rdma_cm_id** id) {
  if (!listen || !id) return Result(EINVAL);
  CmId* out = nullptr;
  int err = Cm::Get().GetRequest(ToId(listen), &out);
  if (!err) *id = &out->pub;
  return Result(err);
}

SOFTRDMA_EXPORT int rdma_accept(rdma_cm_id* id, rdma_conn_param* conn_param) {
  if (!id) return Result(EINVAL);
  return Result(Cm::Get().Accept(ToId(id), conn_param));
}

SOFTRDMA_EXPORT int rdma_reject(rdma_cm_id* id, const void* private_data,
                                uint8_t private_data_len) {
  if (!id) return Result(EINVAL);
  return Result(
      Cm::Get().Reject(ToId(id), private_data, private_data_len, softrdma::cm::kRejConsumer));
}

SOFTRDMA_EXPORT int rdma_reject_ece(rdma_cm_id* id, const void* private_data,
                                    uint8_t private_data_len) {
  if (!id) return Result(EINVAL);
  return Result(Cm::Get().Reject(ToId(id), private_data, private_data_len,
                                 softrdma::cm::kRejVendorOptionNotSupported));
}

SOFTRDMA_EXPORT int rdma_notify(rdma_cm_id* id, ibv_event_type event) {
  if (!id) return Result(EINVAL);
  return Result(Cm::Get().Notify(ToId(id), event));
}

SOFTRDMA_EXPORT int rdma_disconnect(rdma_cm_id* id) {
  if (!id) return Result(EINVAL);
  return Result(Cm::Get().Disconnect(ToId(id)));
}

SOFTRDMA_EXPORT int rdma_get_cm_event(rdma_event_channel* channel, rdma_cm_event** event) {
  if (!channel || !event) return Result(EINVAL);
  return Result(Cm::Get().GetEvent(ToChannel(channel), event));
}

SOFTRDMA_EXPORT int rdma_ack_cm_event(rdma_cm_event* event) {
  return Result(Cm::Get().AckEvent(event));
}

SOFTRDMA_EXPORT const char* rdma_event_str(rdma_cm_event_type event) {
  // Any int may come in; its bytes are read as an int, since loading an enum object that holds
  // a value outside the enumeration is undefined (UBSan stops on it).
  int value;
  std::memcpy(&value, &event, sizeof value);
  switch (value) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
      return "RDMA_CM_EVENT_ADDR_RESOLVED";
    case RDMA_CM_EVENT_ADDR_ERROR:
      return "RDMA_CM_EVENT_ADDR_ERROR";
    case RDMA_CM_EVENT_ROUTE_RESOLVED:
      return "RDMA_CM_EVENT_ROUTE_RESOLVED";
    case RDMA_CM_EVENT_ROUTE_ERROR:
      return "RDMA_CM_EVENT_ROUTE_ERROR";
    case RDMA_CM_EVENT_CONNECT_REQUEST:
      return "RDMA_CM_EVENT_CONNECT_REQUEST";
    case RDMA_CM_EVENT_CONNECT_RESPONSE:
      return "RDMA_CM_EVENT_CONNECT_RESPONSE";
    case RDMA_CM_EVENT_CONNECT_ERROR:
      return "RDMA_CM_EVENT_CONNECT_ERROR";
    case RDMA_CM_EVENT_UNREACHABLE:
      return "RDMA_CM_EVENT_UNREACHABLE";
    case RDMA_CM_EVENT_REJECTED:
      return "RDMA_CM_EVENT_REJECTED";
    case RDMA_CM_EVENT_ESTABLISHED:
      return "RDMA_CM_EVENT_ESTABLISHED";
    case RDMA_CM_EVENT_DISCONNECTED:
      return "RDMA_CM_EVENT_DISCONNECTED";
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
      return "RDMA_CM_EVENT_DEVICE_REMOVAL";
    case RDMA_CM_EVENT_MULTICAST_JOIN:
      return "RDMA_CM_EVENT_MULTICAST_JOIN";
    case RDMA_CM_EVENT_MULTICAST_ERROR:
      return "RDMA_CM_EVENT_MULTICAST_ERROR";
    case RDMA_CM_EVENT_ADDR_CHANGE:
      return "RDMA_CM_EVENT_ADDR_CHANGE";
    case RDMA_CM_EVENT_TIMEWAIT_EXIT:
      return "RDMA_CM_EVENT_TIMEWAIT_EXIT";
  }
  return "UNKNOWN EVENT";
}

SOFTRDMA_EXPORT int rdma_init_qp_attr(rdma_cm_id* id, ibv_qp_attr* qp_attr, int* qp_attr_mask) {
  if (!id) return Result(EINVAL);
  return Result(Cm::Get().InitQpAttr(ToId(id), qp_attr, qp_attr_mask));
}

SOFTRDMA_EXPORT int rdma_set_option(rdma_cm_id* id, int level, int optname, void* optval,
                                    size_t optlen) {
  if (!id) return Result(EINVAL);
  return Result(Cm::Get().SetOption(ToId(id), level, optname, optval, optlen));
}

SOFTRDMA_EXPORT int rdma_migrate_id(rdma_cm_id* id, rdma_event_channel* channel) {
  if (!id) return Result(EINVAL);
  return Result(Cm::Get().MigrateId(ToId(id), channel ? ToChannel(channel) : nullptr));
}

SOFTRDMA_EXPORT int rdma_getaddrinfo(const char* node, const char* service,
                                     const rdma_addrinfo* hints, rdma_addrinfo** res) {
  int err = softrdma::cm::GetAddrInfo(node, service, hints, res);
  // getaddrinfo's own EAI_* codes are returned as they are, as rdma-core does.
  return err > 0 ? Result(err) : err;
}

SOFTRDMA_EXPORT void rdma_freeaddrinfo(rdma_addrinfo* res) {
  softrdma::cm::FreeAddrInfo(res);
}

SOFTRDMA_EXPORT ibv_context** rdma_get_devices(int* num_devices) {
  Cm& cm = Cm::Get();
  ibv_context* ctx;
  {
    std::lock_guard<std::mutex> g(cm.mu);
    ctx = cm.Context();
  }
  auto** list = static_cast<ibv_context**>(std::calloc(2, sizeof(ibv_context*)));
  if (!list) {
    errno = ENOMEM;
    return nullptr;
  }
  list[0] = ctx;
  if (num_devices) *num_devices = ctx ? 1 : 0;
  return list;
}

SOFTRDMA_EXPORT void rdma_free_devices(ibv_context** list) {
  std::free(list);
}

SOFTRDMA_EXPORT __be16 rdma_get_src_port(rdma_cm_id* id) {
  const sockaddr* a = &id->route.addr.src_addr;
  if (a->sa_family == AF_INET) return reinterpret_cast<const sockaddr_in*>(a)->sin_port;
  if (a->sa_family == AF_INET6) return reinterpret_cast<const sockaddr_in6*>(a)->sin6_port;
  return 0;
}

SOFTRDMA_EXPORT __be16 rdma_get_dst_port(rdma_cm_id* id) {
  const sockaddr* a = &id->route.addr.dst_addr;
  if (a->sa_family == AF_INET) return reinterpret_cast<const sockaddr_in*>(a)->sin_port;
  if (a->sa_family == AF_INET6) return reinterpret_cast<const sockaddr_in6*>(a)->sin6_port;
  return 0;
}

SOFTRDMA_EXPORT int rdma_set_local_ece(rdma_cm_id* id, ibv_ece* ece) {
  if (!id) return Result(EINVAL);
  return Result(Cm::Get().SetLocalEce(ToId(id), ece));
}

SOFTRDMA_EXPORT int rdma_get_remote_ece(rdma_cm_id* id, ibv_ece* ece) {
  if (!id) return Result(EINVAL);
  return Result(Cm::Get().GetRemoteEce(ToId(id), ece));
}

// rdma_create_ep(3): one call for an id, its address and route (active side), or its bound
// address plus the pd and QP attributes rdma_get_request applies to each request (passive).
SOFTRDMA_EXPORT int rdma_create_ep(rdma_cm_id** id, rdma_addrinfo* res, ibv_pd* pd,
                                   ibv_qp_init_attr* qp_init_attr) {
  if (!id || !res) return Result(EINVAL);
  Cm& cm = Cm::Get();
  CmId* cid = nullptr;
  auto ps = static_cast<rdma_port_space>(res->ai_port_space ? res->ai_port_space : RDMA_PS_TCP);
  auto qpt = res->ai_qp_type ? static_cast<ibv_qp_type>(res->ai_qp_type) : DefaultQpType(ps);
  if (int err = cm.CreateId(nullptr, &cid, nullptr, ps, qpt)) return Result(err);
  rdma_cm_id* pub = &cid->pub;
  int err = 0;
  if (res->ai_flags & RAI_PASSIVE) {
    err = cm.BindAddr(cid, res->ai_src_addr);
    if (!err) {
      std::lock_guard<std::mutex> g(cm.mu);
      if (pd) pub->pd = pd;
      if (qp_init_attr) {
        cid->ep_qp_init_attr = std::make_unique<ibv_qp_init_attr>(*qp_init_attr);
        cid->ep_qp_init_attr->qp_type = qpt;
      }
    }
  } else {
    err = cm.ResolveAddr(cid, res->ai_src_addr, res->ai_dst_addr, 2000);
    if (!err) err = cm.ResolveRoute(cid, 2000);
    if (!err && qp_init_attr) {
      qp_init_attr->qp_type = qpt;
      ibv_qp_init_attr_ex ex{};
      std::memcpy(&ex, qp_init_attr, sizeof *qp_init_attr);
      ex.comp_mask = IBV_QP_INIT_ATTR_PD;
      ex.pd = pd;
      err = cm.CreateQp(cid, &ex);
      if (!err) std::memcpy(qp_init_attr, &ex, sizeof *qp_init_attr);
    }
  }
  if (err) {
    rdma_destroy_ep(pub);
    return Result(err);
  }
  *id = pub;
  return 0;
}

SOFTRDMA_EXPORT void rdma_destroy_ep(rdma_cm_id* id) {
  if (!id) return;
  Cm& cm = Cm::Get();
  if (id->qp) cm.DestroyQp(ToId(id));
  if (id->srq) cm.DestroySrq(ToId(id));
  cm.DestroyId(ToId(id));
}

SOFTRDMA_EXPORT int rdma_join_multicast(rdma_cm_id* id, sockaddr* addr, void* context) {
  if (!id) return Result(EINVAL);
  return Result(Cm::Get().JoinMulticast(ToId(id), addr, RDMA_MC_JOIN_FLAG_FULLMEMBER, context));
}

SOFTRDMA_EXPORT int rdma_join_multicast_ex(rdma_cm_id* id, rdma_cm_join_mc_attr_ex* mc_join_attr,
                                           void* context) {
  if (!id || !mc_join_attr) return Result(EINVAL);
  if (!(mc_join_attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS) ||
      (mc_join_attr->comp_mask &
       ~(RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS))) {
    return Result(EINVAL);
  }
  uint16_t flags = (mc_join_attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS)
                       ? static_cast<uint16_t>(mc_join_attr->join_flags)
                       : static_cast<uint16_t>(RDMA_MC_JOIN_FLAG_FULLMEMBER);
  return Result(Cm::Get().JoinMulticast(ToId(id), mc_join_attr->addr, flags, context));
}

SOFTRDMA_EXPORT int rdma_leave_multicast(rdma_cm_id* id, sockaddr* addr) {
  if (!id) return Result(EINVAL);
  return Result(Cm::Get().LeaveMulticast(ToId(id), addr));
}
