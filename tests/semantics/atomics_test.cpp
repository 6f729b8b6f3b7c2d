// Remote atomics: concurrent FETCH_AND_ADD from several requesters — threads with their own QPs on
// the in-process link and a forked process on the TCP link — loses no update and hands out every
// intermediate value exactly once; CMP_AND_SWP returns the original value and swaps only on a
// match; a misaligned target is an error completion that leaves memory alone.
#include <algorithm>
#include <numeric>

#include "support/semantics_harness.h"

namespace semantics {
namespace {

using Atomics = VerbsTest;

constexpr int kOpsPerRequester = 400;
constexpr int kWindow = 8;  // outstanding atomics per requester (<= max_rd_atomic)

// Issues kOpsPerRequester FETCH_ADD(1) on (raddr, rkey) through `qp`, kWindow at a time, and
// returns the fetched values in `out`. Empty string on success, else what went wrong. No gtest
// here: it runs on helper threads and in a forked child.
std::string FetchAddMany(ibv_qp* qp, ibv_cq* cq, const Buffer& results, uint64_t raddr,
                         uint32_t rkey, std::vector<uint64_t>* out) {
  int posted = 0, done = 0;
  while (done < kOpsPerRequester) {
    while (posted < kOpsPerRequester && posted - done < kWindow) {
      if (int r = PostAtomic(qp, IBV_WR_ATOMIC_FETCH_AND_ADD, results, posted * 8, raddr, rkey, 1,
                             0, posted))
        return "post_send: " + std::string(strerror(r));
      ++posted;
    }
    ibv_wc wc;
    if (!PollOne(cq, &wc)) return "no completion after " + std::to_string(done);
    if (wc.status != IBV_WC_SUCCESS) return "completion: " + WcStr(wc);
    if (wc.opcode != IBV_WC_FETCH_ADD) return "opcode: " + WcStr(wc);
    if (wc.wr_id != uint64_t(done)) return "out of order: " + WcStr(wc);
    ++done;
  }
  out->assign(results.storage.get(), results.storage.get() + kOpsPerRequester);
  return "";
}

struct AtomicTarget {
  Remote remote;
  uint64_t addr;
  uint32_t rkey;
};

TEST_F(Atomics, ConcurrentFetchAddFromThreadsAndAProcessLosesNoUpdate) {
  constexpr int kThreads = 3;
  Buffer* counter = Buf(8);
  counter->u64(0) = 0;

  // The forked requester: connects by LID (slot registry), waits for 'G', reports its values.
  QpOpts co;
  co.max_rd_atomic = co.max_dest_rd_atomic = kWindow;
  ForkedPeer child;
  ASSERT_TRUE(child.Start([co](int up, int down) {
    ChildPipe p{up, down};
    Verbs cv;
    if (!cv.Open()) return 10;
    Qp* q = cv.NewQp(co);
    Buffer* results = cv.NewBuffer(kOpsPerRequester * 8);
    if (!q || !results) return 11;
    AtomicTarget t;
    if (!p.Send(cv.RemoteOf(q)) || !p.Recv(&t)) return 12;
    if (BringUp(q->qp, co, t.remote)) return 13;
    char go;
    if (!p.Send('R') || !p.Recv(&go)) return 14;
    std::vector<uint64_t> got;
    std::string err = FetchAddMany(q->qp, q->scq, *results, t.addr, t.rkey, &got);
    if (!err.empty()) {
      fprintf(stderr, "child: %s\n", err.c_str());
      return 15;
    }
    if (!WriteAll(up, got.data(), got.size() * 8)) return 16;
    p.Recv(&go);
    return 0;
  }));
  Remote child_qp;
  ASSERT_TRUE(child.Recv(&child_qp));
  Qp* server_for_child = v.NewQp(co);
  ASSERT_NE(server_for_child, nullptr);
  ASSERT_TRUE(
      child.Send(AtomicTarget{v.RemoteOf(server_for_child), counter->addr(), counter->rkey()}));
  ASSERT_EQ(BringUp(server_for_child->qp, co, child_qp), 0);
  char c;
  ASSERT_TRUE(child.Recv(&c));

  // In-process requesters, each with its own QP pair and CQ.
  struct Requester {
    Qp* client;
    Buffer* results;
    std::vector<uint64_t> got;
    std::string err;
  };
  std::vector<Requester> reqs(kThreads);
  for (auto& r : reqs) {
    Qp* server;
    ASSERT_NO_FATAL_FAILURE(Pair(co, &r.client, &server));
    r.results = Buf(kOpsPerRequester * 8);
  }
  ASSERT_TRUE(child.Send('G'));
  std::vector<std::thread> threads;
  for (auto& r : reqs) {
    threads.emplace_back([&r, counter] {
      r.err = FetchAddMany(r.client->qp, r.client->scq, *r.results, counter->addr(),
                           counter->rkey(), &r.got);
    });
  }
  for (auto& t : threads) t.join();
  std::vector<uint64_t> all;
  for (auto& r : reqs) {
    EXPECT_EQ(r.err, "");
    all.insert(all.end(), r.got.begin(), r.got.end());
  }
  std::vector<uint64_t> from_child(kOpsPerRequester);
  ASSERT_TRUE(child.Recv(from_child.data(), from_child.size() * 8))
      << "the forked requester did not finish";
  all.insert(all.end(), from_child.begin(), from_child.end());
  child.Send('q');
  EXPECT_EQ(child.Wait(), 0);

  const uint64_t total = uint64_t{kThreads + 1} * kOpsPerRequester;
  EXPECT_EQ(counter->u64(0), total) << "updates were lost";
  // Every value 0..total-1 was fetched by exactly one FETCH_ADD.
  ASSERT_EQ(all.size(), total);
  std::sort(all.begin(), all.end());
  std::vector<uint64_t> expect(total);
  std::iota(expect.begin(), expect.end(), 0);
  EXPECT_TRUE(all == expect) << "fetched values are not a permutation of 0.." << total - 1;
}

TEST_F(Atomics, CompareAndSwapReturnsTheOriginalAndSwapsOnlyOnMatch) {
  Qp *a, *b;
  Pair(QpOpts{}, &a, &b);
  Buffer* target = Buf(64);
  Buffer* result = Buf(64);
  target->u64(1) = 5;
  const uint64_t raddr = target->addr(8);
  struct Step {
    ibv_wr_opcode op;
    uint64_t compare_add, swap;
    uint64_t expect_fetched, expect_after;
  };
  const Step steps[] = {
      {IBV_WR_ATOMIC_CMP_AND_SWP, 5, 9, 5, 9},               // match: swapped
      {IBV_WR_ATOMIC_CMP_AND_SWP, 5, 11, 9, 9},              // no match: unchanged
      {IBV_WR_ATOMIC_CMP_AND_SWP, 9, ~0ull, 9, ~0ull},       // all 64 bits compared/set
      {IBV_WR_ATOMIC_FETCH_AND_ADD, 2, 0, ~0ull, 1},         // wraps modulo 2^64
      {IBV_WR_ATOMIC_CMP_AND_SWP, 0x100000001ull, 7, 1, 1},  // high half differs
      {IBV_WR_ATOMIC_FETCH_AND_ADD, 0x100000000ull, 0, 1, 0x100000001ull},
  };
  uint64_t id = 0;
  for (const Step& s : steps) {
    SCOPED_TRACE("step " + std::to_string(id));
    result->u64(0) = 0xcccccccccccccccc;
    ASSERT_EQ(PostAtomic(a->qp, s.op, *result, 0, raddr, target->rkey(), s.compare_add, s.swap, id),
              0);
    ibv_wc wc;
    ASSERT_TRUE(PollOne(a->scq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
    EXPECT_EQ(wc.wr_id, id);
    EXPECT_EQ(wc.opcode, s.op == IBV_WR_ATOMIC_CMP_AND_SWP ? IBV_WC_COMP_SWAP : IBV_WC_FETCH_ADD);
    EXPECT_EQ(wc.byte_len, 8u);
    EXPECT_EQ(result->u64(0), s.expect_fetched);
    EXPECT_EQ(target->u64(1), s.expect_after);
    ++id;
  }
  EXPECT_EQ(target->u64(0), 0u) << "neighbouring words touched";
  EXPECT_EQ(target->u64(2), 0u) << "neighbouring words touched";
}

TEST_F(Atomics, MisalignedTargetIsAnErrorCompletionAndTouchesNothing) {
  for (ibv_wr_opcode op : {IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WR_ATOMIC_CMP_AND_SWP}) {
    SCOPED_TRACE(op == IBV_WR_ATOMIC_FETCH_AND_ADD ? "FETCH_ADD" : "CMP_AND_SWP");
    Qp *a, *b;
    Pair(QpOpts{}, &a, &b);
    Buffer* target = Buf(64);
    Buffer* result = Buf(64);
    target->u64(0) = 0x1111111111111111;
    target->u64(1) = 0x1111111111111111;
    result->u64(0) = 0x2222222222222222;
    ASSERT_EQ(PostAtomic(a->qp, op, *result, 0, target->addr(4), target->rkey(), 0x1111111111111111,
                         3, 42),
              0);
    ibv_wc wc;
    ASSERT_TRUE(PollOne(a->scq, &wc));
    EXPECT_EQ(wc.wr_id, 42u);
    // IBTA C9-... / rxe: a misaligned atomic is an invalid request (NAK, class C error).
    EXPECT_EQ(wc.status, IBV_WC_REM_INV_REQ_ERR) << WcStr(wc);
    EXPECT_EQ(target->u64(0), 0x1111111111111111u);
    EXPECT_EQ(target->u64(1), 0x1111111111111111u);
    EXPECT_EQ(result->u64(0), 0x2222222222222222u);
    EXPECT_EQ(StateOf(a->qp), IBV_QPS_ERR);
  }
}

}  // namespace
}  // namespace semantics
