// Completion channels and completion queues, classic and extended (ibv_cq_ex).
#include <cerrno>

#include "abi/export.h"
#include "abi/verbs/objects.h"
#include "core/limits.h"

using namespace softrdma;
using namespace softrdma::abi;

SOFTRDMA_EXPORT ibv_comp_channel* ibv_create_comp_channel(ibv_context* context) {
  if (!context) return Fail<ibv_comp_channel>(EINVAL);
  auto* ch = new VerbsCompChannel{};
  if (!ch->core.events.ok()) {
    delete ch;
    return Fail<ibv_comp_channel>(EMFILE);
  }
  ch->ibv.context = context;
  ch->ibv.fd = ch->core.events.fd();
  ch->ibv.refcnt = 0;
  return &ch->ibv;
}

SOFTRDMA_EXPORT int ibv_destroy_comp_channel(ibv_comp_channel* channel) {
  if (!channel) return EINVAL;
  if (channel->refcnt > 0) return EBUSY;
  VerbsCompChannel* c = VerbsCompChannel::From(channel);
  if (c->core.events.Close()) delete c;  // else a thread waits in it: see EventQueue::Close
  return 0;
}

namespace softrdma::abi {

ibv_cq_ex* CreateCqEx(ibv_context* ctx, ibv_cq_init_attr_ex* attr) {
  constexpr uint64_t kWcFlags =
      IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM | IBV_WC_EX_WITH_SRC_QP |
      IBV_WC_EX_WITH_SLID | IBV_WC_EX_WITH_SL | IBV_WC_EX_WITH_DLID_PATH_BITS |
      IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | IBV_WC_EX_WITH_CVLAN | IBV_WC_EX_WITH_FLOW_TAG |
      IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;
  if (!ctx || !attr) return Fail<ibv_cq_ex>(EINVAL);
  if (attr->cqe < 1 || attr->cqe > core::kMaxCqe) return Fail<ibv_cq_ex>(EINVAL);
  if (attr->comp_vector >= static_cast<uint32_t>(ctx->num_comp_vectors))
    return Fail<ibv_cq_ex>(EINVAL);
  if (attr->comp_mask & ~uint32_t{IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD})
    return Fail<ibv_cq_ex>(EOPNOTSUPP);
  if (attr->wc_flags & ~kWcFlags) return Fail<ibv_cq_ex>(EOPNOTSUPP);
  auto* cq = new VerbsCq{};
  VerbsCompChannel* ch = attr->channel ? VerbsCompChannel::From(attr->channel) : nullptr;
  constexpr uint64_t kTimestampFlags =
      IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;
  cq->core = std::make_unique<core::Cq>(CoreOf(ctx), attr->cqe, ch ? &ch->core : nullptr, &cq->ibv,
                                        (attr->wc_flags & kTimestampFlags) != 0);
  cq->wc_flags = attr->wc_flags;
  ibv_cq_ex& c = cq->ibv;
  c.context = ctx;
  c.channel = attr->channel;
  c.cq_context = attr->cq_context;
  c.cqe = static_cast<int>(attr->cqe);
  pthread_mutex_init(&c.mutex, nullptr);
  pthread_cond_init(&c.cond, nullptr);
  if (attr->channel) ++attr->channel->refcnt;
  InstallCqExOps(&c);
  return &c;
}

int PollCq(ibv_cq* cq, int n, ibv_wc* wc) {
  if (n < 0) return -1;
  return VerbsCq::From(cq)->core->Poll(n, wc);
}

int ReqNotifyCq(ibv_cq* cq, int solicited_only) {
  return VerbsCq::From(cq)->core->Arm(solicited_only != 0);
}

}  // namespace softrdma::abi

SOFTRDMA_EXPORT ibv_cq* ibv_create_cq(ibv_context* context, int cqe, void* cq_context,
                                      ibv_comp_channel* channel, int comp_vector) {
  if (cqe < 1 || comp_vector < 0) return Fail<ibv_cq>(EINVAL);
  ibv_cq_init_attr_ex attr{};
  attr.cqe = static_cast<uint32_t>(cqe);
  attr.cq_context = cq_context;
  attr.channel = channel;
  attr.comp_vector = static_cast<uint32_t>(comp_vector);
  attr.wc_flags = IBV_WC_STANDARD_FLAGS;
  return ibv_cq_ex_to_cq(CreateCqEx(context, &attr));
}

SOFTRDMA_EXPORT int ibv_resize_cq(ibv_cq* cq, int cqe) {
  if (!cq || cqe < 1 || static_cast<uint32_t>(cqe) > core::kMaxCqe) return EINVAL;
  VerbsCq* c = VerbsCq::From(cq);
  int r = c->core->Resize(static_cast<uint32_t>(cqe));
  if (r == 0) cq->cqe = cqe;
  return r;
}

SOFTRDMA_EXPORT int ibv_destroy_cq(ibv_cq* cq) {
  if (!cq) return EINVAL;
  VerbsCq* c = VerbsCq::From(cq);
  if (c->users.load() > 0) return EBUSY;
  uint32_t reported = c->core->events_reported();
  if (cq->channel) {
    // Events never read cannot be acknowledged: drop them rather than wait forever for them.
    reported -= static_cast<uint32_t>(
        VerbsCompChannel::From(cq->channel)->core.events.Purge([cq](void* h) { return h == cq; }));
    --cq->channel->refcnt;
  }
  pthread_mutex_lock(&cq->mutex);
  while (cq->comp_events_completed < reported) pthread_cond_wait(&cq->cond, &cq->mutex);
  pthread_mutex_unlock(&cq->mutex);
  CoreOf(cq->context).async_events().Purge([cq](const ibv_async_event& e) {
    return e.event_type == IBV_EVENT_CQ_ERR && e.element.cq == cq;
  });
  pthread_mutex_destroy(&cq->mutex);
  pthread_cond_destroy(&cq->cond);
  delete c;
  return 0;
}

