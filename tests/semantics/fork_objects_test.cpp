// A fork child that goes on using its parent's verbs objects (which rdma-core leaves undefined)
// gets nothing from them, and does not crash: the fork abandoned the HCA they belong to.
#include <infiniband/verbs.h>

#include <sys/wait.h>

#include <gtest/gtest.h>

#include "support/semantics_harness.h"

namespace {

using namespace semantics;

using ForkObjects = VerbsTest;

// It crashed: polling an empty CQ ran progress on the abandoned HCA's endpoint, which is null.
TEST_F(ForkObjects, AChildPollingItsParentsCqFindsNothing) {
  QpOpts o;
  o.use_gid = true;
  Qp* parent = v.NewQp(o);
  ASSERT_NE(parent, nullptr);
  Remote mine = v.RemoteOf(parent);
  ibv_cq* cq = parent->scq;
  ibv_pd* pd = v.pd;
  ForkedPeer child;
  ASSERT_TRUE(child.Start([cq, pd, o, mine](int, int) {
    ibv_wc wc;
    for (int i = 0; i < 100; ++i)
      if (ibv_poll_cq(cq, 1, &wc) != 0) return 1;
    // A QP built on the parent's PD and CQ, brought up towards the parent's QP.
    ibv_qp_init_attr ia{};
    ia.send_cq = cq;
    ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = ia.cap.max_recv_wr = 4;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    ibv_qp* qp = ibv_create_qp(pd, &ia);
    if (qp) {
      ToInit(qp, o);
      ToRtr(qp, o, mine);
      ibv_destroy_qp(qp);
    }
    return 0;
  }));
  int st = child.Wait();
  ASSERT_TRUE(WIFEXITED(st)) << "the child died of signal " << WTERMSIG(st);
  EXPECT_EQ(WEXITSTATUS(st), 0) << "the child found a completion that was never its own";
}

}  // namespace
