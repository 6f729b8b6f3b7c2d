// librdmacm: how a process that sees none of this process's run directory (on another host, or in
// a container with its own /dev/shm) reaches a listener (src/cm/host_reach.cpp). A listener also
// listens on its own TCP address and port and serves the CM protocol there; the tests play the
// other process with a raw TCP client on that port. Resolving and connecting across a real host
// boundary is rdmacm_tools.sh --hosts: two namespaces, each with a run directory of its own.
#include <sys/socket.h>

#include "support/cm_harness.h"
#include "support/cm_raw_client.h"

namespace cmtest {
namespace {

// True when a plain TCP connect to 127.0.0.1:`port` is accepted.
bool TcpConnects(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_storage a = Ip("127.0.0.1", port);
  bool ok = connect(fd, Sa(&a), sizeof(sockaddr_in)) == 0;
  close(fd);
  return ok;
}

class CmOtherHost : public CmTest {
 protected:
  // A listener on the wildcard address (as rping -a 0.0.0.0 or ucmatose's server bind).
  void ListenOnAnyAddress() {
    sch_ = Channel();
    listen_ = Listen(sch_, &port_, RDMA_PS_TCP, "0.0.0.0");
    ASSERT_NE(listen_, nullptr);
  }

  // A connection through librdmacm still works, and the listener reported nothing else.
  void ListenerStillServes() {
    EXPECT_TRUE(Quiet(sch_));
    rdma_event_channel* cch = Channel();
    rdma_cm_id* client = Resolved(cch, port_);
    ASSERT_NE(client, nullptr);
    ASSERT_TRUE(MakeQp(client));
    ASSERT_NE(Establish(client, sch_), nullptr);
  }

  rdma_event_channel* sch_ = nullptr;
  rdma_cm_id* listen_ = nullptr;
  uint16_t port_ = 0;
};

TEST_F(CmOtherHost, AListenerOnAnAddressOfTheHostListensOnItsTcpPortUntilDestroyed) {
  ListenOnAnyAddress();
  EXPECT_TRUE(TcpConnects(port_));
  Destroy(listen_);
  EXPECT_FALSE(TcpConnects(port_)) << "the TCP port outlived its listener";
}

// A process of this namespace with a run directory of its own (a container with its own
// /dev/shm on the host's network) reaches a loopback listener there.
TEST_F(CmOtherHost, ALoopbackListenerListensOnItsTcpPortToo) {
  sch_ = Channel();
  ASSERT_NE(Listen(sch_, &port_), nullptr);
  EXPECT_TRUE(TcpConnects(port_));
}

TEST_F(CmOtherHost, ARequestOnTheTcpPortReachesTheListenerAndItsAnswerComesBack) {
  ListenOnAnyAddress();
  RawClient raw(port_);
  ASSERT_TRUE(raw.ok());
  ASSERT_TRUE(raw.Send(Hello()));
  std::vector<uint8_t> m;
  ASSERT_TRUE(raw.ReadMessage(&m));
  ASSERT_EQ(m[1], static_cast<uint8_t>(wire::MsgType::kHello));
  ASSERT_TRUE(raw.Send(Req(21, port_, 1, 1)));
  Event req;
  ASSERT_TRUE(Next(sch_, RDMA_CM_EVENT_CONNECT_REQUEST, &req));
  rdma_cm_id* server = Adopt(req.id);
  EXPECT_EQ(req.conn.qp_num, 0x1234u);
  const uint8_t why[] = {1, 2, 3};
  ASSERT_EQ(rdma_reject(server, why, sizeof why), 0) << strerror(errno);
  ASSERT_TRUE(raw.ReadMessage(&m));
  ASSERT_EQ(m[1], static_cast<uint8_t>(wire::MsgType::kRej));
  EXPECT_EQ(Get32(m.data() + 8), 21u);  // to the requester's id
  ASSERT_EQ(m.size(), sizeof(wire::MsgHeader) + sizeof(wire::RejBody) + sizeof why);
  EXPECT_EQ(std::memcmp(m.data() + m.size() - sizeof why, why, sizeof why), 0);
  ListenerStillServes();
}

TEST_F(CmOtherHost, GarbageOnTheTcpPortCostsOnlyThatChannel) {
  ListenOnAnyAddress();
  RawClient raw(port_);
  ASSERT_TRUE(raw.ok());
  ASSERT_TRUE(raw.Send(Garbage()));
  EXPECT_TRUE(raw.ClosedByPeer());
  ListenerStillServes();
  EXPECT_TRUE(TcpConnects(port_));
}

// The port belongs to a TCP program: the listener still works on this host (other hosts cannot
// reach it, which only the log says).
TEST_F(CmOtherHost, ATcpProgramOnThePortDoesNotStopTheListener) {
  int tcp = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(tcp, 0);
  sockaddr_storage any = Ip("0.0.0.0", 0);
  ASSERT_EQ(bind(tcp, Sa(&any), sizeof(sockaddr_in)), 0) << strerror(errno);
  ASSERT_EQ(listen(tcp, 4), 0);
  sockaddr_storage got{};
  socklen_t len = sizeof got;
  ASSERT_EQ(getsockname(tcp, Sa(&got), &len), 0);
  port_ = PortOf(Sa(&got));

  sch_ = Channel();
  listen_ = NewId(sch_);
  ASSERT_NE(listen_, nullptr);
  sockaddr_storage at = Ip("0.0.0.0", port_);
  ASSERT_EQ(rdma_bind_addr(listen_, Sa(&at)), 0) << strerror(errno);
  ASSERT_EQ(rdma_listen(listen_, 4), 0) << strerror(errno);
  ListenerStillServes();
  close(tcp);
}

}  // namespace
}  // namespace cmtest
