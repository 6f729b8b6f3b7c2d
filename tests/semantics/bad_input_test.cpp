// Wrong arguments to the verbs: every one is refused with the errno that rdma-core 44 (and the
// kernel drivers behind it) give for it, nothing is created or changed by a refused call, and
// nothing crashes. Only misuse that the API lets a library detect is tried: a NULL handle where the
// entry point is ours (verbs.h inlines such as ibv_post_send dereference their argument before we
// are called, exactly as with rdma-core), out-of-range numbers, objects still in use.
//
// The fixture's TearDown deallocates the PD and expects 0: a refused create that still counted a
// user of the PD (or of the CQ) shows up there as EBUSY.
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "support/semantics_harness.h"

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <vector>

namespace {

// ibv_reg_mr is a macro that masks `access` with an ib_uverbs_access_flags constant, so access
// flags go in as int: a bare ibv_access_flags constant mixes two enum types
// (clang -Wdeprecated-enum-enum-conversion).
constexpr int kAllRemote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                           IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

// Expects a creating verb to have returned NULL with errno set to `err`.
#define EXPECT_FAILS_WITH(expr, err)   \
  do {                                 \
    errno = 0;                         \
    auto* _obj = (expr);               \
    EXPECT_EQ(_obj, nullptr) << #expr; \
    EXPECT_EQ(errno, (err)) << #expr;  \
  } while (0)

class BadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    ctx_ = semantics::OpenFirstDevice();
    ASSERT_NE(ctx_, nullptr);
    ASSERT_EQ(ibv_query_device(ctx_, &dev_), 0);
    ASSERT_EQ(ibv_query_port(ctx_, 1, &port_), 0);
    pd_ = ibv_alloc_pd(ctx_);
    ASSERT_NE(pd_, nullptr);
    cq_ = ibv_create_cq(ctx_, 64, nullptr, nullptr, 0);
    ASSERT_NE(cq_, nullptr);
    buf_.assign(4096, 0);
    mr_ = ibv_reg_mr(pd_, buf_.data(), buf_.size(), kAllRemote);
    ASSERT_NE(mr_, nullptr);
  }

  void TearDown() override {
    for (ibv_qp* qp : qps_) EXPECT_EQ(ibv_destroy_qp(qp), 0);
    if (mr_) {
      EXPECT_EQ(ibv_dereg_mr(mr_), 0);
    }
    if (cq_) {
      EXPECT_EQ(ibv_destroy_cq(cq_), 0);
    }
    if (pd_) {
      EXPECT_EQ(ibv_dealloc_pd(pd_), 0) << "a refused call left the PD counted as in use";
    }
    if (ctx_) {
      EXPECT_EQ(ibv_close_device(ctx_), 0);
    }
  }

  ibv_qp_init_attr RcAttr(ibv_qp_type type = IBV_QPT_RC) const {
    ibv_qp_init_attr a{};
    a.send_cq = cq_;
    a.recv_cq = cq_;
    a.qp_type = type;
    a.cap.max_send_wr = 4;
    a.cap.max_recv_wr = 4;
    a.cap.max_send_sge = 2;
    a.cap.max_recv_sge = 2;
    a.cap.max_inline_data = 64;
    return a;
  }

  // A QP that TearDown destroys.
  ibv_qp* NewQp(ibv_qp_init_attr a) {
    ibv_qp* qp = ibv_create_qp(pd_, &a);
    EXPECT_NE(qp, nullptr) << "errno " << errno;
    if (qp) qps_.push_back(qp);
    return qp;
  }

  int ToInit(ibv_qp* qp) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = 1;
    a.qp_access_flags = kAllRemote;
    a.qkey = 0x11111111;
    int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
    mask |= qp->qp_type == IBV_QPT_UD ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS;
    return ibv_modify_qp(qp, &a, mask);
  }

  // Connected QPs point at `dest` in this process (through the port's LID) with retransmission
  // off, so requests to a peer that never answers stay outstanding.
  int ToRtr(ibv_qp* qp, uint32_t dest) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    if (qp->qp_type == IBV_QPT_UD) return ibv_modify_qp(qp, &a, IBV_QP_STATE);
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = dest;
    a.rq_psn = 0;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;
    a.ah_attr.dlid = port_.lid;
    a.ah_attr.port_num = 1;
    int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
    if (qp->qp_type == IBV_QPT_RC) mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    return ibv_modify_qp(qp, &a, mask);
  }

  int ToRts(ibv_qp* qp) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 0;
    a.timeout = 0;  // never retransmit
    a.retry_cnt = 0;
    a.rnr_retry = 0;
    a.max_rd_atomic = 1;
    int mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
    if (qp->qp_type == IBV_QPT_RC)
      mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
    return ibv_modify_qp(qp, &a, mask);
  }

  // An RC QP in RTS whose requests go to a QP of this process that stays in INIT and so drops
  // them: nothing it posts ever completes.
  ibv_qp* StuckRcQp(ibv_qp_init_attr a) {
    ibv_qp* sink = NewQp(RcAttr());
    ibv_qp* qp = NewQp(a);
    if (!sink || !qp) return nullptr;
    EXPECT_EQ(ToInit(sink), 0);
    EXPECT_EQ(ToInit(qp), 0);
    EXPECT_EQ(ToRtr(qp, sink->qp_num), 0);
    EXPECT_EQ(ToRts(qp), 0);
    return qp;
  }

  // A chain longer than a full send queue of that depth is refused at the first WR that no longer
  // fits, and so is a single WR afterwards.
  void ExpectFullSendQueueRefused(uint32_t max_send_wr);

  ibv_qp_state StateOf(ibv_qp* qp) {
    ibv_qp_attr a{};
    ibv_qp_init_attr init{};
    EXPECT_EQ(ibv_query_qp(qp, &a, IBV_QP_STATE, &init), 0);
    return a.qp_state;
  }

  ibv_sge Sge(size_t offset, uint32_t len) const {
    return ibv_sge{reinterpret_cast<uintptr_t>(buf_.data()) + offset, len, mr_->lkey};
  }

  ibv_context* ctx_ = nullptr;
  ibv_device_attr dev_{};
  ibv_port_attr port_{};
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_mr* mr_ = nullptr;
  std::vector<uint8_t> buf_;
  std::vector<ibv_qp*> qps_;
};

