// IBVERBS_PRIVATE_34: the provider-private ABI of rdma-core 44's libibverbs.
//
// softrdma has no kernel uverbs device and loads no vendor provider, but
// Debian's libmlx5.so.1 and libefa.so.1 are DT_NEEDED by every perftest binary,
// they are linked BIND_NOW, and they import 61 resp. 21 of these symbols (one a
// data object).  Both also call verbs_register_driver_34() from an ELF
// constructor.  So every symbol has to exist, and every one must be safe to
// call:
//
//   * verbs_register_driver_34 ignores the provider (we never match sysfs
//     devices, so its alloc_context would never be called anyway);
//   * verbs_set_ops / verbs_uninit_context / verbs_init_cq / __verbs_log are
//     no-ops;
//   * everything that would talk to /dev/infiniband/uverbsN fails the way the
//     real function fails: the ibv_cmd_* family returns a positive errno value
//     (EOPNOTSUPP), functions returning a pointer return NULL with errno set,
//     the sysfs reader returns -1 with errno set.
//
// Signatures follow rdma-core v44 libibverbs/driver.h and cmd_ioctl.h.  Those
// headers are not installed, so the private struct types below are
// incomplete; only pointers to them cross the ABI.  Scalars keep their exact
// width (int, uint32_t, size_t, uint64_t, ...) so the calling convention
// matches what the providers were compiled against.
//
// ibv_query_gid_type, the 71st PRIVATE_34 name, is implemented with the GID
// table code, not here.

#include <infiniband/verbs.h>

#include <rdma/ib_user_verbs.h>

#include <cerrno>
#include <cstdarg>
#include <cstddef>
#include <cstdint>

#include "abi/export.h"

// rdma-core private types (libibverbs/driver.h, kern-abi.h, cmd_ioctl.h).
// ib_uverbs_*_resp come from <rdma/ib_user_verbs.h>; the ibv_* command structs
// are rdma-core's own wrappers around them and stay incomplete.
struct verbs_device_ops;
struct verbs_context_ops;
struct verbs_sysfs_dev;
struct verbs_xrcd;
struct verbs_srq;
struct verbs_qp;
struct verbs_cq;
struct verbs_mr;
struct verbs_dm;
struct verbs_flow_action;
struct verbs_counters;
struct ibv_command_buffer;
struct ibv_get_context;
struct ibv_query_port;
struct ibv_alloc_pd;
struct ibv_open_xrcd;
struct ibv_reg_mr;
struct ibv_rereg_mr;
struct ibv_alloc_mw;
struct ibv_create_cq;
struct ibv_create_cq_ex;
struct ibv_resize_cq;
struct ibv_modify_cq;
struct ibv_create_srq;
struct ibv_create_xsrq;
struct ibv_modify_srq;
struct ibv_query_srq;
struct ibv_create_qp;
struct ibv_create_qp_ex;
struct ibv_open_qp;
struct ibv_query_qp;
struct ibv_modify_qp;
struct ibv_modify_qp_ex;
struct ibv_create_wq;
struct ibv_modify_wq;

namespace {

// Result of an int-returning ibv_cmd_*: rdma-core returns the errno value
// (positive) and most paths also leave it in errno.
inline int cmd_unsupported() {
  errno = EOPNOTSUPP;
  return EOPNOTSUPP;
}

// Result of a pointer-returning entry point.
inline void* ptr_unsupported() {
  errno = EOPNOTSUPP;
  return nullptr;
}

}  // namespace

// ---------------------------------------------------------------------------
// Data object.  rdma-core sets it from RDMAV_ALLOW_DISASSOC_DESTROY at
// ibv_get_device_list() time; providers read it to decide whether EIO from a
// destroy command counts as success.  We never return EIO, so it stays false.
// SOFTRDMA_EXPORT expands to `extern "C"`, which makes a single declaration
// with an initializer draw -Werror=extern-initializer (a bogus warning here);
// declare it exported first, then define it: the definition inherits both the
// C language linkage and the default visibility.
SOFTRDMA_EXPORT bool verbs_allow_disassociate_destroy;
bool verbs_allow_disassociate_destroy = false;

// ---------------------------------------------------------------------------
// Provider registration, context life cycle, logging.

// Called from the ELF constructors of libmlx5/libefa.  softrdma does not load
// vendor providers, so the ops table is ignored.
SOFTRDMA_EXPORT void verbs_register_driver_34(const struct verbs_device_ops* /*ops*/) {}

