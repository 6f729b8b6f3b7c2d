// librdmacm: every event path of an RC connection in RDMA_PS_TCP (rdma_cm(7)): address and route
// resolution and their errors, request, response, rejection, unreachable peers, establishment and
// disconnection on both sides. Both ends live in this process (two ids, two channels).
#include "support/cm_harness.h"

namespace cmtest {
namespace {

class CmEvents : public CmTest {};

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

TEST_F(CmEvents, AddrAndRouteResolved) {
  rdma_event_channel* ch = Channel();
  rdma_cm_id* id = NewId(ch);
  ASSERT_NE(id, nullptr);
  uint16_t port = NextPort();
  sockaddr_storage dst = Ip("127.0.0.1", port);
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, Sa(&dst), 2000), 0) << strerror(errno);
  Event e;
  ASSERT_TRUE(Next(ch, RDMA_CM_EVENT_ADDR_RESOLVED, &e));
  EXPECT_EQ(e.status, 0);
  EXPECT_EQ(e.id, id);
  EXPECT_EQ(e.listen_id, nullptr);
  EXPECT_NE(id->verbs, nullptr);  // bound to the device once the address is resolved
  EXPECT_EQ(IpOf(rdma_get_local_addr(id)), "127.0.0.1");
  EXPECT_EQ(IpOf(rdma_get_peer_addr(id)), "127.0.0.1");
  EXPECT_EQ(ntohs(rdma_get_dst_port(id)), port);
  EXPECT_NE(rdma_get_src_port(id), 0);

  ASSERT_EQ(rdma_resolve_route(id, 2000), 0) << strerror(errno);
  ASSERT_TRUE(Next(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, &e));
  EXPECT_EQ(e.status, 0);
  EXPECT_EQ(id->route.num_paths, 1);
  EXPECT_NE(id->route.path_rec, nullptr);
  EXPECT_TRUE(Quiet(ch));
}

// 255.255.255.255 has no route a connected socket may take (connect(2) refuses broadcast without
// SO_BROADCAST), so there is no source address: ADDR_ERROR at once.
TEST_F(CmEvents, AddrErrorUnroutable) {
  rdma_event_channel* ch = Channel();
  rdma_cm_id* id = NewId(ch);
  ASSERT_NE(id, nullptr);
  sockaddr_storage dst = Ip("255.255.255.255", NextPort());
  auto t0 = Clock::now();
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, Sa(&dst), 2000), 0) << strerror(errno);
  Event e;
  ASSERT_TRUE(Next(ch, RDMA_CM_EVENT_ADDR_ERROR, &e, milliseconds(1000)));
  EXPECT_LT(MsSince(t0), 1000);
  EXPECT_LT(e.status, 0);
  // The id can still be destroyed, and a failed resolution is not followed by anything else.
  EXPECT_TRUE(Quiet(ch));
}

// An address that routes but that no softrdma process owns (TEST-NET-2): like an unanswered ARP,
// the error comes when the caller's timeout runs out, not before and not much later.
TEST_F(CmEvents, AddrErrorNobodyOwnsAddress) {
  rdma_event_channel* ch = Channel();
  rdma_cm_id* id = NewId(ch);
  ASSERT_NE(id, nullptr);
  sockaddr_storage dst = Ip("198.51.100.7", NextPort());
  constexpr int kTimeoutMs = 400;
  if (NetworkAnswersFor(dst, kTimeoutMs)) GTEST_SKIP() << "this network answers for 198.51.100.7";
  auto t0 = Clock::now();
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, Sa(&dst), kTimeoutMs), 0) << strerror(errno);
  Event e;
  ASSERT_TRUE(Next(ch, RDMA_CM_EVENT_ADDR_ERROR, &e, milliseconds(kTimeoutMs + 1000)));
  int64_t took = MsSince(t0);
  EXPECT_LE(took, kTimeoutMs + 500);
  if (e.status == -ETIMEDOUT) {
    EXPECT_GE(took, kTimeoutMs - 50);  // it waited for the timeout it was given
  } else {
    EXPECT_EQ(e.status, -ENETUNREACH) << "no route to TEST-NET-2 in this namespace";
  }
  // A route cannot be resolved for it.
  EXPECT_NE(rdma_resolve_route(id, 1000), 0);
  EXPECT_TRUE(Quiet(ch));
}

