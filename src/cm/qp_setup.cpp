// QPs on CM ids: creation with the defaults rdma_verbs.h programs rely on (a PD, completion
// channels and CQs made when the caller gives none), and the attributes each transition takes
// from the connection (rdma_init_qp_attr).
#include <fcntl.h>

#include <cerrno>
#include <cstring>

#include "cm/cm.h"
#include "cm/ip_address.h"
#include "core/device_names.h"

namespace softrdma::cm {

namespace {

constexpr uint8_t kDefaultAckTimeout = 14;  // 4.096 us * 2^14 = 67 ms, the usual CM choice
constexpr uint8_t kMinRnrTimer = 12;        // 0.64 ms

bool IsUd(const CmId* id) {
  return id->pub.qp_type == IBV_QPT_UD;
}

// Connections with RC semantics: RC and both halves of XRC (verbs drop what each half ignores).
bool IsReliable(ibv_qp_type t) {
  return t == IBV_QPT_RC || t == IBV_QPT_XRC_SEND || t == IBV_QPT_XRC_RECV;
}

}  // namespace

ibv_context* Cm::Context() {
  if (ctx_) return ctx_;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list) return nullptr;
  ibv_device* dev = n > 0 ? list[0] : nullptr;
  for (int i = 0; i < n; ++i) {
    if (std::strcmp(ibv_get_device_name(list[i]), core::kDeviceName) == 0) dev = list[i];
  }
  ibv_context* ctx = dev ? ibv_open_device(dev) : nullptr;
  ibv_free_device_list(list);
  if (!ctx) return nullptr;
  ibv_port_attr port{};
  std::vector<ibv_gid> gids(1);
  if (ibv_query_device(ctx, &device_attr_) != 0 || ibv_query_port(ctx, 1, &port) != 0 ||
      ibv_query_gid(ctx, 1, 0, &gids[0]) != 0) {
    ibv_close_device(ctx);
    return nullptr;
  }
  lid_ = port.lid;
  for (int i = 1;; ++i) {
    ibv_gid g{};
    if (ibv_query_gid(ctx, 1, i, &g) != 0 || g.global.interface_id == 0) break;
    gids.push_back(g);
  }
  gids_ = std::move(gids);
  pd_ = ibv_alloc_pd(ctx);
  if (!pd_) {
    ibv_close_device(ctx);
    return nullptr;
  }
  ctx_ = ctx;
  presence_.ClaimPresence();
  return ctx_;
}

const ibv_gid& Cm::GidFor(const Addr& local, uint8_t* index) const {
  if (index) *index = 0;
  if (local.family != 4 || IsLoopbackIp(local)) return gids_.front();
  for (size_t i = 0; i < gids_.size(); ++i) {
    if (std::memcmp(gids_[i].raw + 8, local.ip + 12, 4) == 0) {
      if (index) *index = static_cast<uint8_t>(i);
      return gids_[i];
    }
  }
  return gids_.front();
}

namespace {

// A completion channel and CQ for one direction, owned by the id (rdma_destroy_qp frees them).
// The CQ's context is the id: rdma_get_send_comp/rdma_get_recv_comp (rdma_verbs.h) assert it.
int MakeCq(rdma_cm_id* id, int depth, ibv_comp_channel** ch, ibv_cq** cq) {
  ibv_context* ctx = id->verbs;
  *ch = ibv_create_comp_channel(ctx);
  if (!*ch) return errno ? errno : ENOMEM;
  *cq = ibv_create_cq(ctx, depth > 0 ? depth : 1, id, *ch, 0);
  if (!*cq) {
    int e = errno ? errno : ENOMEM;
    ibv_destroy_comp_channel(*ch);
    *ch = nullptr;
    return e;
  }
  return 0;
}

void FreeCqs(rdma_cm_id* id) {
  // An XRC SRQ still completing on the receive CQ keeps it (and its channel) until it goes.
  bool recv_kept = false;
  if (id->recv_cq) {
    recv_kept = ibv_destroy_cq(id->recv_cq) == EBUSY && id->srq;
    if (!recv_kept) {
      if (id->send_cq == id->recv_cq) id->send_cq = nullptr;
      id->recv_cq = nullptr;
    }
  }
  if (id->recv_cq_channel && !recv_kept) {
    ibv_destroy_comp_channel(id->recv_cq_channel);
    if (id->send_cq_channel == id->recv_cq_channel) id->send_cq_channel = nullptr;
    id->recv_cq_channel = nullptr;
  }
  if (id->send_cq) {
    ibv_destroy_cq(id->send_cq);
    id->send_cq = nullptr;
  }
  if (id->send_cq_channel) {
    ibv_destroy_comp_channel(id->send_cq_channel);
    id->send_cq_channel = nullptr;
  }
}

}  // namespace

ibv_xrcd* Cm::XrcdLocked() {
  if (!xrcd_ && ctx_) {
    ibv_xrcd_init_attr a{};
    a.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
    a.fd = -1;
    a.oflags = O_CREAT;
    xrcd_ = ibv_open_xrcd(ctx_, &a);
  }
  return xrcd_;
}