SOFTRDMA_EXPORT void* _verbs_init_and_alloc_context(struct ibv_device* /*device*/, int /*cmd_fd*/,
                                                    size_t /*alloc_size*/,
                                                    struct verbs_context* /*context_offset*/,
                                                    uint32_t /*driver_id*/) {
  return ptr_unsupported();
}

SOFTRDMA_EXPORT void verbs_uninit_context(struct verbs_context* /*context*/) {}

SOFTRDMA_EXPORT void verbs_set_ops(struct verbs_context* /*vctx*/,
                                   const struct verbs_context_ops* /*ops*/) {}

SOFTRDMA_EXPORT void verbs_init_cq(struct ibv_cq* /*cq*/, struct ibv_context* /*context*/,
                                   struct ibv_comp_channel* /*channel*/, void* /*cq_context*/) {}

SOFTRDMA_EXPORT struct ibv_context* verbs_open_device(struct ibv_device* /*device*/,
                                                      void* /*private_data*/) {
  return static_cast<struct ibv_context*>(ptr_unsupported());
}

SOFTRDMA_EXPORT void __verbs_log(struct verbs_context* /*ctx*/, uint32_t /*level*/,
                                 const char* /*fmt*/, ...) {}

// ---------------------------------------------------------------------------
// ioctl() command-buffer machinery (cmd_ioctl.h).

// Sizes the on-stack attribute array of a command that links a driver
// command buffer.  We cannot walk the (opaque) link chain, and since
// execute_ioctl never merges linked attributes there is nothing to reserve
// room for: the caller's own count is the right answer.
SOFTRDMA_EXPORT unsigned int __ioctl_final_num_attrs(unsigned int num_attrs,
                                                     struct ibv_command_buffer* /*link*/) {
  return num_attrs;
}

// Returns the errno value on failure, like the real one after a failed ioctl().
SOFTRDMA_EXPORT int execute_ioctl(struct ibv_context* /*context*/,
                                  struct ibv_command_buffer* /*cmd*/) {
  return cmd_unsupported();
}

// ---------------------------------------------------------------------------
// sysfs.  The real function returns -1 with errno set (EINVAL without a
// device, otherwise whatever openat() reported).  We have no sysfs tree.
SOFTRDMA_EXPORT int ibv_read_ibdev_sysfs_file(char* /*buf*/, size_t /*size*/,
                                              struct verbs_sysfs_dev* sysfs_dev,
                                              const char* /*fnfmt*/, ...) {
  errno = sysfs_dev ? ENOENT : EINVAL;
  return -1;
}

// ---------------------------------------------------------------------------
// Device / context commands.

SOFTRDMA_EXPORT int ibv_cmd_get_context(struct verbs_context* /*context*/,
                                        struct ibv_get_context* /*cmd*/, size_t /*cmd_size*/,
                                        struct ib_uverbs_get_context_resp* /*resp*/,
                                        size_t /*resp_size*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_query_context(struct ibv_context* /*ctx*/,
                                          struct ibv_command_buffer* /*driver*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_query_device_any(struct ibv_context* /*context*/,
                                             const struct ibv_query_device_ex_input* /*input*/,
                                             struct ibv_device_attr_ex* /*attr*/,
                                             size_t /*attr_size*/,
                                             struct ib_uverbs_ex_query_device_resp* /*resp*/,
                                             size_t* /*resp_size*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_query_port(struct ibv_context* /*context*/, uint8_t /*port_num*/,
                                       struct ibv_port_attr* /*port_attr*/,
                                       struct ibv_query_port* /*cmd*/, size_t /*cmd_size*/) {
  return cmd_unsupported();
}

// ---------------------------------------------------------------------------
// PD, XRCD.

SOFTRDMA_EXPORT int ibv_cmd_alloc_pd(struct ibv_context* /*context*/, struct ibv_pd* /*pd*/,
                                     struct ibv_alloc_pd* /*cmd*/, size_t /*cmd_size*/,
                                     struct ib_uverbs_alloc_pd_resp* /*resp*/,
                                     size_t /*resp_size*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_dealloc_pd(struct ibv_pd* /*pd*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_open_xrcd(struct ibv_context* /*context*/, struct verbs_xrcd* /*xrcd*/,
                                      int /*vxrcd_size*/, struct ibv_xrcd_init_attr* /*attr*/,
                                      struct ibv_open_xrcd* /*cmd*/, size_t /*cmd_size*/,
                                      struct ib_uverbs_open_xrcd_resp* /*resp*/,
                                      size_t /*resp_size*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_close_xrcd(struct verbs_xrcd* /*xrcd*/) {
  return cmd_unsupported();
}

