// Registered pages the application unmaps (munmap), or whose file it truncates, before it
// deregisters them. An HCA's DMA goes to the pages the registration pinned, not through the
// process's page tables: what a peer writes lands there, unseen. Pages we moved onto the shared
// arena at registration are still ours, and placements go there; private pages and the file's are
// gone, and the access fails as a page fault of an on-demand region fails on an HCA
// (REM_ACCESS_ERR for a WRITE, LOC_PROT_ERR at the receiver of a SEND and for a READ's or an
// atomic's local buffer). Before, the placement's SIGSEGV (SEGV_MAPERR) or SIGBUS killed the
// process whose pages they were. A READ of pages gone is refused (REM_ACCESS_ERR) by a responder
// that lives on; before, the response's copy killed it.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <ostream>
#include <string>

#include "support/fresh_process.h"
#include "support/semantics_harness.h"

namespace semantics {
namespace {

// Private pages (one page stays so at registration) and arena pages (these are moved): an odd
// size, which no allocator maps as one piece.
const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));
const size_t kArenaBytes = 67 * kPage;

// Registered pages between two inaccessible pages that stay mapped: once unmapped they leave a
// hole of their exact size, where nothing the process maps later is likely to land. Anything that
// did would take the placements meant for the pages gone (an HCA writes the pages it pinned).
struct UnmappedPages {
  UnmappedPages() = default;
  UnmappedPages(ibv_pd* pd, size_t len) : len(len) {
    void* r = mmap(nullptr, len + 2 * kPage, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r == MAP_FAILED) return;
    reserved = static_cast<uint8_t*>(r);
    void* p = mmap(reserved + kPage, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (p == MAP_FAILED) return;
    base = static_cast<uint8_t*>(p);
    mr = ibv_reg_mr(pd, base, len, kAllAccess);
  }
  ~UnmappedPages() {
    if (mr) ibv_dereg_mr(mr);
    if (!reserved) return;
    munmap(reserved, kPage);  // the guard pages
    munmap(reserved + kPage + len, kPage);
    // The pages between only while they are ours: once unmapped, the hole may hold another's
    // mapping (ThreadSanitizer's runtime put a thread's signal state there, and unmapping the whole
    // reservation killed that thread at its next blocking call).
    if (!unmapped) munmap(reserved + kPage, len);
  }
  // Last before the accesses.
  bool Unmap() {
    unmapped = munmap(base, len) == 0;
    return unmapped;
  }
  uint64_t addr(size_t off) const { return reinterpret_cast<uintptr_t>(base) + off; }
  size_t len = 0;
  uint8_t* reserved = nullptr;
  uint8_t* base = nullptr;
  ibv_mr* mr = nullptr;
  bool unmapped = false;
};

// A READ (`add` 0) or a FETCH_AND_ADD of `add` whose result lands in `local`'s pages at `off`.
SendArgs ResultInto(const UnmappedPages& local, size_t off, uint64_t remote_addr, uint32_t rkey,
                    uint64_t wr_id, uint64_t add = 0) {
  SendArgs s;
  s.opcode = add ? IBV_WR_ATOMIC_FETCH_AND_ADD : IBV_WR_RDMA_READ;
  s.wr_id = wr_id;
  s.sges = {ibv_sge{local.addr(off), add ? 8u : 64u, local.mr->lkey}};
  s.remote_addr = remote_addr;
  s.rkey = rkey;
  s.compare_add = add;
  return s;
}

// The completion status of each access (-1: none came): the requester's for the WRITE, the SEND,
// the READs and the atomic, the responder's for the SEND's receive (`recv`). `read` lands in the
// pages, `remote_read` reads them.
struct Outcome {
  int write = -1, send = -1, recv = -1, read = -1, atomic_result = -1, remote_read = -1;
  bool operator==(const Outcome&) const = default;
};
std::ostream& operator<<(std::ostream& os, const Outcome& o) {
  return os << "WRITE " << o.write << ", SEND " << o.send << " (receive " << o.recv << "), READ "
            << o.read << ", atomic result " << o.atomic_result << ", READ of them "
            << o.remote_read;
}
constexpr Outcome kRefused{IBV_WC_REM_ACCESS_ERR, IBV_WC_REM_OP_ERR,   IBV_WC_LOC_PROT_ERR,
                           IBV_WC_LOC_PROT_ERR,   IBV_WC_LOC_PROT_ERR, IBV_WC_REM_ACCESS_ERR};
constexpr Outcome kTaken{IBV_WC_SUCCESS, IBV_WC_SUCCESS, IBV_WC_SUCCESS,
                         IBV_WC_SUCCESS, IBV_WC_SUCCESS, IBV_WC_SUCCESS};

// What a peer process's pages are, for the tests with one.
struct PeerTargets {
  uint64_t arena = 0, private_page = 0;
  uint32_t arena_rkey = 0, private_rkey = 0;
};

// A peer process's pages of both kinds.
struct PeerPages {
  explicit PeerPages(ibv_pd* pd) : arena(pd, kArenaBytes), private_page(pd, kPage) {}
  bool ok() const { return arena.mr && private_page.mr; }
  PeerTargets Targets() const {
    return {arena.addr(0), private_page.addr(0), arena.mr->rkey, private_page.mr->rkey};
  }
  UnmappedPages arena, private_page;
};

class UnmappedRegion : public VerbsTest {
 protected:
  // Starts `peer` in a child process, connects `a` to its QP and takes the targets it sends.
  bool StartPeer(ForkedPeer& child, int (*peer)(ChildPipe), Qp* a, PeerTargets* t) {
    Remote theirs;
    return child.Start([peer](int up, int down) {
      return peer(ChildPipe{up, down});
    }) && child.Recv(&theirs) &&
           child.Send(v.RemoteOf(a)) && BringUp(a->qp, QpOpts{}, theirs) == 0 && child.Recv(t);
  }
  // `gone()` takes the pages away, then a WRITE and a SEND go into `target`'s pages, a READ and an
  // atomic whose results land in `local`'s, and a READ of `target`'s, each on a pair of its own (a
  // failed access takes its QPs to error). The pairs are made before: creating them may map memory.
  // `out_` is a mapped buffer of the requester's (sources, the READ's and the atomic's target).
  Outcome AccessAfter(const std::function<bool()>& gone, const UnmappedPages& target,
                      const UnmappedPages& local) {
    out_ = Buf(4096);
    if (!out_) return {};
    out_->Fill(0x5a);
    std::pair<Qp*, Qp*> pairs[5];
    for (auto& [a, b] : pairs) Pair(QpOpts{}, &a, &b);
    if (!gone()) return {};
    Outcome o;
    ibv_wc wc{};
    if (auto [a, b] = pairs[0];
        PostRdma(a->qp, IBV_WR_RDMA_WRITE, *out_, 0, 64, target.addr(8), target.mr->rkey, 1) == 0 &&
        PollOne(a->scq, &wc))
      o.write = wc.status;
    if (auto [a, b] = pairs[1];
        PostRecvSge(b->qp, ibv_sge{target.addr(1024), 64, target.mr->lkey}, 2) == 0 &&
        PostSendMsg(a->qp, *out_, 0, 32, 3) == 0 && PollOne(a->scq, &wc)) {
      o.send = wc.status;
      if (PollOne(b->rcq, &wc)) o.recv = wc.status;
    }
    const SendArgs read = ResultInto(local, 0, out_->addr(0), out_->rkey(), 4);
    if (Qp* a = pairs[2].first; Post(a->qp, read) == 0 && PollOne(a->scq, &wc)) o.read = wc.status;
    const SendArgs add = ResultInto(local, 512, out_->addr(128), out_->rkey(), 5, 1);
    if (Qp* a = pairs[3].first; Post(a->qp, add) == 0 && PollOne(a->scq, &wc))
      o.atomic_result = wc.status;
    if (auto [a, b] = pairs[4];
        PostRdma(a->qp, IBV_WR_RDMA_READ, *out_, 0, 64, target.addr(8), target.mr->rkey, 6) == 0 &&
        PollOne(a->scq, &wc))
      o.remote_read = wc.status;
    return o;
  }
  Buffer* out_ = nullptr;
};

TEST_F(UnmappedRegion, PrivatePagesFailTheAccessAndTheProcessLivesOn) {
  UnmappedPages target(v.pd, kPage);
  UnmappedPages local(v.pd, kPage);
  ASSERT_TRUE(target.mr && local.mr) << strerror(errno);
  EXPECT_EQ(AccessAfter([&] { return target.Unmap() && local.Unmap(); }, target, local), kRefused);
  uint64_t word;
  std::memcpy(&word, out_->data() + 128, 8);
  EXPECT_EQ(word, 0x5a5a5a5a5a5a5a5bu) << "the atomic is done (only its result was refused)";
}

// Pages of a file the application truncated after it registered them: accesses fault with
// SIGBUS, and past the end of the file nothing writes them. The access fails as for private pages
// unmapped. Before, the placement's SIGBUS killed the process.
TEST_F(UnmappedRegion, PagesOfATruncatedFileFailTheAccessAndTheProcessLivesOn) {
  const size_t len = 2 * kPage;
  const int fd = memfd_create("unmapped-region-test", MFD_CLOEXEC);
  ASSERT_GE(fd, 0) << strerror(errno);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(len)), 0);
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(p, MAP_FAILED);
  UnmappedPages file;  // the file's pages, registered where the application mapped them
  file.len = len;
  file.base = static_cast<uint8_t*>(p);
  file.mr = ibv_reg_mr(v.pd, p, len, kAllAccess);
  ASSERT_NE(file.mr, nullptr) << strerror(errno);
  EXPECT_EQ(AccessAfter([&] { return ftruncate(fd, 0) == 0; }, file, file), kRefused);
  close(fd);
  munmap(p, len);
}