// The target half of XRC has no CQs or PD of its own: it needs a domain, the CM's when none is
// given, and waits in INIT for the connection.
int Cm::CreateXrcRecvQpLocked(CmId* id, ibv_qp_init_attr_ex* attr) {
  rdma_cm_id& pub = id->pub;
  if (!(attr->comp_mask & IBV_QP_INIT_ATTR_XRCD) || !attr->xrcd) {
    attr->xrcd = XrcdLocked();
    if (!attr->xrcd) return errno ? errno : ENOMEM;
    attr->comp_mask |= IBV_QP_INIT_ATTR_XRCD;
  }
  attr->comp_mask &= ~static_cast<uint32_t>(IBV_QP_INIT_ATTR_PD);
  ibv_qp* qp = ibv_create_qp_ex(pub.verbs, attr);
  if (!qp) return errno ? errno : EINVAL;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  int mask = 0;
  int err = FillQpAttr(id, &a, &mask);
  if (!err) err = ibv_modify_qp(qp, &a, mask);
  if (err) {
    ibv_destroy_qp(qp);
    return err;
  }
  pub.qp = qp;
  return 0;
}

int Cm::CreateQp(CmId* id, ibv_qp_init_attr_ex* attr) {
  std::lock_guard<std::mutex> g(mu);
  rdma_cm_id& pub = id->pub;
  if (!attr || pub.qp) return EINVAL;
  if (!pub.verbs) AttachDevice(id);
  if (!pub.verbs) return ENODEV;
  if (attr->qp_type == IBV_QPT_XRC_RECV) return CreateXrcRecvQpLocked(id, attr);
  if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd) {
    attr->comp_mask |= IBV_QP_INIT_ATTR_PD;
    attr->pd = pub.pd ? pub.pd : pd_;
  } else if (attr->pd->context != pub.verbs) {
    return EINVAL;
  }
  if ((pub.recv_cq && attr->recv_cq && pub.recv_cq != attr->recv_cq) ||
      (pub.send_cq && attr->send_cq && pub.send_cq != attr->send_cq)) {
    return EINVAL;
  }
  bool made_send = false, made_recv = false;
  if (!attr->send_cq && !pub.send_cq) {
    if (int e = MakeCq(&pub, static_cast<int>(attr->cap.max_send_wr), &pub.send_cq_channel,
                       &pub.send_cq)) {
      return e;
    }
    made_send = true;
  }
  if (!attr->recv_cq && !pub.recv_cq) {
    if (int e = MakeCq(&pub, static_cast<int>(attr->cap.max_recv_wr), &pub.recv_cq_channel,
                       &pub.recv_cq)) {
      if (made_send) FreeCqs(&pub);
      return e;
    }
    made_recv = true;
  }
  if (!attr->send_cq) attr->send_cq = pub.send_cq;
  if (!attr->recv_cq) attr->recv_cq = pub.recv_cq;
  if (pub.srq && !attr->srq) attr->srq = pub.srq;
  ibv_qp* qp = ibv_create_qp_ex(pub.verbs, attr);
  if (!qp) {
    int e = errno ? errno : EINVAL;
    if (made_send || made_recv) FreeCqs(&pub);
    return e;
  }
  pub.qp = qp;
  pub.pd = qp->pd;
  // Connected QPs wait in INIT for the connection; UD QPs are ready at once (as rdma-core does).
  ibv_qp_attr a{};
  int mask = 0;
  a.qp_state = IBV_QPS_INIT;
  int err = 0;
  if (IsReliable(qp->qp_type) || qp->qp_type == IBV_QPT_UC || IsUd(id)) {
    err = FillQpAttr(id, &a, &mask);
    if (!err) err = ibv_modify_qp(qp, &a, mask);
    if (!err && IsUd(id)) {
      a = {};
      a.qp_state = IBV_QPS_RTR;
      err = ibv_modify_qp(qp, &a, IBV_QP_STATE);
      if (!err) {
        a = {};
        a.qp_state = IBV_QPS_RTS;
        a.sq_psn = 0;
        err = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
      }
    }
  }
  if (err) {
    ibv_destroy_qp(qp);
    pub.qp = nullptr;
    if (made_send || made_recv) FreeCqs(&pub);
    return err;
  }
  return 0;
}

void Cm::DestroyQp(CmId* id) {
  std::lock_guard<std::mutex> g(mu);
  if (id->pub.qp) {
    ibv_destroy_qp(id->pub.qp);
    id->pub.qp = nullptr;
  }
  FreeCqs(&id->pub);
}

