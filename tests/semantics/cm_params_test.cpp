// librdmacm: connection parameters and their limits (rdma_accept(3), rdma_reject(3),
// rdma_set_option(3)): private data sizes, responder resources and initiator depth, retry counts
// and the ACK timeout as the QPs end up with them (ibv_query_qp), on both sides.
#include "support/cm_harness.h"

namespace cmtest {
namespace {

class CmParams : public CmTest {
 protected:
  // A listener and a resolved client with a QP; `client_` has sent its REQ with `cp` and the
  // passive side's request is in `req_`/`server_` when this returns.
  void Request(const rdma_conn_param& cp, rdma_port_space ps = RDMA_PS_TCP) {
    sch_ = Channel();
    cch_ = Channel();
    ASSERT_NE(Listen(sch_, &port_, ps), nullptr);
    client_ = Resolved(cch_, port_, ps);
    ASSERT_NE(client_, nullptr);
    ASSERT_TRUE(MakeQp(client_, ps == RDMA_PS_UDP ? IBV_QPT_UD : IBV_QPT_RC));
    rdma_conn_param copy = cp;
    ASSERT_EQ(rdma_connect(client_, &copy), 0) << strerror(errno);
    ASSERT_TRUE(Next(sch_, RDMA_CM_EVENT_CONNECT_REQUEST, &req_));
    server_ = Adopt(req_.id);
  }

  static rdma_conn_param Param(uint8_t resp = 1, uint8_t init = 1) {
    rdma_conn_param p{};
    p.responder_resources = resp;
    p.initiator_depth = init;
    p.retry_count = 7;
    p.rnr_retry_count = 7;
    return p;
  }

  ibv_device_attr DeviceAttr() {
    ibv_device_attr a{};
    EXPECT_EQ(ibv_query_device(client_->verbs, &a), 0);
    return a;
  }