// ---- NULL handles
// --------------------------------------------------------------------------------

TEST_F(BadInput, NullHandlesAreRefusedWithEinval) {
  EXPECT_FAILS_WITH(ibv_alloc_pd(nullptr), EINVAL);
  EXPECT_EQ(ibv_dealloc_pd(nullptr), EINVAL);
  EXPECT_FAILS_WITH(ibv_create_cq(nullptr, 4, nullptr, nullptr, 0), EINVAL);
  EXPECT_EQ(ibv_destroy_cq(nullptr), EINVAL);
  EXPECT_EQ(ibv_resize_cq(nullptr, 8), EINVAL);
  EXPECT_FAILS_WITH(ibv_create_comp_channel(nullptr), EINVAL);
  EXPECT_EQ(ibv_destroy_comp_channel(nullptr), EINVAL);

  ibv_qp_init_attr qa = RcAttr();
  EXPECT_FAILS_WITH(ibv_create_qp(nullptr, &qa), EINVAL);
  EXPECT_FAILS_WITH(ibv_create_qp(pd_, nullptr), EINVAL);
  qa.send_cq = nullptr;
  EXPECT_FAILS_WITH(ibv_create_qp(pd_, &qa), EINVAL);
  qa = RcAttr();
  qa.recv_cq = nullptr;
  EXPECT_FAILS_WITH(ibv_create_qp(pd_, &qa), EINVAL);
  EXPECT_EQ(ibv_destroy_qp(nullptr), EINVAL);
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  EXPECT_EQ(ibv_modify_qp(nullptr, &attr, IBV_QP_STATE), EINVAL);
  EXPECT_EQ(ibv_query_qp(nullptr, &attr, IBV_QP_STATE, &init), EINVAL);
  ibv_qp* qp = NewQp(RcAttr());
  ASSERT_NE(qp, nullptr);
  EXPECT_EQ(ibv_modify_qp(qp, nullptr, IBV_QP_STATE), EINVAL);
  EXPECT_EQ(ibv_query_qp(qp, nullptr, IBV_QP_STATE, &init), EINVAL);

  EXPECT_FAILS_WITH(ibv_reg_mr(nullptr, buf_.data(), 64, int{IBV_ACCESS_LOCAL_WRITE}), EINVAL);
  EXPECT_EQ(ibv_dereg_mr(nullptr), EINVAL);

  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 4;
  sa.attr.max_sge = 1;
  EXPECT_FAILS_WITH(ibv_create_srq(nullptr, &sa), EINVAL);
  EXPECT_FAILS_WITH(ibv_create_srq(pd_, nullptr), EINVAL);
  EXPECT_EQ(ibv_destroy_srq(nullptr), EINVAL);

  ibv_ah_attr ah{};
  ah.dlid = port_.lid;
  ah.port_num = 1;
  EXPECT_FAILS_WITH(ibv_create_ah(nullptr, &ah), EINVAL);
  EXPECT_FAILS_WITH(ibv_create_ah(pd_, nullptr), EINVAL);
  EXPECT_EQ(ibv_destroy_ah(nullptr), EINVAL);

  ibv_device_attr da;
  EXPECT_EQ(ibv_query_device(nullptr, &da), EINVAL);
  EXPECT_EQ(ibv_query_device(ctx_, nullptr), EINVAL);
  ibv_gid gid;
  EXPECT_EQ(ibv_query_gid(nullptr, 1, 0, &gid), -1);
  EXPECT_EQ(ibv_query_gid(ctx_, 1, 0, nullptr), -1);
  EXPECT_EQ(ibv_close_device(nullptr), EINVAL);

  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  errno = 0;
  EXPECT_EQ(ibv_get_cq_event(nullptr, &ev_cq, &ev_ctx), -1);
  EXPECT_EQ(errno, EINVAL);
  ibv_async_event ev;
  errno = 0;
  EXPECT_EQ(ibv_get_async_event(nullptr, &ev), -1);
  EXPECT_EQ(errno, EINVAL);
  ibv_ack_cq_events(nullptr, 1);  // no-ops, not crashes
  ibv_ack_async_event(nullptr);
}

TEST_F(BadInput, OpeningADeviceThatIsNotOursFailsWithEnodev) {
  ibv_device foreign{};
  std::strcpy(foreign.name, "mlx5_0");
  EXPECT_FAILS_WITH(ibv_open_device(&foreign), ENODEV);
}

// A kernel device's context holds its command descriptor open; programs dup it to import the
// context elsewhere (pyverbs' test_import_dm), which softrdma does not support.
TEST_F(BadInput, AContextsCommandFdIsItsOwnAndImportingItIsNotSupported) {
  ibv_context* other = ibv_open_device(ctx_->device);
  ASSERT_NE(other, nullptr) << strerror(errno);
  for (ibv_context* c : {ctx_, other}) {
    ASSERT_GE(c->cmd_fd, 0);
    EXPECT_NE(fcntl(c->cmd_fd, F_GETFD), -1) << "not an open descriptor";
    EXPECT_NE(c->cmd_fd, c->async_fd);
  }
  EXPECT_NE(ctx_->cmd_fd, other->cmd_fd);
  const int dup_fd = dup(other->cmd_fd);
  ASSERT_GE(dup_fd, 0) << strerror(errno);
  EXPECT_FAILS_WITH(ibv_import_device(dup_fd), EOPNOTSUPP);
  close(dup_fd);
  EXPECT_EQ(ibv_close_device(other), 0);

  // ibv_close_device closes it: contexts opened and closed leave no descriptor behind.
  auto open_fds = [] {
    return std::distance(std::filesystem::directory_iterator("/proc/self/fd"),
                         std::filesystem::directory_iterator{});
  };
  const auto before = open_fds();
  for (int i = 0; i < 64; ++i) {
    ibv_context* c = ibv_open_device(ctx_->device);
    ASSERT_NE(c, nullptr) << strerror(errno);
    ASSERT_EQ(ibv_close_device(c), 0);
  }
  EXPECT_LT(open_fds() - before, 32) << "each context left a descriptor open";
}

// ---- Memory regions
// --------------------------------------------------------------------------------

