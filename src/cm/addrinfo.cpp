#include "cm/addrinfo.h"

#include <netdb.h>
#include <netinet/in.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace softrdma::cm {

namespace {

bool CopyAddr(sockaddr** dst, socklen_t* dst_len, const sockaddr* src, socklen_t len) {
  *dst = static_cast<sockaddr*>(std::calloc(1, len));
  if (!*dst) return false;
  std::memcpy(*dst, src, len);
  *dst_len = len;
  return true;
}

addrinfo ToSystemHints(const rdma_addrinfo& h) {
  addrinfo ai{};
  if (h.ai_flags & RAI_PASSIVE) ai.ai_flags |= AI_PASSIVE;
  if (h.ai_flags & RAI_NUMERICHOST) ai.ai_flags |= AI_NUMERICHOST;
  if (h.ai_family != AF_IB) ai.ai_family = h.ai_family;
  switch (h.ai_qp_type) {
    case IBV_QPT_RC:
    case IBV_QPT_UC:
    case IBV_QPT_XRC_SEND:
    case IBV_QPT_XRC_RECV:
      ai.ai_socktype = SOCK_STREAM;
      break;
    case IBV_QPT_UD:
      ai.ai_socktype = SOCK_DGRAM;
      break;
    default:
      break;
  }
  switch (h.ai_port_space) {
    case RDMA_PS_TCP:
      ai.ai_protocol = IPPROTO_TCP;
      break;
    case RDMA_PS_UDP:
    case RDMA_PS_IPOIB:
      ai.ai_protocol = IPPROTO_UDP;
      break;
    case RDMA_PS_IB:
      if (ai.ai_socktype == SOCK_STREAM) ai.ai_protocol = IPPROTO_TCP;
      if (ai.ai_socktype == SOCK_DGRAM) ai.ai_protocol = IPPROTO_UDP;
      break;
    default:
      break;
  }
  return ai;
}

}  // namespace

int GetAddrInfo(const char* node, const char* service, const rdma_addrinfo* hints,
                rdma_addrinfo** res) {
  if ((!service && !node && !hints) || !res) return EINVAL;
  static const rdma_addrinfo kNoHints{};
  const rdma_addrinfo& h = hints ? *hints : kNoHints;
  auto* rai = static_cast<rdma_addrinfo*>(std::calloc(1, sizeof(rdma_addrinfo)));
  if (!rai) return ENOMEM;
  if (node || service) {
    addrinfo sys_hints = ToSystemHints(h);
    addrinfo* ai = nullptr;
    int ret = getaddrinfo(node, service, hints ? &sys_hints : nullptr, &ai);
    if (ret) {
      std::free(rai);
      return ret;
    }
    if (h.ai_qp_type) {
      rai->ai_qp_type = h.ai_qp_type;
    } else {
      rai->ai_qp_type = ai->ai_socktype == SOCK_DGRAM ? IBV_QPT_UD : IBV_QPT_RC;
    }
    if (h.ai_port_space) {
      rai->ai_port_space = h.ai_port_space;
    } else {
      rai->ai_port_space = ai->ai_protocol == IPPROTO_UDP ? RDMA_PS_UDP : RDMA_PS_TCP;
    }
    rai->ai_family = ai->ai_family;
    bool ok;
    if (ai->ai_flags & AI_PASSIVE) {
      rai->ai_flags = RAI_PASSIVE;
      ok = CopyAddr(&rai->ai_src_addr, &rai->ai_src_len, ai->ai_addr, ai->ai_addrlen);
      if (ok && ai->ai_canonname) rai->ai_src_canonname = strdup(ai->ai_canonname);
    } else {
      ok = CopyAddr(&rai->ai_dst_addr, &rai->ai_dst_len, ai->ai_addr, ai->ai_addrlen);
      if (ok && ai->ai_canonname) rai->ai_dst_canonname = strdup(ai->ai_canonname);
    }
    freeaddrinfo(ai);
    if (!ok) {
      FreeAddrInfo(rai);
      return ENOMEM;
    }
  } else {
    rai->ai_flags = h.ai_flags;
    rai->ai_family = h.ai_family;
    rai->ai_qp_type = h.ai_qp_type;
    rai->ai_port_space = h.ai_port_space;
    if (h.ai_dst_len &&
        !CopyAddr(&rai->ai_dst_addr, &rai->ai_dst_len, h.ai_dst_addr, h.ai_dst_len)) {
      FreeAddrInfo(rai);
      return ENOMEM;
    }
  }
  if (!rai->ai_src_len && h.ai_src_len) {
    if (!CopyAddr(&rai->ai_src_addr, &rai->ai_src_len, h.ai_src_addr, h.ai_src_len)) {
      FreeAddrInfo(rai);
      return ENOMEM;
    }
  }
  *res = rai;
  return 0;
}

void FreeAddrInfo(rdma_addrinfo* res) {
  while (res) {
    rdma_addrinfo* next = res->ai_next;
    std::free(res->ai_src_addr);
    std::free(res->ai_dst_addr);
    std::free(res->ai_src_canonname);
    std::free(res->ai_dst_canonname);
    std::free(res->ai_route);
    std::free(res->ai_connect);
    std::free(res);
    res = next;
  }
}

}  // namespace softrdma::cm