// ---------------------------------------------------------------------------
// MR, MW, DM.

SOFTRDMA_EXPORT int ibv_cmd_reg_mr(struct ibv_pd* /*pd*/, void* /*addr*/, size_t /*length*/,
                                   uint64_t /*hca_va*/, int /*access*/, struct verbs_mr* /*vmr*/,
                                   struct ibv_reg_mr* /*cmd*/, size_t /*cmd_size*/,
                                   struct ib_uverbs_reg_mr_resp* /*resp*/, size_t /*resp_size*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_rereg_mr(struct verbs_mr* /*vmr*/, uint32_t /*flags*/, void* /*addr*/,
                                     size_t /*length*/, uint64_t /*hca_va*/, int /*access*/,
                                     struct ibv_pd* /*pd*/, struct ibv_rereg_mr* /*cmd*/,
                                     size_t /*cmd_sz*/, struct ib_uverbs_rereg_mr_resp* /*resp*/,
                                     size_t /*resp_sz*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_dereg_mr(struct verbs_mr* /*vmr*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_query_mr(struct ibv_pd* /*pd*/, struct verbs_mr* /*vmr*/,
                                     uint32_t /*mr_handle*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_advise_mr(struct ibv_pd* /*pd*/, enum ibv_advise_mr_advice /*advice*/,
                                      uint32_t /*flags*/, struct ibv_sge* /*sg_list*/,
                                      uint32_t /*num_sge*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_reg_dmabuf_mr(struct ibv_pd* /*pd*/, uint64_t /*offset*/,
                                          size_t /*length*/, uint64_t /*iova*/, int /*fd*/,
                                          int /*access*/, struct verbs_mr* /*vmr*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_alloc_mw(struct ibv_pd* /*pd*/, enum ibv_mw_type /*type*/,
                                     struct ibv_mw* /*mw*/, struct ibv_alloc_mw* /*cmd*/,
                                     size_t /*cmd_size*/, struct ib_uverbs_alloc_mw_resp* /*resp*/,
                                     size_t /*resp_size*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_dealloc_mw(struct ibv_mw* /*mw*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_alloc_dm(struct ibv_context* /*ctx*/,
                                     const struct ibv_alloc_dm_attr* /*dm_attr*/,
                                     struct verbs_dm* /*dm*/, struct ibv_command_buffer* /*link*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_free_dm(struct verbs_dm* /*dm*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_reg_dm_mr(struct ibv_pd* /*pd*/, struct verbs_dm* /*dm*/,
                                      uint64_t /*offset*/, size_t /*length*/,
                                      unsigned int /*access*/, struct verbs_mr* /*vmr*/,
                                      struct ibv_command_buffer* /*link*/) {
  return cmd_unsupported();
}

// ---------------------------------------------------------------------------
// CQ.

SOFTRDMA_EXPORT int ibv_cmd_create_cq(struct ibv_context* /*context*/, int /*cqe*/,
                                      struct ibv_comp_channel* /*channel*/, int /*comp_vector*/,
                                      struct ibv_cq* /*cq*/, struct ibv_create_cq* /*cmd*/,
                                      size_t /*cmd_size*/,
                                      struct ib_uverbs_create_cq_resp* /*resp*/,
                                      size_t /*resp_size*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_create_cq_ex(struct ibv_context* /*context*/,
                                         const struct ibv_cq_init_attr_ex* /*cq_attr*/,
                                         struct verbs_cq* /*cq*/, struct ibv_create_cq_ex* /*cmd*/,
                                         size_t /*cmd_size*/,
                                         struct ib_uverbs_ex_create_cq_resp* /*resp*/,
                                         size_t /*resp_size*/, uint32_t /*cmd_flags*/) {
  return cmd_unsupported();
}

// Unlike the other commands, the real ibv_cmd_poll_cq returns the number of
// completions, or -1 on failure.
SOFTRDMA_EXPORT int ibv_cmd_poll_cq(struct ibv_cq* /*cq*/, int /*ne*/, struct ibv_wc* /*wc*/) {
  errno = EOPNOTSUPP;
  return -1;
}