// Writes into arena pages land. A READ of them is answered here from the application's addresses,
// which are gone: refused as an on-demand region's page fault (a same-host peer's direct READ,
// which reads the arena, is served: APeerProcessReadsPagesItsOwnerUnmapped).
TEST_F(UnmappedRegion, ArenaPagesTakeTheAccessAsAnHcaWouldTheirPinnedPages) {
  UnmappedPages target(v.pd, kArenaBytes);
  UnmappedPages local(v.pd, kArenaBytes);
  ASSERT_TRUE(target.mr && local.mr) << strerror(errno);
  Outcome taken = kTaken;
  taken.remote_read = IBV_WC_REM_ACCESS_ERR;
  EXPECT_EQ(AccessAfter([&] { return target.Unmap() && local.Unmap(); }, target, local), taken);
}

// Pages the application made inaccessible (PROT_NONE) after registering them: a READ of them is
// refused as above. Before, in one process the refusal blamed the requester's buffer
// (LOC_PROT_ERR); from a peer process the READ killed its responder, as for pages unmapped.
TEST_F(UnmappedRegion, AReadOfPagesMadeInaccessibleIsRefused) {
  UnmappedPages target(v.pd, kPage);
  ASSERT_TRUE(target.mr) << strerror(errno);
  Buffer* in = Buf(4096);
  ASSERT_NE(in, nullptr);
  Qp *a, *b;
  Pair(QpOpts{}, &a, &b);
  ASSERT_EQ(mprotect(target.base, kPage, PROT_NONE), 0);
  ASSERT_EQ(PostRdma(a->qp, IBV_WR_RDMA_READ, *in, 0, 64, target.addr(8), target.mr->rkey, 1), 0);
  ibv_wc wc{};
  ASSERT_TRUE(PollOne(a->scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << WcStr(wc);
}

// The same between two processes, the unmapped pages the peer's: SENDs into its arena pages (the
// peer copies a small message out of its slot, a larger one out of its staging buffer), a WRITE
// into its arena pages and, last, one into its private pages. Over the shared-memory link, and
// over TCP (the fresh run below).
constexpr uint32_t kSendSizes[] = {32, 1500};

int UnmappedTarget(ChildPipe p) {
  ChildQp c;
  if (int e = c.Connect(p, QpOpts{}, 64)) return e;
  PeerPages pages(c.v.pd);
  if (!pages.ok()) return 14;
  UnmappedPages &arena = pages.arena, &private_page = pages.private_page;
  // A first message into a mapped buffer opens the connection (TCP) before the unmapping: what
  // that maps is not mapped later, into the holes.
  if (PostRecv(c.q->qp, *c.b, 0, 64, 0)) return 15;
  for (uint64_t i = 1; i <= 2; ++i)
    if (PostRecvSge(c.q->qp, ibv_sge{arena.addr(4096 * i), 2048, arena.mr->lkey}, i)) return 15;
  if (!p.Send(pages.Targets())) return 16;
  ibv_wc wc{};
  if (!PollOne(c.q->rcq, &wc) || wc.status != IBV_WC_SUCCESS) return 17;
  if (!arena.Unmap() || !private_page.Unmap() || !p.Send('u')) return 18;
  int received[2] = {-1, -1};
  for (int& r : received)
    if (PollOne(c.q->rcq, &wc)) r = static_cast<int>(wc.status);
  char done;
  return p.Send(received) && p.Recv(&done) ? 0 : 19;
}

TEST_F(UnmappedRegion, APeerProcessTakesAccessesToPagesItUnmapped) {
  Qp* a = v.NewQp(QpOpts{});
  Buffer* out = Buf(4096);
  ASSERT_TRUE(a && out);
  out->Fill(0x5a);
  ForkedPeer child;
  PeerTargets t;
  ASSERT_TRUE(StartPeer(child, UnmappedTarget, a, &t));
  ibv_wc wc{};
  ASSERT_EQ(PostSendMsg(a->qp, *out, 0, 8, 1), 0);
  ASSERT_TRUE(PollOne(a->scq, &wc));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << "the first SEND: " << WcStr(wc);
  char unmapped;
  ASSERT_TRUE(child.Recv(&unmapped));
  for (uint32_t len : kSendSizes) {
    ASSERT_EQ(PostSendMsg(a->qp, *out, 0, len, len), 0);
    ASSERT_TRUE(PollOne(a->scq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << "SEND of " << len << " bytes: " << WcStr(wc);
  }
  int received[2];
  ASSERT_TRUE(child.Recv(&received));
  EXPECT_EQ(received[0], IBV_WC_SUCCESS) << "the receive of the SEND in its slot";
  EXPECT_EQ(received[1], IBV_WC_SUCCESS) << "the receive of the staged SEND";
  ASSERT_EQ(PostRdma(a->qp, IBV_WR_RDMA_WRITE, *out, 0, 64, t.arena + 64, t.arena_rkey, 3), 0);
  ASSERT_TRUE(PollOne(a->scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << "WRITE into arena pages: " << WcStr(wc);
  ASSERT_EQ(PostRdma(a->qp, IBV_WR_RDMA_WRITE, *out, 0, 64, t.private_page + 64, t.private_rkey, 4),
            0);
  ASSERT_TRUE(PollOne(a->scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << "WRITE into private pages: " << WcStr(wc);
  EXPECT_TRUE(child.Send('x'));
  EXPECT_EQ(child.Wait(), 0) << "the peer failed or died";
}

// A same-host peer's atomic executes directly in its window, and its result lands in the
// requester's local buffer, here private pages unmapped: refused, the request completes with
// LOC_PROT_ERR (the atomic done, as an HCA whose write of the result faults). Until now only the
// result that comes in an ACK (frames) had a test of its refusal.
int AtomicTarget(ChildPipe p) {
  ChildQp c;
  if (int e = c.Connect(p, QpOpts{}, 64)) return e;
  UnmappedPages arena(c.v.pd, kArenaBytes);
  if (!arena.mr) return 14;
  std::memset(arena.base, 0, 64);
  if (!p.Send(PeerTargets{arena.addr(0), 0, arena.mr->rkey, 0})) return 15;
  char done;
  if (!p.Recv(&done)) return 16;
  uint64_t word;
  std::memcpy(&word, arena.base + 8, 8);
  return word == 7 ? 0 : 17;
}

TEST_F(UnmappedRegion, ADirectAtomicsResultInPagesUnmappedFailsTheRequest) {
  Qp* a = v.NewQp(QpOpts{});
  UnmappedPages local(v.pd, kPage);
  ASSERT_TRUE(a && local.mr);
  ForkedPeer child;
  PeerTargets t;
  ASSERT_TRUE(StartPeer(child, AtomicTarget, a, &t));
  ASSERT_TRUE(local.Unmap());
  ASSERT_EQ(Post(a->qp, ResultInto(local, 0, t.arena + 8, t.arena_rkey, 1, 7)), 0);
  ibv_wc wc{};
  ASSERT_TRUE(PollOne(a->scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << WcStr(wc);
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  ASSERT_EQ(ibv_query_qp(a->qp, &attr, IBV_QP_STATE, &init), 0);
  EXPECT_EQ(attr.qp_state, IBV_QPS_ERR);
  EXPECT_TRUE(child.Send('x'));
  EXPECT_EQ(child.Wait(), 0) << "17: the atomic was not done in the peer's word";
}

// A peer process READs pages their owner unmapped: the owner's responder answers REM_ACCESS_ERR
// (an on-demand region's page fault) instead of dying in the response's copy. Over shared memory
// a READ of arena pages is the peer's own (direct) and is served first. Over TCP (the fresh run
// below) only the refusal: the arena's READ would be answered by the owner, refused, and take the
// QP to error first.
int ReadTarget(ChildPipe p) {
  ChildQp c;
  if (int e = c.Connect(p, QpOpts{}, 64)) return e;
  PeerPages pages(c.v.pd);
  if (!pages.ok()) return 14;
  UnmappedPages &arena = pages.arena, &private_page = pages.private_page;
  std::memset(arena.base, 0x33, 64);
  // The arena's pages stay mapped: the connection a TCP peer opens now could take their place.
  if (!private_page.Unmap()) return 15;
  if (!p.Send(pages.Targets())) return 16;
  char done;
  return p.Recv(&done) ? 0 : 17;
}

TEST_F(UnmappedRegion, APeerProcessReadsPagesItsOwnerUnmapped) {
  Qp* a = v.NewQp(QpOpts{});
  Buffer* in = Buf(4096);
  ASSERT_TRUE(a && in);
  ForkedPeer child;
  PeerTargets t;
  ASSERT_TRUE(StartPeer(child, ReadTarget, a, &t));
  ibv_wc wc{};
  const char* link = getenv("SOFTRDMA_LINK");
  if (!link || std::string(link) != "tcp") {
    ASSERT_EQ(PostRdma(a->qp, IBV_WR_RDMA_READ, *in, 0, 64, t.arena, t.arena_rkey, 1), 0);
    ASSERT_TRUE(PollOne(a->scq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << "READ of mapped arena pages: " << WcStr(wc);
    EXPECT_EQ(in->data()[0], 0x33);
  }
  ASSERT_EQ(PostRdma(a->qp, IBV_WR_RDMA_READ, *in, 0, 64, t.private_page + 8, t.private_rkey, 2),
            0);
  ASSERT_TRUE(PollOne(a->scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << "READ of private pages: " << WcStr(wc);
  EXPECT_TRUE(child.Send('x'));
  EXPECT_EQ(child.Wait(), 0) << "the peer failed or died";
}

TEST(UnmappedRegionOnTcp, APeerProcessReadsPagesItsOwnerUnmapped) {
  if (kFreshRunsSkipped) GTEST_SKIP() << "see kFreshRunsSkipped";
  EXPECT_EQ(FailedFreshRuns("UnmappedRegion.APeerProcessReadsPagesItsOwnerUnmapped", 1,
                            std::chrono::seconds(60), {"SOFTRDMA_LINK=tcp"}),
            0);
}

TEST(UnmappedRegionOnTcp, APeerProcessTakesAccessesToPagesItUnmapped) {
  if (kFreshRunsSkipped) GTEST_SKIP() << "see kFreshRunsSkipped";
  EXPECT_EQ(FailedFreshRuns("UnmappedRegion.APeerProcessTakesAccessesToPagesItUnmapped", 1,
                            std::chrono::seconds(60), {"SOFTRDMA_LINK=tcp"}),
            0);
}

// A source the application took away after registering it: made inaccessible (PROT_NONE) or
// unmapped. The request fails as the sender's (LOC_PROT_ERR, as a page fault of an on-demand
// region on the requester's side), nothing reaches the peer, and the process lives on. Before, the
// copy's SIGSEGV killed a same-host peer's requester, TCP took the failed send for a dead
// connection (RETRY_EXC_ERR), and in one process the responder's refusal blamed the responder
// (REM_ACCESS_ERR, REM_OP_ERR).
enum class Gone { kInaccessible, kUnmapped };
bool TakeAway(UnmappedPages& p, Gone how) {
  return how == Gone::kUnmapped ? p.Unmap() : mprotect(p.base, p.len, PROT_NONE) == 0;
}
std::string Trace(const char* request, Gone how) {
  return std::string(request) + (how == Gone::kUnmapped ? ", unmapped" : ", PROT_NONE");
}

// The requests from a source gone: a WRITE of one piece (small, and large enough to be copied
// differently), of two pieces (the gone one first) and a SEND, larger than a receive slot holds
// and within it.
struct FromGone {
  const char* name;
  ibv_wr_opcode opcode;
  uint32_t len;
  bool two_pieces;
};
constexpr FromGone kFromGone[] = {{"WRITE", IBV_WR_RDMA_WRITE, 64, false},
                                  {"WRITE of a page", IBV_WR_RDMA_WRITE, 4096, false},
                                  {"WRITE of two pieces", IBV_WR_RDMA_WRITE, 64, true},
                                  {"SEND", IBV_WR_SEND, 64, false},
                                  {"SEND within a slot", IBV_WR_SEND, 16, false}};

// Where the target's bytes go: the request from the source gone WRITEs at 0 and SENDs into a
// receive at kGoneRecv; the same request made first, while the source is there, lands at
// kFirstLands and in a receive there. That first request settles the QP's path, the local key in
// its cache and the peer's receive queue, so that the second takes the paths a running
// application's would (a QP's first request goes by frames).
constexpr size_t kGoneRecv = 4096, kFirstLands = 8192, kTargetBytes = 12288;

SendArgs RequestFrom(const FromGone& r, const UnmappedPages& gone, const Buffer& mapped,
                     uint64_t remote_addr, uint32_t rkey, uint64_t wr_id) {
  SendArgs s;
  s.opcode = r.opcode;
  s.wr_id = wr_id;
  s.sges = {ibv_sge{gone.addr(0), r.len, gone.mr->lkey}};
  if (r.two_pieces) s.sges.push_back(mapped.Sge(0, r.len));
  s.remote_addr = remote_addr;
  s.rkey = rkey;
  return s;
}

// Whether nothing landed in the target's bytes before kFirstLands.
bool NothingLanded(const uint8_t* target) {
  return std::count(target, target + kFirstLands, 0) == kFirstLands;
}

// The first request (wr_id 1) and, once `gone` is taken away `how`, the second (wr_id 2) into
// `remote` (the target's base) with `rkey`; the second's completion status.
int FirstAndGone(Qp* a, const FromGone& r, UnmappedPages& gone, const Buffer& mapped, Gone how,
                 uint64_t remote, uint32_t rkey) {
  ibv_wc wc{};
  if (Post(a->qp, RequestFrom(r, gone, mapped, remote + kFirstLands, rkey, 1)) ||
      !PollOne(a->scq, &wc) || wc.status != IBV_WC_SUCCESS || !TakeAway(gone, how) ||
      Post(a->qp, RequestFrom(r, gone, mapped, remote, rkey, 2)) || !PollOne(a->scq, &wc))
    return -1;
  return wc.status;
}

TEST_F(UnmappedRegion, ARequestFromASourceGoneIsTheSendersError) {
  for (Gone how : {Gone::kInaccessible, Gone::kUnmapped}) {
    for (const FromGone& r : kFromGone) {
      SCOPED_TRACE(Trace(r.name, how));
      UnmappedPages gone(v.pd, kPage);
      Buffer* mapped = Buf(4096);
      Buffer* target = Buf(kTargetBytes);
      ASSERT_TRUE(gone.mr && mapped && target) << strerror(errno);
      target->Fill(0);
      Qp *a, *b;
      Pair(QpOpts{}, &a, &b);
      ASSERT_EQ(PostRecv(b->qp, *target, kFirstLands, 1024, 1), 0);
      ASSERT_EQ(PostRecv(b->qp, *target, kGoneRecv, 1024, 2), 0);
      EXPECT_EQ(FirstAndGone(a, r, gone, *mapped, how, target->addr(0), target->rkey()),
                IBV_WC_LOC_PROT_ERR);
      EXPECT_TRUE(NothingLanded(target->data()));
      ibv_wc wc{};
      if (r.opcode == IBV_WR_SEND) {
        ASSERT_TRUE(PollOne(b->rcq, &wc)) << "the first SEND's receive";
      }
      if (ibv_poll_cq(b->rcq, 1, &wc) == 1) {
        EXPECT_NE(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
      }
    }
  }
}

// The same towards a peer process: over the shared-memory link the direct paths (one piece, the
// general one, a SEND), into arena pages (a private page is not the peer's to write directly);
// over TCP (the fresh run below) the frames. The peer checks that nothing landed in its pages and
// that only the first SEND's receive completed.
int NothingLandsTarget(ChildPipe p) {
  ChildQp c;
  if (int e = c.Connect(p, QpOpts{}, 64)) return e;
  UnmappedPages target(c.v.pd, kArenaBytes);
  if (!target.mr) return 14;
  const uint32_t key = target.mr->lkey;
  if (PostRecvSge(c.q->qp, ibv_sge{target.addr(kFirstLands), 1024, key}, 1) ||
      PostRecvSge(c.q->qp, ibv_sge{target.addr(kGoneRecv), 1024, key}, 2))
    return 15;
  if (!p.Send(PeerTargets{target.addr(0), 0, target.mr->rkey, 0})) return 16;
  char sends;
  if (!p.Recv(&sends)) return 17;
  ibv_wc wc{};
  if (sends == 's' && (!PollOne(c.q->rcq, &wc) || wc.wr_id != 1)) return 18;
  if (ibv_poll_cq(c.q->rcq, 1, &wc) == 1 && wc.status == IBV_WC_SUCCESS) return 20;
  return NothingLanded(target.base) ? 0 : 21;
}

TEST_F(UnmappedRegion, APeerProcessGetsNothingFromASourceGone) {
  for (Gone how : {Gone::kInaccessible, Gone::kUnmapped}) {
    for (const FromGone& r : kFromGone) {
      SCOPED_TRACE(Trace(r.name, how));
      Qp* a = v.NewQp(QpOpts{});
      UnmappedPages gone(v.pd, kPage);
      Buffer* mapped = Buf(4096);
      ASSERT_TRUE(a && gone.mr && mapped) << strerror(errno);
      ForkedPeer child;
      PeerTargets t;
      ASSERT_TRUE(StartPeer(child, NothingLandsTarget, a, &t));
      EXPECT_EQ(FirstAndGone(a, r, gone, *mapped, how, t.arena, t.arena_rkey), IBV_WC_LOC_PROT_ERR);
      EXPECT_TRUE(child.Send(r.opcode == IBV_WR_SEND ? 's' : 'w'));
      EXPECT_EQ(child.Wait(), 0) << "18: no first receive, 20: the second completed, 21: bytes "
                                    "landed";
    }
  }
}

TEST(UnmappedRegionOnTcp, APeerProcessGetsNothingFromASourceGone) {
  if (kFreshRunsSkipped) GTEST_SKIP() << "see kFreshRunsSkipped";
  EXPECT_EQ(FailedFreshRuns("UnmappedRegion.APeerProcessGetsNothingFromASourceGone", 1,
                            std::chrono::seconds(60), {"SOFTRDMA_LINK=tcp"}),
            0);
}

}  // namespace
}  // namespace semantics