TEST_F(BadInput, RegMrRemoteWriteOrAtomicWithoutLocalWriteIsEinval) {
  // ibv_reg_mr(3): "If IBV_ACCESS_REMOTE_WRITE or IBV_ACCESS_REMOTE_ATOMIC is set, then
  // IBV_ACCESS_LOCAL_WRITE must be set too."
  EXPECT_FAILS_WITH(ibv_reg_mr(pd_, buf_.data(), 64, int{IBV_ACCESS_REMOTE_WRITE}), EINVAL);
  EXPECT_FAILS_WITH(ibv_reg_mr(pd_, buf_.data(), 64, int{IBV_ACCESS_REMOTE_ATOMIC}), EINVAL);
  EXPECT_FAILS_WITH(
      ibv_reg_mr(pd_, buf_.data(), 64, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ), EINVAL);
  // The same rule through the iova variants.
  EXPECT_FAILS_WITH(ibv_reg_mr_iova(pd_, buf_.data(), 64, 0x1000, int{IBV_ACCESS_REMOTE_WRITE}),
                    EINVAL);
  EXPECT_FAILS_WITH(ibv_reg_mr_iova2(pd_, buf_.data(), 64, 0x1000, IBV_ACCESS_REMOTE_ATOMIC),
                    EINVAL);
  // Remote read alone needs no local write.
  ibv_mr* ok = ibv_reg_mr(pd_, buf_.data(), 64, int{IBV_ACCESS_REMOTE_READ});
  ASSERT_NE(ok, nullptr);
  EXPECT_EQ(ibv_dereg_mr(ok), 0);
}

TEST_F(BadInput, RegMrZeroLengthIsEinval) {
  EXPECT_FAILS_WITH(ibv_reg_mr(pd_, buf_.data(), 0, int{IBV_ACCESS_LOCAL_WRITE}), EINVAL);
  EXPECT_FAILS_WITH(ibv_reg_mr_iova2(pd_, buf_.data(), 0, 0, IBV_ACCESS_LOCAL_WRITE), EINVAL);
}

TEST_F(BadInput, RegMrUnknownAccessBitIsEinval) {
  // Bit 12 is neither a defined flag nor in the optional range (bits 20..29) a provider may ignore.
  EXPECT_FAILS_WITH(ibv_reg_mr(pd_, buf_.data(), 64, IBV_ACCESS_LOCAL_WRITE | (1 << 12)), EINVAL);
  // An optional bit is ignored, not refused (verbs.h IBV_ACCESS_OPTIONAL_RANGE).
  ibv_mr* ok = ibv_reg_mr(pd_, buf_.data(), 64, IBV_ACCESS_LOCAL_WRITE | (1 << 25));
  ASSERT_NE(ok, nullptr);
  EXPECT_EQ(ibv_dereg_mr(ok), 0);
}

TEST_F(BadInput, RegMrNullAddressIsRefused) {
  errno = 0;
  EXPECT_EQ(ibv_reg_mr(pd_, nullptr, 64, int{IBV_ACCESS_LOCAL_WRITE}), nullptr);
  EXPECT_TRUE(errno == EINVAL || errno == EFAULT) << errno;
}

TEST_F(BadInput, RegMrRangeThatWrapsTheAddressSpaceIsEinval) {
  // The kernel's ib_umem_get() refuses addr + length overflowing; a region that wrapped would let
  // a remote peer's in-bounds offset land below the buffer.
  EXPECT_FAILS_WITH(ibv_reg_mr(pd_, buf_.data(), SIZE_MAX, int{IBV_ACCESS_LOCAL_WRITE}), EINVAL);
  EXPECT_FAILS_WITH(
      ibv_reg_mr(pd_, buf_.data(), SIZE_MAX - reinterpret_cast<uintptr_t>(buf_.data()) + 2,
                 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE),
      EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_rereg_mr(mr_, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, buf_.data(), SIZE_MAX,
                         IBV_ACCESS_LOCAL_WRITE),
            IBV_REREG_MR_ERR_INPUT);
  EXPECT_EQ(errno, EINVAL);
}

// The kernel pins a region's pages, for writing when it may be written (ib_access_writable), and
// says EFAULT when their protection refuses that. Accepted, a peer's WRITE into the read-only page
// killed the responder (SIGSEGV); a page nobody may touch failed already at its first READ.
TEST_F(BadInput, RegMrOverPagesWithoutTheProtectionItsAccessNeedsIsEfault) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* p = mmap(nullptr, 2 * page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED) << strerror(errno);
  EXPECT_FAILS_WITH(ibv_reg_mr(pd_, p, 2 * page, int{IBV_ACCESS_LOCAL_WRITE}), EFAULT);
  EXPECT_FAILS_WITH(ibv_reg_mr(pd_, p, 2 * page, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE),
                    EFAULT);
  EXPECT_FAILS_WITH(ibv_reg_mr(pd_, p, 2 * page, int{IBV_ACCESS_MW_BIND}), EFAULT);
  ibv_mr* ro = ibv_reg_mr(pd_, p, 2 * page, int{IBV_ACCESS_REMOTE_READ});
  ASSERT_NE(ro, nullptr) << strerror(errno);
  EXPECT_EQ(ibv_dereg_mr(ro), 0);
  // A translation onto those pages, for a region that may be written: refused, and the region is
  // still the one it was.
  errno = 0;
  EXPECT_EQ(ibv_rereg_mr(mr_, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, p, page, 0),
            IBV_REREG_MR_ERR_CMD);
  EXPECT_EQ(errno, EFAULT);
  EXPECT_EQ(mr_->addr, buf_.data());
  ASSERT_EQ(mprotect(p, 2 * page, PROT_NONE), 0) << strerror(errno);
  EXPECT_FAILS_WITH(ibv_reg_mr(pd_, p, 2 * page, int{IBV_ACCESS_REMOTE_READ}), EFAULT);
  munmap(p, 2 * page);
}

TEST_F(BadInput, ReregMrWithBadFlagsIsInputError) {
  errno = 0;
  EXPECT_EQ(ibv_rereg_mr(mr_, 0, nullptr, nullptr, 0, 0), IBV_REREG_MR_ERR_INPUT);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_rereg_mr(mr_, 1 << 10, nullptr, nullptr, 0, 0), IBV_REREG_MR_ERR_INPUT);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(
      ibv_rereg_mr(mr_, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, IBV_ACCESS_REMOTE_WRITE),
      IBV_REREG_MR_ERR_INPUT);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_rereg_mr(mr_, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, buf_.data(), 0,
                         IBV_ACCESS_LOCAL_WRITE),
            IBV_REREG_MR_ERR_INPUT);
  EXPECT_EQ(errno, EINVAL);
  // Still the region it was.
  EXPECT_EQ(mr_->addr, buf_.data());
  EXPECT_EQ(mr_->length, buf_.size());
}

