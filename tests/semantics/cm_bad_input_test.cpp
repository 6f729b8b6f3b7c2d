// librdmacm: hostile input on the CM service. A raw TCP client (a plain socket, no librdmacm)
// connects to the CM service of this process's listener, found as `listen <port>` in its claim
// under $SOFTRDMA_RUNDIR/cm, and sends truncated, oversized and garbage messages: the service drops
// that channel and nothing else, and the listener keeps serving real connections. A well-formed
// raw REQ also shows how rdma_accept(NULL) adjusts a request's values to the device's limits.
#include <dirent.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <fstream>
#include <sstream>

#include "support/cm_harness.h"
#include "support/cm_raw_client.h"

namespace cmtest {
namespace {

class CmBadInput : public CmTest {
 protected:
  void SetUp() override {
    sch_ = Channel();
    listen_ = Listen(sch_, &port_);
    ASSERT_NE(listen_, nullptr);
    service_ = ServicePortOf(port_);
    ASSERT_NE(service_, 0) << "no `listen <port>` for our listener under $SOFTRDMA_RUNDIR/cm";
  }

  // A real connection through the same listener still works, and the listener reported nothing
  // for the hostile channels.
  void ListenerStillServes() {
    EXPECT_TRUE(Quiet(sch_));
    rdma_event_channel* cch = Channel();
    rdma_cm_id* client = Resolved(cch, port_);
    ASSERT_NE(client, nullptr);
    ASSERT_TRUE(MakeQp(client));
    rdma_cm_id* server = Establish(client, sch_);
    ASSERT_NE(server, nullptr);
    ASSERT_EQ(rdma_disconnect(client), 0);
    EXPECT_TRUE(Next(cch, RDMA_CM_EVENT_DISCONNECTED));
    EXPECT_TRUE(Next(sch_, RDMA_CM_EVENT_DISCONNECTED));
  }