  rdma_event_channel* sch_ = nullptr;
  rdma_event_channel* cch_ = nullptr;
  uint16_t port_ = 0;
  rdma_cm_id* client_ = nullptr;
  rdma_cm_id* server_ = nullptr;
  Event req_;
};

std::vector<uint8_t> Bytes(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(0xa0 ^ i);
  return v;
}

// ---- rdma_reject private data: 0, 196, 197 ----

TEST_F(CmParams, RejectWithoutPrivateData) {
  ASSERT_NO_FATAL_FAILURE(Request(Param()));
  ASSERT_EQ(rdma_reject(server_, nullptr, 0), 0) << strerror(errno);
  Event e;
  ASSERT_TRUE(Next(cch_, RDMA_CM_EVENT_REJECTED, &e));
  EXPECT_EQ(e.status, 28);
  // The transport may pad, but nothing the application gave is there: all zero if anything.
  for (uint8_t b : e.data) EXPECT_EQ(b, 0);
}

TEST_F(CmParams, RejectWith196BytesOfPrivateData) {
  ASSERT_NO_FATAL_FAILURE(Request(Param()));
  auto data = Bytes(196);
  ASSERT_EQ(rdma_reject(server_, data.data(), 196), 0) << strerror(errno);
  Event e;
  ASSERT_TRUE(Next(cch_, RDMA_CM_EVENT_REJECTED, &e));
  EXPECT_EQ(e.status, 28);
  ASSERT_GE(e.data.size(), 196u);
  EXPECT_TRUE(std::equal(data.begin(), data.end(), e.data.begin()));
}

// 197 bytes is refused before anything is sent: the active side hears nothing, and its answer
// comes from what the passive side does next.
TEST_F(CmParams, RejectWith197BytesIsRefusedAndSendsNothing) {
  ASSERT_NO_FATAL_FAILURE(Request(Param()));
  auto data = Bytes(197);
  errno = 0;
  EXPECT_EQ(rdma_reject(server_, data.data(), 197), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_TRUE(Quiet(cch_, milliseconds(300)));
  // The request is still pending: a later reject with valid data is what the client gets.
  auto small = Bytes(7);
  ASSERT_EQ(rdma_reject(server_, small.data(), 7), 0) << strerror(errno);
  Event e;
  ASSERT_TRUE(Next(cch_, RDMA_CM_EVENT_REJECTED, &e));
  ASSERT_GE(e.data.size(), 7u);
  EXPECT_TRUE(std::equal(small.begin(), small.end(), e.data.begin()));
}

TEST_F(CmParams, RejectWith197BytesThenAcceptEstablishes) {
  ASSERT_NO_FATAL_FAILURE(Request(Param()));
  auto data = Bytes(197);
  EXPECT_EQ(rdma_reject(server_, data.data(), 197), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_TRUE(Quiet(cch_));
  ASSERT_TRUE(MakeQp(server_));
  rdma_conn_param ap = Param();
  ASSERT_EQ(rdma_accept(server_, &ap), 0) << strerror(errno);
  EXPECT_TRUE(Next(cch_, RDMA_CM_EVENT_ESTABLISHED));
  EXPECT_TRUE(Next(sch_, RDMA_CM_EVENT_ESTABLISHED));
}

// ---- rdma_accept private data: 196 / 197 (PS_TCP), 136 / 137 (PS_UDP) ----

TEST_F(CmParams, AcceptWith196BytesOfPrivateData) {
  ASSERT_NO_FATAL_FAILURE(Request(Param()));
  ASSERT_TRUE(MakeQp(server_));
  auto data = Bytes(196);
  rdma_conn_param ap = Param();
  ap.private_data = data.data();
  ap.private_data_len = 196;
  ASSERT_EQ(rdma_accept(server_, &ap), 0) << strerror(errno);
  Event e;
  ASSERT_TRUE(Next(cch_, RDMA_CM_EVENT_ESTABLISHED, &e));
  ASSERT_GE(e.data.size(), 196u);
  EXPECT_TRUE(std::equal(data.begin(), data.end(), e.data.begin()));
  EXPECT_TRUE(Next(sch_, RDMA_CM_EVENT_ESTABLISHED));
}

TEST_F(CmParams, AcceptWith197BytesIsRefused) {
  ASSERT_NO_FATAL_FAILURE(Request(Param()));
  ASSERT_TRUE(MakeQp(server_));
  auto data = Bytes(197);
  rdma_conn_param ap = Param();
  ap.private_data = data.data();
  ap.private_data_len = 197;
  errno = 0;
  EXPECT_EQ(rdma_accept(server_, &ap), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_TRUE(Quiet(cch_));
  // Nothing changed: the same request can still be accepted.
  ap.private_data_len = 196;
  ASSERT_EQ(rdma_accept(server_, &ap), 0) << strerror(errno);
  EXPECT_TRUE(Next(cch_, RDMA_CM_EVENT_ESTABLISHED));
}

TEST_F(CmParams, UdAcceptPrivateData136Ok137Refused) {
  sch_ = Channel();
  cch_ = Channel();
  ASSERT_NE(Listen(sch_, &port_, RDMA_PS_UDP), nullptr);
  client_ = Resolved(cch_, port_, RDMA_PS_UDP);
  ASSERT_NE(client_, nullptr);
  ibv_qp_init_attr qa = RcAttr();
  qa.qp_type = IBV_QPT_UD;
  if (rdma_create_qp(client_, nullptr, &qa) != 0) {
    GTEST_SKIP() << "UD QPs on CM ids not available yet: " << strerror(errno);
  }
  rdma_conn_param cp{};
  if (rdma_connect(client_, &cp) != 0) {
    GTEST_SKIP() << "RDMA_PS_UDP connect (SIDR) not available yet: " << strerror(errno);
  }
  Event got = Take(sch_);
  if (!got.ok || got.type != RDMA_CM_EVENT_CONNECT_REQUEST) {
    GTEST_SKIP() << "RDMA_PS_UDP requests not reported yet: " << Describe(got);
  }
  server_ = Adopt(got.id);
  ASSERT_EQ(server_->qp_type, IBV_QPT_UD);
  qa = RcAttr();
  qa.qp_type = IBV_QPT_UD;
  ASSERT_EQ(rdma_create_qp(server_, nullptr, &qa), 0) << strerror(errno);
  auto data = Bytes(137);
  rdma_conn_param ap{};
  ap.private_data = data.data();
  ap.private_data_len = 137;
  errno = 0;
  EXPECT_EQ(rdma_accept(server_, &ap), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_TRUE(Quiet(cch_));
  ap.private_data_len = 136;
  ASSERT_EQ(rdma_accept(server_, &ap), 0) << strerror(errno);
  Event e;
  ASSERT_TRUE(Next(cch_, RDMA_CM_EVENT_ESTABLISHED, &e));
  EXPECT_EQ(e.status, 0);
  ASSERT_GE(e.data.size(), 136u);
  EXPECT_TRUE(std::equal(data.begin(), data.begin() + 136, e.data.begin()));
  EXPECT_EQ(e.ud.qp_num, server_->qp->qp_num);
  EXPECT_EQ(e.ud.qkey, RDMA_UDP_QKEY);
}

// ---- responder resources and initiator depth ----

// Accept with NULL conn_param (the QP is on the id): the request's values are taken, seen from
// this side: the server's QP serves as many reads as the client initiates, and initiates as many
// as the client serves.
TEST_F(CmParams, AcceptWithNullParamTakesTheRequestsValues) {
  ASSERT_NO_FATAL_FAILURE(Request(Param(/*resp=*/8, /*init=*/4)));
  ASSERT_TRUE(MakeQp(server_));
  ASSERT_EQ(rdma_accept(server_, nullptr), 0) << strerror(errno);
  ASSERT_TRUE(Next(cch_, RDMA_CM_EVENT_ESTABLISHED));
  ASSERT_TRUE(Next(sch_, RDMA_CM_EVENT_ESTABLISHED));
  ibv_qp_attr s = QueryQp(server_->qp);
  EXPECT_EQ(s.max_rd_atomic, 8);
  EXPECT_EQ(s.max_dest_rd_atomic, 4);
  ibv_qp_attr c = QueryQp(client_->qp);
  EXPECT_EQ(c.max_rd_atomic, 4);
  EXPECT_EQ(c.max_dest_rd_atomic, 8);
}

// The RDMA_MAX_* markers ask for the device's maxima; the passive side adjusts them to its own.
TEST_F(CmParams, AcceptWithNullParamAdjustsToDeviceLimits) {
  rdma_conn_param cp = Param(RDMA_MAX_RESP_RES, RDMA_MAX_INIT_DEPTH);
  ASSERT_NO_FATAL_FAILURE(Request(cp));
  ibv_device_attr dev = DeviceAttr();
  EXPECT_LE(req_.conn.responder_resources, dev.max_qp_rd_atom);
  EXPECT_LE(req_.conn.initiator_depth, dev.max_qp_init_rd_atom);
  ASSERT_TRUE(MakeQp(server_));
  ASSERT_EQ(rdma_accept(server_, nullptr), 0) << strerror(errno);
  ASSERT_TRUE(Next(cch_, RDMA_CM_EVENT_ESTABLISHED));
  ASSERT_TRUE(Next(sch_, RDMA_CM_EVENT_ESTABLISHED));
  ibv_qp_attr s = QueryQp(server_->qp);
  EXPECT_EQ(s.max_rd_atomic, std::min(dev.max_qp_init_rd_atom, 255));
  EXPECT_EQ(s.max_dest_rd_atomic, std::min(dev.max_qp_rd_atom, 255));
  ibv_qp_attr c = QueryQp(client_->qp);
  EXPECT_EQ(c.max_rd_atomic, s.max_dest_rd_atomic);
  EXPECT_EQ(c.max_dest_rd_atomic, s.max_rd_atomic);
}

TEST_F(CmParams, AcceptResponderResourcesAboveDeviceMaxIsRefused) {
  ASSERT_NO_FATAL_FAILURE(Request(Param(4, 4)));
  ASSERT_TRUE(MakeQp(server_));
  ibv_device_attr dev = DeviceAttr();
  ASSERT_LT(dev.max_qp_rd_atom, 255) << "no value above the device maximum to try";
  rdma_conn_param ap = Param(static_cast<uint8_t>(dev.max_qp_rd_atom + 1), 1);
  errno = 0;
  EXPECT_EQ(rdma_accept(server_, &ap), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_TRUE(Quiet(cch_));
  // At the maximum it is fine (above the request's value is allowed for responder resources).
  ap.responder_resources = static_cast<uint8_t>(dev.max_qp_rd_atom);
  ASSERT_EQ(rdma_accept(server_, &ap), 0) << strerror(errno);
  ASSERT_TRUE(Next(cch_, RDMA_CM_EVENT_ESTABLISHED));
  EXPECT_EQ(QueryQp(server_->qp).max_dest_rd_atomic, dev.max_qp_rd_atom);
}

TEST_F(CmParams, AcceptInitiatorDepthAboveTheRequestsIsRefused) {
  // The client serves 4 reads: the server may initiate at most 4.
  ASSERT_NO_FATAL_FAILURE(Request(Param(/*resp=*/4, /*init=*/2)));
  EXPECT_EQ(req_.conn.initiator_depth, 4);
  ASSERT_TRUE(MakeQp(server_));
  rdma_conn_param ap = Param(2, 5);
  errno = 0;
  EXPECT_EQ(rdma_accept(server_, &ap), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_TRUE(Quiet(cch_));
  ap.initiator_depth = 4;
  ASSERT_EQ(rdma_accept(server_, &ap), 0) << strerror(errno);
  ASSERT_TRUE(Next(cch_, RDMA_CM_EVENT_ESTABLISHED));
  EXPECT_EQ(QueryQp(server_->qp).max_rd_atomic, 4);
  EXPECT_EQ(QueryQp(client_->qp).max_dest_rd_atomic, 4);
}

TEST_F(CmParams, ConnectResourcesAboveDeviceMaxAreRefused) {
  sch_ = Channel();
  cch_ = Channel();
  ASSERT_NE(Listen(sch_, &port_), nullptr);
  client_ = Resolved(cch_, port_);
  ASSERT_NE(client_, nullptr);
  ASSERT_TRUE(MakeQp(client_));
  ibv_device_attr dev = DeviceAttr();
  rdma_conn_param cp = Param(static_cast<uint8_t>(dev.max_qp_rd_atom + 1), 1);
  EXPECT_EQ(rdma_connect(client_, &cp), -1);
  EXPECT_EQ(errno, EINVAL);
  cp = Param(1, static_cast<uint8_t>(dev.max_qp_init_rd_atom + 1));
  EXPECT_EQ(rdma_connect(client_, &cp), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_TRUE(Quiet(sch_));
}

// ---- retry counts (IB semantics: connect's rnr_retry_count goes to the passive QP, accept's to
// the active QP; retry_count is the active side's and applies to both) ----

TEST_F(CmParams, RetryAndRnrRetryCountsReachTheRightQps) {
  rdma_conn_param cp = Param();
  cp.retry_count = 3;
  cp.rnr_retry_count = 2;
  ASSERT_NO_FATAL_FAILURE(Request(cp));
  EXPECT_EQ(req_.conn.rnr_retry_count, 2);
  EXPECT_EQ(req_.conn.retry_count, 3);
  ASSERT_TRUE(MakeQp(server_));
  rdma_conn_param ap = Param();
  ap.retry_count = 1;  // ignored (rdma_accept(3))
  ap.rnr_retry_count = 5;
  ASSERT_EQ(rdma_accept(server_, &ap), 0) << strerror(errno);
  ASSERT_TRUE(Next(cch_, RDMA_CM_EVENT_ESTABLISHED));
  ASSERT_TRUE(Next(sch_, RDMA_CM_EVENT_ESTABLISHED));
  ibv_qp_attr c = QueryQp(client_->qp);
  ibv_qp_attr s = QueryQp(server_->qp);
  EXPECT_EQ(c.rnr_retry, 5);
  EXPECT_EQ(s.rnr_retry, 2);
  EXPECT_EQ(c.retry_cnt, 3);
  EXPECT_EQ(s.retry_cnt, 3);
}

TEST_F(CmParams, AckTimeoutOptionIsTheQpTimeout) {
  sch_ = Channel();
  cch_ = Channel();
  ASSERT_NE(Listen(sch_, &port_), nullptr);
  client_ = Resolved(cch_, port_);
  ASSERT_NE(client_, nullptr);
  uint8_t t = 19;
  ASSERT_EQ(rdma_set_option(client_, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &t, sizeof t), 0)
      << strerror(errno);
  ASSERT_TRUE(MakeQp(client_));
  rdma_cm_id* server = Establish(client_, sch_);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(QueryQp(client_->qp).timeout, 19);
  // The other side keeps its own default.
  EXPECT_NE(QueryQp(server->qp).timeout, 19);
  // rdma_init_qp_attr reports the same.
  ibv_qp_attr a{};
  int mask = 0;
  a.qp_state = IBV_QPS_RTS;
  ASSERT_EQ(rdma_init_qp_attr(client_, &a, &mask), 0);
  EXPECT_TRUE(mask & IBV_QP_TIMEOUT);
  EXPECT_EQ(a.timeout, 19);
}

// Set on the listener, the option is inherited by the ids of its requests.
TEST_F(CmParams, AckTimeoutOnTheListenerReachesAcceptedQps) {
  sch_ = Channel();
  cch_ = Channel();
  rdma_cm_id* listen = Listen(sch_, &port_);
  ASSERT_NE(listen, nullptr);
  uint8_t t = 9;
  ASSERT_EQ(rdma_set_option(listen, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &t, sizeof t), 0);
  client_ = Resolved(cch_, port_);
  ASSERT_NE(client_, nullptr);
  ASSERT_TRUE(MakeQp(client_));
  rdma_cm_id* server = Establish(client_, sch_);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(QueryQp(server->qp).timeout, 9);
  EXPECT_NE(QueryQp(client_->qp).timeout, 9);
}

TEST_F(CmParams, SetOptionRefusesBadSizes) {
  rdma_event_channel* ch = Channel();
  rdma_cm_id* id = NewId(ch);
  ASSERT_NE(id, nullptr);
  uint8_t u8 = 1;
  int i32 = 1;
  uint64_t u64 = 1;
  struct Case {
    int name;
    void* val;
    size_t len;
  };
  for (Case c : {Case{RDMA_OPTION_ID_TOS, &i32, sizeof i32}, Case{RDMA_OPTION_ID_TOS, &u8, 0},
                 Case{RDMA_OPTION_ID_REUSEADDR, &u8, sizeof u8},
                 Case{RDMA_OPTION_ID_REUSEADDR, &u64, sizeof u64},
                 Case{RDMA_OPTION_ID_AFONLY, &u8, sizeof u8},
                 Case{RDMA_OPTION_ID_ACK_TIMEOUT, &i32, sizeof i32},
                 Case{RDMA_OPTION_ID_ACK_TIMEOUT, &u8, 0}}) {
    errno = 0;
    EXPECT_EQ(rdma_set_option(id, RDMA_OPTION_ID, c.name, c.val, c.len), -1)
        << "option " << c.name << " len " << c.len;
    EXPECT_EQ(errno, EINVAL) << "option " << c.name << " len " << c.len;
  }
  errno = 0;
  EXPECT_EQ(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, nullptr, 1), -1);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(rdma_set_option(id, RDMA_OPTION_IB, RDMA_OPTION_IB_PATH, &u8, 1), -1);
  EXPECT_EQ(errno, EINVAL);
  // The right sizes are accepted.
  EXPECT_EQ(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &u8, sizeof u8), 0);
  EXPECT_EQ(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &i32, sizeof i32), 0);
  EXPECT_EQ(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &i32, sizeof i32), 0);
  EXPECT_EQ(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &u8, sizeof u8), 0);
}

}  // namespace
}  // namespace cmtest
