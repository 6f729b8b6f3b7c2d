// Stateless helpers of libibverbs.so.1: enum-to-string tables, IB static-rate
// conversions, the historical kernel-struct copy helpers that librdmacm
// imports, the sysfs helpers, and the ibv_register_driver compat stub.
//
// The strings are the ones rdma-core 44 prints (libibverbs/enum_strs.c):
// tools and test suites compare them verbatim, so they must not be "improved".

#include <infiniband/verbs.h>
#include <infiniband/sa.h>

#include <rdma/ib_user_sa.h>
#include <rdma/ib_user_verbs.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "abi/export.h"

namespace {

constexpr const char kUnknown[] = "unknown";

// C callers may pass any int as one of these enums, and loading an out-of-range value as the C++
// enum is undefined (UBSan, strings_test's OutOfRange cases): each is read as the int it is.
template <typename E>
int Raw(const E& v) {
  static_assert(sizeof(E) == sizeof(int));
  int i;
  std::memcpy(&i, &v, sizeof i);
  return i;
}

}  // namespace

// ---------------------------------------------------------------------------
// Enum -> human-readable string.  Out-of-range values give "unknown".

SOFTRDMA_EXPORT const char* ibv_node_type_str(enum ibv_node_type node_type) {
  switch (Raw(node_type)) {
    case IBV_NODE_CA:
      return "InfiniBand channel adapter";
    case IBV_NODE_SWITCH:
      return "InfiniBand switch";
    case IBV_NODE_ROUTER:
      return "InfiniBand router";
    case IBV_NODE_RNIC:
      return "iWARP NIC";
    case IBV_NODE_USNIC:
      return "usNIC";
    case IBV_NODE_USNIC_UDP:
      return "usNIC UDP";
    case IBV_NODE_UNSPECIFIED:
      return "unspecified";
    default:
      return kUnknown;
  }
}

SOFTRDMA_EXPORT const char* ibv_port_state_str(enum ibv_port_state port_state) {
  switch (Raw(port_state)) {
    case IBV_PORT_NOP:
      return "no state change (NOP)";
    case IBV_PORT_DOWN:
      return "down";
    case IBV_PORT_INIT:
      return "init";
    case IBV_PORT_ARMED:
      return "armed";
    case IBV_PORT_ACTIVE:
      return "active";
    case IBV_PORT_ACTIVE_DEFER:
      return "active defer";
    default:
      return kUnknown;
  }
}

SOFTRDMA_EXPORT const char* ibv_event_type_str(enum ibv_event_type event) {
  switch (Raw(event)) {
    case IBV_EVENT_CQ_ERR:
      return "CQ error";
    case IBV_EVENT_QP_FATAL:
      return "local work queue catastrophic error";
    case IBV_EVENT_QP_REQ_ERR:
      return "invalid request local work queue error";
    case IBV_EVENT_QP_ACCESS_ERR:
      return "local access violation work queue error";
    case IBV_EVENT_COMM_EST:
      return "communication established";
    case IBV_EVENT_SQ_DRAINED:
      return "send queue drained";
    case IBV_EVENT_PATH_MIG:
      return "path migrated";
    case IBV_EVENT_PATH_MIG_ERR:
      return "path migration request error";
    case IBV_EVENT_DEVICE_FATAL:
      return "local catastrophic error";
    case IBV_EVENT_PORT_ACTIVE:
      return "port active";
    case IBV_EVENT_PORT_ERR:
      return "port error";
    case IBV_EVENT_LID_CHANGE:
      return "LID change";
    case IBV_EVENT_PKEY_CHANGE:
      return "P_Key change";
    case IBV_EVENT_SM_CHANGE:
      return "SM change";
    case IBV_EVENT_SRQ_ERR:
      return "SRQ catastrophic error";
    case IBV_EVENT_SRQ_LIMIT_REACHED:
      return "SRQ limit reached";
    case IBV_EVENT_QP_LAST_WQE_REACHED:
      return "last WQE reached";
    case IBV_EVENT_CLIENT_REREGISTER:
      return "client reregistration";
    case IBV_EVENT_GID_CHANGE:
      return "GID table change";
    case IBV_EVENT_WQ_FATAL:
      return "WQ fatal";
    default:
      return kUnknown;
  }
}

