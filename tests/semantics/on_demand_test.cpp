// Regions on demand (ibv_reg_mr(3), IBV_ACCESS_ON_DEMAND; ibv_advise_mr(3)): their pages need not
// be mapped at registration, an implicit one spans the whole address space, and an access to a page
// that is not mapped fails as an HCA's page fault does (an error completion), never as a crash.
// ibv_rc_pingpong -o/-O/-P and perftest --odp refused to run before the device advertised them.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>

#include "support/semantics_harness.h"

namespace semantics {
namespace {

using OnDemand = VerbsTest;

constexpr int kOnDemandAccess = kAllAccess | IBV_ACCESS_ON_DEMAND;

// Three pages whose middle one is not mapped; unmapped at destruction, the middle one only while
// the test has it mapped: the process may have mapped something of its own into the hole since
// (ThreadSanitizer's runtime did, into a hole of 67 pages, and unmapping it killed a thread).
struct PagesWithAHole {
  PagesWithAHole() {
    page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    void* p = mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return;
    base = static_cast<uint8_t*>(p);
    munmap(hole(), page);
  }
  ~PagesWithAHole() {
    if (!base) return;
    munmap(base, page);
    munmap(base + 2 * page, page);
    if (filled) munmap(hole(), page);
  }
  uint8_t* hole() const { return base + page; }
  bool Fill() {
    void* p =
        mmap(hole(), page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    filled = p == hole();
    return filled;
  }
  bool Empty() {
    filled = munmap(hole(), page) != 0;
    return !filled;
  }
  size_t page = 0;
  uint8_t* base = nullptr;
  bool filled = false;
};

TEST_F(OnDemand, TheDeviceAdvertisesRegionsOnDemandForEveryTransport) {
  ibv_device_attr_ex attr{};
  ASSERT_EQ(ibv_query_device_ex(v.ctx, nullptr, &attr), 0);
  EXPECT_TRUE(attr.odp_caps.general_caps & IBV_ODP_SUPPORT);
  EXPECT_TRUE(attr.odp_caps.general_caps & IBV_ODP_SUPPORT_IMPLICIT);
  constexpr uint32_t kRc = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE |
                           IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_ATOMIC | IBV_ODP_SUPPORT_SRQ_RECV;
  EXPECT_EQ(attr.odp_caps.per_transport_caps.rc_odp_caps & kRc, kRc);
  EXPECT_EQ(attr.xrc_odp_caps & kRc, kRc);
  EXPECT_TRUE(attr.odp_caps.per_transport_caps.ud_odp_caps & IBV_ODP_SUPPORT_SEND);
  EXPECT_TRUE(attr.odp_caps.per_transport_caps.ud_odp_caps & IBV_ODP_SUPPORT_RECV);
}

// Pages that are not mapped: an ordinary registration is refused (EFAULT, as the kernel's pinning
// says), one on demand is not. Peers reach the pages once they exist, and get REM_ACCESS_ERR, as
// from an HCA whose page fault failed, while they do not.
TEST_F(OnDemand, ARegionOverPagesNotMappedYetWorksOnceTheyAre) {
  PagesWithAHole pages;
  ASSERT_NE(pages.base, nullptr) << strerror(errno);
  const size_t len = 3 * pages.page;
  errno = 0;
  EXPECT_EQ(ibv_reg_mr(v.pd, pages.base, len, kAllAccess), nullptr);
  EXPECT_EQ(errno, EFAULT);
  ibv_mr* mr = ibv_reg_mr(v.pd, pages.base, len, kOnDemandAccess);
  ASSERT_NE(mr, nullptr) << strerror(errno);

  Qp *a, *b;
  Pair(QpOpts{}, &a, &b);
  Buffer* local = Buf(256);
  local->Fill(0x3c);
  ASSERT_TRUE(pages.Fill()) << strerror(errno);
  const uint64_t into = reinterpret_cast<uintptr_t>(pages.hole()) + 100;
  ASSERT_EQ(PostRdma(a->qp, IBV_WR_RDMA_WRITE, *local, 0, 64, into, mr->rkey, 1), 0);
  ibv_wc wc;
  ASSERT_TRUE(PollOne(a->scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
  for (int i = 0; i < 64; ++i) ASSERT_EQ(pages.hole()[100 + i], 0x3c) << i;
  pages.hole()[200] = 0x5e;
  ASSERT_EQ(PostRdma(a->qp, IBV_WR_RDMA_READ, *local, 0, 1, into + 100, mr->rkey, 2), 0);
  ASSERT_TRUE(PollOne(a->scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
  EXPECT_EQ(local->data()[0], 0x5e);

  // The application unmaps the page again: the next access into it fails, and nothing crashes.
  ASSERT_TRUE(pages.Empty()) << strerror(errno);
  ASSERT_EQ(PostRdma(a->qp, IBV_WR_RDMA_WRITE, *local, 0, 64, into, mr->rkey, 3), 0);
  ASSERT_TRUE(PollOne(a->scq, &wc));
  EXPECT_EQ(wc.wr_id, 3u);
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << WcStr(wc);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
}

// A window bound to a region on demand reaches the same pages, with the same check.
TEST_F(OnDemand, AWindowOverAPageNotMappedIsRemAccessErr) {
  PagesWithAHole pages;
  ASSERT_NE(pages.base, nullptr) << strerror(errno);
  ibv_mr* mr = ibv_reg_mr(v.pd, pages.base, 3 * pages.page, kOnDemandAccess | IBV_ACCESS_MW_BIND);
  ASSERT_NE(mr, nullptr) << strerror(errno);
  Qp *a, *b;
  Pair(QpOpts{}, &a, &b);
  ibv_mw* mw = ibv_alloc_mw(v.pd, IBV_MW_TYPE_1);
  ASSERT_NE(mw, nullptr) << strerror(errno);
  ibv_mw_bind mb{};
  mb.send_flags = IBV_SEND_SIGNALED;
  mb.bind_info = ibv_mw_bind_info{mr, reinterpret_cast<uintptr_t>(pages.base), 3 * pages.page,
                                  IBV_ACCESS_REMOTE_WRITE};
  ASSERT_EQ(ibv_bind_mw(b->qp, mw, &mb), 0);
  ibv_wc wc;
  ASSERT_TRUE(PollOne(b->scq, &wc));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
  Buffer* local = Buf(64);
  ASSERT_EQ(PostRdma(a->qp, IBV_WR_RDMA_WRITE, *local, 0, 64,
                     reinterpret_cast<uintptr_t>(pages.hole()), mw->rkey, 1),
            0);
  ASSERT_TRUE(PollOne(a->scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << WcStr(wc);
  ASSERT_EQ(v.DestroyQp(a), 0);
  ASSERT_EQ(v.DestroyQp(b), 0);
  EXPECT_EQ(ibv_dealloc_mw(mw), 0);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
}

// A SEND gathered from, or received into, a page of the region that is not mapped is the local
// side's protection error.
TEST_F(OnDemand, ALocalPieceOnAPageNotMappedIsLocProtErr) {
  PagesWithAHole pages;
  ASSERT_NE(pages.base, nullptr) << strerror(errno);
  ibv_mr* mr = ibv_reg_mr(v.pd, pages.base, 3 * pages.page, kOnDemandAccess);
  ASSERT_NE(mr, nullptr) << strerror(errno);
  const uint64_t hole = reinterpret_cast<uintptr_t>(pages.hole());
  {
    Qp *a, *b;
    Pair(QpOpts{}, &a, &b);
    Buffer* rx = Buf(256);
    ASSERT_EQ(PostRecv(b->qp, *rx, 0, 256, 10), 0);
    ASSERT_EQ(PostPiece(a->qp, IBV_WR_SEND, {hole, 32, mr->lkey}, 0, 0, 1), 0);
    ibv_wc wc;
    ASSERT_TRUE(PollOne(a->scq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << WcStr(wc);
  }
  {
    Qp *a, *b;
    Pair(QpOpts{}, &a, &b);
    Buffer* tx = Buf(256);
    ibv_sge s{hole, 64, mr->lkey};
    ibv_recv_wr rw{};
    rw.wr_id = 20;
    rw.sg_list = &s;
    rw.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_recv(b->qp, &rw, &bad), 0);
    ASSERT_EQ(PostSendMsg(a->qp, *tx, 0, 32, 2), 0);
    ibv_wc wc;
    ASSERT_TRUE(PollOne(b->rcq, &wc));
    EXPECT_EQ(wc.wr_id, 20u);
    EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << WcStr(wc);
  }
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
}

// A page the application made read-only takes READs but not WRITEs or atomics, one it made
// inaccessible nothing: the HCA's page fault fails, the requester gets REM_ACCESS_ERR. Before, the
// responder's copy into such a page killed the process (SIGSEGV).
TEST_F(OnDemand, APageWithoutTheProtectionAnAccessNeedsIsRemAccessErr) {
  PagesWithAHole pages;
  ASSERT_NE(pages.base, nullptr) << strerror(errno);
  ASSERT_TRUE(pages.Fill()) << strerror(errno);
  ibv_mr* mr = ibv_reg_mr(v.pd, pages.base, 3 * pages.page, kOnDemandAccess);
  ASSERT_NE(mr, nullptr) << strerror(errno);
  pages.hole()[8] = 0x71;
  ASSERT_EQ(mprotect(pages.hole(), pages.page, PROT_READ), 0) << strerror(errno);
  const uint64_t ro = reinterpret_cast<uintptr_t>(pages.hole());
  Buffer* local = Buf(64);
  local->Fill(0x3c);
  ibv_wc wc;
  {
    Qp *a, *b;
    Pair(QpOpts{}, &a, &b);
    ASSERT_EQ(PostRdma(a->qp, IBV_WR_RDMA_READ, *local, 0, 16, ro, mr->rkey, 1), 0);
    ASSERT_TRUE(PollOne(a->scq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
    EXPECT_EQ(local->data()[8], 0x71);
    ASSERT_EQ(PostRdma(a->qp, IBV_WR_RDMA_WRITE, *local, 0, 64, ro, mr->rkey, 2), 0);
    ASSERT_TRUE(PollOne(a->scq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << WcStr(wc);
  }
  {
    Qp *a, *b;
    Pair(QpOpts{}, &a, &b);
    ASSERT_EQ(PostAtomic(a->qp, IBV_WR_ATOMIC_FETCH_AND_ADD, *local, 0, ro, mr->rkey, 1, 0, 3), 0);
    ASSERT_TRUE(PollOne(a->scq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << WcStr(wc);
  }
  EXPECT_EQ(pages.hole()[8], 0x71);
  ASSERT_EQ(mprotect(pages.hole(), pages.page, PROT_NONE), 0) << strerror(errno);
  {
    Qp *a, *b;
    Pair(QpOpts{}, &a, &b);
    ASSERT_EQ(PostRdma(a->qp, IBV_WR_RDMA_READ, *local, 0, 16, ro, mr->rkey, 4), 0);
    ASSERT_TRUE(PollOne(a->scq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << WcStr(wc);
  }
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
}

// ibv_reg_mr(pd, NULL, SIZE_MAX, ...ON_DEMAND): one key for every address of the process.
TEST_F(OnDemand, AnImplicitRegionCoversEveryAddressThatIsMapped) {
  errno = 0;
  EXPECT_EQ(ibv_reg_mr(v.pd, nullptr, SIZE_MAX, kAllAccess), nullptr);
  EXPECT_EQ(errno, EINVAL) << "the whole address space is a region on demand only";
  errno = 0;
  EXPECT_EQ(ibv_reg_mr(v.pd, nullptr, 4096, kOnDemandAccess), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ibv_mr* all = ibv_reg_mr(v.pd, nullptr, SIZE_MAX, kOnDemandAccess);
  ASSERT_NE(all, nullptr) << strerror(errno);

  Qp *a, *b;
  Pair(QpOpts{}, &a, &b);
  std::vector<uint8_t> from(128, 0x21), to(128, 0);  // registered by nobody but `all`
  const auto addr = [](const std::vector<uint8_t>& x) {
    return reinterpret_cast<uintptr_t>(x.data());
  };
  ASSERT_EQ(
      PostPiece(a->qp, IBV_WR_RDMA_WRITE, {addr(from), 128, all->lkey}, addr(to), all->rkey, 1), 0);
  ibv_wc wc;
  ASSERT_TRUE(PollOne(a->scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
  EXPECT_EQ(to, from);

  PagesWithAHole pages;
  ASSERT_NE(pages.base, nullptr) << strerror(errno);
  ASSERT_EQ(PostPiece(a->qp, IBV_WR_RDMA_WRITE, {addr(from), 128, all->lkey},
                      reinterpret_cast<uintptr_t>(pages.hole()), all->rkey, 2),
            0);
  ASSERT_TRUE(PollOne(a->scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << WcStr(wc);
  EXPECT_EQ(ibv_dereg_mr(all), 0);
}

TEST_F(OnDemand, AdviseMrPrefetchesAndAnswersWithTheErrorsItsManPageNames) {
  Buffer* plain = Buf(4096);
  std::vector<uint8_t> mem(8192);
  const uint64_t addr = reinterpret_cast<uintptr_t>(mem.data());
  ibv_mr* mr = ibv_reg_mr(v.pd, mem.data(), mem.size(), kOnDemandAccess);
  ASSERT_NE(mr, nullptr) << strerror(errno);
  const int read_only = IBV_ACCESS_ON_DEMAND;  // an int: verbs.h's macro mixes enum types
  ibv_mr* ro = ibv_reg_mr(v.pd, mem.data(), mem.size(), read_only);
  ASSERT_NE(ro, nullptr) << strerror(errno);

  ibv_sge s{addr, 8192, mr->lkey};
  for (auto advice : {IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
                      IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT}) {
    EXPECT_EQ(ibv_advise_mr(v.pd, advice, 0, &s, 1), 0) << advice;
    EXPECT_EQ(ibv_advise_mr(v.pd, advice, IBV_ADVISE_MR_FLAG_FLUSH, &s, 1), 0) << advice;
  }
  const auto advise = [&](ibv_sge g, ibv_advise_mr_advice advice = IBV_ADVISE_MR_ADVICE_PREFETCH,
                          uint32_t flags = 0) { return ibv_advise_mr(v.pd, advice, flags, &g, 1); };
  EXPECT_EQ(advise(s, IBV_ADVISE_MR_ADVICE_PREFETCH, 0x80), EINVAL) << "unknown flag";
  EXPECT_EQ(advise({addr, 64, mr->lkey ^ 0x5a5a00}), EFAULT) << "no such key";
  EXPECT_EQ(advise({addr + 8000, 500, mr->lkey}), EFAULT) << "beyond the region";
  EXPECT_EQ(advise({addr, 64, ro->lkey}, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE), EPERM)
      << "a write prefetch of a region not locally writable";
  EXPECT_EQ(advise({addr, 64, ro->lkey}), 0);
  EXPECT_EQ(advise({plain->addr(), 64, plain->lkey()}), EINVAL) << "not a region on demand";
  EXPECT_EQ(ibv_dereg_mr(ro), 0);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
}

}  // namespace
}  // namespace semantics
