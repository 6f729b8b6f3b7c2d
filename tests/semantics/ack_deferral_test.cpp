// RC ACK deferral (requester.cpp / responder.cpp): in ping-pong traffic an ACK waits for the
// answer and rides with it. These tests hold the liveness and delivery rules around it: traffic
// that stops answering still completes, data and completions stay in order, and a QP destroyed
// while it owes a deferred ACK still acknowledges what it received.
#include <gtest/gtest.h>

#include <cstring>

#include "support/semantics_harness.h"

namespace {

using namespace semantics;

class AckDeferral : public VerbsTest {
 protected:
  // One round: a sends to b, b answers. Both sides' receives are posted beforehand.
  void Round(Qp* a, Qp* b, Buffer* abuf, Buffer* bbuf, int i) {
    ASSERT_EQ(PostRecv(a->qp, *abuf, 64, 64, 1000 + i), 0);
    ASSERT_EQ(PostRecv(b->qp, *bbuf, 64, 64, 2000 + i), 0);
    abuf->data()[0] = static_cast<uint8_t>(i);
    ASSERT_EQ(PostSendMsg(a->qp, *abuf, 0, 16, 3000 + i), 0);
    ibv_wc wc;
    ASSERT_TRUE(PollOne(b->rcq, &wc)) << "round " << i << ": b saw nothing";
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
    ASSERT_EQ(bbuf->data()[64], static_cast<uint8_t>(i));
    bbuf->data()[0] = static_cast<uint8_t>(i + 1);
    ASSERT_EQ(PostSendMsg(b->qp, *bbuf, 0, 16, 4000 + i), 0);
    ASSERT_TRUE(PollOne(a->rcq, &wc)) << "round " << i << ": a saw no answer";
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
    ASSERT_EQ(abuf->data()[64], static_cast<uint8_t>(i + 1));
    auto sa = PollN(a->scq, 1);
    auto sb = PollN(b->scq, 1);
    ASSERT_EQ(sa.size(), 1u);
    ASSERT_EQ(sb.size(), 1u);
    ASSERT_EQ(sa[0].status, IBV_WC_SUCCESS);
    ASSERT_EQ(sb[0].status, IBV_WC_SUCCESS);
  }
};

QpOpts Signaled() {
  QpOpts o;
  o.sq_sig_all = true;
  return o;
}

TEST_F(AckDeferral, PingPongThenOneWayTrafficStillCompletesInOrder) {
  Qp *a, *b;
  Pair(Signaled(), &a, &b);
  Buffer* abuf = Buf(4096);
  Buffer* bbuf = Buf(64 * 128);
  for (int i = 0; i < 50; ++i) ASSERT_NO_FATAL_FAILURE(Round(a, b, abuf, bbuf, i));
  // Now b stops answering: each of a's sends must still complete (its ACK may no longer wait for
  // an answer that never comes), in order, with the data in place.
  for (int i = 0; i < 64; ++i) ASSERT_EQ(PostRecv(b->qp, *bbuf, size_t(i) * 64, 64, i), 0);
  for (int i = 0; i < 64; ++i) {
    std::memset(abuf->data(), i, 16);
    ASSERT_EQ(PostSendMsg(a->qp, *abuf, 0, 16, 5000 + i), 0);
    ibv_wc wc;
    ASSERT_TRUE(PollOne(a->scq, &wc)) << "one-way send " << i << " never completed";
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
    ASSERT_EQ(wc.wr_id, 5000u + i);
  }
  auto recvs = PollN(b->rcq, 64);
  ASSERT_EQ(recvs.size(), 64u);
  for (int i = 0; i < 64; ++i) {
    EXPECT_EQ(recvs[i].wr_id, uint64_t(i));
    EXPECT_EQ(bbuf->data()[size_t(i) * 64], static_cast<uint8_t>(i));
  }
  // And answering again works.
  for (int i = 0; i < 10; ++i) ASSERT_NO_FATAL_FAILURE(Round(a, b, abuf, bbuf, 100 + i));
}

TEST_F(AckDeferral, AQpDestroyedWhileOwingAnAckStillAcknowledges) {
  Qp *a, *b;
  Pair(Signaled(), &a, &b);
  Buffer* abuf = Buf(4096);
  Buffer* bbuf = Buf(4096);
  for (int i = 0; i < 50; ++i) ASSERT_NO_FATAL_FAILURE(Round(a, b, abuf, bbuf, i));
  // b receives one more message, which (in ping-pong mode) it would acknowledge with its answer;
  // instead its QP is destroyed at once. a's send must succeed, not time out.
  ASSERT_EQ(PostRecv(b->qp, *bbuf, 0, 64, 7), 0);
  ASSERT_EQ(PostSendMsg(a->qp, *abuf, 0, 16, 8), 0);
  ibv_wc wc;
  ASSERT_TRUE(PollOne(b->rcq, &wc));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
  ASSERT_EQ(v.DestroyQp(b), 0);
  ASSERT_TRUE(PollOne(a->scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
  EXPECT_EQ(wc.wr_id, 8u);
}

}  // namespace
