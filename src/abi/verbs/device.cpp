// Device discovery, contexts, and the query verbs: what softrdma0 looks like to applications.
#include <arpa/inet.h>
#include <endian.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "abi/export.h"
#include "abi/verbs/objects.h"
#include "core/device_names.h"
#include "core/limits.h"

#undef ibv_query_port
struct _compat_ibv_port_attr;

using namespace softrdma;
using namespace softrdma::abi;

namespace {

VerbsDevice* TheDevice() {
  static VerbsDevice* dev = [] {
    auto* d = new VerbsDevice{};
    d->ibv.node_type = IBV_NODE_CA;
    d->ibv.transport_type = IBV_TRANSPORT_IB;
    std::strcpy(d->ibv.name, core::kDeviceName);
    std::strcpy(d->ibv.dev_name, core::kUverbsName);
    std::snprintf(d->ibv.dev_path, sizeof d->ibv.dev_path, "/sys/class/infiniband_verbs/%s",
                  core::kUverbsName);
    std::snprintf(d->ibv.ibdev_path, sizeof d->ibv.ibdev_path, "/sys/class/infiniband/%s",
                  core::kDeviceName);
    return d;
  }();
  return dev;
}

std::shared_ptr<core::Hca> HcaOrNull() {
  std::string err;
  return core::Hca::Get(&err);
}

void FillDeviceAttr(const core::Hca& hca, ibv_device_attr* a) {
  using namespace softrdma::core;
  *a = ibv_device_attr{};
  std::snprintf(a->fw_ver, sizeof a->fw_ver, "softrdma %s", "0.1.0");
  a->node_guid = htobe64(hca.node_guid());
  a->sys_image_guid = htobe64(hca.node_guid());
  a->max_mr_size = UINT64_MAX;
  a->page_size_cap = 0xfffff000;
  a->vendor_id = kVendorId;
  a->vendor_part_id = kVendorPartId;
  a->hw_ver = kHwVersion;
  a->max_qp = kMaxQp;
  a->max_qp_wr = kMaxQpWr;
  a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_SYS_IMAGE_GUID |
                        IBV_DEVICE_PORT_ACTIVE_EVENT | IBV_DEVICE_N_NOTIFY_CQ |
                        IBV_DEVICE_SHUTDOWN_PORT | IBV_DEVICE_MEM_WINDOW |
                        IBV_DEVICE_MEM_WINDOW_TYPE_2A | IBV_DEVICE_MEM_WINDOW_TYPE_2B;
  a->max_sge = kMaxSge;
  a->max_sge_rd = kMaxSge;
  a->max_cq = kMaxCq;
  a->max_cqe = kMaxCqe;
  a->max_mr = kMaxMr;
  a->max_mw = kMaxMr;
  a->max_pd = kMaxPd;
  a->max_qp_rd_atom = kMaxRdAtomic;
  a->max_res_rd_atom = kMaxRdAtomic * kMaxQp;
  a->max_qp_init_rd_atom = kMaxRdAtomic;
  a->atomic_cap = IBV_ATOMIC_HCA;
  a->max_mcast_grp = kMaxMcastGroups;
  a->max_mcast_qp_attach = kMaxMcastQpAttach;
  a->max_total_mcast_qp_attach = kMaxMcastGroups * kMaxMcastQpAttach;
  a->max_ah = kMaxAh;
  a->max_srq = kMaxSrq;
  a->max_srq_wr = kMaxSrqWr;
  a->max_srq_sge = kMaxSge;
  a->max_pkeys = 1;
  a->local_ca_ack_delay = 15;
  a->phys_port_cnt = 1;
}

void FillPortAttr(const core::Hca& hca, ibv_port_attr* a) {
  *a = ibv_port_attr{};
  a->state = IBV_PORT_ACTIVE;
  a->max_mtu = IBV_MTU_4096;
  a->active_mtu = IBV_MTU_4096;
  a->gid_tbl_len = static_cast<int>(hca.gids().size());
  a->port_cap_flags = IBV_PORT_CM_SUP | IBV_PORT_DEVICE_MGMT_SUP | IBV_PORT_VENDOR_CLASS_SUP;
  a->max_msg_sz = core::kMaxMsgSize;
  a->pkey_tbl_len = 1;
  a->lid = hca.lid();
  a->max_vl_num = 1;
  a->active_width = 2;   // 4X
  a->active_speed = 32;  // EDR: 4X EDR reads as 100 Gb/s
  a->phys_state = 5;     // LinkUp
  a->link_layer = IBV_LINK_LAYER_ETHERNET;
}

}  // namespace

