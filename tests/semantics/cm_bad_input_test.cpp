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

#include "cm/cm_wire.h"
#include "support/cm_harness.h"

namespace cmtest {
namespace {

namespace wire = softrdma::cm;

void Put16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
}
void Put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (24 - 8 * i));
}
uint32_t Get32(const uint8_t* p) {
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3];
}

std::vector<uint8_t> Header(wire::MsgType type, size_t len, uint32_t sender, uint32_t receiver) {
  std::vector<uint8_t> m(sizeof(wire::MsgHeader), 0);
  auto* h = reinterpret_cast<wire::MsgHeader*>(m.data());
  h->version = wire::kCmWireVersion;
  h->type = static_cast<uint8_t>(type);
  Put16(h->length, static_cast<uint16_t>(len));
  Put32(h->sender_id, sender);
  Put32(h->receiver_id, receiver);
  return m;
}

std::vector<uint8_t> Hello() {
  auto m = Header(wire::MsgType::kHello, sizeof(wire::MsgHeader) + sizeof(wire::HelloBody), 0, 0);
  wire::HelloBody b{};
  Put32(b.magic, wire::kCmMagic);
  auto* p = reinterpret_cast<uint8_t*>(&b);
  m.insert(m.end(), p, p + sizeof b);
  return m;
}

void PutLoopback4(wire::WireAddr* a, uint16_t port) {
  a->family = 4;
  Put16(a->port, port);
  static const uint8_t kMapped[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1};
  std::memcpy(a->ip, kMapped, 16);
}

// A REQ for 127.0.0.1:`port` in RDMA_PS_TCP from "QP" `qpn`.
std::vector<uint8_t> Req(uint32_t sender, uint16_t port, uint8_t resp, uint8_t init,
                         uint8_t declared_private = 0, size_t actual_private = 0) {
  size_t len = sizeof(wire::MsgHeader) + sizeof(wire::ReqBody) + actual_private;
  auto m = Header(wire::MsgType::kReq, len, sender, 0);
  wire::ReqBody b{};
  Put16(b.port_space, RDMA_PS_TCP);
  b.qp_type = IBV_QPT_RC;
  PutLoopback4(&b.src, 40000);
  PutLoopback4(&b.dst, port);
  Put32(b.end.qpn, 0x1234);
  Put32(b.end.psn, 0x777);
  b.end.responder_resources = resp;
  b.end.initiator_depth = init;
  b.end.flow_control = 1;
  b.retry_count = 7;
  b.end.rnr_retry_count = 7;
  b.end.private_data_len = declared_private;
  auto* p = reinterpret_cast<uint8_t*>(&b);
  m.insert(m.end(), p, p + sizeof b);
  m.insert(m.end(), actual_private, 0x5a);
  return m;
}

class RawClient {
 public:
  explicit RawClient(uint16_t service_port) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_storage a = Ip("127.0.0.1", service_port);
    if (fd_ >= 0 && connect(fd_, Sa(&a), sizeof(sockaddr_in)) != 0) {
      close(fd_);
      fd_ = -1;
    }
    int one = 1;
    if (fd_ >= 0) setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  ~RawClient() {
    if (fd_ >= 0) close(fd_);
  }
  bool ok() const { return fd_ >= 0; }
  bool Send(const std::vector<uint8_t>& m) {
    return ::send(fd_, m.data(), m.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(m.size());
  }
  void ShutdownWrite() { shutdown(fd_, SHUT_WR); }

  // Reads one whole message within `timeout` (false at EOF or timeout).
  bool ReadMessage(std::vector<uint8_t>* out, milliseconds timeout = kWait) {
    auto deadline = Clock::now() + timeout;
    for (;;) {
      if (rx_.size() >= sizeof(wire::MsgHeader)) {
        size_t len = size_t(rx_[2]) << 8 | rx_[3];
        if (len >= sizeof(wire::MsgHeader) && rx_.size() >= len) {
          out->assign(rx_.begin(), rx_.begin() + static_cast<ptrdiff_t>(len));
          rx_.erase(rx_.begin(), rx_.begin() + static_cast<ptrdiff_t>(len));
          return true;
        }
      }
      if (!Fill(deadline)) return false;
    }
  }

  // True when the service closes the channel within `timeout` (whatever it sent before).
  bool ClosedByPeer(milliseconds timeout = kWait) {
    auto deadline = Clock::now() + timeout;
    while (Fill(deadline)) {
    }
    return eof_;
  }

 private:
  bool Fill(Clock::time_point deadline) {
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (left.count() <= 0 || !Readable(fd_, left)) return false;
    uint8_t buf[4096];
    ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) {
      eof_ = true;  // orderly close or reset
      return false;
    }
    rx_.insert(rx_.end(), buf, buf + n);
    return true;
  }

  int fd_ = -1;
  bool eof_ = false;
  std::vector<uint8_t> rx_;
};

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
  std::vector<uint8_t> junk(300);
  for (size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<uint8_t>(i * 131 + 17);
  ASSERT_TRUE(raw.Send(junk));
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