TEST_F(CmEvents, ConnectRequestCarriesPrivateDataAndParameters) {
  rdma_event_channel* sch = Channel();
  rdma_event_channel* cch = Channel();
  uint16_t port = 0;
  rdma_cm_id* listen = Listen(sch, &port);
  ASSERT_NE(listen, nullptr);
  rdma_cm_id* client = Resolved(cch, port);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(MakeQp(client));

  auto data = Pattern(56, 3);  // the REQ limit in RDMA_PS_TCP
  rdma_conn_param cp{};
  cp.private_data = data.data();
  cp.private_data_len = static_cast<uint8_t>(data.size());
  cp.responder_resources = 5;
  cp.initiator_depth = 3;
  cp.retry_count = 6;
  cp.rnr_retry_count = 4;
  cp.flow_control = 1;
  ASSERT_EQ(rdma_connect(client, &cp), 0) << strerror(errno);
  Event req;
  ASSERT_TRUE(Next(sch, RDMA_CM_EVENT_CONNECT_REQUEST, &req));
  rdma_cm_id* server = Adopt(req.id);
  EXPECT_EQ(req.status, 0);
  EXPECT_EQ(req.listen_id, listen);
  ASSERT_NE(server, nullptr);
  EXPECT_NE(server, listen);
  ASSERT_GE(req.data.size(), data.size());
  EXPECT_TRUE(std::equal(data.begin(), data.end(), req.data.begin()));
  // Seen from the passive side: what the client reads from us is what we serve.
  EXPECT_EQ(req.conn.responder_resources, 3);
  EXPECT_EQ(req.conn.initiator_depth, 5);
  EXPECT_EQ(req.conn.retry_count, 6);
  EXPECT_EQ(req.conn.rnr_retry_count, 4);
  EXPECT_EQ(req.conn.qp_num, client->qp->qp_num);
  EXPECT_EQ(server->verbs, client->verbs);
  EXPECT_EQ(ntohs(rdma_get_src_port(server)), port);
  EXPECT_EQ(rdma_get_dst_port(server), rdma_get_src_port(client));
  EXPECT_EQ(server->channel, sch);  // a request's id reports on its listener's channel

  // 57 bytes is one more than a REQ carries.
  rdma_cm_id* other = Resolved(cch, port);
  ASSERT_NE(other, nullptr);
  ASSERT_TRUE(MakeQp(other));
  auto big = Pattern(57, 9);
  cp.private_data = big.data();
  cp.private_data_len = 57;
  errno = 0;
  EXPECT_EQ(rdma_connect(other, &cp), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_TRUE(Quiet(sch));
}

// An active id without a QP gets CONNECT_RESPONSE (not ESTABLISHED) and completes the handshake
// with rdma_establish, which gives the passive side its ESTABLISHED.
TEST_F(CmEvents, ConnectResponseThenEstablish) {
  rdma_event_channel* sch = Channel();
  rdma_event_channel* cch = Channel();
  uint16_t port = 0;
  ASSERT_NE(Listen(sch, &port), nullptr);
  rdma_cm_id* client = Resolved(cch, port);
  ASSERT_NE(client, nullptr);
  // The application makes and drives its own QP.
  ibv_pd* pd = ibv_alloc_pd(client->verbs);
  ASSERT_NE(pd, nullptr);
  ibv_cq* cq = ibv_create_cq(client->verbs, 16, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_qp_init_attr qa = RcAttr();
  qa.send_cq = qa.recv_cq = cq;
  ibv_qp* qp = ibv_create_qp(pd, &qa);
  ASSERT_NE(qp, nullptr);

  rdma_conn_param cp{};
  cp.qp_num = qp->qp_num;
  cp.responder_resources = 1;
  cp.initiator_depth = 1;
  cp.rnr_retry_count = 7;
  ASSERT_EQ(rdma_connect(client, &cp), 0) << strerror(errno);
  Event req;
  ASSERT_TRUE(Next(sch, RDMA_CM_EVENT_CONNECT_REQUEST, &req));
  EXPECT_EQ(req.conn.qp_num, qp->qp_num);
  rdma_cm_id* server = Adopt(req.id);
  ASSERT_TRUE(MakeQp(server));
  auto data = Pattern(20, 40);
  rdma_conn_param ap{};
  ap.responder_resources = 1;
  ap.initiator_depth = 1;
  ap.private_data = data.data();
  ap.private_data_len = 20;
  ASSERT_EQ(rdma_accept(server, &ap), 0) << strerror(errno);

  Event rep;
  ASSERT_TRUE(Next(cch, RDMA_CM_EVENT_CONNECT_RESPONSE, &rep));
  EXPECT_EQ(rep.status, 0);
  EXPECT_EQ(rep.conn.qp_num, server->qp->qp_num);
  ASSERT_GE(rep.data.size(), data.size());
  EXPECT_TRUE(std::equal(data.begin(), data.end(), rep.data.begin()));
  // Not established until the application says so.
  EXPECT_TRUE(Quiet(sch));

  // The application brings its QP up with rdma_init_qp_attr, as rdma-core programs do.
  for (ibv_qp_state s : {IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS}) {
    ibv_qp_attr a{};
    int mask = 0;
    a.qp_state = s;
    ASSERT_EQ(rdma_init_qp_attr(client, &a, &mask), 0) << s;
    ASSERT_EQ(ibv_modify_qp(qp, &a, mask), 0) << s;
  }
  EXPECT_EQ(QueryQp(qp).dest_qp_num, server->qp->qp_num);
  ASSERT_EQ(rdma_establish(client), 0) << strerror(errno);
  EXPECT_TRUE(Next(sch, RDMA_CM_EVENT_ESTABLISHED));
  EXPECT_TRUE(Quiet(cch));                // the active side had its answer in CONNECT_RESPONSE
  EXPECT_EQ(rdma_establish(client), -1);  // once only

  ASSERT_EQ(rdma_disconnect(client), 0);
  EXPECT_TRUE(Next(cch, RDMA_CM_EVENT_DISCONNECTED));
  EXPECT_TRUE(Next(sch, RDMA_CM_EVENT_DISCONNECTED));
  ibv_destroy_qp(qp);
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
}

// rping -q: both sides make their own QPs, and the passive side brings its QP to RTS with
// rdma_init_qp_attr before rdma_accept. The PSN its QP starts with is the one the REP announces:
// when the accept chose another, the client dropped the server's requests as out of sequence and
// the server's first one ended in RETRY_EXC_ERR.
TEST_F(CmEvents, APassiveSideThatBringsItsOwnQpUpBeforeAcceptingIsHeard) {
  rdma_event_channel* sch = Channel();
  rdma_event_channel* cch = Channel();
  uint16_t port = 0;
  ASSERT_NE(Listen(sch, &port), nullptr);
  rdma_cm_id* client = Resolved(cch, port);
  ASSERT_NE(client, nullptr);
  struct OwnQp {
    ibv_pd* pd = nullptr;
    ibv_cq* cq = nullptr;
    ibv_qp* qp = nullptr;
    ibv_mr* mr = nullptr;
    uint64_t buf[8] = {};
    bool Make(ibv_context* ctx) {
      pd = ibv_alloc_pd(ctx);
      cq = pd ? ibv_create_cq(ctx, 16, nullptr, nullptr, 0) : nullptr;
      ibv_qp_init_attr qa = RcAttr();
      qa.send_cq = qa.recv_cq = cq;
      qp = cq ? ibv_create_qp(pd, &qa) : nullptr;
      const int access = IBV_ACCESS_LOCAL_WRITE;  // an int: ibv_reg_mr's macro mixes enums
      mr = qp ? ibv_reg_mr(pd, buf, sizeof buf, access) : nullptr;
      return mr != nullptr;
    }
    // INIT, RTR and RTS from the id, as rping's rping_self_modify_qp does.
    bool BringUp(rdma_cm_id* id) {
      for (ibv_qp_state s : {IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS}) {
        ibv_qp_attr a{};
        int mask = 0;
        a.qp_state = s;
        if (rdma_init_qp_attr(id, &a, &mask) != 0 || ibv_modify_qp(qp, &a, mask) != 0) return false;
      }
      return true;
    }
    int Post(bool send) {
      ibv_sge sge{reinterpret_cast<uintptr_t>(send ? &buf[0] : &buf[4]), 16, mr->lkey};
      if (!send) {
        ibv_recv_wr wr{};
        wr.sg_list = &sge;
        wr.num_sge = 1;
        ibv_recv_wr* bad = nullptr;
        return ibv_post_recv(qp, &wr, &bad);
      }
      ibv_send_wr wr{};
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.opcode = IBV_WR_SEND;
      wr.send_flags = IBV_SEND_SIGNALED;
      ibv_send_wr* bad = nullptr;
      return ibv_post_send(qp, &wr, &bad);
    }
    ~OwnQp() {
      if (mr) ibv_dereg_mr(mr);
      if (qp) ibv_destroy_qp(qp);
      if (cq) ibv_destroy_cq(cq);
      if (pd) ibv_dealloc_pd(pd);
    }
  };
  OwnQp c;
  ASSERT_TRUE(c.Make(client->verbs));
  rdma_conn_param cp{};
  cp.qp_num = c.qp->qp_num;
  cp.responder_resources = cp.initiator_depth = 1;
  cp.retry_count = cp.rnr_retry_count = 7;
  ASSERT_EQ(rdma_connect(client, &cp), 0) << strerror(errno);
  Event req;
  ASSERT_TRUE(Next(sch, RDMA_CM_EVENT_CONNECT_REQUEST, &req));
  rdma_cm_id* server = Adopt(req.id);
  OwnQp s;
  ASSERT_TRUE(s.Make(server->verbs));
  ASSERT_TRUE(s.BringUp(server)) << strerror(errno);
  ASSERT_EQ(s.Post(false), 0);
  rdma_conn_param ap = cp;
  ap.qp_num = s.qp->qp_num;
  ASSERT_EQ(rdma_accept(server, &ap), 0) << strerror(errno);
  ASSERT_TRUE(Next(cch, RDMA_CM_EVENT_CONNECT_RESPONSE));
  ASSERT_TRUE(c.BringUp(client)) << strerror(errno);
  ASSERT_EQ(c.Post(false), 0);
  ASSERT_EQ(rdma_establish(client), 0) << strerror(errno);
  ASSERT_TRUE(Next(sch, RDMA_CM_EVENT_ESTABLISHED));

  // Both directions: the server's first request used to be lost.
  ASSERT_EQ(s.Post(true), 0);
  ASSERT_EQ(c.Post(true), 0);
  for (OwnQp* side : {&s, &c}) {
    int got = 0;
    for (auto deadline = Clock::now() + milliseconds(5000); got < 2 && Clock::now() < deadline;) {
      ibv_wc wc{};
      if (ibv_poll_cq(side->cq, 1, &wc) != 1) continue;
      EXPECT_EQ(wc.status, IBV_WC_SUCCESS)
          << (side == &s ? "server " : "client ") << ibv_wc_status_str(wc.status);
      ++got;
    }
    EXPECT_EQ(got, 2) << (side == &s ? "server" : "client") << ": a SEND and a receive";
  }
  ASSERT_EQ(rdma_disconnect(client), 0);
  EXPECT_TRUE(Next(cch, RDMA_CM_EVENT_DISCONNECTED));
  EXPECT_TRUE(Next(sch, RDMA_CM_EVENT_DISCONNECTED));
}

TEST_F(CmEvents, UnreachableWhenNothingListens) {
  rdma_event_channel* cch = Channel();
  rdma_cm_id* client = Resolved(cch, NextPort());
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(MakeQp(client));
  rdma_conn_param cp{};
  cp.responder_resources = cp.initiator_depth = 1;
  auto t0 = Clock::now();
  ASSERT_EQ(rdma_connect(client, &cp), 0) << strerror(errno);
  Event e;
  ASSERT_TRUE(Next(cch, RDMA_CM_EVENT_UNREACHABLE, &e, milliseconds(2000)));
  EXPECT_EQ(e.status, -ECONNREFUSED);
  EXPECT_LT(MsSince(t0), 2000);
  EXPECT_TRUE(Quiet(cch));
}

// A listener that never answers: the REQ times out (kReqTimeoutMs = 4 s) with UNREACHABLE.
TEST_F(CmEvents, UnreachableWhenRequestIsNeverAnswered) {
  rdma_event_channel* sch = Channel();
  rdma_event_channel* cch = Channel();
  uint16_t port = 0;
  ASSERT_NE(Listen(sch, &port), nullptr);
  rdma_cm_id* client = Resolved(cch, port);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(MakeQp(client));
  rdma_conn_param cp{};
  cp.responder_resources = cp.initiator_depth = 1;
  auto t0 = Clock::now();
  ASSERT_EQ(rdma_connect(client, &cp), 0) << strerror(errno);
  Event req;
  ASSERT_TRUE(Next(sch, RDMA_CM_EVENT_CONNECT_REQUEST, &req));
  rdma_cm_id* server = Adopt(req.id);
  Event e;
  ASSERT_TRUE(Next(cch, RDMA_CM_EVENT_UNREACHABLE, &e, milliseconds(8000)));
  EXPECT_EQ(e.status, -ETIMEDOUT);
  int64_t took = MsSince(t0);
  EXPECT_GE(took, 3900);
  EXPECT_LE(took, 6000);
  // The active side gave up and said so: the passive side's request is rejected (as IB CM's REJ
  // in REQ_RCVD gives the passive id REJECTED), and a late accept is refused.
  ASSERT_TRUE(Next(sch, RDMA_CM_EVENT_REJECTED, &e));
  EXPECT_EQ(e.id, server);
  ASSERT_TRUE(MakeQp(server));
  errno = 0;
  EXPECT_EQ(rdma_accept(server, nullptr), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_TRUE(Quiet(cch, milliseconds(300)));
}

// The active id is destroyed while its request waits for an answer: the passive side learns it
// (REJECTED), and the request no longer counts against the listener's backlog.
TEST_F(CmEvents, ActiveIdDestroyedWhileRequestPendingRejectsThePassiveSide) {
  rdma_event_channel* sch = Channel();
  rdma_event_channel* cch = Channel();
  uint16_t port = 0;
  ASSERT_NE(Listen(sch, &port, RDMA_PS_TCP, "127.0.0.1", /*backlog=*/1), nullptr);
  rdma_cm_id* client = Resolved(cch, port);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(MakeQp(client));
  rdma_conn_param cp{};
  cp.responder_resources = cp.initiator_depth = 1;
  ASSERT_EQ(rdma_connect(client, &cp), 0);
  Event req;
  ASSERT_TRUE(Next(sch, RDMA_CM_EVENT_CONNECT_REQUEST, &req));
  rdma_cm_id* server = Adopt(req.id);
  Destroy(client);
  Event e;
  ASSERT_TRUE(Next(sch, RDMA_CM_EVENT_REJECTED, &e));
  EXPECT_EQ(e.id, server);
  ASSERT_TRUE(MakeQp(server));
  errno = 0;
  EXPECT_EQ(rdma_accept(server, nullptr), -1);
  EXPECT_EQ(errno, EINVAL);
  // The backlog of 1 has room again.
  rdma_cm_id* next = Resolved(cch, port);
  ASSERT_NE(next, nullptr);
  ASSERT_TRUE(MakeQp(next));
  ASSERT_NE(Establish(next, sch), nullptr);
}

TEST_F(CmEvents, RejectedCarriesPrivateDataAndConsumerStatus) {
  rdma_event_channel* sch = Channel();
  rdma_event_channel* cch = Channel();
  uint16_t port = 0;
  ASSERT_NE(Listen(sch, &port), nullptr);
  rdma_cm_id* client = Resolved(cch, port);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(MakeQp(client));
  rdma_conn_param cp{};
  cp.responder_resources = cp.initiator_depth = 1;
  ASSERT_EQ(rdma_connect(client, &cp), 0);
  Event req;
  ASSERT_TRUE(Next(sch, RDMA_CM_EVENT_CONNECT_REQUEST, &req));
  rdma_cm_id* server = Adopt(req.id);
  auto data = Pattern(33, 1);
  ASSERT_EQ(rdma_reject(server, data.data(), 33), 0) << strerror(errno);
  Event e;
  ASSERT_TRUE(Next(cch, RDMA_CM_EVENT_REJECTED, &e));
  EXPECT_EQ(e.status, 28);  // IB CM REJ reason: consumer reject
  ASSERT_GE(e.data.size(), data.size());
  EXPECT_TRUE(std::equal(data.begin(), data.end(), e.data.begin()));
  // The client's QP is no longer usable for this connection.
  EXPECT_NE(QueryQp(client->qp).qp_state, IBV_QPS_RTS);
  EXPECT_TRUE(Quiet(sch));
  EXPECT_TRUE(Quiet(cch));
}

TEST_F(CmEvents, EstablishedAndDisconnectedOnBothSidesActiveCloses) {
  Connection c;
  ASSERT_TRUE(Connect(&c));
  auto [sch, cch, client, server] = c;
  EXPECT_EQ(QueryQp(client->qp).qp_state, IBV_QPS_RTS);
  EXPECT_EQ(QueryQp(server->qp).qp_state, IBV_QPS_RTS);
  EXPECT_EQ(QueryQp(client->qp).dest_qp_num, server->qp->qp_num);
  EXPECT_EQ(QueryQp(server->qp).dest_qp_num, client->qp->qp_num);

  ASSERT_EQ(rdma_disconnect(client), 0) << strerror(errno);
  Event e;
  ASSERT_TRUE(Next(sch, RDMA_CM_EVENT_DISCONNECTED, &e));
  EXPECT_EQ(e.id, server);
  ASSERT_TRUE(Next(cch, RDMA_CM_EVENT_DISCONNECTED, &e));
  EXPECT_EQ(e.id, client);
  // The passive side answers with its own rdma_disconnect, which reports nothing more.
  EXPECT_EQ(rdma_disconnect(server), 0);
  EXPECT_TRUE(Quiet(sch));
  EXPECT_TRUE(Quiet(cch));
  EXPECT_EQ(QueryQp(client->qp).qp_state, IBV_QPS_ERR);
  EXPECT_EQ(QueryQp(server->qp).qp_state, IBV_QPS_ERR);
}

TEST_F(CmEvents, DisconnectedOnBothSidesPassiveCloses) {
  Connection c;
  ASSERT_TRUE(Connect(&c));
  auto [sch, cch, client, server] = c;
  ASSERT_EQ(rdma_disconnect(server), 0) << strerror(errno);
  EXPECT_TRUE(Next(cch, RDMA_CM_EVENT_DISCONNECTED));
  EXPECT_TRUE(Next(sch, RDMA_CM_EVENT_DISCONNECTED));
  EXPECT_EQ(rdma_disconnect(client), 0);
  EXPECT_TRUE(Quiet(sch));
  EXPECT_TRUE(Quiet(cch));
}

// After DISCONNECTED, each asynchronous id gets TIMEWAIT_EXIT once the time-wait (1 s) is over.
TEST_F(CmEvents, TimewaitExitFollowsDisconnectedOnBothSides) {
  Connection c;
  ASSERT_TRUE(Connect(&c));
  auto [sch, cch, client, server] = c;
  ASSERT_EQ(rdma_disconnect(client), 0);
  ASSERT_TRUE(Next(cch, RDMA_CM_EVENT_DISCONNECTED));
  ASSERT_TRUE(Next(sch, RDMA_CM_EVENT_DISCONNECTED));
  auto t0 = Clock::now();
  EXPECT_TRUE(Quiet(cch, milliseconds(500)));
  Event e;
  ASSERT_TRUE(Next(cch, RDMA_CM_EVENT_TIMEWAIT_EXIT, &e, milliseconds(2500)));
  EXPECT_EQ(e.id, client);
  ASSERT_TRUE(Next(sch, RDMA_CM_EVENT_TIMEWAIT_EXIT, &e, milliseconds(2500)));
  EXPECT_EQ(e.id, server);
  EXPECT_LE(MsSince(t0), 2500);
  EXPECT_TRUE(Quiet(cch));
  EXPECT_TRUE(Quiet(sch));
}

// Destroying a connected id tells its peer (DISCONNECTED), as the kernel's rdma_cm does.
TEST_F(CmEvents, DestroyingAConnectedIdDisconnectsThePeer) {
  Connection c;
  ASSERT_TRUE(Connect(&c));
  auto [sch, cch, client, server] = c;
  Destroy(client);
  Event e;
  ASSERT_TRUE(Next(sch, RDMA_CM_EVENT_DISCONNECTED, &e));
  EXPECT_EQ(e.id, server);
}

TEST_F(CmEvents, EventStrNamesEveryEvent) {
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_ADDR_RESOLVED), "RDMA_CM_EVENT_ADDR_RESOLVED");
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_CONNECT_REQUEST), "RDMA_CM_EVENT_CONNECT_REQUEST");
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_REJECTED), "RDMA_CM_EVENT_REJECTED");
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_TIMEWAIT_EXIT), "RDMA_CM_EVENT_TIMEWAIT_EXIT");
  for (int t = RDMA_CM_EVENT_ADDR_RESOLVED; t <= RDMA_CM_EVENT_TIMEWAIT_EXIT; ++t) {
    std::string s = rdma_event_str(static_cast<rdma_cm_event_type>(t));
    EXPECT_EQ(s.rfind("RDMA_CM_EVENT_", 0), 0u) << t;
  }
  EXPECT_STREQ(rdma_event_str(static_cast<rdma_cm_event_type>(99)), "UNKNOWN EVENT");
}

}  // namespace
}  // namespace cmtest