namespace softrdma::abi {

int QueryDeviceEx(ibv_context* ctx, const ibv_query_device_ex_input* input,
                  ibv_device_attr_ex* attr, size_t attr_size) {
  if (input && input->comp_mask) return EINVAL;
  if (attr_size < sizeof(ibv_device_attr)) return EINVAL;
  ibv_device_attr_ex full{};
  FillDeviceAttr(CoreOf(ctx).hca(), &full.orig_attr);
  full.completion_timestamp_mask = UINT64_MAX;
  full.hca_core_clock = 1000000;  // kHz: completion timestamps count nanoseconds
  full.device_cap_flags_ex = full.orig_attr.device_cap_flags;
  full.phys_port_cnt_ex = 1;
  // Regions on demand (IBV_ACCESS_ON_DEMAND, implicit too) for every operation of every transport:
  // the library reaches its own memory at any time, and checks per access that it is mapped.
  constexpr uint32_t kOnDemandOps = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV |
                                    IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ |
                                    IBV_ODP_SUPPORT_ATOMIC | IBV_ODP_SUPPORT_SRQ_RECV;
  full.odp_caps.general_caps = IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT;
  full.odp_caps.per_transport_caps.rc_odp_caps = kOnDemandOps;
  full.odp_caps.per_transport_caps.uc_odp_caps = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV |
                                                 IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_SRQ_RECV;
  full.odp_caps.per_transport_caps.ud_odp_caps =
      IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_SRQ_RECV;
  full.xrc_odp_caps = kOnDemandOps;
  full.max_dm_size = kMaxDeviceMemory;
  std::memcpy(attr, &full, attr_size < sizeof full ? attr_size : sizeof full);
  if (attr_size > sizeof full)
    std::memset(reinterpret_cast<char*>(attr) + sizeof full, 0, attr_size - sizeof full);
  return 0;
}

int QueryPortEx(ibv_context* ctx, uint8_t port, ibv_port_attr* attr, size_t attr_len) {
  if (port != core::kPortNum) return EINVAL;
  ibv_port_attr full;
  FillPortAttr(CoreOf(ctx).hca(), &full);
  std::memset(attr, 0, attr_len);
  std::memcpy(attr, &full, attr_len < sizeof full ? attr_len : sizeof full);
  return 0;
}

}  // namespace softrdma::abi

SOFTRDMA_EXPORT ibv_device** ibv_get_device_list(int* num_devices) {
  auto** list = static_cast<ibv_device**>(calloc(2, sizeof(ibv_device*)));
  if (!list) {
    errno = ENOMEM;
    return nullptr;
  }
  list[0] = &TheDevice()->ibv;
  if (num_devices) *num_devices = 1;
  return list;
}

SOFTRDMA_EXPORT void ibv_free_device_list(ibv_device** list) {
  free(list);
}

SOFTRDMA_EXPORT const char* ibv_get_device_name(ibv_device* device) {
  return device ? device->name : nullptr;
}

SOFTRDMA_EXPORT int ibv_get_device_index(ibv_device* device) {
  return device ? 0 : -1;
}

SOFTRDMA_EXPORT __be64 ibv_get_device_guid(ibv_device* /*device*/) {
  auto hca = HcaOrNull();
  return hca ? htobe64(hca->node_guid()) : 0;
}