SOFTRDMA_EXPORT int ibv_cmd_req_notify_cq(struct ibv_cq* /*cq*/, int /*solicited_only*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_resize_cq(struct ibv_cq* /*cq*/, int /*cqe*/,
                                      struct ibv_resize_cq* /*cmd*/, size_t /*cmd_size*/,
                                      struct ib_uverbs_resize_cq_resp* /*resp*/,
                                      size_t /*resp_size*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_destroy_cq(struct ibv_cq* /*cq*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_modify_cq(struct ibv_cq* /*cq*/, struct ibv_modify_cq_attr* /*attr*/,
                                      struct ibv_modify_cq* /*cmd*/, size_t /*cmd_size*/) {
  return cmd_unsupported();
}

// ---------------------------------------------------------------------------
// SRQ.

SOFTRDMA_EXPORT int ibv_cmd_create_srq(struct ibv_pd* /*pd*/, struct ibv_srq* /*srq*/,
                                       struct ibv_srq_init_attr* /*attr*/,
                                       struct ibv_create_srq* /*cmd*/, size_t /*cmd_size*/,
                                       struct ib_uverbs_create_srq_resp* /*resp*/,
                                       size_t /*resp_size*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_create_srq_ex(struct ibv_context* /*context*/,
                                          struct verbs_srq* /*srq*/,
                                          struct ibv_srq_init_attr_ex* /*attr_ex*/,
                                          struct ibv_create_xsrq* /*cmd*/, size_t /*cmd_size*/,
                                          struct ib_uverbs_create_srq_resp* /*resp*/,
                                          size_t /*resp_size*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_modify_srq(struct ibv_srq* /*srq*/, struct ibv_srq_attr* /*srq_attr*/,
                                       int /*srq_attr_mask*/, struct ibv_modify_srq* /*cmd*/,
                                       size_t /*cmd_size*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_query_srq(struct ibv_srq* /*srq*/, struct ibv_srq_attr* /*srq_attr*/,
                                      struct ibv_query_srq* /*cmd*/, size_t /*cmd_size*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_destroy_srq(struct ibv_srq* /*srq*/) {
  return cmd_unsupported();
}

// ---------------------------------------------------------------------------
// QP.

SOFTRDMA_EXPORT int ibv_cmd_create_qp(struct ibv_pd* /*pd*/, struct ibv_qp* /*qp*/,
                                      struct ibv_qp_init_attr* /*attr*/,
                                      struct ibv_create_qp* /*cmd*/, size_t /*cmd_size*/,
                                      struct ib_uverbs_create_qp_resp* /*resp*/,
                                      size_t /*resp_size*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_create_qp_ex(struct ibv_context* /*context*/, struct verbs_qp* /*qp*/,
                                         struct ibv_qp_init_attr_ex* /*attr_ex*/,
                                         struct ibv_create_qp* /*cmd*/, size_t /*cmd_size*/,
                                         struct ib_uverbs_create_qp_resp* /*resp*/,
                                         size_t /*resp_size*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_create_qp_ex2(struct ibv_context* /*context*/, struct verbs_qp* /*qp*/,
                                          struct ibv_qp_init_attr_ex* /*qp_attr*/,
                                          struct ibv_create_qp_ex* /*cmd*/, size_t /*cmd_size*/,
                                          struct ib_uverbs_ex_create_qp_resp* /*resp*/,
                                          size_t /*resp_size*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_open_qp(struct ibv_context* /*context*/, struct verbs_qp* /*qp*/,
                                    int /*vqp_sz*/, struct ibv_qp_open_attr* /*attr*/,
                                    struct ibv_open_qp* /*cmd*/, size_t /*cmd_size*/,
                                    struct ib_uverbs_create_qp_resp* /*resp*/,
                                    size_t /*resp_size*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_query_qp(struct ibv_qp* /*qp*/, struct ibv_qp_attr* /*qp_attr*/,
                                     int /*attr_mask*/, struct ibv_qp_init_attr* /*qp_init_attr*/,
                                     struct ibv_query_qp* /*cmd*/, size_t /*cmd_size*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_modify_qp(struct ibv_qp* /*qp*/, struct ibv_qp_attr* /*attr*/,
                                      int /*attr_mask*/, struct ibv_modify_qp* /*cmd*/,
                                      size_t /*cmd_size*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_modify_qp_ex(struct ibv_qp* /*qp*/, struct ibv_qp_attr* /*attr*/,
                                         int /*attr_mask*/, struct ibv_modify_qp_ex* /*cmd*/,
                                         size_t /*cmd_size*/,
                                         struct ib_uverbs_ex_modify_qp_resp* /*resp*/,
                                         size_t /*resp_size*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_destroy_qp(struct ibv_qp* /*qp*/) {
  return cmd_unsupported();
}

