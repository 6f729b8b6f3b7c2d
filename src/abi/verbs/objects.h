// The objects behind every libibverbs handle. Each embeds its public struct first (as rdma-core
// providers do), so the handle an application holds converts back with one cast, and carries the
// core object it stands for. No verbs semantics live here: only the mapping.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <memory>
#include <mutex>

#include "core/context.h"
#include "core/cq.h"
#include "core/hca.h"
#include "core/mr.h"
#include "core/qp.h"
#include "core/recv_queue.h"

namespace softrdma::abi {

struct VerbsDevice {
  ibv_device ibv;
};

struct VerbsContext {
  verbs_context vctx;  // ibv_context is its last member; applications hold &vctx.context
  std::unique_ptr<core::Context> core;
  static VerbsContext* From(ibv_context* c) {
    return reinterpret_cast<VerbsContext*>(reinterpret_cast<char*>(c) -
                                           offsetof(verbs_context, context));
  }
};

struct VerbsPd {
  ibv_pd ibv;
  core::Pd core;
  std::atomic<int> users{0};  // MRs, QPs, SRQs, AHs: dealloc_pd answers EBUSY while any exist
  static VerbsPd* From(ibv_pd* p) { return reinterpret_cast<VerbsPd*>(p); }
};

// Device memory (device_memory.cpp): the library's own pages, at most kMaxDeviceMemory bytes per
// allocation (what ibv_query_device_ex says as max_dm_size).
constexpr size_t kMaxDeviceMemory = size_t{256} << 10;
struct VerbsDm {
  ibv_dm ibv;
  uint8_t* mem = nullptr;
  size_t length = 0;
  std::atomic<int> users{0};  // regions over it: ibv_free_dm answers EBUSY while any exist
  static VerbsDm* From(ibv_dm* d) { return reinterpret_cast<VerbsDm*>(d); }
};

struct VerbsMr {
  ibv_mr ibv;
  VerbsDm* dm = nullptr;  // registered over device memory (ibv_reg_dm_mr)
  static VerbsMr* From(ibv_mr* m) { return reinterpret_cast<VerbsMr*>(m); }
  // The application's handle of region `key` (lkey == rkey), counted as a user of `pd` and `dm`.
  static ibv_mr* Make(ibv_pd* pd, uint32_t key, void* addr, size_t length, VerbsDm* dm = nullptr) {
    auto* mr = new VerbsMr{};
    mr->ibv.context = pd->context;
    mr->ibv.pd = pd;
    mr->ibv.addr = addr;
    mr->ibv.length = length;
    mr->ibv.handle = key;
    mr->ibv.lkey = key;
    mr->ibv.rkey = key;
    mr->dm = dm;
    if (dm) ++dm->users;
    ++VerbsPd::From(pd)->users;
    return &mr->ibv;
  }
};

struct VerbsMw {
  ibv_mw ibv;  // handle: the window's index (the upper 24 bits of every key it has)
  static VerbsMw* From(ibv_mw* m) { return reinterpret_cast<VerbsMw*>(m); }
};

struct VerbsCompChannel {
  ibv_comp_channel ibv;
  core::CompChannel core;
  static VerbsCompChannel* From(ibv_comp_channel* c) {
    return reinterpret_cast<VerbsCompChannel*>(c);
  }
};

// Every CQ is an ibv_cq_ex (ibv_cq is its prefix), so ibv_cq_ex_to_cq works on any of them.
struct VerbsCq {
  ibv_cq_ex ibv;
  std::unique_ptr<core::Cq> core;
  uint64_t wc_flags;    // what create_cq_ex asked to read
  core::Cqe current{};  // the entry an extended poll is looking at
  // Held from ibv_start_poll to ibv_end_poll: one poll batch at a time reads `current`. Not the
  // CQ's own lock, which work posted from inside the batch takes to complete on this CQ.
  std::mutex poll_batch;
  std::atomic<int> users{0};  // QPs and SRQs using it: destroy_cq answers EBUSY
  static VerbsCq* From(ibv_cq* c) { return reinterpret_cast<VerbsCq*>(c); }
  static VerbsCq* From(ibv_cq_ex* c) { return reinterpret_cast<VerbsCq*>(c); }
};

// One per ibv_open_xrcd: handles of one domain (the same file) share the core object.
struct VerbsXrcd {
  ibv_xrcd ibv;
  std::shared_ptr<core::Xrcd> core;
  std::atomic<int> users{0};  // XRC SRQs and QPs: close_xrcd answers EBUSY while any exist
  static VerbsXrcd* From(ibv_xrcd* x) { return reinterpret_cast<VerbsXrcd*>(x); }
};

struct VerbsSrq {
  ibv_srq ibv;
  std::unique_ptr<core::Srq> core;
  std::atomic<int> users{0};
  VerbsXrcd* xrcd = nullptr;  // XRC SRQs
  VerbsCq* cq = nullptr;      // XRC SRQs: where their receive completions go
  static VerbsSrq* From(ibv_srq* s) { return reinterpret_cast<VerbsSrq*>(s); }
};

// Every QP is an ibv_qp_ex; ibv_qp_to_qp_ex answers only for those created with send_ops_flags.
struct VerbsQp {
  ibv_qp_ex ibv;
  std::shared_ptr<core::Qp> core;
  bool extended = false;
  VerbsXrcd* xrcd = nullptr;  // XRC_RECV QPs
  // ibv_wr_* builder state between wr_start and wr_complete.
  struct Builder;
  std::unique_ptr<Builder> builder;
  static VerbsQp* From(ibv_qp* q) { return reinterpret_cast<VerbsQp*>(q); }
  static VerbsQp* From(ibv_qp_ex* q) { return reinterpret_cast<VerbsQp*>(q); }
};

using core::Ah;

inline core::Context& CoreOf(ibv_context* c) {
  return *VerbsContext::From(c)->core;
}

// Sets errno and returns nullptr: the convention of every creating verb.
template <typename T = void>
T* Fail(int err) {
  errno = err;
  return nullptr;
}

void InstallContextOps(verbs_context* vctx);
void InstallQpExOps(ibv_qp_ex* qpx, uint64_t send_ops_flags);
void InstallCqExOps(ibv_cq_ex* cq);

// Context-op entry points that other files register.
int PollCq(ibv_cq* cq, int n, ibv_wc* wc);
int ReqNotifyCq(ibv_cq* cq, int solicited_only);
int PostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad);
int PostRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad);
int PostSrqRecv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad);
ibv_cq_ex* CreateCqEx(ibv_context* ctx, ibv_cq_init_attr_ex* attr);
ibv_qp* CreateQpEx(ibv_context* ctx, ibv_qp_init_attr_ex* attr);
ibv_qp* OpenQp(ibv_context* ctx, ibv_qp_open_attr* attr);
ibv_srq* CreateSrqEx(ibv_context* ctx, ibv_srq_init_attr_ex* attr);
int GetSrqNum(ibv_srq* srq, uint32_t* srq_num);
ibv_xrcd* OpenXrcd(ibv_context* ctx, ibv_xrcd_init_attr* attr);
int CloseXrcd(ibv_xrcd* xrcd);
int QueryDeviceEx(ibv_context* ctx, const ibv_query_device_ex_input* input,
                  ibv_device_attr_ex* attr, size_t attr_size);
int QueryPortEx(ibv_context* ctx, uint8_t port, ibv_port_attr* attr, size_t attr_len);
ibv_dm* AllocDm(ibv_context* ctx, ibv_alloc_dm_attr* attr);
int FreeDm(ibv_dm* dm);
ibv_mr* RegDmMr(ibv_pd* pd, ibv_dm* dm, uint64_t offset, size_t length, unsigned int access);
int AdviseMr(ibv_pd* pd, ibv_advise_mr_advice advice, uint32_t flags, ibv_sge* sg_list,
             uint32_t num_sge);

}  // namespace softrdma::abi