SOFTRDMA_EXPORT ibv_context* ibv_open_device(ibv_device* device) {
  if (device != &TheDevice()->ibv) return Fail<ibv_context>(ENODEV);
  std::string err;
  auto hca = core::Hca::Get(&err);
  if (!hca) {
    fprintf(stderr, "softrdma: cannot start: %s\n", err.c_str());
    return Fail<ibv_context>(ENODEV);
  }
  auto* vc = new VerbsContext{};
  vc->core = std::make_unique<core::Context>(hca);
  // The command descriptor a kernel device's context holds open. Nothing is ever read from ours,
  // but it is a real one: programs dup it to import the context into another (pyverbs does;
  // ibv_import_device then says EOPNOTSUPP, which they take for "not supported").
  const int cmd_fd = eventfd(0, EFD_CLOEXEC);
  if (!vc->core->async_events().ok() || cmd_fd < 0) {
    if (cmd_fd >= 0) close(cmd_fd);
    delete vc;
    return Fail<ibv_context>(EMFILE);
  }
  vc->vctx.sz = sizeof(verbs_context);
  ibv_context& c = vc->vctx.context;
  c.device = device;
  c.cmd_fd = cmd_fd;
  c.async_fd = vc->core->async_events().fd();
  c.num_comp_vectors = 1;
  pthread_mutex_init(&c.mutex, nullptr);
  c.abi_compat = reinterpret_cast<void*>(UINTPTR_MAX);  // __VERBS_ABI_IS_EXTENDED
  InstallContextOps(&vc->vctx);
  return &c;
}

SOFTRDMA_EXPORT int ibv_close_device(ibv_context* context) {
  if (!context) return EINVAL;
  VerbsContext* vc = VerbsContext::From(context);
  pthread_mutex_destroy(&context->mutex);
  close(context->cmd_fd);
  delete vc;
  return 0;
}

SOFTRDMA_EXPORT ibv_context* ibv_import_device(int /*cmd_fd*/) {
  return Fail<ibv_context>(EOPNOTSUPP);
}

SOFTRDMA_EXPORT int ibv_query_device(ibv_context* context, ibv_device_attr* attr) {
  if (!context || !attr) return EINVAL;
  FillDeviceAttr(CoreOf(context).hca(), attr);
  return 0;
}

// The exported symbol fills only the historic 48-byte prefix; newer callers reach QueryPortEx
// through verbs_context.query_port (the ibv_query_port macro).
SOFTRDMA_EXPORT int ibv_query_port(ibv_context* context, uint8_t port_num,
                                   _compat_ibv_port_attr* port_attr) {
  if (!context || !port_attr) return EINVAL;
  return QueryPortEx(context, port_num, reinterpret_cast<ibv_port_attr*>(port_attr),
                     offsetof(ibv_port_attr, port_cap_flags2));
}

SOFTRDMA_EXPORT int ibv_query_gid(ibv_context* context, uint8_t port_num, int index, ibv_gid* gid) {
  if (!context || !gid || port_num != core::kPortNum || index < 0) {
    errno = EINVAL;
    return -1;
  }
  const auto& gids = CoreOf(context).hca().gids();
  if (static_cast<size_t>(index) >= gids.size()) {
    errno = EINVAL;
    return -1;
  }
  *gid = gids[index];
  return 0;
}

SOFTRDMA_EXPORT int _ibv_query_gid_ex(ibv_context* context, uint32_t port_num, uint32_t gid_index,
                                      ibv_gid_entry* entry, uint32_t flags, size_t entry_size) {
  if (!context || !entry || flags || port_num != core::kPortNum ||
      entry_size < sizeof(ibv_gid_entry))
    return EINVAL;
  const auto& gids = CoreOf(context).hca().gids();
  if (gid_index >= gids.size()) return EINVAL;
  *entry = ibv_gid_entry{};
  entry->gid = gids[gid_index];
  entry->gid_index = gid_index;
  entry->port_num = port_num;
  entry->gid_type = IBV_GID_TYPE_ROCE_V2;
  entry->ndev_ifindex = 0;
  return 0;
}

