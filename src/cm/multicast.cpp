// Multicast on CM ids (rdma_join_multicast(3)): an IP multicast address names a group of the
// host (core/multicast.h); joining reports the group's address handle and, for an id with a QP,
// attaches the QP so it receives the group's datagrams.
#include <cerrno>
#include <cstring>

#include "cm/cm.h"
#include "cm/ip_address.h"

namespace softrdma::cm {

namespace {

bool IsMulticastIp(const Addr& a) {
  return a.family == 4 ? (a.ip[12] & 0xf0) == 0xe0 : a.ip[0] == 0xff;
}

// IPv6 groups are their own GID; an IPv4 group a.b.c.d becomes ff0e::ffff:a.b.c.d.
ibv_gid GroupGid(const Addr& a) {
  ibv_gid g{};
  std::memcpy(g.raw, a.ip, 16);
  if (a.family == 4) {
    g.raw[0] = 0xff;
    g.raw[1] = 0x0e;
  }
  return g;
}

uint16_t GroupLid(const ibv_gid& g) {
  uint32_t h = 0;
  for (uint8_t b : g.raw) h = h * 31 + b;
  return static_cast<uint16_t>(0xc000 | (h % 0x3fff));
}

}  // namespace

int Cm::JoinMulticast(CmId* id, const sockaddr* addr, uint16_t join_flags, void* context) {
  std::unique_lock<std::mutex> lk(mu);
  Addr a;
  if (!addr) return EINVAL;
  if (!FromSockaddr(addr, &a)) return EAFNOSUPPORT;
  if (!IsMulticastIp(a)) return EINVAL;
  if (id->pub.qp_type != IBV_QPT_UD) return EINVAL;
  if (id->state != IdState::kBound && id->state != IdState::kAddrResolved &&
      id->state != IdState::kRouteResolved) {
    return EINVAL;
  }
  if (join_flags != RDMA_MC_JOIN_FLAG_FULLMEMBER &&
      join_flags != RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER) {
    return EINVAL;
  }
  for (const McastMembership& m : id->mcast) {
    if (SameIp(m.addr, a)) return EADDRINUSE;
  }
  McastMembership m;
  m.addr = a;
  m.mgid = GroupGid(a);
  m.mlid = GroupLid(m.mgid);
  m.context = context;
  int status = 0;
  if (id->pub.qp && join_flags == RDMA_MC_JOIN_FLAG_FULLMEMBER) {
    status = ibv_attach_mcast(id->pub.qp, &m.mgid, m.mlid);
    m.attached = status == 0;
  }
  if (status == 0) id->mcast.push_back(m);
  CmEvent* e = nullptr;
  Report(id, status ? RDMA_CM_EVENT_MULTICAST_ERROR : RDMA_CM_EVENT_MULTICAST_JOIN, -status,
         nullptr, nullptr, &e);
  rdma_ud_param& u = e->pub.param.ud;
  u.private_data = context;
  u.private_data_len = 0;
  u.ah_attr.is_global = 1;
  u.ah_attr.grh.dgid = m.mgid;
  u.ah_attr.grh.sgid_index = 0;
  u.ah_attr.grh.hop_limit = 64;
  u.ah_attr.grh.traffic_class = id->tos;
  u.ah_attr.dlid = m.mlid;
  u.ah_attr.port_num = 1;
  u.qp_num = 0xffffff;
  u.qkey = id->qkey ? id->qkey : RDMA_UDP_QKEY;
  return CompleteSync(id, &lk);
}

int Cm::LeaveMulticast(CmId* id, const sockaddr* addr) {
  std::lock_guard<std::mutex> g(mu);
  Addr a;
  if (!addr) return EINVAL;
  if (!FromSockaddr(addr, &a)) return EAFNOSUPPORT;
  for (auto it = id->mcast.begin(); it != id->mcast.end(); ++it) {
    if (!SameIp(it->addr, a)) continue;
    if (it->attached && id->pub.qp) ibv_detach_mcast(id->pub.qp, &it->mgid, it->mlid);
    id->mcast.erase(it);
    return 0;
  }
  return EADDRNOTAVAIL;
}

}  // namespace softrdma::cm