// ---- Completion queues and channels
// ----------------------------------------------------------------

TEST_F(BadInput, CreateCqWithZeroOrNegativeCqeIsEinval) {
  EXPECT_FAILS_WITH(ibv_create_cq(ctx_, 0, nullptr, nullptr, 0), EINVAL);
  EXPECT_FAILS_WITH(ibv_create_cq(ctx_, -1, nullptr, nullptr, 0), EINVAL);
  ibv_cq_init_attr_ex ex{};
  ex.cqe = 0;
  ex.wc_flags = IBV_WC_STANDARD_FLAGS;
  EXPECT_FAILS_WITH(ibv_create_cq_ex(ctx_, &ex), EINVAL);
}

TEST_F(BadInput, CreateCqBeyondMaxCqeIsEinval) {
  ASSERT_GT(dev_.max_cqe, 0);
  EXPECT_FAILS_WITH(ibv_create_cq(ctx_, dev_.max_cqe + 1, nullptr, nullptr, 0), EINVAL);
  ibv_cq_init_attr_ex ex{};
  ex.cqe = static_cast<uint32_t>(dev_.max_cqe) + 1;
  ex.wc_flags = IBV_WC_STANDARD_FLAGS;
  EXPECT_FAILS_WITH(ibv_create_cq_ex(ctx_, &ex), EINVAL);
  ex.cqe = UINT32_MAX;
  EXPECT_FAILS_WITH(ibv_create_cq_ex(ctx_, &ex), EINVAL);
}

TEST_F(BadInput, CreateCqWithBadCompVectorIsEinval) {
  EXPECT_FAILS_WITH(ibv_create_cq(ctx_, 4, nullptr, nullptr, ctx_->num_comp_vectors), EINVAL);
  EXPECT_FAILS_WITH(ibv_create_cq(ctx_, 4, nullptr, nullptr, -1), EINVAL);
}

TEST_F(BadInput, CreateCqExWithUnknownWcFlagsOrMaskIsRefused) {
  ibv_cq_init_attr_ex ex{};
  ex.cqe = 4;
  ex.wc_flags = IBV_WC_STANDARD_FLAGS | (uint64_t{1} << 40);
  errno = 0;
  EXPECT_EQ(ibv_create_cq_ex(ctx_, &ex), nullptr);
  EXPECT_TRUE(errno == EOPNOTSUPP || errno == EINVAL) << errno;
  ex.wc_flags = IBV_WC_STANDARD_FLAGS;
  ex.comp_mask = 1u << 20;  // no such field (providers differ: mlx5 says EINVAL, rxe EOPNOTSUPP)
  errno = 0;
  EXPECT_EQ(ibv_create_cq_ex(ctx_, &ex), nullptr);
  EXPECT_TRUE(errno == EOPNOTSUPP || errno == EINVAL) << errno;
}

TEST_F(BadInput, ResizeCqOutOfRangeIsEinval) {
  EXPECT_EQ(ibv_resize_cq(cq_, 0), EINVAL);
  EXPECT_EQ(ibv_resize_cq(cq_, -5), EINVAL);
  EXPECT_EQ(ibv_resize_cq(cq_, dev_.max_cqe + 1), EINVAL);
  EXPECT_GE(cq_->cqe, 64);
}

TEST_F(BadInput, DestroyCqInUseIsEbusy) {
  ibv_qp* qp = NewQp(RcAttr());
  ASSERT_NE(qp, nullptr);
  EXPECT_EQ(ibv_destroy_cq(cq_), EBUSY);
  // The CQ is intact and still serves its QP.
  ibv_wc wc;
  EXPECT_EQ(ibv_poll_cq(cq_, 1, &wc), 0);
  EXPECT_EQ(ToInit(qp), 0);
  // Released once its QP is gone (TearDown destroys the CQ and expects 0).
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  qps_.clear();
}

TEST_F(BadInput, DestroyCompChannelInUseIsEbusy) {
  ibv_comp_channel* ch = ibv_create_comp_channel(ctx_);
  ASSERT_NE(ch, nullptr);
  ibv_cq* cq = ibv_create_cq(ctx_, 4, nullptr, ch, 0);
  ASSERT_NE(cq, nullptr);
  EXPECT_EQ(ibv_destroy_comp_channel(ch), EBUSY);
  EXPECT_EQ(ibv_req_notify_cq(cq, 0), 0);  // the CQ still works with its channel
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_EQ(ibv_destroy_comp_channel(ch), 0);
}

// ---- Protection domains
// ----------------------------------------------------------------------------

TEST_F(BadInput, DeallocPdInUseIsEbusy) {
  ibv_pd* pd = ibv_alloc_pd(ctx_);
  ASSERT_NE(pd, nullptr);
  // An MR.
  ibv_mr* mr = ibv_reg_mr(pd, buf_.data(), 64, int{IBV_ACCESS_LOCAL_WRITE});
  ASSERT_NE(mr, nullptr);
  EXPECT_EQ(ibv_dealloc_pd(pd), EBUSY);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  // A QP.
  ibv_qp_init_attr qa = RcAttr();
  ibv_qp* qp = ibv_create_qp(pd, &qa);
  ASSERT_NE(qp, nullptr);
  EXPECT_EQ(ibv_dealloc_pd(pd), EBUSY);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  // An AH.
  ibv_ah_attr aa{};
  aa.dlid = port_.lid;
  aa.port_num = 1;
  ibv_ah* ah = ibv_create_ah(pd, &aa);
  ASSERT_NE(ah, nullptr);
  EXPECT_EQ(ibv_dealloc_pd(pd), EBUSY);
  EXPECT_EQ(ibv_destroy_ah(ah), 0);
  // An SRQ.
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 4;
  sa.attr.max_sge = 1;
  ibv_srq* srq = ibv_create_srq(pd, &sa);
  ASSERT_NE(srq, nullptr);
  EXPECT_EQ(ibv_dealloc_pd(pd), EBUSY);
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
}

// ---- Queue pairs: creation
// -------------------------------------------------------------------------

