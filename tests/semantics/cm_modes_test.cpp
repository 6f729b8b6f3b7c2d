// librdmacm: the ways of driving ids besides an event channel per id: synchronous ids
// (rdma_create_id(3) with a NULL channel), rdma_migrate_id with events pending, and
// rdma_create_ep/rdma_get_request (rdma_create_ep(3)).
#include <future>

#include "support/cm_harness.h"

namespace cmtest {
namespace {

class CmSync : public CmTest {};
class CmMigrate : public CmTest {};
class CmEndpoint : public CmTest {};

// Runs a blocking call on another thread and waits at most `timeout` for it. A call that never
// returns cannot be cancelled: the test process is ended so the suite fails instead of hanging.
template <typename Fn>
auto Bounded(Fn fn, milliseconds timeout = kWait) {
  auto f = std::async(std::launch::async, fn);
  if (f.wait_for(timeout) != std::future_status::ready) {
    fprintf(stderr, "a blocking rdma_* call did not return within %lld ms\n",
            static_cast<long long>(timeout.count()));
    fflush(stderr);
    std::abort();
  }
  return f.get();
}

struct Result {
  int ret;
  int err;
};

// ---- synchronous ids ----

TEST_F(CmSync, ResolveBlocksAndLeavesTheEventInTheId) {
  rdma_cm_id* id = NewId(nullptr);
  ASSERT_NE(id, nullptr);
  EXPECT_NE(id->channel, nullptr);  // a private channel
  sockaddr_storage dst = Ip("127.0.0.1", NextPort());
  Result r = Bounded([&] {
    int ret = rdma_resolve_addr(id, nullptr, Sa(&dst), 2000);
    return Result{ret, errno};
  });
  ASSERT_EQ(r.ret, 0) << strerror(r.err);
  ASSERT_NE(id->event, nullptr);
  EXPECT_EQ(id->event->event, RDMA_CM_EVENT_ADDR_RESOLVED);
  EXPECT_EQ(id->event->status, 0);
  EXPECT_EQ(id->event->id, id);
  EXPECT_NE(id->verbs, nullptr);
  r = Bounded([&] {
    int ret = rdma_resolve_route(id, 2000);
    return Result{ret, errno};
  });
  ASSERT_EQ(r.ret, 0) << strerror(r.err);
  ASSERT_NE(id->event, nullptr);
  EXPECT_EQ(id->event->event, RDMA_CM_EVENT_ROUTE_RESOLVED);
}

TEST_F(CmSync, ResolveOfAnAddressNobodyOwnsFailsWithinItsTimeout) {
  rdma_cm_id* id = NewId(nullptr);
  ASSERT_NE(id, nullptr);
  sockaddr_storage dst = Ip("198.51.100.9", NextPort());
  if (NetworkAnswersFor(dst, 300)) GTEST_SKIP() << "this network answers for 198.51.100.9";
  auto t0 = Clock::now();
  Result r = Bounded([&] {
    int ret = rdma_resolve_addr(id, nullptr, Sa(&dst), 300);
    return Result{ret, errno};
  });
  EXPECT_LE(MsSince(t0), 1000);
  EXPECT_EQ(r.ret, -1);
  EXPECT_TRUE(r.err == ETIMEDOUT || r.err == ENETUNREACH) << strerror(r.err);
  ASSERT_NE(id->event, nullptr);
  EXPECT_EQ(id->event->event, RDMA_CM_EVENT_ADDR_ERROR);
}

TEST_F(CmSync, ConnectReturnsEconnrefusedOnRejectWithTheRejectionInTheId) {
  rdma_event_channel* sch = Channel();
  uint16_t port = 0;
  ASSERT_NE(Listen(sch, &port), nullptr);
  rdma_cm_id* client = NewId(nullptr);
  ASSERT_NE(client, nullptr);
  sockaddr_storage dst = Ip("127.0.0.1", port);
  ASSERT_EQ(rdma_resolve_addr(client, nullptr, Sa(&dst), 2000), 0);
  ASSERT_EQ(rdma_resolve_route(client, 2000), 0);
  ASSERT_TRUE(MakeQp(client));

  // The passive side answers from this thread while the client blocks in rdma_connect.
  const char kWhy[] = "go away";
  auto connect = std::async(std::launch::async, [&] {
    rdma_conn_param cp{};
    cp.responder_resources = cp.initiator_depth = 1;
    int ret = rdma_connect(client, &cp);
    return Result{ret, errno};
  });
  Event req;
  ASSERT_TRUE(Next(sch, RDMA_CM_EVENT_CONNECT_REQUEST, &req));
  Adopt(req.id);
  ASSERT_EQ(rdma_reject(req.id, kWhy, sizeof kWhy), 0);
  ASSERT_EQ(connect.wait_for(kWait), std::future_status::ready);
  Result r = connect.get();
  EXPECT_EQ(r.ret, -1);
  EXPECT_EQ(r.err, ECONNREFUSED);
  ASSERT_NE(client->event, nullptr);
  EXPECT_EQ(client->event->event, RDMA_CM_EVENT_REJECTED);
  EXPECT_EQ(client->event->status, 28);
  ASSERT_GE(client->event->param.conn.private_data_len, sizeof kWhy);
  EXPECT_EQ(std::memcmp(client->event->param.conn.private_data, kWhy, sizeof kWhy), 0);
}

TEST_F(CmSync, ConnectToNothingReturnsEconnrefused) {
  rdma_cm_id* client = NewId(nullptr);
  ASSERT_NE(client, nullptr);
  sockaddr_storage dst = Ip("127.0.0.1", NextPort());
  ASSERT_EQ(rdma_resolve_addr(client, nullptr, Sa(&dst), 2000), 0);
  ASSERT_EQ(rdma_resolve_route(client, 2000), 0);
  ASSERT_TRUE(MakeQp(client));
  Result r = Bounded([&] {
    rdma_conn_param cp{};
    int ret = rdma_connect(client, &cp);
    return Result{ret, errno};
  });
  EXPECT_EQ(r.ret, -1);
  EXPECT_EQ(r.err, ECONNREFUSED);
  ASSERT_NE(client->event, nullptr);
  EXPECT_EQ(client->event->event, RDMA_CM_EVENT_UNREACHABLE);
}

TEST_F(CmSync, ConnectAcceptedThenDisconnectBlocksUntilDisconnected) {
  rdma_event_channel* sch = Channel();
  uint16_t port = 0;
  ASSERT_NE(Listen(sch, &port), nullptr);
  rdma_cm_id* client = NewId(nullptr);
  ASSERT_NE(client, nullptr);
  sockaddr_storage dst = Ip("127.0.0.1", port);
  ASSERT_EQ(rdma_resolve_addr(client, nullptr, Sa(&dst), 2000), 0);
  ASSERT_EQ(rdma_resolve_route(client, 2000), 0);
  ASSERT_TRUE(MakeQp(client));
  auto connect = std::async(std::launch::async, [&] {
    rdma_conn_param cp{};
    cp.responder_resources = cp.initiator_depth = 1;
    int ret = rdma_connect(client, &cp);
    return Result{ret, errno};
  });
  Event req;
  ASSERT_TRUE(Next(sch, RDMA_CM_EVENT_CONNECT_REQUEST, &req));
  rdma_cm_id* server = Adopt(req.id);
  ASSERT_TRUE(MakeQp(server));
  ASSERT_EQ(rdma_accept(server, nullptr), 0) << strerror(errno);
  ASSERT_EQ(connect.wait_for(kWait), std::future_status::ready);
  Result r = connect.get();
  ASSERT_EQ(r.ret, 0) << strerror(r.err);
  ASSERT_NE(client->event, nullptr);
  EXPECT_EQ(client->event->event, RDMA_CM_EVENT_ESTABLISHED);
  ASSERT_TRUE(Next(sch, RDMA_CM_EVENT_ESTABLISHED));

  r = Bounded([&] {
    int ret = rdma_disconnect(client);
    return Result{ret, errno};
  });
  EXPECT_EQ(r.ret, 0) << strerror(r.err);
  ASSERT_NE(client->event, nullptr);
  EXPECT_EQ(client->event->event, RDMA_CM_EVENT_DISCONNECTED);
  EXPECT_TRUE(Next(sch, RDMA_CM_EVENT_DISCONNECTED));
}

// ---- rdma_migrate_id ----

TEST_F(CmMigrate, PendingEventsMoveToTheNewChannel) {
  rdma_event_channel* ch1 = Channel();
  rdma_event_channel* ch2 = Channel();
  rdma_cm_id* a = NewId(ch1);
  rdma_cm_id* b = NewId(ch1);
  ASSERT_TRUE(a && b);
  uint16_t port = NextPort();
  sockaddr_storage dst = Ip("127.0.0.1", port);
  ASSERT_EQ(rdma_resolve_addr(a, nullptr, Sa(&dst), 2000), 0);
  ASSERT_EQ(rdma_resolve_addr(b, nullptr, Sa(&dst), 2000), 0);
  ASSERT_EQ(rdma_resolve_route(a, 2000), 0);  // a now has two events pending on ch1
  ASSERT_TRUE(Readable(ch1->fd, kWait));

  ASSERT_EQ(rdma_migrate_id(a, ch2), 0) << strerror(errno);
  EXPECT_EQ(a->channel, ch2);
  Event e;
  ASSERT_TRUE(Next(ch2, RDMA_CM_EVENT_ADDR_RESOLVED, &e));
  EXPECT_EQ(e.id, a);
  ASSERT_TRUE(Next(ch2, RDMA_CM_EVENT_ROUTE_RESOLVED, &e));
  EXPECT_EQ(e.id, a);
  EXPECT_TRUE(Quiet(ch2));
  // The old channel keeps b's event and no longer reports a's.
  ASSERT_TRUE(Next(ch1, RDMA_CM_EVENT_ADDR_RESOLVED, &e));
  EXPECT_EQ(e.id, b);
  EXPECT_TRUE(Quiet(ch1));

  // Later events of a arrive on the new channel.
  ASSERT_TRUE(MakeQp(a));
  rdma_conn_param cp{};
  cp.responder_resources = cp.initiator_depth = 1;
  ASSERT_EQ(rdma_connect(a, &cp), 0);
  ASSERT_TRUE(Next(ch2, RDMA_CM_EVENT_UNREACHABLE, &e));
  EXPECT_EQ(e.id, a);
  EXPECT_TRUE(Quiet(ch1));
}

// A listener migrated with a connection request pending: the request moves, and so does the new
// id that comes with it (rdma-core makes it on the listener's channel when the request is read).
TEST_F(CmMigrate, ListenerWithAPendingRequestTakesItAlong) {
  rdma_event_channel* ch1 = Channel();
  rdma_event_channel* ch2 = Channel();
  rdma_event_channel* cch = Channel();
  uint16_t port = 0;
  rdma_cm_id* listen = Listen(ch1, &port);
  ASSERT_NE(listen, nullptr);
  rdma_cm_id* client = Resolved(cch, port);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(MakeQp(client));
  rdma_conn_param cp{};
  cp.responder_resources = cp.initiator_depth = 1;
  ASSERT_EQ(rdma_connect(client, &cp), 0);
  ASSERT_TRUE(Readable(ch1->fd, kWait));  // the request is pending on ch1

  ASSERT_EQ(rdma_migrate_id(listen, ch2), 0) << strerror(errno);
  EXPECT_TRUE(Quiet(ch1));
  Event req;
  ASSERT_TRUE(Next(ch2, RDMA_CM_EVENT_CONNECT_REQUEST, &req));
  EXPECT_EQ(req.listen_id, listen);
  rdma_cm_id* server = Adopt(req.id);
  EXPECT_EQ(server->channel, ch2);
  ASSERT_TRUE(MakeQp(server));
  ASSERT_EQ(rdma_accept(server, nullptr), 0);
  ASSERT_TRUE(Next(cch, RDMA_CM_EVENT_ESTABLISHED));
  EXPECT_TRUE(Next(ch2, RDMA_CM_EVENT_ESTABLISHED));
  EXPECT_TRUE(Quiet(ch1));
}

// ---- rdma_create_ep / rdma_get_request ----

rdma_addrinfo* AddrInfo(const char* node, uint16_t port, bool passive) {
  rdma_addrinfo hints{};
  hints.ai_flags = passive ? RAI_PASSIVE : 0;
  hints.ai_port_space = RDMA_PS_TCP;
  rdma_addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  if (rdma_getaddrinfo(node, service.c_str(), &hints, &res) != 0) return nullptr;
  return res;
}

// Passive: rdma_create_ep keeps the pd and QP attributes, and every id rdma_get_request returns
// has a QP made with them. Active: the QP is made at once, on the default PD when none is given.
TEST_F(CmEndpoint, PassiveEndpointGivesEachRequestAQpActiveUsesTheDefaultPd) {
  int n = 0;
  ibv_context** devs = rdma_get_devices(&n);
  ASSERT_NE(devs, nullptr);
  ASSERT_GE(n, 1);
  ibv_pd* pd = ibv_alloc_pd(devs[0]);
  ASSERT_NE(pd, nullptr);

  ibv_qp_init_attr attr = RcAttr();
  attr.cap.max_send_wr = 5;
  attr.cap.max_recv_wr = 6;
  attr.sq_sig_all = 1;
  rdma_cm_id* listen = nullptr;
  uint16_t port = 0;
  for (int tries = 0; tries < 50 && !listen; ++tries) {
    port = NextPort();
    rdma_addrinfo* res = AddrInfo("127.0.0.1", port, true);
    ASSERT_NE(res, nullptr);
    ibv_qp_init_attr a = attr;
    int ret = rdma_create_ep(&listen, res, pd, &a);
    int err = errno;
    rdma_freeaddrinfo(res);
    if (ret != 0) {
      ASSERT_EQ(err, EADDRINUSE) << strerror(err);
      listen = nullptr;
    }
  }
  ASSERT_NE(listen, nullptr);
  EXPECT_EQ(listen->qp, nullptr);  // a passive endpoint has no QP of its own
  ASSERT_EQ(rdma_listen(listen, 4), 0) << strerror(errno);

  std::vector<rdma_cm_id*> clients, servers;
  for (int i = 0; i < 2; ++i) {
    rdma_addrinfo* res = AddrInfo("127.0.0.1", port, false);
    ASSERT_NE(res, nullptr);
    rdma_cm_id* client = nullptr;
    ibv_qp_init_attr a = attr;
    Result r = Bounded([&] {
      int ret = rdma_create_ep(&client, res, nullptr, &a);
      return Result{ret, errno};
    });
    rdma_freeaddrinfo(res);
    ASSERT_EQ(r.ret, 0) << strerror(r.err);
    clients.push_back(client);
    ASSERT_NE(client->qp, nullptr);
    ASSERT_NE(client->pd, nullptr);
    EXPECT_EQ(client->qp->pd, client->pd);
    EXPECT_NE(client->pd, pd);  // the default PD, not the passive side's
    EXPECT_NE(client->send_cq, nullptr);
    EXPECT_NE(client->recv_cq, nullptr);

    auto connect = std::async(std::launch::async, [&] {
      int ret = rdma_connect(client, nullptr);
      return Result{ret, errno};
    });
    ASSERT_TRUE(Readable(listen->channel->fd, kWait)) << "no request for the passive endpoint";
    rdma_cm_id* server = nullptr;
    ASSERT_EQ(rdma_get_request(listen, &server), 0) << strerror(errno);
    servers.push_back(server);
    ASSERT_NE(server->qp, nullptr);
    EXPECT_EQ(server->qp->pd, pd);
    ASSERT_NE(server->event, nullptr);
    EXPECT_EQ(server->event->event, RDMA_CM_EVENT_CONNECT_REQUEST);
    ibv_qp_attr qa{};
    ibv_qp_init_attr qi{};
    ASSERT_EQ(ibv_query_qp(server->qp, &qa, IBV_QP_CAP, &qi), 0);
    EXPECT_GE(qi.cap.max_send_wr, 5u);
    EXPECT_GE(qi.cap.max_recv_wr, 6u);
    EXPECT_EQ(qi.sq_sig_all, 1);
    r = Bounded([&] {
      int ret = rdma_accept(server, nullptr);
      return Result{ret, errno};
    });
    ASSERT_EQ(r.ret, 0) << strerror(r.err);
    ASSERT_EQ(connect.wait_for(kWait), std::future_status::ready);
    r = connect.get();
    ASSERT_EQ(r.ret, 0) << strerror(r.err);
    EXPECT_EQ(QueryQp(client->qp).qp_state, IBV_QPS_RTS);
    EXPECT_EQ(QueryQp(server->qp).qp_state, IBV_QPS_RTS);
    EXPECT_EQ(QueryQp(client->qp).dest_qp_num, server->qp->qp_num);
  }
  EXPECT_NE(servers[0]->qp, servers[1]->qp);
  for (rdma_cm_id* id : servers) rdma_destroy_ep(id);
  for (rdma_cm_id* id : clients) rdma_destroy_ep(id);
  rdma_destroy_ep(listen);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
  rdma_free_devices(devs);
}

TEST_F(CmEndpoint, GetRequestNeedsASynchronousListener) {
  rdma_event_channel* ch = Channel();
  uint16_t port = 0;
  rdma_cm_id* listen = Listen(ch, &port);
  ASSERT_NE(listen, nullptr);
  rdma_cm_id* out = nullptr;
  errno = 0;
  EXPECT_EQ(rdma_get_request(listen, &out), -1);
  EXPECT_EQ(errno, EINVAL);
}

}  // namespace
}  // namespace cmtest
