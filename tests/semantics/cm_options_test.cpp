// The rest of the connection properties: ECE values travel in the REQ and REP
// (rdma_set_local_ece / rdma_get_remote_ece), rdma_reject_ece rejects with IBTA reason 35,
// rdma_notify(COMM_EST) establishes a passive id still waiting for its RTU, RDMA_OPTION_ID_TOS
// becomes the GRH traffic class, RDMA_PS_IB connects the id's QP type, and a CM connection
// carries data (an RDMA WRITE and a SEND through the QPs the CM set up).
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#include "support/cm_harness.h"

namespace cmtest {
namespace {

using CmOptions = CmTest;

TEST_F(CmOptions, EceValuesTravelBothWays) {
  rdma_event_channel* sch = Channel();
  uint16_t port = 0;
  ASSERT_NE(Listen(sch, &port), nullptr);
  rdma_event_channel* cch = Channel();
  rdma_cm_id* client = Resolved(cch, port);
  ASSERT_NE(client, nullptr);
  ibv_ece bad{0, 1, 0};
  EXPECT_EQ(rdma_set_local_ece(client, &bad), -1) << "vendor id 0 must be refused";
  EXPECT_EQ(errno, EINVAL);
  ibv_ece mine{0x1234, 0x55, 0};
  ASSERT_EQ(rdma_set_local_ece(client, &mine), 0);
  rdma_conn_param cp{};
  cp.qp_num = 0x42;
  ASSERT_EQ(rdma_connect(client, &cp), 0);
  Event req;
  ASSERT_TRUE(Next(sch, RDMA_CM_EVENT_CONNECT_REQUEST, &req));
  rdma_cm_id* server = Adopt(req.id);
  ibv_ece got{};
  ASSERT_EQ(rdma_get_remote_ece(server, &got), 0);
  EXPECT_EQ(got.vendor_id, 0x1234u);
  EXPECT_EQ(got.options, 0x55u);
  ibv_ece theirs{0x1234, 0x05, 0};
  ASSERT_EQ(rdma_set_local_ece(server, &theirs), 0);
  rdma_conn_param ap{};
  ap.qp_num = 0x43;
  ASSERT_EQ(rdma_accept(server, &ap), 0);
  ASSERT_TRUE(Next(cch, RDMA_CM_EVENT_CONNECT_RESPONSE));
  ASSERT_EQ(rdma_get_remote_ece(client, &got), 0);
  EXPECT_EQ(got.vendor_id, 0x1234u);
  EXPECT_EQ(got.options, 0x05u) << "the REP carries the responder's options";
}

TEST_F(CmOptions, RejectEceIsReason35) {
  rdma_event_channel* sch = Channel();
  uint16_t port = 0;
  ASSERT_NE(Listen(sch, &port), nullptr);
  rdma_event_channel* cch = Channel();
  rdma_cm_id* client = Resolved(cch, port);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(MakeQp(client));
  rdma_conn_param cp{};
  cp.responder_resources = 1;
  cp.initiator_depth = 1;
  ASSERT_EQ(rdma_connect(client, &cp), 0);
  Event req;
  ASSERT_TRUE(Next(sch, RDMA_CM_EVENT_CONNECT_REQUEST, &req));
  Adopt(req.id);
  ASSERT_EQ(rdma_reject_ece(req.id, nullptr, 0), 0);
  Event rej;
  ASSERT_TRUE(Next(cch, RDMA_CM_EVENT_REJECTED, &rej));
  EXPECT_EQ(rej.status, 35);
}

TEST_F(CmOptions, NotifyCommEstEstablishesBeforeTheRtu) {
  rdma_event_channel* sch = Channel();
  uint16_t port = 0;
  ASSERT_NE(Listen(sch, &port), nullptr);
  rdma_event_channel* cch = Channel();
  rdma_cm_id* client = Resolved(cch, port);
  ASSERT_NE(client, nullptr);
  rdma_conn_param cp{};
  cp.qp_num = 0x77;  // no QP on the client: it answers the REP only when told (rdma_establish)
  ASSERT_EQ(rdma_connect(client, &cp), 0);
  Event req;
  ASSERT_TRUE(Next(sch, RDMA_CM_EVENT_CONNECT_REQUEST, &req));
  rdma_cm_id* server = Adopt(req.id);
  ASSERT_TRUE(MakeQp(server));
  EXPECT_EQ(rdma_notify(server, IBV_EVENT_PATH_MIG), -1);
  EXPECT_EQ(errno, EINVAL);
  rdma_conn_param ap{};  // the request offered no reads: none initiated back (else EINVAL)
  ASSERT_EQ(rdma_accept(server, &ap), 0) << strerror(errno);
  ASSERT_TRUE(Next(cch, RDMA_CM_EVENT_CONNECT_RESPONSE));
  ASSERT_TRUE(Quiet(sch)) << "ESTABLISHED before any RTU or notify";
  // Traffic arrived on the QP before the RTU: the application says so.
  ASSERT_EQ(rdma_notify(server, IBV_EVENT_COMM_EST), 0);
  ASSERT_TRUE(Next(sch, RDMA_CM_EVENT_ESTABLISHED));
  // The RTU that follows changes nothing.
  ASSERT_EQ(rdma_establish(client), 0);
  EXPECT_TRUE(Quiet(sch));
}

TEST_F(CmOptions, TosBecomesTheTrafficClassOfTheRoute) {
  rdma_event_channel* sch = Channel();
  uint16_t port = 0;
  ASSERT_NE(Listen(sch, &port), nullptr);
  rdma_event_channel* cch = Channel();
  rdma_cm_id* client = Resolved(cch, port);
  ASSERT_NE(client, nullptr);
  uint8_t tos = 0x48;
  ASSERT_EQ(rdma_set_option(client, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, sizeof tos), 0);
  ASSERT_TRUE(MakeQp(client));
  rdma_cm_id* server = Establish(client, sch);
  ASSERT_NE(server, nullptr);
  ibv_qp_attr a{};
  int mask = 0;
  a.qp_state = IBV_QPS_RTR;
  ASSERT_EQ(rdma_init_qp_attr(client, &a, &mask), 0);
  EXPECT_TRUE(mask & IBV_QP_AV);
  EXPECT_EQ(a.ah_attr.grh.traffic_class, 0x48);
  ASSERT_NE(client->route.path_rec, nullptr);
  EXPECT_EQ(client->route.path_rec->traffic_class, 0x48);
}

TEST_F(CmOptions, PortSpaceIbConnectsAnRcQp) {
  rdma_event_channel* sch = Channel();
  uint16_t port = 0;
  ASSERT_NE(Listen(sch, &port, RDMA_PS_IB), nullptr);
  rdma_event_channel* cch = Channel();
  rdma_cm_id* client = Resolved(cch, port, RDMA_PS_IB);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(MakeQp(client));
  rdma_cm_id* server = Establish(client, sch);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(server->qp_type, IBV_QPT_RC);
  EXPECT_EQ(server->ps, RDMA_PS_IB);
}

// The QPs the CM set up carry data with the rdma_verbs.h helpers, as rdma_server/client do.
TEST_F(CmOptions, ConnectionCarriesWriteAndSend) {
  rdma_event_channel* sch = Channel();
  uint16_t port = 0;
  ASSERT_NE(Listen(sch, &port), nullptr);
  rdma_event_channel* cch = Channel();
  rdma_cm_id* client = Resolved(cch, port);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(MakeQp(client));
  rdma_conn_param p{};
  p.responder_resources = 4;
  p.initiator_depth = 4;
  p.retry_count = 7;
  p.rnr_retry_count = 7;
  rdma_cm_id* server = Establish(client, sch, &p, &p);
  ASSERT_NE(server, nullptr);

  std::vector<uint8_t> sbuf(4096), rbuf(4096, 0), target(4096, 0);
  for (size_t i = 0; i < sbuf.size(); ++i) sbuf[i] = static_cast<uint8_t>(i * 13 + 1);
  ibv_mr* smr = rdma_reg_msgs(client, sbuf.data(), sbuf.size());
  ibv_mr* rmr = rdma_reg_msgs(server, rbuf.data(), rbuf.size());
  ibv_mr* tmr = rdma_reg_write(server, target.data(), target.size());
  ASSERT_TRUE(smr && rmr && tmr) << strerror(errno);
  ASSERT_EQ(rdma_post_recv(server, nullptr, rbuf.data(), rbuf.size(), rmr), 0);
  ASSERT_EQ(rdma_post_write(client, nullptr, sbuf.data(), 1024, smr, IBV_SEND_SIGNALED,
                            reinterpret_cast<uintptr_t>(target.data()), tmr->rkey),
            0);
  ibv_wc wc{};
  ASSERT_EQ(rdma_get_send_comp(client, &wc), 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(target.data(), sbuf.data(), 1024), 0);
  ASSERT_EQ(rdma_post_send(client, nullptr, sbuf.data(), 2048, smr, IBV_SEND_SIGNALED), 0);
  ASSERT_EQ(rdma_get_send_comp(client, &wc), 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  ASSERT_EQ(rdma_get_recv_comp(server, &wc), 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.byte_len, 2048u);
  EXPECT_EQ(std::memcmp(rbuf.data(), sbuf.data(), 2048), 0);
  rdma_dereg_mr(smr);
  rdma_dereg_mr(rmr);
  rdma_dereg_mr(tmr);
}

}  // namespace
}  // namespace cmtest