TEST_F(BadInput, CreateQpBeyondDeviceLimitsIsEinval) {
  ibv_qp_init_attr a = RcAttr();
  a.cap.max_send_wr = static_cast<uint32_t>(dev_.max_qp_wr) + 1;
  EXPECT_FAILS_WITH(ibv_create_qp(pd_, &a), EINVAL);
  a = RcAttr();
  a.cap.max_recv_wr = static_cast<uint32_t>(dev_.max_qp_wr) + 1;
  EXPECT_FAILS_WITH(ibv_create_qp(pd_, &a), EINVAL);
  a = RcAttr();
  a.cap.max_send_sge = static_cast<uint32_t>(dev_.max_sge) + 1;
  EXPECT_FAILS_WITH(ibv_create_qp(pd_, &a), EINVAL);
  a = RcAttr();
  a.cap.max_recv_sge = static_cast<uint32_t>(dev_.max_sge) + 1;
  EXPECT_FAILS_WITH(ibv_create_qp(pd_, &a), EINVAL);
  a = RcAttr();
  a.cap.max_inline_data = 1u << 20;  // the device attributes carry no inline limit; 1 MiB is beyond
  EXPECT_FAILS_WITH(ibv_create_qp(pd_, &a), EINVAL);
  a = RcAttr();
  a.cap.max_send_wr = UINT32_MAX;
  a.cap.max_send_sge = UINT32_MAX;
  EXPECT_FAILS_WITH(ibv_create_qp(pd_, &a), EINVAL);
  // The limits themselves are accepted.
  a = RcAttr();
  a.cap.max_send_sge = static_cast<uint32_t>(dev_.max_sge);
  a.cap.max_recv_sge = static_cast<uint32_t>(dev_.max_sge);
  EXPECT_NE(NewQp(a), nullptr);
}

TEST_F(BadInput, CreateQpOfUnknownTypeIsRefused) {
  // rdma-core passes the type to the kernel, which answers EOPNOTSUPP (rxe, siw) or EINVAL.
  for (int type : {0, 1, 77, 0xfe, static_cast<int>(IBV_QPT_DRIVER)}) {
    ibv_qp_init_attr a = RcAttr();
    a.qp_type = static_cast<ibv_qp_type>(type);
    errno = 0;
    EXPECT_EQ(ibv_create_qp(pd_, &a), nullptr) << "type " << type;
    EXPECT_TRUE(errno == EOPNOTSUPP || errno == EINVAL) << "type " << type << " errno " << errno;
  }
}

TEST_F(BadInput, CreateQpExWithUnknownMaskOrFlagsIsRefused) {
  ibv_qp_init_attr_ex ex{};
  ex.send_cq = cq_;
  ex.recv_cq = cq_;
  ex.qp_type = IBV_QPT_RC;
  ex.cap = RcAttr().cap;
  ex.pd = pd_;
  ex.comp_mask = IBV_QP_INIT_ATTR_PD | (1u << 30);
  errno = 0;
  EXPECT_EQ(ibv_create_qp_ex(ctx_, &ex), nullptr);
  EXPECT_TRUE(errno == EOPNOTSUPP || errno == EINVAL) << errno;
  ex.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
  ex.create_flags = 1u << 29;
  errno = 0;
  EXPECT_EQ(ibv_create_qp_ex(ctx_, &ex), nullptr);
  EXPECT_TRUE(errno == EOPNOTSUPP || errno == EINVAL) << errno;
  // Without a PD there is nothing to create the QP in.
  ex.comp_mask = 0;
  ex.create_flags = 0;
  EXPECT_FAILS_WITH(ibv_create_qp_ex(ctx_, &ex), EINVAL);
}

// ---- Queue pairs: modify
// ---------------------------------------------------------------------------

