// Events through real file descriptors: CQ overflow raises IBV_EVENT_CQ_ERR on the context's async
// fd, an armed SRQ limit raises IBV_EVENT_SRQ_LIMIT_REACHED once per arming, and a completion
// channel's fd delivers exactly one event per ibv_req_notify_cq (solicited-only arming: only
// solicited or error completions).
#include "support/semantics_harness.h"

namespace semantics {
namespace {

using Events = VerbsTest;

void SetNonBlocking(int fd) {
  ASSERT_EQ(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK), 0);
}

// Sends one message a -> b and waits for the sender's completion.
void SendOne(Qp* a, const Buffer& buf, uint64_t id, unsigned flags = IBV_SEND_SIGNALED) {
  ASSERT_EQ(PostSendMsg(a->qp, buf, 0, 16, id, flags | IBV_SEND_SIGNALED), 0);
  ibv_wc wc;
  ASSERT_TRUE(PollOne(a->scq, &wc));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
  ASSERT_EQ(wc.wr_id, id);
}

TEST_F(Events, CqOverflowRaisesCqErrOnTheAsyncFd) {
  ibv_cq* small = v.NewCq(4);
  ASSERT_NE(small, nullptr);
  const int depth = small->cqe;
  ASSERT_GE(depth, 4);
  QpOpts oa, ob;
  oa.send_cq = small;
  oa.sq_sig_all = true;
  Qp *a, *b;
  Pair(oa, ob, &a, &b);
  Buffer* buf = Buf(4096);
  EXPECT_FALSE(Readable(v.ctx->async_fd, milliseconds(0)));
  const int n = depth + 4;
  for (int i = 0; i < n; ++i) ASSERT_EQ(PostRecv(b->qp, *buf, 1024 + i * 16, 16, i), 0);
  for (int i = 0; i < n; ++i) ASSERT_EQ(PostSendMsg(a->qp, *buf, 0, 16, i, 0), 0);
  // Nobody polls `small`: its depth + 4 completions cannot all fit.
  ibv_async_event e{};
  ASSERT_TRUE(NextAsyncEvent(v.ctx, &e)) << "no async event after overflowing the CQ";
  EXPECT_EQ(e.event_type, IBV_EVENT_CQ_ERR) << ibv_event_type_str(e.event_type);
  EXPECT_EQ(e.element.cq, small);
  ibv_ack_async_event(&e);
  EXPECT_EQ(PollN(b->rcq, n).size(), size_t(n)) << "the receiver's CQ is not affected";
  // One event for the overflow, not one per lost completion.
  EXPECT_FALSE(Readable(v.ctx->async_fd, kQuiet));
  SetNonBlocking(v.ctx->async_fd);
  errno = 0;
  EXPECT_EQ(ibv_get_async_event(v.ctx, &e), -1);
  EXPECT_EQ(errno, EAGAIN);
}

TEST_F(Events, SrqLimitFiresOncePerArming) {
  ibv_srq* srq = v.NewSrq(32);
  ASSERT_NE(srq, nullptr);
  QpOpts oa, ob;
  ob.srq = srq;
  Qp *a, *b;
  Pair(oa, ob, &a, &b);
  Buffer* buf = Buf(8192);
  uint64_t next_recv = 0;
  auto post_recvs = [&](int n) {
    for (int i = 0; i < n; ++i, ++next_recv)
      ASSERT_EQ(PostSrqRecv(srq, *buf, 1024 + (next_recv % 64) * 64, 64, next_recv), 0);
  };
  uint64_t next_send = 0;
  auto send = [&](int n) {
    for (int i = 0; i < n; ++i) ASSERT_NO_FATAL_FAILURE(SendOne(a, *buf, next_send++));
  };
  auto expect_limit_event = [&] {
    ibv_async_event e{};
    ASSERT_TRUE(NextAsyncEvent(v.ctx, &e)) << "no SRQ limit event";
    EXPECT_EQ(e.event_type, IBV_EVENT_SRQ_LIMIT_REACHED) << ibv_event_type_str(e.event_type);
    EXPECT_EQ(e.element.srq, srq);
    ibv_ack_async_event(&e);
  };

  ASSERT_NO_FATAL_FAILURE(post_recvs(10));
  ibv_srq_attr attr{};
  attr.srq_limit = 5;
  ASSERT_EQ(ibv_modify_srq(srq, &attr, IBV_SRQ_LIMIT), 0);
  ibv_srq_attr q{};
  ASSERT_EQ(ibv_query_srq(srq, &q), 0);
  EXPECT_EQ(q.srq_limit, 5u);
  EXPECT_GE(q.max_wr, 32u);

  // 10 -> 5 receives left: not below the limit yet.
  ASSERT_NO_FATAL_FAILURE(send(5));
  EXPECT_FALSE(Readable(v.ctx->async_fd, milliseconds(10))) << "fired before dropping below";
  // 5 -> 4: below the limit, one event.
  ASSERT_NO_FATAL_FAILURE(send(1));
  ASSERT_NO_FATAL_FAILURE(expect_limit_event());
  // Disarmed now: going further down says nothing.
  ASSERT_NO_FATAL_FAILURE(send(2));
  EXPECT_FALSE(Readable(v.ctx->async_fd, kQuiet)) << "fired twice for one arming";

  // Re-arm above the current count and cross it again: one more event.
  ASSERT_NO_FATAL_FAILURE(post_recvs(10));  // 2 + 10 = 12 left
  attr.srq_limit = 10;
  ASSERT_EQ(ibv_modify_srq(srq, &attr, IBV_SRQ_LIMIT), 0);
  ASSERT_NO_FATAL_FAILURE(send(2));  // 10 left
  EXPECT_FALSE(Readable(v.ctx->async_fd, milliseconds(10)));
  ASSERT_NO_FATAL_FAILURE(send(1));  // 9 left
  ASSERT_NO_FATAL_FAILURE(expect_limit_event());
  EXPECT_EQ(PollN(b->rcq, next_send).size(), next_send);
}

struct ChannelSetup {
  ibv_comp_channel* ch;
  ibv_cq* cq;
  Qp* a;
  Qp* b;
  Buffer* buf;
};

class ChannelEvents : public VerbsTest {
 protected:
  void MakeChannel(ChannelSetup* s) {
    s->ch = v.NewChannel();
    ASSERT_NE(s->ch, nullptr);
    s->cq = v.NewCq(64, s->ch, &marker_);
    ASSERT_NE(s->cq, nullptr);
    QpOpts ob;
    ob.recv_cq = s->cq;
    Pair(QpOpts{}, ob, &s->a, &s->b);
    s->buf = Buf(8192);
    for (int i = 0; i < 32; ++i) ASSERT_EQ(PostRecv(s->b->qp, *s->buf, 4096 + i * 64, 64, i), 0);
  }
  // Waits for one event on the channel and checks it names our CQ; acknowledges it.
  void ExpectEvent(const ChannelSetup& s) {
    ASSERT_TRUE(Readable(s.ch->fd, kWait)) << "no completion event";
    ibv_cq* cq = nullptr;
    void* ctx = nullptr;
    ASSERT_EQ(ibv_get_cq_event(s.ch, &cq, &ctx), 0);
    EXPECT_EQ(cq, s.cq);
    EXPECT_EQ(ctx, &marker_);
    ibv_ack_cq_events(cq, 1);
  }
  int marker_ = 0;
};

TEST_F(ChannelEvents, OneEventPerArmingOnAPollableFd) {
  ChannelSetup s;
  ASSERT_NO_FATAL_FAILURE(MakeChannel(&s));
  EXPECT_FALSE(Readable(s.ch->fd, milliseconds(0)));

  // Not armed: a completion arrives, no event.
  ASSERT_NO_FATAL_FAILURE(SendOne(s.a, *s.buf, 1));
  ASSERT_EQ(PollN(s.cq, 1).size(), 1u);
  EXPECT_FALSE(Readable(s.ch->fd, kQuiet)) << "event without ibv_req_notify_cq";

  // Armed once: three completions, one event.
  ASSERT_EQ(ibv_req_notify_cq(s.cq, 0), 0);
  for (uint64_t id = 2; id <= 4; ++id) ASSERT_NO_FATAL_FAILURE(SendOne(s.a, *s.buf, id));
  ASSERT_NO_FATAL_FAILURE(ExpectEvent(s));
  EXPECT_FALSE(Readable(s.ch->fd, kQuiet)) << "more than one event for one arming";
  EXPECT_EQ(PollN(s.cq, 3).size(), 3u);

  // Re-armed: the next completion gives the next event.
  ASSERT_EQ(ibv_req_notify_cq(s.cq, 0), 0);
  ASSERT_NO_FATAL_FAILURE(SendOne(s.a, *s.buf, 5));
  ASSERT_NO_FATAL_FAILURE(ExpectEvent(s));
  EXPECT_EQ(PollN(s.cq, 1).size(), 1u);

  // The fd is real: non-blocking reads say EAGAIN when there is nothing.
  SetNonBlocking(s.ch->fd);
  ibv_cq* cq = nullptr;
  void* ctx = nullptr;
  errno = 0;
  EXPECT_EQ(ibv_get_cq_event(s.ch, &cq, &ctx), -1);
  EXPECT_EQ(errno, EAGAIN);
}

TEST_F(ChannelEvents, SolicitedOnlyArmingFiresOnSolicitedOrErrorCompletionsOnly) {
  ChannelSetup s;
  ASSERT_NO_FATAL_FAILURE(MakeChannel(&s));
  ASSERT_EQ(ibv_req_notify_cq(s.cq, 1), 0);

  // An unsolicited SEND: its completion is there, but no event.
  ASSERT_NO_FATAL_FAILURE(SendOne(s.a, *s.buf, 1));
  ibv_wc wc;
  ASSERT_TRUE(PollOne(s.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_FALSE(Readable(s.ch->fd, kQuiet)) << "solicited-only arming fired on a plain SEND";

  // A solicited one fires.
  ASSERT_NO_FATAL_FAILURE(SendOne(s.a, *s.buf, 2, IBV_SEND_SOLICITED));
  ASSERT_NO_FATAL_FAILURE(ExpectEvent(s));
  ASSERT_TRUE(PollOne(s.cq, &wc));
  EXPECT_EQ(wc.wr_id, 1u);  // receive #1 (receives complete in order)

  // So does a solicited WRITE_WITH_IMM.
  ASSERT_EQ(ibv_req_notify_cq(s.cq, 1), 0);
  Buffer* target = Buf(64);
  ASSERT_EQ(PostRdma(s.a->qp, IBV_WR_RDMA_WRITE_WITH_IMM, *s.buf, 0, 8, target->addr(),
                     target->rkey(), 3, IBV_SEND_SIGNALED | IBV_SEND_SOLICITED),
            0);
  ASSERT_NO_FATAL_FAILURE(ExpectEvent(s));
  ASSERT_TRUE(PollOne(s.cq, &wc));
  EXPECT_EQ(wc.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
  ASSERT_TRUE(PollOne(s.a->scq, &wc));
  EXPECT_EQ(wc.wr_id, 3u);

  // Re-armed solicited-only: unsolicited traffic stays silent, an error completion fires.
  ASSERT_EQ(ibv_req_notify_cq(s.cq, 1), 0);
  ASSERT_NO_FATAL_FAILURE(SendOne(s.a, *s.buf, 4));
  ASSERT_TRUE(PollOne(s.cq, &wc));
  EXPECT_FALSE(Readable(s.ch->fd, kQuiet));
  ASSERT_EQ(ToErr(s.b->qp), 0);  // flushes the remaining receives with errors
  ASSERT_NO_FATAL_FAILURE(ExpectEvent(s));
  ASSERT_TRUE(PollOne(s.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
  Drain(s.cq, milliseconds(1));
}

}  // namespace
}  // namespace semantics