int Cm::CreateSrq(CmId* id, ibv_srq_init_attr_ex* attr) {
  std::lock_guard<std::mutex> g(mu);
  rdma_cm_id& pub = id->pub;
  if (!attr || pub.srq) return EINVAL;
  if (!pub.verbs) AttachDevice(id);
  if (!pub.verbs) return ENODEV;
  if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !attr->pd) {
    attr->comp_mask |= IBV_SRQ_INIT_ATTR_PD;
    attr->pd = pub.pd ? pub.pd : pd_;
  }
  if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE)) {
    attr->comp_mask |= IBV_SRQ_INIT_ATTR_TYPE;
    attr->srq_type = pub.qp_type == IBV_QPT_XRC_RECV ? IBV_SRQT_XRC : IBV_SRQT_BASIC;
  }
  if (attr->srq_type == IBV_SRQT_XRC) {
    // As rdma-core: the CM's domain, and the id's receive CQ (rdma_get_recv_comp polls it).
    if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_XRCD) || !attr->xrcd) {
      attr->xrcd = XrcdLocked();
      if (!attr->xrcd) return errno ? errno : ENOMEM;
      attr->comp_mask |= IBV_SRQ_INIT_ATTR_XRCD;
    }
    if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_CQ) || !attr->cq) {
      if (!pub.recv_cq) {
        if (int e = MakeCq(&pub, static_cast<int>(attr->attr.max_wr), &pub.recv_cq_channel,
                           &pub.recv_cq))
          return e;
      }
      attr->cq = pub.recv_cq;
      attr->comp_mask |= IBV_SRQ_INIT_ATTR_CQ;
    }
  }
  ibv_srq* srq = ibv_create_srq_ex(pub.verbs, attr);
  if (!srq) return errno ? errno : EINVAL;
  pub.srq = srq;
  return 0;
}

void Cm::DestroySrq(CmId* id) {
  std::lock_guard<std::mutex> g(mu);
  if (id->pub.srq) {
    ibv_destroy_srq(id->pub.srq);
    id->pub.srq = nullptr;
  }
  FreeCqs(&id->pub);
}

int Cm::InitQpAttr(CmId* id, ibv_qp_attr* a, int* mask) {
  std::lock_guard<std::mutex> g(mu);
  if (!a || !mask) return EINVAL;
  return FillQpAttr(id, a, mask);
}

int Cm::FillQpAttr(CmId* id, ibv_qp_attr* a, int* mask) {
  ibv_qp_state want = a->qp_state;
  std::memset(a, 0, sizeof *a);
  a->qp_state = want;
  bool ud = IsUd(id);
  bool rc = IsReliable(id->pub.qp_type);
  switch (want) {
    case IBV_QPS_INIT:
      a->pkey_index = 0;
      a->port_num = 1;
      *mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
      if (ud) {
        a->qkey = id->qkey;
        *mask |= IBV_QP_QKEY;
      } else {
        a->qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
        if (rc) a->qp_access_flags |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
        *mask |= IBV_QP_ACCESS_FLAGS;
      }
      return 0;
    case IBV_QPS_RTR:
      *mask = IBV_QP_STATE;
      if (ud) return 0;
      if (!id->remote_known) return EINVAL;
      a->path_mtu = IBV_MTU_4096;
      a->dest_qp_num = id->remote_qpn;
      a->rq_psn = id->remote_psn;
      a->ah_attr.is_global = 1;
      std::memcpy(&a->ah_attr.grh.dgid, id->remote_gid, 16);
      GidFor(id->src, &a->ah_attr.grh.sgid_index);
      a->ah_attr.grh.hop_limit = 64;
      a->ah_attr.grh.traffic_class = id->tos;
      a->ah_attr.dlid = id->remote_lid;
      a->ah_attr.port_num = 1;
      *mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
      if (rc) {
        a->max_dest_rd_atomic = id->responder_resources;
        a->min_rnr_timer = kMinRnrTimer;
        *mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
      }
      return 0;
    case IBV_QPS_RTS:
      a->sq_psn = ud ? 0 : id->psn;
      *mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
      if (rc) {
        a->timeout = id->ack_timeout_set ? id->ack_timeout : kDefaultAckTimeout;
        a->retry_cnt = id->retry_count;
        a->rnr_retry = id->rnr_retry_count;
        a->max_rd_atomic = id->initiator_depth;
        *mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
      }
      return 0;
    default:
      *mask = IBV_QP_STATE;
      return 0;
  }
}

// Under mu.
int Cm::ModifyToRtrRts(CmId* id) {
  ibv_qp* qp = id->pub.qp;
  if (!qp) return 0;
  ibv_qp_attr a{};
  ibv_qp_init_attr init{};
  if (ibv_query_qp(qp, &a, IBV_QP_STATE, &init) != 0) return EINVAL;
  for (ibv_qp_state s : {IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS}) {
    if (s == IBV_QPS_INIT && a.qp_state != IBV_QPS_RESET) continue;
    ibv_qp_attr t{};
    t.qp_state = s;
    int mask = 0;
    int err = FillQpAttr(id, &t, &mask);
    if (!err) err = ibv_modify_qp(qp, &t, mask);
    if (err) return err;
  }
  return 0;
}

void Cm::ModifyToError(CmId* id) {
  if (!id->pub.qp) return;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  ibv_modify_qp(id->pub.qp, &a, IBV_QP_STATE);
}

}  // namespace softrdma::cm