SOFTRDMA_EXPORT const char* ibv_wc_status_str(enum ibv_wc_status status) {
  switch (Raw(status)) {
    case IBV_WC_SUCCESS:
      return "success";
    case IBV_WC_LOC_LEN_ERR:
      return "local length error";
    case IBV_WC_LOC_QP_OP_ERR:
      return "local QP operation error";
    case IBV_WC_LOC_EEC_OP_ERR:
      return "local EE context operation error";
    case IBV_WC_LOC_PROT_ERR:
      return "local protection error";
    case IBV_WC_WR_FLUSH_ERR:
      // Capitalised in rdma-core too; keep it byte-identical.
      return "Work Request Flushed Error";
    case IBV_WC_MW_BIND_ERR:
      return "memory management operation error";
    case IBV_WC_BAD_RESP_ERR:
      return "bad response error";
    case IBV_WC_LOC_ACCESS_ERR:
      return "local access error";
    case IBV_WC_REM_INV_REQ_ERR:
      return "remote invalid request error";
    case IBV_WC_REM_ACCESS_ERR:
      return "remote access error";
    case IBV_WC_REM_OP_ERR:
      return "remote operation error";
    case IBV_WC_RETRY_EXC_ERR:
      return "transport retry counter exceeded";
    case IBV_WC_RNR_RETRY_EXC_ERR:
      return "RNR retry counter exceeded";
    case IBV_WC_LOC_RDD_VIOL_ERR:
      return "local RDD violation error";
    case IBV_WC_REM_INV_RD_REQ_ERR:
      return "remote invalid RD request";
    case IBV_WC_REM_ABORT_ERR:
      return "aborted error";
    case IBV_WC_INV_EECN_ERR:
      return "invalid EE context number";
    case IBV_WC_INV_EEC_STATE_ERR:
      return "invalid EE context state";
    case IBV_WC_FATAL_ERR:
      return "fatal error";
    case IBV_WC_RESP_TIMEOUT_ERR:
      return "response timeout error";
    case IBV_WC_GENERAL_ERR:
      return "general error";
    case IBV_WC_TM_ERR:
      return "TM error";
    case IBV_WC_TM_RNDV_INCOMPLETE:
      return "TM software rendezvous";
    default:
      return kUnknown;
  }
}

// ---------------------------------------------------------------------------
// Static-rate conversions.
//
// One row per enum ibv_rate value: its multiple of the 2.5 Gb/s base rate and
// its data rate in Mb/s.  The multiplier only exists for the classic IB rates
// (and the newer 28/50/400/600/800/1200 Gb/s ones); FDR/EDR/HDR-era rates
// whose signalling is not a multiple of 2.5 Gb/s (14, 56, 112, 168, 25, 100,
// 200, 300 Gb/s) have none, so ibv_rate_to_mult() returns -1 for them and
// mult_to_ibv_rate() can never produce them.  The Mb/s figures are the exact
// post-encoding data rates rdma-core reports (e.g. 100 Gb/s EDR 4x ->
// 103125), not the nominal marketing number.

namespace {

struct RateRow {
  enum ibv_rate rate;
  int mult;  // -1: no 2.5 Gb/s multiple
  int mbps;
};

constexpr RateRow kRates[] = {
    {IBV_RATE_2_5_GBPS, 1, 2500},       {IBV_RATE_5_GBPS, 2, 5000},
    {IBV_RATE_10_GBPS, 4, 10000},       {IBV_RATE_20_GBPS, 8, 20000},
    {IBV_RATE_30_GBPS, 12, 30000},      {IBV_RATE_40_GBPS, 16, 40000},
    {IBV_RATE_60_GBPS, 24, 60000},      {IBV_RATE_80_GBPS, 32, 80000},
    {IBV_RATE_120_GBPS, 48, 120000},    {IBV_RATE_14_GBPS, -1, 14062},
    {IBV_RATE_56_GBPS, -1, 56250},      {IBV_RATE_112_GBPS, -1, 112500},
    {IBV_RATE_168_GBPS, -1, 168750},    {IBV_RATE_25_GBPS, -1, 25781},
    {IBV_RATE_100_GBPS, -1, 103125},    {IBV_RATE_200_GBPS, -1, 206250},
    {IBV_RATE_300_GBPS, -1, 309375},    {IBV_RATE_28_GBPS, 11, 28125},
    {IBV_RATE_50_GBPS, 20, 53125},      {IBV_RATE_400_GBPS, 160, 425000},
    {IBV_RATE_600_GBPS, 240, 637500},   {IBV_RATE_800_GBPS, 320, 850000},
    {IBV_RATE_1200_GBPS, 480, 1275000},
};

constexpr const RateRow* find_rate(int rate) {
  for (const RateRow& row : kRates)
    if (row.rate == rate) return &row;
  return nullptr;
}

}  // namespace

