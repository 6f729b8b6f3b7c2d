// Device memory (ibv_alloc_dm(3), ibv_reg_dm_mr(3)): memory the application reaches through
// ibv_memcpy_to_dm / ibv_memcpy_from_dm, and work requests through zero-based regions, whose local
// pieces name offsets into it. ibv_rc_pingpong -j refused to run before ("Couldn't allocate
// device memory": the verbs were EOPNOTSUPP).
#include <cstring>
#include <vector>

#include "support/semantics_harness.h"

namespace semantics {
namespace {

using DeviceMemory = VerbsTest;

constexpr int kZeroBased = kAllAccess | IBV_ACCESS_ZERO_BASED;

ibv_dm* AllocDm(ibv_context* ctx, size_t length) {
  ibv_alloc_dm_attr a{};
  a.length = length;
  return ibv_alloc_dm(ctx, &a);
}

TEST_F(DeviceMemory, CopiesInAndOutStayWithinTheAllocation) {
  ibv_device_attr_ex attr{};
  ASSERT_EQ(ibv_query_device_ex(v.ctx, nullptr, &attr), 0);
  ASSERT_GE(attr.max_dm_size, 4096u);
  ibv_dm* dm = AllocDm(v.ctx, 4096);
  ASSERT_NE(dm, nullptr) << strerror(errno);
  std::vector<uint8_t> in(100, 0x6d), out(100, 0);
  EXPECT_EQ(ibv_memcpy_to_dm(dm, 4000, in.data(), 96), 0);
  EXPECT_EQ(ibv_memcpy_from_dm(out.data(), dm, 4000, 96), 0);
  EXPECT_EQ(std::vector<uint8_t>(out.begin(), out.begin() + 96),
            std::vector<uint8_t>(in.begin(), in.begin() + 96));
  EXPECT_EQ(ibv_memcpy_to_dm(dm, 4000, in.data(), 97), EFAULT) << "one byte past the end";
  EXPECT_EQ(ibv_memcpy_from_dm(out.data(), dm, 4097, 0), EFAULT);
  // mlx5 moves 4-byte words: an offset or a length off that grain is EINVAL, the range intact.
  std::vector<uint8_t> before(8, 0);
  ASSERT_EQ(ibv_memcpy_from_dm(before.data(), dm, 0, 8), 0);
  EXPECT_EQ(ibv_memcpy_to_dm(dm, 1, in.data(), 4), EINVAL);
  EXPECT_EQ(ibv_memcpy_to_dm(dm, 0, in.data(), 6), EINVAL);
  EXPECT_EQ(ibv_memcpy_from_dm(out.data(), dm, 2, 4), EINVAL);
  EXPECT_EQ(ibv_memcpy_from_dm(out.data(), dm, 0, 3), EINVAL);
  std::vector<uint8_t> after(8, 1);
  ASSERT_EQ(ibv_memcpy_from_dm(after.data(), dm, 0, 8), 0);
  EXPECT_EQ(after, before);
  // An empty region over it registers (mlx5's does; pyverbs' test_create_dm_mr makes one).
  ibv_mr* empty = ibv_reg_dm_mr(v.pd, dm, 0, 0, kZeroBased);
  ASSERT_NE(empty, nullptr) << strerror(errno);
  EXPECT_EQ(empty->length, 0u);
  EXPECT_EQ(ibv_dereg_mr(empty), 0);
  EXPECT_EQ(ibv_free_dm(dm), 0);

  ibv_alloc_dm_attr bad{};
  bad.length = 4096;
  bad.comp_mask = 1;
  errno = 0;
  EXPECT_EQ(ibv_alloc_dm(v.ctx, &bad), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(AllocDm(v.ctx, attr.max_dm_size + 1), nullptr);
  EXPECT_EQ(errno, ENOMEM);
}

// Local pieces of a region over device memory name offsets into it; remote peers address it from 0
// too. A piece beyond the region is LOC_PROT_ERR, as any other.
TEST_F(DeviceMemory, WorkRequestsReachItByOffsetFromZero) {
  ibv_dm* dm = AllocDm(v.ctx, 8192);
  ASSERT_NE(dm, nullptr) << strerror(errno);
  errno = 0;
  EXPECT_EQ(ibv_reg_dm_mr(v.pd, dm, 0, 4096, kAllAccess), nullptr) << "not zero-based";
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_reg_dm_mr(v.pd, dm, 4096, 4097, kZeroBased), nullptr) << "beyond the allocation";
  EXPECT_EQ(errno, EINVAL);
  ibv_mr* mr = ibv_reg_dm_mr(v.pd, dm, 4096, 4096, kZeroBased);  // the second page
  ASSERT_NE(mr, nullptr) << strerror(errno);
  EXPECT_EQ(ibv_free_dm(dm), EBUSY) << "a region is registered over it";

  std::vector<uint8_t> pattern(64);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<uint8_t>(i + 1);
  ASSERT_EQ(ibv_memcpy_to_dm(dm, 4096 + 100, pattern.data(), 64), 0);

  Qp *a, *b;
  Pair(QpOpts{}, &a, &b);
  Buffer* host = Buf(4096);
  // A SEND gathered from offset 100 of the region.
  ASSERT_EQ(PostRecv(b->qp, *host, 0, 64, 10), 0);
  ASSERT_EQ(PostPiece(a->qp, IBV_WR_SEND, {100, 64, mr->lkey}, 0, 0, 1), 0);
  ibv_wc wc;
  ASSERT_TRUE(PollOne(a->scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
  ASSERT_TRUE(PollOne(b->rcq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
  EXPECT_EQ(0, std::memcmp(host->data(), pattern.data(), 64));

  // A peer's WRITE to remote address 200 of the region, and a READ of it back into offset 300.
  host->Fill(0x4e);
  ASSERT_EQ(PostRdma(b->qp, IBV_WR_RDMA_WRITE, *host, 0, 32, 200, mr->rkey, 2), 0);
  ASSERT_TRUE(PollOne(b->scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
  ASSERT_EQ(PostPiece(a->qp, IBV_WR_RDMA_READ, {300, 32, mr->lkey}, 200, mr->rkey, 3), 0);
  ASSERT_TRUE(PollOne(a->scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
  std::vector<uint8_t> out(32);
  ASSERT_EQ(ibv_memcpy_from_dm(out.data(), dm, 4096 + 300, 32), 0);
  EXPECT_EQ(out, std::vector<uint8_t>(32, 0x4e));
  ASSERT_EQ(ibv_memcpy_from_dm(out.data(), dm, 4096 + 200, 32), 0);
  EXPECT_EQ(out, std::vector<uint8_t>(32, 0x4e));

  // Past the region's 4096 bytes (still inside the allocation): refused.
  ASSERT_EQ(PostRecv(b->qp, *host, 0, 64, 11), 0);
  ASSERT_EQ(PostPiece(a->qp, IBV_WR_SEND, {4090, 16, mr->lkey}, 0, 0, 4), 0);
  ASSERT_TRUE(PollOne(a->scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << WcStr(wc);

  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_free_dm(dm), 0);
}

}  // namespace
}  // namespace semantics
