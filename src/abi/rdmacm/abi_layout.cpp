// The librdmacm structures applications read directly (abi-survey §8), pinned to rdma-core 44.
#include <rdma/rdma_cma.h>

#include <cstddef>

#include "cm/cm.h"

static_assert(sizeof(rdma_cm_id) == 416);
static_assert(offsetof(rdma_cm_id, verbs) == 0);
static_assert(offsetof(rdma_cm_id, channel) == 8);
static_assert(offsetof(rdma_cm_id, context) == 16);
static_assert(offsetof(rdma_cm_id, qp) == 24);
static_assert(offsetof(rdma_cm_id, route) == 32);
static_assert(offsetof(rdma_cm_id, ps) == 344);
static_assert(offsetof(rdma_cm_id, port_num) == 348);
static_assert(offsetof(rdma_cm_id, event) == 352);
static_assert(offsetof(rdma_cm_id, send_cq_channel) == 360);
static_assert(offsetof(rdma_cm_id, send_cq) == 368);
static_assert(offsetof(rdma_cm_id, recv_cq_channel) == 376);
static_assert(offsetof(rdma_cm_id, recv_cq) == 384);
static_assert(offsetof(rdma_cm_id, srq) == 392);
static_assert(offsetof(rdma_cm_id, pd) == 400);
static_assert(offsetof(rdma_cm_id, qp_type) == 408);
static_assert(sizeof(rdma_cm_event) == 80);
static_assert(offsetof(rdma_cm_event, status) == 20);
static_assert(offsetof(rdma_cm_event, param) == 24);
static_assert(sizeof(rdma_event_channel) == 4);

// The private objects hand out a pointer to their public part, which must come first. They hold
// C++ members, so offsetof is only conditionally supported; GCC and Clang compute it exactly.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winvalid-offsetof"
static_assert(offsetof(softrdma::cm::CmId, pub) == 0);
static_assert(offsetof(softrdma::cm::CmEvent, pub) == 0);
static_assert(offsetof(softrdma::cm::EventChannel, pub) == 0);
#pragma GCC diagnostic pop