SOFTRDMA_EXPORT int ibv_rate_to_mult(enum ibv_rate rate) {
  const RateRow* row = find_rate(Raw(rate));
  return row ? row->mult : -1;
}

SOFTRDMA_EXPORT enum ibv_rate mult_to_ibv_rate(int mult) {
  if (mult <= 0) return IBV_RATE_MAX;
  for (const RateRow& row : kRates)
    if (row.mult == mult) return row.rate;
  return IBV_RATE_MAX;
}

SOFTRDMA_EXPORT int ibv_rate_to_mbps(enum ibv_rate rate) {
  const RateRow* row = find_rate(Raw(rate));
  return row ? row->mbps : -1;
}

SOFTRDMA_EXPORT enum ibv_rate mbps_to_ibv_rate(int mbps) {
  if (mbps <= 0) return IBV_RATE_MAX;
  for (const RateRow& row : kRates)
    if (row.mbps == mbps) return row.rate;
  return IBV_RATE_MAX;
}

// ---------------------------------------------------------------------------
// Kernel-ABI struct copies.  Historical libibverbs exports, still imported by
// Debian's librdmacm (§8 of abi-symbols.txt).  rdma-core declares them in its
// private marshall.h; the kernel structs come from the uapi headers.  Byte
// order is not converted: both sides carry the same (network or host) order
// field by field.

namespace {

void copy_grh_from_kern(struct ibv_global_route& to, const struct ib_uverbs_global_route& from) {
  static_assert(sizeof(to.dgid.raw) == sizeof(from.dgid));
  std::memcpy(to.dgid.raw, from.dgid, sizeof(to.dgid.raw));
  to.flow_label = from.flow_label;
  to.sgid_index = from.sgid_index;
  to.hop_limit = from.hop_limit;
  to.traffic_class = from.traffic_class;
}

// The path-record field lists of the two structs are identical apart from the
// GID representation, so one template serves both directions.
template <typename To, typename From>
void copy_path_rec_scalars(To& to, const From& from) {
  to.dlid = from.dlid;
  to.slid = from.slid;
  to.raw_traffic = from.raw_traffic;
  to.flow_label = from.flow_label;
  to.hop_limit = from.hop_limit;
  to.traffic_class = from.traffic_class;
  to.reversible = from.reversible;
  to.numb_path = from.numb_path;
  to.pkey = from.pkey;
  to.sl = from.sl;
  to.mtu_selector = from.mtu_selector;
  to.mtu = from.mtu;
  to.rate_selector = from.rate_selector;
  to.rate = from.rate;
  to.packet_life_time_selector = from.packet_life_time_selector;
  to.packet_life_time = from.packet_life_time;
  to.preference = from.preference;
}

}  // namespace

SOFTRDMA_EXPORT void ibv_copy_ah_attr_from_kern(struct ibv_ah_attr* dst,
                                                struct ib_uverbs_ah_attr* src) {
  copy_grh_from_kern(dst->grh, src->grh);
  dst->dlid = src->dlid;
  dst->sl = src->sl;
  dst->src_path_bits = src->src_path_bits;
  dst->static_rate = src->static_rate;
  dst->is_global = src->is_global;
  dst->port_num = src->port_num;
}

// Like rdma-core, qp_state is deliberately not copied: callers (librdmacm's
// rdma_init_qp_attr) set dst->qp_state themselves before asking the kernel
// for the attributes of that state.  Fields the kernel struct lacks
// (rate_limit) are left untouched.
SOFTRDMA_EXPORT void ibv_copy_qp_attr_from_kern(struct ibv_qp_attr* dst,
                                                struct ib_uverbs_qp_attr* src) {
  dst->cur_qp_state = static_cast<enum ibv_qp_state>(src->cur_qp_state);
  dst->path_mtu = static_cast<enum ibv_mtu>(src->path_mtu);
  dst->path_mig_state = static_cast<enum ibv_mig_state>(src->path_mig_state);
  dst->qkey = src->qkey;
  dst->rq_psn = src->rq_psn;
  dst->sq_psn = src->sq_psn;
  dst->dest_qp_num = src->dest_qp_num;
  dst->qp_access_flags = src->qp_access_flags;

  dst->cap.max_send_wr = src->max_send_wr;
  dst->cap.max_recv_wr = src->max_recv_wr;
  dst->cap.max_send_sge = src->max_send_sge;
  dst->cap.max_recv_sge = src->max_recv_sge;
  dst->cap.max_inline_data = src->max_inline_data;

  ibv_copy_ah_attr_from_kern(&dst->ah_attr, &src->ah_attr);
  ibv_copy_ah_attr_from_kern(&dst->alt_ah_attr, &src->alt_ah_attr);

  dst->pkey_index = src->pkey_index;
  dst->alt_pkey_index = src->alt_pkey_index;
  dst->en_sqd_async_notify = src->en_sqd_async_notify;
  dst->sq_draining = src->sq_draining;
  dst->max_rd_atomic = src->max_rd_atomic;
  dst->max_dest_rd_atomic = src->max_dest_rd_atomic;
  dst->min_rnr_timer = src->min_rnr_timer;
  dst->port_num = src->port_num;
  dst->timeout = src->timeout;
  dst->retry_cnt = src->retry_cnt;
  dst->rnr_retry = src->rnr_retry;
  dst->alt_port_num = src->alt_port_num;
  dst->alt_timeout = src->alt_timeout;
}

