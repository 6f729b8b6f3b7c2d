// Memory windows, type 1 (ibv_bind_mw) and type 2 (IBV_WR_BIND_MW, LOCAL_INV, SEND_WITH_INV):
// remote access through a window is checked against the window's bounds, rights, key and (type 2)
// queue pair; binds and invalidations complete with the statuses rxe gives.
#include <infiniband/verbs.h>

#include <gtest/gtest.h>

#include "support/semantics_harness.h"

namespace {

using namespace semantics;

constexpr size_t kLen = 4096;
constexpr size_t kWinOff = 1024, kWinLen = 512;
constexpr int kWindowHost = kAllAccess | IBV_ACCESS_MW_BIND;

class MemoryWindow : public VerbsTest {
 protected:
  void SetUp() override {
    VerbsTest::SetUp();
    Pair(QpOpts{}, &a, &b);
    src = Buf(kLen);
    dst = Buf(kLen, kWindowHost);
    msgs = Buf(256);
  }
  ibv_mw* Alloc(ibv_mw_type t) {
    ibv_mw* mw = ibv_alloc_mw(v.pd, t);
    EXPECT_NE(mw, nullptr) << strerror(errno);
    if (mw) mws.push_back(mw);
    return mw;
  }
  void TearDown() override {
    for (ibv_mw* mw : mws) ibv_dealloc_mw(mw);
    VerbsTest::TearDown();
  }
  ibv_mw_bind_info Info(ibv_mr* mr, size_t off, size_t len, unsigned access) {
    return ibv_mw_bind_info{mr, reinterpret_cast<uintptr_t>(dst->data()) + off, len, access};
  }
  // Type 1: ibv_bind_mw on b's QP; returns the completion's status.
  ibv_wc_status Bind1(ibv_mw* mw, const ibv_mw_bind_info& info) {
    ibv_mw_bind mb{};
    mb.wr_id = 77;
    mb.send_flags = IBV_SEND_SIGNALED;
    mb.bind_info = info;
    EXPECT_EQ(ibv_bind_mw(b->qp, mw, &mb), 0);
    ibv_wc wc{};
    EXPECT_TRUE(PollOne(b->scq, &wc));
    EXPECT_EQ(wc.wr_id, 77u);
    if (wc.status == IBV_WC_SUCCESS) {
      EXPECT_EQ(wc.opcode, IBV_WC_BIND_MW);
    }
    return wc.status;
  }
  // Posts one signaled local operation on `on` and returns its completion's status; a successful
  // one must carry `opcode`.
  ibv_wc_status PostLocalOp(Qp* on, ibv_send_wr& wr, ibv_wc_opcode opcode) {
    ibv_send_wr* bad = nullptr;
    wr.send_flags = IBV_SEND_SIGNALED;
    EXPECT_EQ(ibv_post_send(on->qp, &wr, &bad), 0);
    ibv_wc wc{};
    EXPECT_TRUE(PollOne(on->scq, &wc));
    if (wc.status == IBV_WC_SUCCESS) {
      EXPECT_EQ(wc.opcode, opcode);
    }
    return wc.status;
  }
  // Type 2: IBV_WR_BIND_MW on `on` with the next key; returns the completion's status.
  ibv_wc_status Bind2(Qp* on, ibv_mw* mw, uint32_t rkey, const ibv_mw_bind_info& info) {
    ibv_send_wr wr{};
    wr.wr_id = 78;
    wr.opcode = IBV_WR_BIND_MW;
    wr.bind_mw.mw = mw;
    wr.bind_mw.rkey = rkey;
    wr.bind_mw.bind_info = info;
    return PostLocalOp(on, wr, IBV_WC_BIND_MW);
  }
  ibv_wc_status LocalInv(uint32_t rkey) {
    ibv_send_wr wr{};
    wr.wr_id = 79;
    wr.opcode = IBV_WR_LOCAL_INV;
    wr.invalidate_rkey = rkey;
    return PostLocalOp(b, wr, IBV_WC_LOCAL_INV);
  }
  // One RDMA operation from a to the window; returns its completion status.
  ibv_wc_status Rdma(Qp* from, ibv_wr_opcode op, uint64_t raddr, uint32_t rkey, uint32_t len) {
    EXPECT_EQ(PostRdma(from->qp, op, *src, 0, len, raddr, rkey, 5), 0);
    ibv_wc wc{};
    EXPECT_TRUE(PollOne(from->scq, &wc));
    return wc.status;
  }
  uint64_t WinAddr(size_t off = 0) const { return dst->addr(kWinOff + off); }

