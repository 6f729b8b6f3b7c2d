// Registered pages the application makes read-only (mprotect) after ibv_reg_mr: an HCA writes
// them all the same (its DMA goes to the pinned pages, not through the process's page tables), so
// a peer's WRITE, SEND and atomic land, and so does a READ response in a local buffer. Before,
// the responder's copy into such a page killed the process (SIGSEGV), the TCP link's read of a
// large payload into it dropped the connection (EFAULT).
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

#include "support/fresh_process.h"
#include "support/semantics_harness.h"

namespace semantics {
namespace {

using ReadOnlyRegion = VerbsTest;

// One page (stays private memory) and kLargeBytes (moved onto the shared arena at registration):
// the two kinds of registered pages.
constexpr size_t kLargeBytes = 256 * 1024;
// A WRITE this large is read from a TCP socket straight into its destination.
constexpr uint32_t kLargeWrite = 100 * 1024;
constexpr size_t kSendAt = 1024, kAtomicAt = 512, kWriteAt = 8;

struct ReadOnlyPages {
  ReadOnlyPages(ibv_pd* pd, size_t len) : len(len) {
    void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return;
    base = static_cast<uint8_t*>(p);
    std::memset(base, 0, len);
    mr = ibv_reg_mr(pd, base, len, kAllAccess);
    if (mr && mprotect(base, len, PROT_READ) != 0) {
      ibv_dereg_mr(mr);
      mr = nullptr;
    }
  }
  ~ReadOnlyPages() {
    if (mr) ibv_dereg_mr(mr);
    if (base) munmap(base, len);
  }
  bool ok() const { return mr != nullptr; }
  uint64_t addr(size_t off) const { return reinterpret_cast<uintptr_t>(base) + off; }
  size_t len;
  uint8_t* base = nullptr;
  ibv_mr* mr = nullptr;
};

struct Targets {
  uint64_t small = 0, large = 0;
  uint32_t small_rkey = 0, large_rkey = 0;
};

uint8_t Pattern(size_t i) {
  return static_cast<uint8_t>(i * 7 + 3);
}

// The requester's part: WRITEs into both kinds of pages, a SEND (the peer posted a receive into
// read-only pages), atomics, and READs back, each checked; last, an atomic whose result lands in a
// local page made read-only (`local`). `out` holds kLargeWrite bytes.
void WriteIntoReadOnlyPages(ibv_qp* qp, ibv_cq* scq, Buffer& out, const Targets& t,
                            const ReadOnlyPages& local) {
  for (size_t i = 0; i < kLargeWrite; ++i) out.data()[i] = Pattern(i);
  ibv_wc wc{};
  uint64_t id = 1;
  auto complete = [&](const char* what) {
    ASSERT_TRUE(PollOne(scq, &wc)) << what;
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << what << ": " << WcStr(wc);
  };
  ASSERT_EQ(PostRdma(qp, IBV_WR_RDMA_WRITE, out, 0, 64, t.small + kWriteAt, t.small_rkey, id++), 0);
  complete("WRITE into a private page");
  ASSERT_EQ(PostRdma(qp, IBV_WR_RDMA_WRITE, out, 0, kLargeWrite, t.large, t.large_rkey, id++), 0);
  complete("WRITE into arena pages");
  ASSERT_EQ(PostSendMsg(qp, out, 0, 32, id++), 0);
  complete("SEND");
  ASSERT_EQ(PostAtomic(qp, IBV_WR_ATOMIC_FETCH_AND_ADD, out, kLargeWrite - 8, t.small + kAtomicAt,
                       t.small_rkey, 5, 0, id++),
            0);
  complete("FETCH_AND_ADD");
  uint64_t written;  // what the large WRITE left in the word the swap compares
  std::memcpy(&written, out.data() + kAtomicAt, 8);
  ASSERT_EQ(PostAtomic(qp, IBV_WR_ATOMIC_CMP_AND_SWP, out, kLargeWrite - 8, t.large + kAtomicAt,
                       t.large_rkey, written, 9, id++),
            0);
  complete("CMP_AND_SWP");
  std::memset(out.data(), 0, kLargeWrite);
  ASSERT_EQ(PostRdma(qp, IBV_WR_RDMA_READ, out, 0, 64, t.small + kWriteAt, t.small_rkey, id++), 0);
  complete("READ from a private page");
  for (size_t i = 0; i < 64; ++i) ASSERT_EQ(out.data()[i], Pattern(i)) << "byte " << i;
  ASSERT_EQ(PostRdma(qp, IBV_WR_RDMA_READ, out, 0, kLargeWrite, t.large, t.large_rkey, id++), 0);
  complete("READ from arena pages");
  for (size_t i = 0; i < kLargeWrite; ++i) {
    if (i >= kAtomicAt && i < kAtomicAt + 8) continue;  // the swapped word
    ASSERT_EQ(out.data()[i], Pattern(i)) << "byte " << i;
  }
  uint64_t word;
  ASSERT_EQ(PostRdma(qp, IBV_WR_RDMA_READ, out, 0, 8, t.small + kAtomicAt, t.small_rkey, id++), 0);
  complete("READ of the added word");
  std::memcpy(&word, out.data(), 8);
  EXPECT_EQ(word, 5u);
  ASSERT_EQ(PostRdma(qp, IBV_WR_RDMA_READ, out, 0, 8, t.large + kAtomicAt, t.large_rkey, id++), 0);
  complete("READ of the swapped word");
  std::memcpy(&word, out.data(), 8);
  EXPECT_EQ(word, 9u);
  // Adding nothing to a word the large WRITE left: its bytes are the result.
  SendArgs add;
  add.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
  add.wr_id = id++;
  add.sges = {ibv_sge{local.addr(0), 8, local.mr->lkey}};
  add.remote_addr = t.large + kSendAt;
  add.rkey = t.large_rkey;
  ASSERT_EQ(Post(qp, add), 0);
  complete("FETCH_AND_ADD into a read-only local page");
  for (size_t i = 0; i < 8; ++i)
    ASSERT_EQ(local.base[i], Pattern(kSendAt + i)) << "result byte " << i;
}

// The responder's part, after the requester's: its own view of the pages and the SEND's completion.
// An empty string when all is as it should be.
std::string CheckReadOnlyPages(const ReadOnlyPages& small, const ReadOnlyPages& large,
                               ibv_cq* rcq) {
  for (size_t i = 0; i < 64; ++i)
    if (small.base[kWriteAt + i] != Pattern(i)) return "private page, byte " + std::to_string(i);
  for (size_t i = 0; i < 32; ++i)
    if (small.base[kSendAt + i] != Pattern(i)) return "SEND, byte " + std::to_string(i);
  uint64_t added, swapped;
  std::memcpy(&added, small.base + kAtomicAt, 8);
  std::memcpy(&swapped, large.base + kAtomicAt, 8);
  if (added != 5 || swapped != 9) return "atomics";
  ibv_wc wc{};
  if (!PollOne(rcq, &wc)) return "no receive completion";
  if (wc.status != IBV_WC_SUCCESS || wc.byte_len != 32) return "receive: " + WcStr(wc);
  return "";
}

TEST_F(ReadOnlyRegion, PeersWriteSendAndAtomicIntoPagesMadeReadOnly) {
  ReadOnlyPages small(v.pd, static_cast<size_t>(sysconf(_SC_PAGESIZE)));
  ReadOnlyPages large(v.pd, kLargeBytes);
  ReadOnlyPages local(v.pd, static_cast<size_t>(sysconf(_SC_PAGESIZE)));
  ASSERT_TRUE(small.ok() && large.ok() && local.ok()) << strerror(errno);
  Buffer* out = Buf(kLargeWrite);
  Qp *a, *b;
  Pair(QpOpts{}, &a, &b);
  ASSERT_EQ(PostRecvSge(b->qp, ibv_sge{small.addr(kSendAt), 64, small.mr->lkey}, 1), 0);
  WriteIntoReadOnlyPages(a->qp, a->scq, *out,
                         Targets{small.addr(0), large.addr(0), small.mr->rkey, large.mr->rkey},
                         local);
  EXPECT_EQ(CheckReadOnlyPages(small, large, b->rcq), "");
}

// A READ's response lands in a local buffer made read-only, too.
TEST_F(ReadOnlyRegion, AReadLandsInALocalBufferMadeReadOnly) {
  ReadOnlyPages local(v.pd, kLargeBytes);
  ASSERT_TRUE(local.ok()) << strerror(errno);
  Buffer* source = Buf(kLargeWrite);
  for (size_t i = 0; i < kLargeWrite; ++i) source->data()[i] = Pattern(i);
  Qp *a, *b;
  Pair(QpOpts{}, &a, &b);
  for (uint32_t len : {uint32_t{64}, kLargeWrite}) {
    ibv_send_wr wr{};
    ibv_sge sge{local.addr(0), len, local.mr->lkey};
    wr.wr_id = len;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = source->addr(0);
    wr.wr.rdma.rkey = source->rkey();
    ibv_send_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_send(a->qp, &wr, &bad), 0);
    ibv_wc wc{};
    ASSERT_TRUE(PollOne(a->scq, &wc));
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
    ASSERT_EQ(std::memcmp(local.base, source->data(), len), 0) << len << " bytes";
  }
}

// The application's own shared memory (a memfd) made read-only: /proc/self/mem does not write a
// read-only shared mapping, and we have no other way in. The access fails as a page fault on an
// HCA fails it: REM_ACCESS_ERR for a WRITE, LOC_PROT_ERR at the receiver of a SEND (REM_OP_ERR at
// its sender), LOC_PROT_ERR for an atomic's result; the responder lives on.
TEST_F(ReadOnlyRegion, SharedMemoryOfTheApplicationMadeReadOnlyFailsTheAccess) {
  const size_t len = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const int fd = memfd_create("readonly-region-test", MFD_CLOEXEC);
  ASSERT_GE(fd, 0) << strerror(errno);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(len)), 0);
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(p, MAP_FAILED);
  auto* base = static_cast<uint8_t*>(p);
  ibv_mr* mr = ibv_reg_mr(v.pd, base, len, kAllAccess);
  ASSERT_NE(mr, nullptr) << strerror(errno);
  ASSERT_EQ(mprotect(base, len, PROT_READ), 0);
  Buffer* out = Buf(64);
  out->Fill(0x5a);
  ibv_wc wc{};
  {
    Qp *a, *b;
    Pair(QpOpts{}, &a, &b);
    ASSERT_EQ(PostRdma(a->qp, IBV_WR_RDMA_WRITE, *out, 0, 64, reinterpret_cast<uintptr_t>(base),
                       mr->rkey, 1),
              0);
    ASSERT_TRUE(PollOne(a->scq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << WcStr(wc);
  }
  {
    Qp *a, *b;
    Pair(QpOpts{}, &a, &b);
    ASSERT_EQ(PostRecvSge(b->qp, ibv_sge{reinterpret_cast<uintptr_t>(base), 64, mr->lkey}, 2), 0);
    ASSERT_EQ(PostSendMsg(a->qp, *out, 0, 32, 3), 0);
    ASSERT_TRUE(PollOne(a->scq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_REM_OP_ERR) << WcStr(wc);
    ASSERT_TRUE(PollOne(b->rcq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << WcStr(wc);
  }
  {
    Qp *a, *b;
    Pair(QpOpts{}, &a, &b);
    SendArgs add;
    add.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
    add.wr_id = 4;
    add.sges = {ibv_sge{reinterpret_cast<uintptr_t>(base) + 8, 8, mr->lkey}};
    add.remote_addr = out->addr(0);
    add.rkey = out->rkey();
    add.compare_add = 1;
    ASSERT_EQ(Post(a->qp, add), 0);
    ASSERT_TRUE(PollOne(a->scq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << "the result: " << WcStr(wc);
  }
  for (size_t i = 0; i < 16; ++i) EXPECT_EQ(base[i], 0) << "nothing was written, byte " << i;
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  munmap(p, len);
}

// The same between two processes: the peer's pages are made read-only in the peer.
int ReadOnlyTarget(ChildPipe p, QpOpts o) {
  ChildQp c;
  if (int e = c.Connect(p, o, 64)) return e;
  ReadOnlyPages small(c.v.pd, static_cast<size_t>(sysconf(_SC_PAGESIZE)));
  ReadOnlyPages large(c.v.pd, kLargeBytes);
  if (!small.ok() || !large.ok()) return 14;
  if (PostRecvSge(c.q->qp, ibv_sge{small.addr(kSendAt), 64, small.mr->lkey}, 1)) return 15;
  if (!p.Send(Targets{small.addr(0), large.addr(0), small.mr->rkey, large.mr->rkey})) return 16;
  char done;
  if (!p.Recv(&done)) return 17;
  return CheckReadOnlyPages(small, large, c.q->rcq).empty() ? 0 : 18;
}

TEST_F(ReadOnlyRegion, APeerProcessWritesIntoPagesMadeReadOnly) {
  Qp* a = v.NewQp(QpOpts{});
  Buffer* out = Buf(kLargeWrite);
  ReadOnlyPages local(v.pd, static_cast<size_t>(sysconf(_SC_PAGESIZE)));
  ASSERT_TRUE(a && out && local.ok());
  ForkedPeer child;
  ASSERT_TRUE(child.Start([](int up, int down) {
    return ReadOnlyTarget(ChildPipe{up, down}, {});
  }));
  Remote theirs;
  ASSERT_TRUE(child.Recv(&theirs));
  ASSERT_TRUE(child.Send(v.RemoteOf(a)));
  ASSERT_EQ(BringUp(a->qp, QpOpts{}, theirs), 0);
  Targets t;
  ASSERT_TRUE(child.Recv(&t));
  WriteIntoReadOnlyPages(a->qp, a->scq, *out, t, local);
  EXPECT_TRUE(child.Send('x'));
  EXPECT_EQ(child.Wait(), 0) << "the peer's view of its pages was wrong (18) or it failed";
}

// A datagram from another process lands in a receive buffer made read-only, its GRH too: over the
// link UD takes between processes of one host (shared memory), and over UDP (the fresh run below).
// Before, the GRH's copy killed the receiver.
TEST_F(ReadOnlyRegion, ADatagramFromAPeerProcessLandsInPagesMadeReadOnly) {
  constexpr uint32_t kQkey = 0x2222, kLen = 100, kGrh = 40;
  QpOpts o;
  o.type = IBV_QPT_UD;
  o.qkey = kQkey;
  ReadOnlyPages rx(v.pd, static_cast<size_t>(sysconf(_SC_PAGESIZE)));
  ASSERT_TRUE(rx.ok()) << strerror(errno);
  Qp* me = v.NewQp(o);
  ASSERT_NE(me, nullptr);
  ASSERT_EQ(BringUp(me->qp, o, Remote{}), 0);
  ASSERT_EQ(PostRecvSge(me->qp, ibv_sge{rx.addr(0), 1024, rx.mr->lkey}, 1), 0);
  ForkedPeer child;
  ASSERT_TRUE(child.Start([o](int up, int down) {
    ChildPipe p{up, down};
    Verbs cv;
    if (!cv.Open()) return 10;
    Qp* q = cv.NewQp(o);
    Buffer* b = cv.NewBuffer(4096);
    if (!q || !b || BringUp(q->qp, o, Remote{})) return 11;
    Remote parent;
    if (!p.Recv(&parent)) return 12;
    for (size_t i = 0; i < kLen; ++i) b->data()[i] = Pattern(i);
    ibv_ah* ah = cv.AhTo(parent, true);
    if (!ah) return 13;
    SendArgs s;
    s.sges = {b->Sge(0, kLen)};
    s.ah = ah;
    s.remote_qpn = parent.qpn;
    s.remote_qkey = kQkey;
    if (Post(q->qp, s)) return 14;
    ibv_wc wc{};
    int st = PollOne(q->scq, &wc) ? wc.status : -1;
    char c;
    return p.Send(st) && p.Recv(&c) ? 0 : 15;
  }));
  ASSERT_TRUE(child.Send(v.RemoteOf(me)));
  int st = -1;
  ASSERT_TRUE(child.Recv(&st));
  EXPECT_EQ(st, IBV_WC_SUCCESS);
  ibv_wc wc{};
  ASSERT_TRUE(PollOne(me->rcq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
  EXPECT_EQ(wc.byte_len, kLen + kGrh);
  EXPECT_EQ(reinterpret_cast<const ibv_grh*>(rx.base)->next_hdr, 0x1b) << "no GRH";
  for (size_t i = 0; i < kLen; ++i) ASSERT_EQ(rx.base[kGrh + i], Pattern(i)) << "byte " << i;
  EXPECT_TRUE(child.Send('q'));
  EXPECT_EQ(child.Wait(), 0);
}

TEST(ReadOnlyRegionOnTcp, APeerProcessWritesIntoPagesMadeReadOnly) {
  if (kFreshRunsSkipped) GTEST_SKIP() << "see kFreshRunsSkipped";
  EXPECT_EQ(FailedFreshRuns("ReadOnlyRegion.APeerProcessWritesIntoPagesMadeReadOnly", 1,
                            std::chrono::seconds(60), {"SOFTRDMA_LINK=tcp"}),
            0);
}

TEST(ReadOnlyRegionOnUdp, ADatagramFromAPeerProcessLandsInPagesMadeReadOnly) {
  if (kFreshRunsSkipped) GTEST_SKIP() << "see kFreshRunsSkipped";
  EXPECT_EQ(FailedFreshRuns("ReadOnlyRegion.ADatagramFromAPeerProcessLandsInPagesMadeReadOnly", 1,
                            std::chrono::seconds(60), {"SOFTRDMA_UD_LINK=udp"}),
            0);
}

}  // namespace
}  // namespace semantics