// The post commands report the first rejected work request through *bad_wr.
SOFTRDMA_EXPORT int ibv_cmd_post_send(struct ibv_qp* /*ibqp*/, struct ibv_send_wr* wr,
                                      struct ibv_send_wr** bad_wr) {
  if (bad_wr) *bad_wr = wr;
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_post_recv(struct ibv_qp* /*ibqp*/, struct ibv_recv_wr* wr,
                                      struct ibv_recv_wr** bad_wr) {
  if (bad_wr) *bad_wr = wr;
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_post_srq_recv(struct ibv_srq* /*srq*/, struct ibv_recv_wr* wr,
                                          struct ibv_recv_wr** bad_wr) {
  if (bad_wr) *bad_wr = wr;
  return cmd_unsupported();
}

// ---------------------------------------------------------------------------
// AH, multicast.

SOFTRDMA_EXPORT int ibv_cmd_create_ah(struct ibv_pd* /*pd*/, struct ibv_ah* /*ah*/,
                                      struct ibv_ah_attr* /*attr*/,
                                      struct ib_uverbs_create_ah_resp* /*resp*/,
                                      size_t /*resp_size*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_destroy_ah(struct ibv_ah* /*ah*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_attach_mcast(struct ibv_qp* /*qp*/, const union ibv_gid* /*gid*/,
                                         uint16_t /*lid*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_detach_mcast(struct ibv_qp* /*qp*/, const union ibv_gid* /*gid*/,
                                         uint16_t /*lid*/) {
  return cmd_unsupported();
}

// ---------------------------------------------------------------------------
// Flow steering, flow actions.

SOFTRDMA_EXPORT int ibv_cmd_create_flow(struct ibv_qp* /*qp*/, struct ibv_flow* /*flow_id*/,
                                        struct ibv_flow_attr* /*flow_attr*/, void* /*ucmd*/,
                                        size_t /*ucmd_size*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_destroy_flow(struct ibv_flow* /*flow_id*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_create_flow_action_esp(struct ibv_context* /*ctx*/,
                                                   struct ibv_flow_action_esp_attr* /*attr*/,
                                                   struct verbs_flow_action* /*flow_action*/,
                                                   struct ibv_command_buffer* /*driver*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_modify_flow_action_esp(struct verbs_flow_action* /*flow_action*/,
                                                   struct ibv_flow_action_esp_attr* /*attr*/,
                                                   struct ibv_command_buffer* /*driver*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_destroy_flow_action(struct verbs_flow_action* /*action*/) {
  return cmd_unsupported();
}

// ---------------------------------------------------------------------------
// WQ, RSS indirection tables.

SOFTRDMA_EXPORT int ibv_cmd_create_wq(struct ibv_context* /*context*/,
                                      struct ibv_wq_init_attr* /*wq_init_attr*/,
                                      struct ibv_wq* /*wq*/, struct ibv_create_wq* /*cmd*/,
                                      size_t /*cmd_size*/,
                                      struct ib_uverbs_ex_create_wq_resp* /*resp*/,
                                      size_t /*resp_size*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_modify_wq(struct ibv_wq* /*wq*/, struct ibv_wq_attr* /*attr*/,
                                      struct ibv_modify_wq* /*cmd*/, size_t /*cmd_size*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_destroy_wq(struct ibv_wq* /*wq*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_create_rwq_ind_table(
    struct ibv_context* /*context*/, struct ibv_rwq_ind_table_init_attr* /*init_attr*/,
    struct ibv_rwq_ind_table* /*rwq_ind_table*/,
    struct ib_uverbs_ex_create_rwq_ind_table_resp* /*resp*/, size_t /*resp_size*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_destroy_rwq_ind_table(struct ibv_rwq_ind_table* /*rwq_ind_table*/) {
  return cmd_unsupported();
}

// ---------------------------------------------------------------------------
// Counters.

SOFTRDMA_EXPORT int ibv_cmd_create_counters(struct ibv_context* /*context*/,
                                            struct ibv_counters_init_attr* /*init_attr*/,
                                            struct verbs_counters* /*vcounters*/,
                                            struct ibv_command_buffer* /*link*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_destroy_counters(struct verbs_counters* /*vcounters*/) {
  return cmd_unsupported();
}

SOFTRDMA_EXPORT int ibv_cmd_read_counters(struct verbs_counters* /*vcounters*/,
                                          uint64_t* /*counters_value*/, uint32_t /*ncounters*/,
                                          uint32_t /*flags*/, struct ibv_command_buffer* /*link*/) {
  return cmd_unsupported();
}