SOFTRDMA_EXPORT void ibv_copy_path_rec_from_kern(struct ibv_sa_path_rec* dst,
                                                 struct ib_user_path_rec* src) {
  static_assert(sizeof(dst->dgid.raw) == sizeof(src->dgid));
  std::memcpy(dst->dgid.raw, src->dgid, sizeof(dst->dgid.raw));
  std::memcpy(dst->sgid.raw, src->sgid, sizeof(dst->sgid.raw));
  copy_path_rec_scalars(*dst, *src);
}

SOFTRDMA_EXPORT void ibv_copy_path_rec_to_kern(struct ib_user_path_rec* dst,
                                               struct ibv_sa_path_rec* src) {
  std::memcpy(dst->dgid, src->dgid.raw, sizeof(dst->dgid));
  std::memcpy(dst->sgid, src->sgid.raw, sizeof(dst->sgid));
  copy_path_rec_scalars(*dst, *src);
}

// ---------------------------------------------------------------------------
// sysfs helpers.  softrdma devices have no sysfs presence: the path helper
// reports the conventional mount point and every read fails as if the file
// were missing.  (rdma-core returns -1 with errno from openat() here.)

SOFTRDMA_EXPORT const char* ibv_get_sysfs_path(void) {
  return "/sys";
}

SOFTRDMA_EXPORT int ibv_read_sysfs_file(const char* /*dir*/, const char* /*file*/, char* /*buf*/,
                                        size_t /*size*/) {
  errno = ENOENT;
  return -1;
}

// ---------------------------------------------------------------------------
// RoCE L2 address resolution (netlink neighbour lookup in rdma-core).  Only
// providers call it, from their create_ah.  rdma-core reports failure with a
// negative value (-1 or -errno), never a positive one, so we do the same.
SOFTRDMA_EXPORT int ibv_resolve_eth_l2_from_gid(struct ibv_context* /*context*/,
                                                struct ibv_ah_attr* /*attr*/,
                                                uint8_t /*eth_mac*/[ETHERNET_LL_SIZE],
                                                uint16_t* /*vid*/) {
  errno = EOPNOTSUPP;
  return -EOPNOTSUPP;
}

// ---------------------------------------------------------------------------
// ibv_register_driver@IBVERBS_1.1 (non-default, no @@ version).  Pre-rdma-core
// providers (old libfabric usnic) called it to register themselves; since
// rdma-core 13 it is an empty stub kept for dynamic-link compatibility.  It is
// defined under an internal name and bound to the versioned name with symver
// so nothing can link against it anew.  Default visibility is required: the
// versioned alias inherits it.  GCC's attribute, not a top-level .symver asm:
// link-time optimisation drops a symbol that only an asm statement names.

namespace {
using LegacyDriverInit = struct ibv_device* (*)(const char* uverbs_sys_path, int abi_version);
}  // namespace

#if defined(__GNUC__) && !defined(__clang__)
#define SOFTRDMA_LEGACY_SYMVER __attribute__((symver("ibv_register_driver@IBVERBS_1.1")))
#else
#define SOFTRDMA_LEGACY_SYMVER
__asm__(".symver softrdma_compat_ibv_register_driver, ibv_register_driver@IBVERBS_1.1");
#endif

SOFTRDMA_EXPORT SOFTRDMA_LEGACY_SYMVER void softrdma_compat_ibv_register_driver(
    const char* /*name*/, LegacyDriverInit /*init_func*/) {}