TEST_F(BadInput, ModifyQpOutOfRangeValuesAreEinvalAndChangeNothing) {
  ibv_qp* qp = NewQp(RcAttr());
  ASSERT_NE(qp, nullptr);
  ibv_qp_attr a{};
  // RESET -> INIT with port 2, pkey index 1, an unknown access bit.
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 2;
  a.qp_access_flags = kAllRemote;
  const int init_mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  EXPECT_EQ(ibv_modify_qp(qp, &a, init_mask), EINVAL);
  a.port_num = 0;
  EXPECT_EQ(ibv_modify_qp(qp, &a, init_mask), EINVAL);
  a.port_num = 1;
  a.pkey_index = 1;
  EXPECT_EQ(ibv_modify_qp(qp, &a, init_mask), EINVAL);
  a.pkey_index = 0;
  a.qp_access_flags = 1 << 14;
  EXPECT_EQ(ibv_modify_qp(qp, &a, init_mask), EINVAL);
  EXPECT_EQ(StateOf(qp), IBV_QPS_RESET);
  EXPECT_EQ(qp->state, IBV_QPS_RESET);
  ASSERT_EQ(ToInit(qp), 0);

  // INIT -> RTR with path_mtu 0 / 6, dest QPN beyond 24 bits, too many responder resources, an
  // AV on port 2 or with a GID index past the table.
  auto rtr = [&](auto tweak) {
    ibv_qp_attr r{};
    r.qp_state = IBV_QPS_RTR;
    r.path_mtu = IBV_MTU_1024;
    r.dest_qp_num = 0x123;
    r.max_dest_rd_atomic = 1;
    r.min_rnr_timer = 1;
    r.ah_attr.dlid = port_.lid;
    r.ah_attr.port_num = 1;
    tweak(r);
    return ibv_modify_qp(qp, &r,
                         IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                             IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  };
  EXPECT_EQ(rtr([](ibv_qp_attr& r) { r.path_mtu = static_cast<ibv_mtu>(0); }), EINVAL);
  EXPECT_EQ(rtr([](ibv_qp_attr& r) { r.path_mtu = static_cast<ibv_mtu>(6); }), EINVAL);
  EXPECT_EQ(rtr([](ibv_qp_attr& r) { r.dest_qp_num = 1u << 24; }), EINVAL);
  EXPECT_EQ(rtr([&](ibv_qp_attr& r) { r.max_dest_rd_atomic = 255; }), EINVAL);
  EXPECT_EQ(rtr([](ibv_qp_attr& r) { r.min_rnr_timer = 32; }), EINVAL);
  EXPECT_EQ(rtr([](ibv_qp_attr& r) { r.ah_attr.port_num = 2; }), EINVAL);
  EXPECT_EQ(rtr([](ibv_qp_attr& r) {
              r.ah_attr.is_global = 1;
              r.ah_attr.grh.sgid_index = 200;
            }),
            EINVAL);
  EXPECT_EQ(StateOf(qp), IBV_QPS_INIT);
  ASSERT_EQ(rtr([](ibv_qp_attr&) {}), 0);

  // RTR -> RTS with timeout 32, retry_cnt 8, rnr_retry 8, too many initiator resources.
  auto rts = [&](auto tweak) {
    ibv_qp_attr r{};
    r.qp_state = IBV_QPS_RTS;
    r.timeout = 14;
    r.retry_cnt = 7;
    r.rnr_retry = 7;
    r.max_rd_atomic = 1;
    tweak(r);
    return ibv_modify_qp(qp, &r,
                         IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                             IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
  };
  EXPECT_EQ(rts([](ibv_qp_attr& r) { r.timeout = 32; }), EINVAL);
  EXPECT_EQ(rts([](ibv_qp_attr& r) { r.timeout = 255; }), EINVAL);
  EXPECT_EQ(rts([](ibv_qp_attr& r) { r.retry_cnt = 8; }), EINVAL);
  EXPECT_EQ(rts([](ibv_qp_attr& r) { r.rnr_retry = 8; }), EINVAL);
  EXPECT_EQ(rts([](ibv_qp_attr& r) { r.max_rd_atomic = 255; }), EINVAL);
  EXPECT_EQ(StateOf(qp), IBV_QPS_RTR);
  ASSERT_EQ(rts([](ibv_qp_attr&) {}), 0);
  ibv_qp_attr q{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(ibv_query_qp(qp, &q, IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_PORT, &qi), 0);
  EXPECT_EQ(q.timeout, 14);
  EXPECT_EQ(q.retry_cnt, 7);
  EXPECT_EQ(q.port_num, 1);
  EXPECT_EQ(q.path_mtu, IBV_MTU_1024);
}

TEST_F(BadInput, ModifyQpIllegalTransitionsAndMasksAreEinval) {
  ibv_qp* qp = NewQp(RcAttr());
  ASSERT_NE(qp, nullptr);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTS;  // RESET -> RTS skips two states
  EXPECT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE), EINVAL);
  a.qp_state = static_cast<ibv_qp_state>(99);
  EXPECT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE), EINVAL);
  a.qp_state = IBV_QPS_INIT;  // required PORT, PKEY_INDEX, ACCESS_FLAGS missing
  EXPECT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE), EINVAL);
  a.port_num = 1;
  EXPECT_EQ(ibv_modify_qp(qp, &a,
                          IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS |
                              IBV_QP_SQ_PSN),  // SQ_PSN does not belong to RESET -> INIT
            EINVAL);
  EXPECT_EQ(ibv_modify_qp(qp, &a,
                          IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS |
                              (1 << 30)),  // no such attribute
            EINVAL);
  a.cur_qp_state = IBV_QPS_RTS;  // wrong claim about the current state
  a.qp_state = IBV_QPS_ERR;
  EXPECT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_CUR_STATE), EINVAL);
  EXPECT_EQ(StateOf(qp), IBV_QPS_RESET);
}

// ---- Posting
// ---------------------------------------------------------------------------------------

TEST_F(BadInput, PostSendWithTooManySgesIsEinvalWithBadWr) {
  ibv_qp_init_attr a = RcAttr();
  ibv_qp* qp = StuckRcQp(a);
  ASSERT_NE(qp, nullptr);
  uint32_t max_sge = 0;
  {
    ibv_qp_attr q{};
    ibv_qp_init_attr qi{};
    ASSERT_EQ(ibv_query_qp(qp, &q, IBV_QP_CAP, &qi), 0);
    max_sge = qi.cap.max_send_sge;
  }
  ASSERT_GE(max_sge, 2u);
  std::vector<ibv_sge> sges;
  for (uint32_t i = 0; i <= max_sge; ++i) sges.push_back(Sge(i * 8, 8));

  ibv_send_wr good{}, bad{};
  good.wr_id = 1;
  good.opcode = IBV_WR_RDMA_WRITE;
  good.sg_list = sges.data();
  good.num_sge = 1;
  good.wr.rdma.remote_addr = 0x1000;
  good.wr.rdma.rkey = 1;
  bad = good;
  bad.wr_id = 2;
  bad.num_sge = static_cast<int>(max_sge) + 1;
  good.next = &bad;
  ibv_send_wr* bad_wr = nullptr;
  EXPECT_EQ(ibv_post_send(qp, &good, &bad_wr), EINVAL);
  EXPECT_EQ(bad_wr, &bad);
  // Alone, first in the chain.
  bad.next = nullptr;
  bad_wr = nullptr;
  EXPECT_EQ(ibv_post_send(qp, &bad, &bad_wr), EINVAL);
  EXPECT_EQ(bad_wr, &bad);
  // Negative counts and a missing list.
  bad.num_sge = -1;
  bad_wr = nullptr;
  EXPECT_EQ(ibv_post_send(qp, &bad, &bad_wr), EINVAL);
  EXPECT_EQ(bad_wr, &bad);
  bad.num_sge = 1;
  bad.sg_list = nullptr;
  bad_wr = nullptr;
  EXPECT_EQ(ibv_post_send(qp, &bad, &bad_wr), EINVAL);
  EXPECT_EQ(bad_wr, &bad);
  EXPECT_EQ(StateOf(qp), IBV_QPS_RTS);  // a refused post does not break the QP
}

// Also at a depth that is no power of two (the queue has a power of two of slots).
TEST_F(BadInput, PostSendToFullSendQueueIsEnomemWithBadWr) {
  for (uint32_t max_send_wr : {4u, 5u}) {
    SCOPED_TRACE(max_send_wr);
    ExpectFullSendQueueRefused(max_send_wr);
  }
}