SOFTRDMA_EXPORT ssize_t _ibv_query_gid_table(ibv_context* context, ibv_gid_entry* entries,
                                             size_t max_entries, uint32_t flags,
                                             size_t entry_size) {
  if (!context || !entries || flags || entry_size < sizeof(ibv_gid_entry)) return -EINVAL;
  const auto& gids = CoreOf(context).hca().gids();
  if (max_entries < gids.size()) return -EINVAL;
  for (size_t i = 0; i < gids.size(); ++i) {
    auto* e = reinterpret_cast<ibv_gid_entry*>(reinterpret_cast<char*>(entries) + i * entry_size);
    _ibv_query_gid_ex(context, core::kPortNum, static_cast<uint32_t>(i), e, 0, entry_size);
  }
  return static_cast<ssize_t>(gids.size());
}

// Provider-private in rdma-core but imported by ibv_devinfo and pyverbs: the sysfs GID type,
// where 1 means RoCE v2.
SOFTRDMA_EXPORT int ibv_query_gid_type(ibv_context* context, uint8_t port_num, unsigned int index,
                                       uint32_t* type) {
  if (!context || !type || port_num != core::kPortNum) return EINVAL;
  if (index >= CoreOf(context).hca().gids().size()) return EINVAL;
  *type = 1;
  return 0;
}

SOFTRDMA_EXPORT int ibv_query_pkey(ibv_context* context, uint8_t port_num, int index,
                                   __be16* pkey) {
  if (!context || !pkey || port_num != core::kPortNum || index != 0) {
    errno = EINVAL;
    return -1;
  }
  *pkey = htons(0xffff);
  return 0;
}

SOFTRDMA_EXPORT int ibv_get_pkey_index(ibv_context* context, uint8_t port_num, __be16 pkey) {
  if (!context || port_num != core::kPortNum) return -EINVAL;
  return (ntohs(pkey) & 0x7fff) == 0x7fff ? 0 : -ENOENT;
}

SOFTRDMA_EXPORT int ibv_get_async_event(ibv_context* context, ibv_async_event* event) {
  if (!context || !event) {
    errno = EINVAL;
    return -1;
  }
  int r = CoreOf(context).async_events().Pop(event);
  if (r) {
    errno = r;
    return -1;
  }
  return 0;
}

SOFTRDMA_EXPORT void ibv_ack_async_event(ibv_async_event* event) {
  if (!event) return;
  switch (event->event_type) {
    case IBV_EVENT_CQ_ERR: {
      ibv_cq* cq = event->element.cq;
      pthread_mutex_lock(&cq->mutex);
      ++cq->async_events_completed;
      pthread_cond_signal(&cq->cond);
      pthread_mutex_unlock(&cq->mutex);
      break;
    }
    case IBV_EVENT_SRQ_ERR:
    case IBV_EVENT_SRQ_LIMIT_REACHED: {
      ibv_srq* srq = event->element.srq;
      pthread_mutex_lock(&srq->mutex);
      ++srq->events_completed;
      pthread_cond_signal(&srq->cond);
      pthread_mutex_unlock(&srq->mutex);
      break;
    }
    case IBV_EVENT_PORT_ACTIVE:
    case IBV_EVENT_PORT_ERR:
    case IBV_EVENT_LID_CHANGE:
    case IBV_EVENT_PKEY_CHANGE:
    case IBV_EVENT_SM_CHANGE:
    case IBV_EVENT_CLIENT_REREGISTER:
    case IBV_EVENT_GID_CHANGE:
    case IBV_EVENT_DEVICE_FATAL:
      break;
    default: {
      ibv_qp* qp = event->element.qp;
      pthread_mutex_lock(&qp->mutex);
      ++qp->events_completed;
      pthread_cond_signal(&qp->cond);
      pthread_mutex_unlock(&qp->mutex);
      break;
    }
  }
}

// softrdma needs no madvise(MADV_DONTFORK) games: registered memory is ordinary memory.
SOFTRDMA_EXPORT int ibv_fork_init(void) {
  return 0;
}
SOFTRDMA_EXPORT ibv_fork_status ibv_is_fork_initialized(void) {
  return IBV_FORK_UNNEEDED;
}
SOFTRDMA_EXPORT int ibv_dontfork_range(void*, size_t) {
  return 0;
}
SOFTRDMA_EXPORT int ibv_dofork_range(void*, size_t) {
  return 0;
}