SOFTRDMA_EXPORT int ibv_get_cq_event(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) {
  if (!channel || !cq || !cq_context) {
    errno = EINVAL;
    return -1;
  }
  void* handle = nullptr;
  core::Hca& hca = CoreOf(channel->context).hca();
  int r = VerbsCompChannel::From(channel)->core.events.Pop(
      &handle, [](void* const&) {}, [&hca](int fd) { return hca.WaitAlongside(fd); });
  if (r) {
    errno = r;
    return -1;
  }
  *cq = static_cast<ibv_cq*>(handle);
  *cq_context = (*cq)->cq_context;
  return 0;
}

SOFTRDMA_EXPORT void ibv_ack_cq_events(ibv_cq* cq, unsigned int nevents) {
  if (!cq) return;
  pthread_mutex_lock(&cq->mutex);
  cq->comp_events_completed += nevents;
  pthread_cond_broadcast(&cq->cond);
  pthread_mutex_unlock(&cq->mutex);
}

// ---- ibv_cq_ex: start/next/end_poll and the wc readers ----
namespace {

VerbsCq* X(ibv_cq_ex* c) {
  return VerbsCq::From(c);
}

// Takes the oldest completion as "current", exposing status and wr_id as the ABI requires.
bool TakeCurrent(VerbsCq* cq, bool first) {
  if (!cq->core->TakeOldest(&cq->current, first)) return false;
  cq->ibv.status = cq->current.wc.status;
  cq->ibv.wr_id = cq->current.wc.wr_id;
  return true;
}

int StartPoll(ibv_cq_ex* c, ibv_poll_cq_attr* attr) {
  if (attr && attr->comp_mask) return EINVAL;
  VerbsCq* cq = X(c);
  cq->poll_batch.lock();
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (TakeCurrent(cq, true)) return 0;
    // Like ibv_poll_cq: an empty CQ makes the caller handle inbound work once.
    if (attempt == 0 && !CoreOf(c->context).hca().Progress()) break;
  }
  cq->poll_batch.unlock();  // callers do not end_poll after ENOENT
  return ENOENT;
}

int NextPoll(ibv_cq_ex* c) {
  return TakeCurrent(X(c), false) ? 0 : ENOENT;
}
void EndPoll(ibv_cq_ex* c) {
  X(c)->poll_batch.unlock();
}

const ibv_wc& Cur(ibv_cq_ex* c) {
  return X(c)->current.wc;
}
ibv_wc_opcode ReadOpcode(ibv_cq_ex* c) {
  return Cur(c).opcode;
}
uint32_t ReadVendorErr(ibv_cq_ex* c) {
  return Cur(c).vendor_err;
}
uint32_t ReadByteLen(ibv_cq_ex* c) {
  return Cur(c).byte_len;
}
__be32 ReadImmData(ibv_cq_ex* c) {
  return Cur(c).imm_data;
}
uint32_t ReadQpNum(ibv_cq_ex* c) {
  return Cur(c).qp_num;
}
uint32_t ReadSrcQp(ibv_cq_ex* c) {
  return Cur(c).src_qp;
}
unsigned int ReadWcFlags(ibv_cq_ex* c) {
  return Cur(c).wc_flags;
}
uint32_t ReadSlid(ibv_cq_ex* c) {
  return Cur(c).slid;
}
uint8_t ReadSl(ibv_cq_ex* c) {
  return Cur(c).sl;
}
uint8_t ReadDlidPathBits(ibv_cq_ex* c) {
  return Cur(c).dlid_path_bits;
}
uint64_t ReadTimestamp(ibv_cq_ex* c) {
  return X(c)->current.timestamp_ns;
}
uint64_t ReadWallclock(ibv_cq_ex* c) {
  return X(c)->current.wallclock_ns;
}
uint16_t ReadCvlan(ibv_cq_ex*) {
  return 0;
}
uint32_t ReadFlowTag(ibv_cq_ex*) {
  return 0;
}
void ReadTmInfo(ibv_cq_ex*, ibv_wc_tm_info* info) {
  *info = ibv_wc_tm_info{};
}

}  // namespace

namespace softrdma::abi {
void InstallCqExOps(ibv_cq_ex* c) {
  c->start_poll = StartPoll;
  c->next_poll = NextPoll;
  c->end_poll = EndPoll;
  c->read_opcode = ReadOpcode;
  c->read_vendor_err = ReadVendorErr;
  c->read_byte_len = ReadByteLen;
  c->read_imm_data = ReadImmData;
  c->read_qp_num = ReadQpNum;
  c->read_src_qp = ReadSrcQp;
  c->read_wc_flags = ReadWcFlags;
  c->read_slid = ReadSlid;
  c->read_sl = ReadSl;
  c->read_dlid_path_bits = ReadDlidPathBits;
  c->read_completion_ts = ReadTimestamp;
  c->read_cvlan = ReadCvlan;
  c->read_flow_tag = ReadFlowTag;
  c->read_tm_info = ReadTmInfo;
  c->read_completion_wallclock_ns = ReadWallclock;
}
}  // namespace softrdma::abi