  Qp *a = nullptr, *b = nullptr;
  Buffer *src = nullptr, *dst = nullptr, *msgs = nullptr;
  std::vector<ibv_mw*> mws;
};

TEST_F(MemoryWindow, TheDeviceSaysItHasWindowsOfBothTypes) {
  ibv_device_attr attr{};
  ASSERT_EQ(ibv_query_device(v.ctx, &attr), 0);
  EXPECT_TRUE(attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW);
  EXPECT_TRUE(attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B);
  EXPECT_GT(attr.max_mw, 0);
}

TEST_F(MemoryWindow, Type1WriteAndReadWithinTheWindowLand) {
  ibv_mw* mw = Alloc(IBV_MW_TYPE_1);
  uint32_t before = mw->rkey;
  ASSERT_EQ(
      Bind1(mw, Info(dst->mr, kWinOff, kWinLen, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)),
      IBV_WC_SUCCESS);
  EXPECT_NE(mw->rkey, before);
  EXPECT_EQ(mw->rkey >> 8, before >> 8) << "a bind changes the key's tag only";
  for (size_t i = 0; i < 64; ++i) src->data()[i] = static_cast<uint8_t>(i + 1);
  ASSERT_EQ(Rdma(a, IBV_WR_RDMA_WRITE, WinAddr(kWinLen - 64), mw->rkey, 64), IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(dst->data() + kWinOff + kWinLen - 64, src->data(), 64), 0);
  std::memset(src->data(), 0, 64);
  ASSERT_EQ(Rdma(a, IBV_WR_RDMA_READ, WinAddr(kWinLen - 64), mw->rkey, 64), IBV_WC_SUCCESS);
  EXPECT_EQ(src->data()[63], 64);
}

TEST_F(MemoryWindow, AWriteCrossingTheWindowsEndIsARemoteAccessError) {
  ibv_mw* mw = Alloc(IBV_MW_TYPE_1);
  ASSERT_EQ(Bind1(mw, Info(dst->mr, kWinOff, kWinLen, IBV_ACCESS_REMOTE_WRITE)), IBV_WC_SUCCESS);
  dst->Fill(0xab);
  EXPECT_EQ(Rdma(a, IBV_WR_RDMA_WRITE, WinAddr(kWinLen - 8), mw->rkey, 16), IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(dst->data()[kWinOff + kWinLen], 0xab) << "nothing written beyond the window";
}

TEST_F(MemoryWindow, AnAddressBeforeTheWindowIsARemoteAccessError) {
  ibv_mw* mw = Alloc(IBV_MW_TYPE_1);
  ASSERT_EQ(Bind1(mw, Info(dst->mr, kWinOff, kWinLen, IBV_ACCESS_REMOTE_READ)), IBV_WC_SUCCESS);
  EXPECT_EQ(Rdma(a, IBV_WR_RDMA_READ, WinAddr() - 1, mw->rkey, 8), IBV_WC_REM_ACCESS_ERR);
}

TEST_F(MemoryWindow, ARightTheWindowDoesNotGrantIsARemoteAccessError) {
  ibv_mw* mw = Alloc(IBV_MW_TYPE_1);
  ASSERT_EQ(Bind1(mw, Info(dst->mr, kWinOff, kWinLen, IBV_ACCESS_REMOTE_READ)), IBV_WC_SUCCESS);
  EXPECT_EQ(Rdma(a, IBV_WR_RDMA_WRITE, WinAddr(), mw->rkey, 8), IBV_WC_REM_ACCESS_ERR);
}

TEST_F(MemoryWindow, AtomicsThroughAWindowWithTheAtomicRightWork) {
  ibv_mw* mw = Alloc(IBV_MW_TYPE_1);
  ASSERT_EQ(Bind1(mw, Info(dst->mr, kWinOff, kWinLen, IBV_ACCESS_REMOTE_ATOMIC)), IBV_WC_SUCCESS);
  dst->u64(kWinOff / 8) = 40;
  ASSERT_EQ(PostAtomic(a->qp, IBV_WR_ATOMIC_FETCH_AND_ADD, *src, 0, WinAddr(), mw->rkey, 2, 0, 6),
            0);
  ibv_wc wc{};
  ASSERT_TRUE(PollOne(a->scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(src->u64(0), 40u);
  EXPECT_EQ(dst->u64(kWinOff / 8), 42u);
}

TEST_F(MemoryWindow, TheKeyBeforeARebindNoLongerWorks) {
  ibv_mw* mw = Alloc(IBV_MW_TYPE_1);
  ASSERT_EQ(Bind1(mw, Info(dst->mr, kWinOff, kWinLen, IBV_ACCESS_REMOTE_WRITE)), IBV_WC_SUCCESS);
  uint32_t old = mw->rkey;
  ASSERT_EQ(Bind1(mw, Info(dst->mr, 0, kWinLen, IBV_ACCESS_REMOTE_WRITE)), IBV_WC_SUCCESS);
  EXPECT_EQ(Rdma(a, IBV_WR_RDMA_WRITE, dst->addr(), old, 8), IBV_WC_REM_ACCESS_ERR);
}

TEST_F(MemoryWindow, AZeroLengthBindInvalidatesAType1Window) {
  ibv_mw* mw = Alloc(IBV_MW_TYPE_1);
  ASSERT_EQ(Bind1(mw, Info(dst->mr, kWinOff, kWinLen, IBV_ACCESS_REMOTE_WRITE)), IBV_WC_SUCCESS);
  EXPECT_EQ(ibv_dereg_mr(dst->mr), EBUSY) << "ibv_alloc_mw(3): a region with a bound window stays";
  ibv_mw_bind_info none{nullptr, 0, 0, 0};
  ASSERT_EQ(Bind1(mw, none), IBV_WC_SUCCESS);
  EXPECT_EQ(Rdma(a, IBV_WR_RDMA_WRITE, WinAddr(), mw->rkey, 8), IBV_WC_REM_ACCESS_ERR);
}

TEST_F(MemoryWindow, ZeroBasedWindowsAreAddressedFromZero) {
  ibv_mw* mw = Alloc(IBV_MW_TYPE_1);
  ASSERT_EQ(
      Bind1(mw, Info(dst->mr, kWinOff, kWinLen, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_ZERO_BASED)),
      IBV_WC_SUCCESS);
  src->data()[0] = 0x5a;
  ASSERT_EQ(Rdma(a, IBV_WR_RDMA_WRITE, 16, mw->rkey, 1), IBV_WC_SUCCESS);
  EXPECT_EQ(dst->data()[kWinOff + 16], 0x5a);
}

TEST_F(MemoryWindow, BindErrorsCompleteWithMwBindErr) {
  Buffer* plain = Buf(kLen);                                            // no IBV_ACCESS_MW_BIND
  Buffer* ro = Buf(kLen, IBV_ACCESS_MW_BIND | IBV_ACCESS_REMOTE_READ);  // no local write
  {
    ibv_mw* mw = Alloc(IBV_MW_TYPE_1);
    ibv_mw_bind_info i{plain->mr, plain->addr(), 64, IBV_ACCESS_REMOTE_READ};
    EXPECT_EQ(Bind1(mw, i), IBV_WC_MW_BIND_ERR);
  }
  Pair(QpOpts{}, &a, &b);  // the failed bind put b's QP in error
  {
    ibv_mw* mw = Alloc(IBV_MW_TYPE_1);
    ibv_mw_bind_info i{ro->mr, ro->addr(), 64, IBV_ACCESS_REMOTE_WRITE};
    EXPECT_EQ(Bind1(mw, i), IBV_WC_MW_BIND_ERR) << "remote write needs local write on the MR";
  }
  Pair(QpOpts{}, &a, &b);
  {
    ibv_mw* mw = Alloc(IBV_MW_TYPE_1);
    EXPECT_EQ(Bind1(mw, Info(dst->mr, kLen - 8, 16, IBV_ACCESS_REMOTE_READ)), IBV_WC_MW_BIND_ERR)
        << "a window must lie within its region";
  }
}

TEST_F(MemoryWindow, EachBindVerbTakesItsOwnWindowType) {
  ibv_mw* t1 = Alloc(IBV_MW_TYPE_1);
  ibv_mw* t2 = Alloc(IBV_MW_TYPE_2);
  ibv_send_wr wr{}, *bad = nullptr;
  wr.opcode = IBV_WR_BIND_MW;
  wr.bind_mw.mw = t1;
  wr.bind_mw.rkey = ibv_inc_rkey(t1->rkey);
  wr.bind_mw.bind_info = Info(dst->mr, kWinOff, kWinLen, IBV_ACCESS_REMOTE_READ);
  EXPECT_EQ(ibv_post_send(b->qp, &wr, &bad), EINVAL) << "type 1 windows bind with ibv_bind_mw";
  ibv_mw_bind mb{};
  mb.bind_info = wr.bind_mw.bind_info;
  EXPECT_EQ(ibv_bind_mw(b->qp, t2, &mb), EINVAL) << "type 2 windows bind with a work request";
}

TEST_F(MemoryWindow, Type2WindowsBindThroughAWorkRequestAndInvalidateLocally) {
  ibv_mw* mw = Alloc(IBV_MW_TYPE_2);
  uint32_t rkey = ibv_inc_rkey(mw->rkey);
  ASSERT_EQ(Bind2(b, mw, rkey, Info(dst->mr, kWinOff, kWinLen, IBV_ACCESS_REMOTE_WRITE)),
            IBV_WC_SUCCESS);
  ASSERT_EQ(Rdma(a, IBV_WR_RDMA_WRITE, WinAddr(), rkey, 8), IBV_WC_SUCCESS);
  ASSERT_EQ(LocalInv(rkey), IBV_WC_SUCCESS);
  EXPECT_EQ(Rdma(a, IBV_WR_RDMA_WRITE, WinAddr(), rkey, 8), IBV_WC_REM_ACCESS_ERR);
}

TEST_F(MemoryWindow, ABoundType2WindowMustBeInvalidatedBeforeItBindsAgain) {
  ibv_mw* mw = Alloc(IBV_MW_TYPE_2);
  uint32_t rkey = ibv_inc_rkey(mw->rkey);
  ASSERT_EQ(Bind2(b, mw, rkey, Info(dst->mr, kWinOff, kWinLen, IBV_ACCESS_REMOTE_WRITE)),
            IBV_WC_SUCCESS);
  EXPECT_EQ(Bind2(b, mw, ibv_inc_rkey(rkey), Info(dst->mr, 0, 64, IBV_ACCESS_REMOTE_WRITE)),
            IBV_WC_MW_BIND_ERR);
}

TEST_F(MemoryWindow, SendWithInvalidateInvalidatesTheWindowRemotely) {
  ibv_mw* mw = Alloc(IBV_MW_TYPE_2);
  uint32_t rkey = ibv_inc_rkey(mw->rkey);
  ASSERT_EQ(Bind2(b, mw, rkey, Info(dst->mr, kWinOff, kWinLen, IBV_ACCESS_REMOTE_WRITE)),
            IBV_WC_SUCCESS);
  ASSERT_EQ(PostRecv(b->qp, *msgs, 0, 64, 11), 0);
  ibv_sge sge = src->Sge(0, 8);
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = 12;
  wr.opcode = IBV_WR_SEND_WITH_INV;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.invalidate_rkey = rkey;
  ASSERT_EQ(ibv_post_send(a->qp, &wr, &bad), 0);
  ibv_wc wc{};
  ASSERT_TRUE(PollOne(b->rcq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
  EXPECT_TRUE(wc.wc_flags & IBV_WC_WITH_INV);
  EXPECT_EQ(wc.invalidated_rkey, rkey);
  ASSERT_TRUE(PollOne(a->scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(Rdma(a, IBV_WR_RDMA_WRITE, WinAddr(), rkey, 8), IBV_WC_REM_ACCESS_ERR);
}

TEST_F(MemoryWindow, InvalidatingAKeyThatNamesNoType2WindowFails) {
  ibv_mw* mw = Alloc(IBV_MW_TYPE_1);
  ASSERT_EQ(Bind1(mw, Info(dst->mr, kWinOff, kWinLen, IBV_ACCESS_REMOTE_WRITE)), IBV_WC_SUCCESS);
  EXPECT_EQ(LocalInv(mw->rkey), IBV_WC_LOC_QP_OP_ERR) << "type 1 windows are not invalidated so";
  Pair(QpOpts{}, &a, &b);
  ASSERT_EQ(PostRecv(b->qp, *msgs, 0, 64, 11), 0);
  ibv_send_wr wr{}, *bad = nullptr;
  wr.opcode = IBV_WR_SEND_WITH_INV;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.invalidate_rkey = 0x12345678;
  ASSERT_EQ(ibv_post_send(a->qp, &wr, &bad), 0);
  ibv_wc wc{};
  ASSERT_TRUE(PollOne(b->rcq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_REM_INV_REQ_ERR);
  ASSERT_TRUE(PollOne(a->scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_REM_INV_REQ_ERR);
}

TEST_F(MemoryWindow, AType2WindowAnswersOnlyTheQueuePairItWasBoundThrough) {
  Qp *c, *d;
  Pair(QpOpts{}, &c, &d);
  ibv_mw* mw = Alloc(IBV_MW_TYPE_2);
  uint32_t rkey = ibv_inc_rkey(mw->rkey);
  ASSERT_EQ(Bind2(b, mw, rkey, Info(dst->mr, kWinOff, kWinLen, IBV_ACCESS_REMOTE_WRITE)),
            IBV_WC_SUCCESS);
  EXPECT_EQ(Rdma(c, IBV_WR_RDMA_WRITE, WinAddr(), rkey, 8), IBV_WC_REM_ACCESS_ERR)
      << "d is not the window's QP";
  EXPECT_EQ(Rdma(a, IBV_WR_RDMA_WRITE, WinAddr(), rkey, 8), IBV_WC_SUCCESS);
}

TEST_F(MemoryWindow, TheExtendedPostingApiBindsAndInvalidates) {
  QpOpts o;
  o.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV;
  Pair(o, &a, &b);
  ibv_mw* mw = Alloc(IBV_MW_TYPE_2);
  uint32_t rkey = ibv_inc_rkey(mw->rkey);
  ibv_mw_bind_info info = Info(dst->mr, kWinOff, kWinLen, IBV_ACCESS_REMOTE_WRITE);
  ibv_qp_ex* x = b->ex();
  ibv_wr_start(x);
  x->wr_id = 1;
  x->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_bind_mw(x, mw, rkey, &info);
  ASSERT_EQ(ibv_wr_complete(x), 0);
  ibv_wc wc{};
  ASSERT_TRUE(PollOne(b->scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.opcode, IBV_WC_BIND_MW);
  ASSERT_EQ(Rdma(a, IBV_WR_RDMA_WRITE, WinAddr(), rkey, 8), IBV_WC_SUCCESS);
  ibv_wr_start(x);
  x->wr_id = 2;
  x->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_local_inv(x, rkey);
  ASSERT_EQ(ibv_wr_complete(x), 0);
  ASSERT_TRUE(PollOne(b->scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.opcode, IBV_WC_LOCAL_INV);
  EXPECT_EQ(Rdma(a, IBV_WR_RDMA_WRITE, WinAddr(), rkey, 8), IBV_WC_REM_ACCESS_ERR);
}

// Across processes, over each link: the peer's window takes a WRITE within it, refuses one beyond
// it, and a SEND_WITH_INV closes it.
struct Window {
  Remote remote;
  uint64_t addr;
  uint32_t rkey;
};

class MemoryWindowAcross : public VerbsTest, public ::testing::WithParamInterface<const char*> {};

int WindowPeer(ChildPipe p, const char* link) {
  ForceLink(link);
  Verbs v;
  if (!v.Open()) return 10;
  QpOpts o;
  Qp* q = v.NewQp(o);
  Buffer* dst = v.NewBuffer(64 * 1024, kWindowHost);  // large: shared with same-host peers
  Buffer* msgs = v.NewBuffer(64);
  ibv_mw* mw = ibv_alloc_mw(v.pd, IBV_MW_TYPE_2);
  if (!q || !dst || !msgs || !mw) return 11;
  Remote theirs;
  if (!p.Send(v.RemoteOf(q)) || !p.Recv(&theirs) || BringUp(q->qp, o, theirs)) return 12;
  uint32_t rkey = ibv_inc_rkey(mw->rkey);
  ibv_send_wr wr{}, *bad = nullptr;
  wr.opcode = IBV_WR_BIND_MW;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.bind_mw.mw = mw;
  wr.bind_mw.rkey = rkey;
  wr.bind_mw.bind_info = {dst->mr, dst->addr(kWinOff), kWinLen, IBV_ACCESS_REMOTE_WRITE};
  ibv_wc wc{};
  if (ibv_post_send(q->qp, &wr, &bad) || !PollOne(q->scq, &wc) || wc.status != IBV_WC_SUCCESS)
    return 13;
  if (PostRecv(q->qp, *msgs, 0, 64, 1)) return 14;
  if (!p.Send(Window{{}, dst->addr(kWinOff), rkey})) return 15;
  if (!PollOne(q->rcq, &wc)) return 16;
  int ok = wc.status == IBV_WC_SUCCESS && (wc.wc_flags & IBV_WC_WITH_INV) &&
           wc.invalidated_rkey == rkey && dst->data()[kWinOff + 7] == 0x77;
  p.Send(ok);
  char c;
  p.Recv(&c);
  return 0;
}

TEST_P(MemoryWindowAcross, AWindowIsCheckedAndInvalidatedRemotely) {
  const char* link = GetParam();
  ForkedPeer child;
  ASSERT_TRUE(child.Start([link](int up, int down) { return WindowPeer({up, down}, link); }));
  Remote theirs;
  ASSERT_TRUE(child.Recv(&theirs));
  QpOpts o;
  Qp* a = v.NewQp(o);
  Buffer* src = Buf(kLen);
  ASSERT_TRUE(a && src);
  ASSERT_TRUE(child.Send(v.RemoteOf(a)));
  ASSERT_EQ(BringUp(a->qp, o, theirs), 0);
  Window w;
  ASSERT_TRUE(child.Recv(&w));
  std::memset(src->data(), 0x77, 8);
  ibv_wc wc{};
  ASSERT_EQ(PostRdma(a->qp, IBV_WR_RDMA_WRITE, *src, 0, 8, w.addr, w.rkey, 1), 0);
  ASSERT_TRUE(PollOne(a->scq, &wc));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
  ibv_sge sge = src->Sge(0, 8);
  ibv_send_wr wr{}, *bad = nullptr;
  wr.opcode = IBV_WR_SEND_WITH_INV;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.invalidate_rkey = w.rkey;
  ASSERT_EQ(ibv_post_send(a->qp, &wr, &bad), 0);
  ASSERT_TRUE(PollOne(a->scq, &wc));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
  int ok = 0;
  ASSERT_TRUE(child.Recv(&ok));
  EXPECT_EQ(ok, 1) << "the peer's receive did not report the invalidation, or the data is missing";
  ASSERT_EQ(PostRdma(a->qp, IBV_WR_RDMA_WRITE, *src, 0, 8, w.addr, w.rkey, 2), 0);
  ASSERT_TRUE(PollOne(a->scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << "the window was invalidated";
  child.Send('q');
  EXPECT_EQ(child.Wait(), 0);
}

INSTANTIATE_TEST_SUITE_P(Links, MemoryWindowAcross, ::testing::Values("shm", "tcp"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
