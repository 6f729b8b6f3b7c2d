// rdma_getaddrinfo(3): names and services to rdma_addrinfo, through the system resolver.
#pragma once

#include <rdma/rdma_cma.h>

namespace softrdma::cm {

// 0, an errno (EINVAL, ENOMEM), or getaddrinfo's EAI_* code (negative) passed through as
// rdma-core does.
int GetAddrInfo(const char* node, const char* service, const rdma_addrinfo* hints,
                rdma_addrinfo** res);
void FreeAddrInfo(rdma_addrinfo* res);

}  // namespace softrdma::cm