void BadInput::ExpectFullSendQueueRefused(uint32_t max_send_wr) {
  ibv_qp_init_attr a = RcAttr();
  a.cap.max_send_wr = max_send_wr;
  ibv_qp* qp = StuckRcQp(a);
  ASSERT_NE(qp, nullptr);
  ibv_qp_attr q{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(ibv_query_qp(qp, &q, IBV_QP_CAP, &qi), 0);
  const uint32_t depth = qi.cap.max_send_wr;
  ASSERT_GE(depth, max_send_wr);
  ASSERT_LE(depth, 64u);

  // One chain two longer than the queue: the first `depth` go in, the next is the bad one.
  ibv_sge sge = Sge(0, 8);
  std::vector<ibv_send_wr> wrs(depth + 2);
  for (size_t i = 0; i < wrs.size(); ++i) {
    wrs[i] = ibv_send_wr{};
    wrs[i].wr_id = i;
    wrs[i].opcode = IBV_WR_SEND;
    wrs[i].sg_list = &sge;
    wrs[i].num_sge = 1;
    wrs[i].next = i + 1 < wrs.size() ? &wrs[i + 1] : nullptr;
  }
  ibv_send_wr* bad_wr = nullptr;
  EXPECT_EQ(ibv_post_send(qp, &wrs[0], &bad_wr), ENOMEM);
  EXPECT_EQ(bad_wr, &wrs[depth]);
  // Still full: a single post is refused too.
  ibv_send_wr one = wrs[0];
  one.next = nullptr;
  bad_wr = nullptr;
  EXPECT_EQ(ibv_post_send(qp, &one, &bad_wr), ENOMEM);
  EXPECT_EQ(bad_wr, &one);
  EXPECT_EQ(StateOf(qp), IBV_QPS_RTS);
  ibv_wc wc;
  EXPECT_EQ(ibv_poll_cq(cq_, 1, &wc), 0);  // nothing completed, nothing lost
}

TEST_F(BadInput, PostSendOpcodeTheTransportCannotCarryIsEinval) {
  // UC has no READ or atomics; an opcode that does not exist is refused everywhere.
  ibv_qp_init_attr a = RcAttr(IBV_QPT_UC);
  ibv_qp* uc = NewQp(a);
  ASSERT_NE(uc, nullptr);
  ASSERT_EQ(ToInit(uc), 0);
  ASSERT_EQ(ToRtr(uc, 0x123), 0);
  ASSERT_EQ(ToRts(uc), 0);
  ibv_sge sge = Sge(0, 8);
  // Stored as a C program stores it: 99 is no ibv_wr_opcode, and C++ may not even hold it in one.
  for (int op : {int{IBV_WR_RDMA_READ}, int{IBV_WR_ATOMIC_CMP_AND_SWP},
                 int{IBV_WR_ATOMIC_FETCH_AND_ADD}, 99, -1}) {
    ibv_send_wr wr{};
    std::memcpy(&wr.opcode, &op, sizeof op);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_send_wr* bad_wr = nullptr;
    EXPECT_EQ(ibv_post_send(uc, &wr, &bad_wr), EINVAL) << "opcode " << op;
    EXPECT_EQ(bad_wr, &wr);
  }
}

TEST_F(BadInput, PostSendUdWithoutAhOrWithRdmaIsEinval) {
  ibv_qp* ud = NewQp(RcAttr(IBV_QPT_UD));
  ASSERT_NE(ud, nullptr);
  ASSERT_EQ(ToInit(ud), 0);
  ASSERT_EQ(ToRtr(ud, 0), 0);
  ASSERT_EQ(ToRts(ud), 0);
  ibv_sge sge = Sge(0, 8);
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_send_wr* bad_wr = nullptr;
  EXPECT_EQ(ibv_post_send(ud, &wr, &bad_wr), EINVAL);  // wr.ud.ah is NULL
  EXPECT_EQ(bad_wr, &wr);
  wr.opcode = IBV_WR_RDMA_WRITE;
  bad_wr = nullptr;
  EXPECT_EQ(ibv_post_send(ud, &wr, &bad_wr), EINVAL);
  EXPECT_EQ(bad_wr, &wr);
}

TEST_F(BadInput, PostSendInlineBeyondMaxInlineIsEinval) {
  ibv_qp_init_attr a = RcAttr();
  ibv_qp* qp = StuckRcQp(a);
  ASSERT_NE(qp, nullptr);
  ibv_qp_attr q{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(ibv_query_qp(qp, &q, IBV_QP_CAP, &qi), 0);
  const uint32_t max_inline = qi.cap.max_inline_data;
  ASSERT_LT(max_inline + 1, buf_.size());
  // Two SGEs that fit separately but not together, in memory that is not even registered:
  // inline data needs no lkey.
  std::vector<uint8_t> data(max_inline + 1, 0x5a);
  ibv_sge sges[2] = {{reinterpret_cast<uintptr_t>(data.data()), max_inline / 2 + 1, 0},
                     {reinterpret_cast<uintptr_t>(data.data()) + max_inline / 2 + 1,
                      max_inline - max_inline / 2, 0}};
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_INLINE;
  wr.sg_list = sges;
  wr.num_sge = 2;
  ibv_send_wr* bad_wr = nullptr;
  EXPECT_EQ(ibv_post_send(qp, &wr, &bad_wr), EINVAL);
  EXPECT_EQ(bad_wr, &wr);
  // READ cannot be inline at all.
  wr.opcode = IBV_WR_RDMA_READ;
  wr.num_sge = 1;
  sges[0] = Sge(0, 8);
  bad_wr = nullptr;
  EXPECT_EQ(ibv_post_send(qp, &wr, &bad_wr), EINVAL);
  EXPECT_EQ(bad_wr, &wr);
}

TEST_F(BadInput, PostSendBeforeRtsIsEinval) {
  ibv_qp* qp = NewQp(RcAttr());
  ASSERT_NE(qp, nullptr);
  ibv_sge sge = Sge(0, 8);
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  for (int step = 0; step < 3; ++step) {
    ibv_send_wr* bad_wr = nullptr;
    EXPECT_EQ(ibv_post_send(qp, &wr, &bad_wr), EINVAL) << "state " << StateOf(qp);
    EXPECT_EQ(bad_wr, &wr);
    if (step == 0) {
      ASSERT_EQ(ToInit(qp), 0);
    } else if (step == 1) {
      ASSERT_EQ(ToRtr(qp, 0x123), 0);
    }
  }
}

TEST_F(BadInput, PostRecvTooManySgesOrFullQueueIsRefusedWithBadWr) {
  ibv_qp* qp = NewQp(RcAttr());
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(ToInit(qp), 0);
  ibv_qp_attr q{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(ibv_query_qp(qp, &q, IBV_QP_CAP, &qi), 0);
  const uint32_t max_sge = qi.cap.max_recv_sge;
  const uint32_t depth = qi.cap.max_recv_wr;
  ASSERT_LE(depth, 64u);
  std::vector<ibv_sge> sges;
  for (uint32_t i = 0; i <= max_sge; ++i) sges.push_back(Sge(i * 8, 8));

  ibv_recv_wr wr{};
  wr.sg_list = sges.data();
  wr.num_sge = static_cast<int>(max_sge) + 1;
  ibv_recv_wr* bad_wr = nullptr;
  EXPECT_EQ(ibv_post_recv(qp, &wr, &bad_wr), EINVAL);
  EXPECT_EQ(bad_wr, &wr);
  wr.num_sge = -3;
  bad_wr = nullptr;
  EXPECT_EQ(ibv_post_recv(qp, &wr, &bad_wr), EINVAL);
  EXPECT_EQ(bad_wr, &wr);
  wr.num_sge = 1;  // a count without a list
  wr.sg_list = nullptr;
  bad_wr = nullptr;
  EXPECT_EQ(ibv_post_recv(qp, &wr, &bad_wr), EINVAL);
  EXPECT_EQ(bad_wr, &wr);

  std::vector<ibv_recv_wr> wrs(depth + 1);
  for (size_t i = 0; i < wrs.size(); ++i) {
    wrs[i] = ibv_recv_wr{};
    wrs[i].wr_id = i;
    wrs[i].sg_list = sges.data();
    wrs[i].num_sge = 1;
    wrs[i].next = i + 1 < wrs.size() ? &wrs[i + 1] : nullptr;
  }
  bad_wr = nullptr;
  EXPECT_EQ(ibv_post_recv(qp, &wrs[0], &bad_wr), ENOMEM);
  EXPECT_EQ(bad_wr, &wrs[depth]);
}

TEST_F(BadInput, PostRecvOnQpWithSrqIsEinval) {
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 4;
  sa.attr.max_sge = 1;
  ibv_srq* srq = ibv_create_srq(pd_, &sa);
  ASSERT_NE(srq, nullptr);
  ibv_qp_init_attr a = RcAttr();
  a.srq = srq;
  ibv_qp* qp = ibv_create_qp(pd_, &a);
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(ToInit(qp), 0);
  ibv_sge sge = Sge(0, 8);
  ibv_recv_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad_wr = nullptr;
  EXPECT_EQ(ibv_post_recv(qp, &wr, &bad_wr), EINVAL);
  EXPECT_EQ(bad_wr, &wr);
  EXPECT_EQ(ibv_destroy_srq(srq), EBUSY);  // its QP still uses it
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
}

// ---- SRQs and AHs
// ----------------------------------------------------------------------------------

TEST_F(BadInput, CreateSrqOutOfRangeIsEinval) {
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 0;
  sa.attr.max_sge = 1;
  EXPECT_FAILS_WITH(ibv_create_srq(pd_, &sa), EINVAL);
  sa.attr.max_wr = static_cast<uint32_t>(dev_.max_srq_wr) + 1;
  EXPECT_FAILS_WITH(ibv_create_srq(pd_, &sa), EINVAL);
  sa.attr.max_wr = 4;
  sa.attr.max_sge = static_cast<uint32_t>(dev_.max_srq_sge) + 1;
  EXPECT_FAILS_WITH(ibv_create_srq(pd_, &sa), EINVAL);

  sa.attr.max_sge = 1;
  ibv_srq* srq = ibv_create_srq(pd_, &sa);
  ASSERT_NE(srq, nullptr);
  ibv_srq_attr sattr{};
  sattr.srq_limit = 1000;  // more than it can ever hold
  EXPECT_EQ(ibv_modify_srq(srq, &sattr, IBV_SRQ_LIMIT), EINVAL);
  std::vector<ibv_sge> sges(3, Sge(0, 8));
  ibv_recv_wr wr{};
  wr.sg_list = sges.data();
  wr.num_sge = 3;
  ibv_recv_wr* bad_wr = nullptr;
  EXPECT_EQ(ibv_post_srq_recv(srq, &wr, &bad_wr), EINVAL);
  EXPECT_EQ(bad_wr, &wr);
  wr.num_sge = 1;
  wr.sg_list = nullptr;
  bad_wr = nullptr;
  EXPECT_EQ(ibv_post_srq_recv(srq, &wr, &bad_wr), EINVAL);
  EXPECT_EQ(bad_wr, &wr);
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
}

TEST_F(BadInput, CreateAhOutOfRangeIsEinval) {
  ibv_ah_attr aa{};
  aa.dlid = port_.lid;
  aa.port_num = 2;
  EXPECT_FAILS_WITH(ibv_create_ah(pd_, &aa), EINVAL);
  aa.port_num = 1;
  aa.is_global = 1;
  aa.grh.sgid_index = 255;
  EXPECT_FAILS_WITH(ibv_create_ah(pd_, &aa), EINVAL);
}

// ---- Queries
// ---------------------------------------------------------------------------------------

TEST_F(BadInput, QueriesOutOfRangeFail) {
  ibv_port_attr pa;
  EXPECT_EQ(ibv_query_port(ctx_, 0, &pa), EINVAL);
  EXPECT_EQ(ibv_query_port(ctx_, 2, &pa), EINVAL);
  ibv_gid gid;
  EXPECT_EQ(ibv_query_gid(ctx_, 2, 0, &gid), -1);
  EXPECT_EQ(ibv_query_gid(ctx_, 1, -1, &gid), -1);
  EXPECT_EQ(ibv_query_gid(ctx_, 1, 100000, &gid), -1);
  __be16 pkey;
  EXPECT_EQ(ibv_query_pkey(ctx_, 1, 1, &pkey), -1);
  EXPECT_EQ(ibv_query_pkey(ctx_, 2, 0, &pkey), -1);
  ibv_gid_entry entry;
  EXPECT_EQ(ibv_query_gid_ex(ctx_, 1, 100000, &entry, 0), EINVAL);
  EXPECT_EQ(ibv_query_gid_ex(ctx_, 2, 0, &entry, 0), EINVAL);
}

}  // namespace