  rdma_event_channel* sch_ = nullptr;
  rdma_cm_id* listen_ = nullptr;
  uint16_t port_ = 0;
  uint16_t service_ = 0;
};

TEST_F(CmBadInput, GarbageIsDropped) {
  RawClient raw(service_);
  ASSERT_TRUE(raw.ok());
  ASSERT_TRUE(raw.Send(Garbage()));
  EXPECT_TRUE(raw.ClosedByPeer());
  ListenerStillServes();
}

TEST_F(CmBadInput, OversizedMessageIsDropped) {
  RawClient raw(service_);
  ASSERT_TRUE(raw.ok());
  ASSERT_TRUE(raw.Send(Hello()));
  auto big = Header(wire::MsgType::kReq, 0xffff, 1, 0);
  big.resize(2000, 0xee);
  ASSERT_TRUE(raw.Send(big));
  EXPECT_TRUE(raw.ClosedByPeer());
  ListenerStillServes();
}

TEST_F(CmBadInput, TruncatedMessageThenCloseIsDropped) {
  RawClient raw(service_);
  ASSERT_TRUE(raw.ok());
  ASSERT_TRUE(raw.Send(Hello()));
  auto req = Req(5, port_, 1, 1);
  req.resize(30);  // the header promises more than ever comes
  ASSERT_TRUE(raw.Send(req));
  raw.ShutdownWrite();
  EXPECT_TRUE(raw.ClosedByPeer());
  ListenerStillServes();
}

// A channel that stalls mid-message holds nothing up: other channels are served meanwhile.
TEST_F(CmBadInput, StalledPartialMessageDoesNotBlockOthers) {
  RawClient raw(service_);
  ASSERT_TRUE(raw.ok());
  ASSERT_TRUE(raw.Send(Hello()));
  auto req = Req(6, port_, 1, 1);
  req.resize(sizeof(wire::MsgHeader) + 10);
  ASSERT_TRUE(raw.Send(req));
  ListenerStillServes();
}

TEST_F(CmBadInput, MessageBeforeHelloIsDropped) {
  RawClient raw(service_);
  ASSERT_TRUE(raw.ok());
  ASSERT_TRUE(raw.Send(Req(7, port_, 1, 1)));
  EXPECT_TRUE(raw.ClosedByPeer());
  ListenerStillServes();
}

TEST_F(CmBadInput, PrivateDataLengthMismatchIsDropped) {
  RawClient raw(service_);
  ASSERT_TRUE(raw.ok());
  ASSERT_TRUE(raw.Send(Hello()));
  ASSERT_TRUE(raw.Send(Req(8, port_, 1, 1, /*declared=*/40, /*actual=*/0)));
  EXPECT_TRUE(raw.ClosedByPeer());
  ListenerStillServes();
}

TEST_F(CmBadInput, WrongHelloMagicIsDropped) {
  RawClient raw(service_);
  ASSERT_TRUE(raw.ok());
  auto hello = Hello();
  hello[sizeof(wire::MsgHeader)] ^= 0xff;
  ASSERT_TRUE(raw.Send(hello));
  EXPECT_TRUE(raw.ClosedByPeer());
  ListenerStillServes();
}

// Messages for connections that do not exist are ignored without costing the channel.
TEST_F(CmBadInput, StrayMessagesForUnknownIdsAreIgnored) {
  RawClient raw(service_);
  ASSERT_TRUE(raw.ok());
  ASSERT_TRUE(raw.Send(Hello()));
  std::vector<uint8_t> m;
  ASSERT_TRUE(raw.ReadMessage(&m));  // the service's Hello
  EXPECT_EQ(m[1], static_cast<uint8_t>(wire::MsgType::kHello));
  for (auto t : {wire::MsgType::kRtu, wire::MsgType::kDrep}) {
    ASSERT_TRUE(raw.Send(Header(t, sizeof(wire::MsgHeader), 9, 0x7fffff00)));
  }
  // A DREQ for an unknown id is answered (DREP), as IB CM does.
  ASSERT_TRUE(raw.Send(Header(wire::MsgType::kDreq, sizeof(wire::MsgHeader), 9, 0x7fffff00)));
  ASSERT_TRUE(raw.ReadMessage(&m));
  EXPECT_EQ(m[1], static_cast<uint8_t>(wire::MsgType::kDrep));
  // A REQ for a port nobody listens on is rejected, and the channel stays up.
  uint16_t other = static_cast<uint16_t>(port_ == 65535 ? 65534 : port_ + 1);
  ASSERT_TRUE(raw.Send(Req(10, other, 1, 1)));
  ASSERT_TRUE(raw.ReadMessage(&m));
  ASSERT_EQ(m[1], static_cast<uint8_t>(wire::MsgType::kRej));
  EXPECT_EQ(Get32(m.data() + 8), 10u);  // to our sender id
  EXPECT_EQ(Get32(m.data() + sizeof(wire::MsgHeader)), wire::kRejNoListener);
  EXPECT_FALSE(raw.ClosedByPeer(kQuiet));
  ListenerStillServes();
}

// rdma_accept(NULL) takes the request's values adjusted down to the device's limits: a REQ asking
// the server to serve 3 reads and offering to serve 200 gives the server's QP
// max_dest_rd_atomic 3 and max_rd_atomic min(200, max_qp_init_rd_atom).
TEST_F(CmBadInput, AcceptWithNullParamClampsARequestAboveTheDeviceLimits) {
  RawClient raw(service_);
  ASSERT_TRUE(raw.ok());
  ASSERT_TRUE(raw.Send(Hello()));
  std::vector<uint8_t> m;
  ASSERT_TRUE(raw.ReadMessage(&m));
  ASSERT_TRUE(raw.Send(Req(11, port_, /*resp=*/200, /*init=*/3)));
  Event req;
  ASSERT_TRUE(Next(sch_, RDMA_CM_EVENT_CONNECT_REQUEST, &req));
  rdma_cm_id* server = Adopt(req.id);
  EXPECT_EQ(req.conn.initiator_depth, 200);  // as asked; accept adjusts it
  EXPECT_EQ(req.conn.responder_resources, 3);
  EXPECT_EQ(req.conn.qp_num, 0x1234u);
  ASSERT_TRUE(MakeQp(server));
  ibv_device_attr dev{};
  ASSERT_EQ(ibv_query_device(server->verbs, &dev), 0);
  ASSERT_LT(dev.max_qp_init_rd_atom, 200) << "the device allows 200: nothing to adjust";
  ASSERT_EQ(rdma_accept(server, nullptr), 0) << strerror(errno);
  ibv_qp_attr q = QueryQp(server->qp);
  EXPECT_EQ(q.max_rd_atomic, dev.max_qp_init_rd_atom);
  EXPECT_EQ(q.max_dest_rd_atomic, 3);
  EXPECT_EQ(q.dest_qp_num, 0x1234u);
  EXPECT_EQ(q.rq_psn, 0x777u);

  // The REP tells the requester the same.
  ASSERT_TRUE(raw.ReadMessage(&m));
  ASSERT_EQ(m[1], static_cast<uint8_t>(wire::MsgType::kRep));
  ASSERT_GE(m.size(), sizeof(wire::MsgHeader) + sizeof(wire::RepBody));
  const auto* rep = reinterpret_cast<const wire::RepBody*>(m.data() + sizeof(wire::MsgHeader));
  EXPECT_EQ(rep->end.responder_resources, 3);
  EXPECT_EQ(rep->end.initiator_depth, dev.max_qp_init_rd_atom);
  EXPECT_EQ(Get32(rep->end.qpn), server->qp->qp_num);
  uint32_t server_comm = Get32(m.data() + 4);
  // RTU: established.
  ASSERT_TRUE(raw.Send(Header(wire::MsgType::kRtu, sizeof(wire::MsgHeader), 11, server_comm)));
  ASSERT_TRUE(Next(sch_, RDMA_CM_EVENT_ESTABLISHED));
  // The raw peer vanishes: the connection is DISCONNECTED.
  raw.ShutdownWrite();
  ASSERT_TRUE(Next(sch_, RDMA_CM_EVENT_DISCONNECTED));
  ListenerStillServes();
}

}  // namespace
}  // namespace cmtest
