/*
 * softrdma: the OFED 1.5 legacy XRC API (ibv_create_xrc_rcv_qp(3) and its siblings), on top of
 * today's XRC (ibv_open_xrcd, XRC_RECV QPs, ibv_open_qp). The symbols are exported by softrdma's
 * libibverbs.so.1 (version node IBVERBS_1.1); rdma-core's library does not have them.
 *
 *   #include <infiniband/verbs.h>
 *   #include <infiniband/ofed_xrc.h>      (build/include, or src/abi/verbs/include)
 *
 * A program written against the man pages compiles with two changes, because today's
 * <infiniband/verbs.h> has no room for what OFED 1.5 added to two of its structs:
 *
 *  1. struct ibv_qp_init_attr had a last field `xrc_domain`. Declare the init attributes you set
 *     it in as `struct ibv_xrc_qp_init_attr` instead: the same fields in the same order, then
 *     `xrc_domain`. ibv_create_xrc_rcv_qp() takes it, and so does ibv_create_qp() (a macro here
 *     in C, an overload in C++) for the legacy send QP (qp_type IBV_QPT_XRC).
 *  2. struct ibv_srq had a field `xrc_srq_num`. Read it with ibv_xrc_srq_num(srq).
 *
 * Everything else is as the man pages say: IBV_QPT_XRC names the send QP's type, and a work
 * request names the remote SRQ in wr.xrc_remote_srq_num. Calls return 0 or an errno value;
 * the creating calls return NULL and set errno. An XRC receive QP number unknown in the domain
 * (never created, or gone after the last ibv_unreg_xrc_rcv_qp) is EINVAL for ibv_modify_*,
 * ibv_query_*, ibv_reg_* and ibv_unreg_xrc_rcv_qp (unreg also when this process is not
 * registered for it).
 *
 * How softrdma keeps the receive QP alive after its creator exits, and what senders need for it:
 * docs/architecture.md §13 and docs/compatibility.md.
 */
#ifndef SOFTRDMA_OFED_XRC_H
#define SOFTRDMA_OFED_XRC_H

#include <infiniband/verbs.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* An XRC domain, as ibv_open_xrc_domain() returns it. */
struct ibv_xrc_domain {
  struct ibv_context* context;
  uint32_t handle;
};

/* struct ibv_qp_init_attr as OFED 1.5 had it. */
struct ibv_xrc_qp_init_attr {
  void* qp_context;
  struct ibv_cq* send_cq;
  struct ibv_cq* recv_cq;
  struct ibv_srq* srq;
  struct ibv_qp_cap cap;
  enum ibv_qp_type qp_type;
  int sq_sig_all;
  struct ibv_xrc_domain* xrc_domain; /* XRC domain the QP will be associated with */
};

/* The send side: a QP of this type sends to the XRC SRQ that each work request names. */
#define IBV_QPT_XRC IBV_QPT_XRC_SEND
#define xrc_remote_srq_num qp_type.xrc.remote_srqn

/* fd -1: a domain of this process only; otherwise the domain of that file, made with O_CREAT. */
struct ibv_xrc_domain* ibv_open_xrc_domain(struct ibv_context* context, int fd, int oflag);
int ibv_close_xrc_domain(struct ibv_xrc_domain* d);

/* An XRC SRQ of the domain; its receive completions go to xrc_cq. */
struct ibv_srq* ibv_create_xrc_srq(struct ibv_pd* pd, struct ibv_xrc_domain* xrc_domain,
                                   struct ibv_cq* xrc_cq, struct ibv_srq_init_attr* srq_init_attr);
/* What OFED 1.5 kept in srq->xrc_srq_num (0 for an SRQ that is not an XRC SRQ). */
uint32_t ibv_xrc_srq_num(struct ibv_srq* srq);

/* Only init_attr->xrc_domain is used. The creator is registered for the QP. */
int ibv_create_xrc_rcv_qp(struct ibv_xrc_qp_init_attr* init_attr, uint32_t* xrc_rcv_qpn);
int ibv_modify_xrc_rcv_qp(struct ibv_xrc_domain* xrc_domain, uint32_t xrc_qp_num,
                          struct ibv_qp_attr* attr, int attr_mask);
int ibv_query_xrc_rcv_qp(struct ibv_xrc_domain* xrc_domain, uint32_t xrc_qp_num,
                         struct ibv_qp_attr* attr, int attr_mask,
                         struct ibv_qp_init_attr* init_attr);
int ibv_reg_xrc_rcv_qp(struct ibv_xrc_domain* xrc_domain, uint32_t xrc_qp_num);
int ibv_unreg_xrc_rcv_qp(struct ibv_xrc_domain* xrc_domain, uint32_t xrc_qp_num);

/* ibv_create_qp() with OFED 1.5's init attributes (the legacy send QP). */
struct ibv_qp* ibv_create_xrc_qp(struct ibv_pd* pd, struct ibv_xrc_qp_init_attr* attr);

#ifdef __cplusplus
}
inline struct ibv_qp* ibv_create_qp(struct ibv_pd* pd, struct ibv_xrc_qp_init_attr* attr) {
  return ibv_create_xrc_qp(pd, attr);
}
#else
/* clang-format off */
#define ibv_create_qp(pd, attr) \
  _Generic((attr), struct ibv_xrc_qp_init_attr *: ibv_create_xrc_qp, default: ibv_create_qp)( \
      (pd), (attr))
/* clang-format on */
#endif

#endif /* SOFTRDMA_OFED_XRC_H */
