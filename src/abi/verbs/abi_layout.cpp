// The struct offsets unmodified Debian binaries depend on (rdma-core 44, x86_64), pinned so that a
// different header can never silently produce an incompatible library.
// Source: shared/reference/abi-symbols.txt §9 and abi-survey.md §4.
#include <infiniband/verbs.h>

#include <cstddef>

#include "abi/verbs/objects.h"

#if defined(__x86_64__)
static_assert(sizeof(verbs_context) == 648);
static_assert(offsetof(verbs_context, context) == 320);
static_assert(sizeof(ibv_context) == 328);
static_assert(offsetof(verbs_context, query_port) == 0);
static_assert(offsetof(verbs_context, query_device_ex) == 216);
static_assert(offsetof(verbs_context, create_cq_ex) == 200);
static_assert(offsetof(verbs_context, create_qp_ex) == 264);
static_assert(offsetof(verbs_context, open_xrcd) == 288);
static_assert(offsetof(verbs_context, close_xrcd) == 296);
static_assert(offsetof(verbs_context, sz) == 312);
static_assert(offsetof(ibv_context, abi_compat) == 320);
static_assert(offsetof(ibv_context, async_fd) == 268);
static_assert(sizeof(ibv_qp_ex) == 352 && offsetof(ibv_qp_ex, qp_base) == 0);
static_assert(sizeof(ibv_cq_ex) == 288);
static_assert(offsetof(ibv_cq_ex, status) == 132 && offsetof(ibv_cq_ex, wr_id) == 136);
static_assert(offsetof(ibv_port_attr, port_cap_flags2) == 48);
static_assert(sizeof(ibv_send_wr) == 128 && offsetof(ibv_send_wr, qp_type) == 72);
#endif

// Each handle converts back to its object with a cast: the public struct must come first.
static_assert(offsetof(softrdma::abi::VerbsQp, ibv) == 0);
static_assert(offsetof(softrdma::abi::VerbsCq, ibv) == 0);
static_assert(offsetof(softrdma::abi::VerbsPd, ibv) == 0);
static_assert(offsetof(softrdma::abi::VerbsSrq, ibv) == 0);
static_assert(offsetof(softrdma::abi::VerbsContext, vctx) == 0);
