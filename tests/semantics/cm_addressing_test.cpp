// librdmacm: addressing. rdma_getaddrinfo(3) in its node/service/hints forms (IPv4 and IPv6),
// port spaces and address conflicts, the src/dst port accessors, and rdma_get_devices.
#include <netdb.h>

#include "support/cm_harness.h"

namespace cmtest {
namespace {

class CmAddrinfo : public CmTest {};
class CmPortSpace : public CmTest {};
class CmDevices : public CmTest {};

struct Rai {
  rdma_addrinfo* res = nullptr;
  int ret = 0;
  ~Rai() {
    if (res) rdma_freeaddrinfo(res);
  }
};

void Resolve(Rai* out, const char* node, const char* service, const rdma_addrinfo* hints) {
  out->ret = rdma_getaddrinfo(node, service, hints, &out->res);
  if (out->ret != 0) out->res = nullptr;
}

bool IsAny(const sockaddr* a) {
  if (a->sa_family == AF_INET) {
    return reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr == htonl(INADDR_ANY);
  }
  if (a->sa_family == AF_INET6) {
    return IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr);
  }
  return false;
}

TEST_F(CmAddrinfo, PassiveServiceOnlyGivesAWildcardSource) {
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_PASSIVE;
  hints.ai_port_space = RDMA_PS_TCP;
  Rai r;
  Resolve(&r, nullptr, "7471", &hints);
  ASSERT_EQ(r.ret, 0) << gai_strerror(r.ret);
  ASSERT_NE(r.res, nullptr);
  EXPECT_TRUE(r.res->ai_flags & RAI_PASSIVE);
  ASSERT_NE(r.res->ai_src_addr, nullptr);
  EXPECT_GT(r.res->ai_src_len, 0u);
  EXPECT_TRUE(IsAny(r.res->ai_src_addr)) << IpOf(r.res->ai_src_addr);
  EXPECT_EQ(PortOf(r.res->ai_src_addr), 7471);
  EXPECT_EQ(r.res->ai_dst_len, 0u);
  EXPECT_EQ(r.res->ai_port_space, RDMA_PS_TCP);
  EXPECT_EQ(r.res->ai_qp_type, IBV_QPT_RC);
  EXPECT_EQ(r.res->ai_family, r.res->ai_src_addr->sa_family);
}

TEST_F(CmAddrinfo, PassiveWithNodeBindsThatAddress) {
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_PASSIVE | RAI_NUMERICHOST;
  Rai r;
  Resolve(&r, "127.0.0.1", "7472", &hints);
  ASSERT_EQ(r.ret, 0) << gai_strerror(r.ret);
  ASSERT_NE(r.res->ai_src_addr, nullptr);
  EXPECT_EQ(IpOf(r.res->ai_src_addr), "127.0.0.1");
  EXPECT_EQ(PortOf(r.res->ai_src_addr), 7472);
  EXPECT_EQ(r.res->ai_dst_len, 0u);
}

TEST_F(CmAddrinfo, ActiveNumericIpv4) {
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_NUMERICHOST;
  hints.ai_port_space = RDMA_PS_TCP;
  Rai r;
  Resolve(&r, "127.0.0.1", "7473", &hints);
  ASSERT_EQ(r.ret, 0) << gai_strerror(r.ret);
  EXPECT_FALSE(r.res->ai_flags & RAI_PASSIVE);
  EXPECT_EQ(r.res->ai_family, AF_INET);
  ASSERT_NE(r.res->ai_dst_addr, nullptr);
  EXPECT_EQ(r.res->ai_dst_len, sizeof(sockaddr_in));
  EXPECT_EQ(IpOf(r.res->ai_dst_addr), "127.0.0.1");
  EXPECT_EQ(PortOf(r.res->ai_dst_addr), 7473);
  EXPECT_EQ(r.res->ai_qp_type, IBV_QPT_RC);
}

TEST_F(CmAddrinfo, ActiveNumericIpv6Loopback) {
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_NUMERICHOST;
  Rai r;
  Resolve(&r, "::1", "7474", &hints);
  ASSERT_EQ(r.ret, 0) << gai_strerror(r.ret);
  EXPECT_EQ(r.res->ai_family, AF_INET6);
  ASSERT_NE(r.res->ai_dst_addr, nullptr);
  EXPECT_EQ(r.res->ai_dst_len, sizeof(sockaddr_in6));
  EXPECT_EQ(IpOf(r.res->ai_dst_addr), "::1");
  EXPECT_EQ(PortOf(r.res->ai_dst_addr), 7474);
}

TEST_F(CmAddrinfo, NumericHostRefusesNames) {
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_NUMERICHOST;
  Rai r;
  Resolve(&r, "localhost", "7475", &hints);
  EXPECT_NE(r.ret, 0);
  EXPECT_EQ(r.res, nullptr);
  // Without the flag the name resolves.
  hints.ai_flags = 0;
  Rai named;
  Resolve(&named, "localhost", "7475", &hints);
  ASSERT_EQ(named.ret, 0) << gai_strerror(named.ret);
  ASSERT_NE(named.res->ai_dst_addr, nullptr);
  EXPECT_EQ(PortOf(named.res->ai_dst_addr), 7475);
}

TEST_F(CmAddrinfo, FamilyHintSelectsTheFamily) {
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_FAMILY | RAI_NUMERICHOST;
  hints.ai_family = AF_INET6;
  Rai v6;
  Resolve(&v6, "::1", "7476", &hints);
  ASSERT_EQ(v6.ret, 0) << gai_strerror(v6.ret);
  EXPECT_EQ(v6.res->ai_family, AF_INET6);
  EXPECT_EQ(v6.res->ai_dst_addr->sa_family, AF_INET6);
  // An IPv6 literal is not an AF_INET address.
  hints.ai_family = AF_INET;
  Rai mismatch;
  Resolve(&mismatch, "::1", "7476", &hints);
  EXPECT_NE(mismatch.ret, 0);
  // A passive wildcard in the family asked for.
  hints.ai_flags = RAI_FAMILY | RAI_PASSIVE;
  hints.ai_family = AF_INET6;
  Rai any6;
  Resolve(&any6, nullptr, "7476", &hints);
  ASSERT_EQ(any6.ret, 0) << gai_strerror(any6.ret);
  ASSERT_NE(any6.res->ai_src_addr, nullptr);
  EXPECT_EQ(any6.res->ai_src_addr->sa_family, AF_INET6);
  EXPECT_TRUE(IsAny(any6.res->ai_src_addr));
}

TEST_F(CmAddrinfo, NodeWithoutServiceHasPortZero) {
  Rai r;
  Resolve(&r, "127.0.0.1", nullptr, nullptr);
  ASSERT_EQ(r.ret, 0) << gai_strerror(r.ret);
  ASSERT_NE(r.res->ai_dst_addr, nullptr);
  EXPECT_EQ(IpOf(r.res->ai_dst_addr), "127.0.0.1");
  EXPECT_EQ(PortOf(r.res->ai_dst_addr), 0);
}

TEST_F(CmAddrinfo, UdpPortSpaceMeansUd) {
  rdma_addrinfo hints{};
  hints.ai_port_space = RDMA_PS_UDP;
  Rai r;
  Resolve(&r, "127.0.0.1", "7477", &hints);
  ASSERT_EQ(r.ret, 0) << gai_strerror(r.ret);
  EXPECT_EQ(r.res->ai_port_space, RDMA_PS_UDP);
  EXPECT_EQ(r.res->ai_qp_type, IBV_QPT_UD);
}

TEST_F(CmAddrinfo, HintsAloneCarryTheAddresses) {
  sockaddr_storage dst = Ip("127.0.0.1", 7478);
  rdma_addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_port_space = RDMA_PS_TCP;
  hints.ai_qp_type = IBV_QPT_RC;
  hints.ai_dst_addr = Sa(&dst);
  hints.ai_dst_len = sizeof(sockaddr_in);
  Rai r;
  Resolve(&r, nullptr, nullptr, &hints);
  ASSERT_EQ(r.ret, 0);
  ASSERT_NE(r.res->ai_dst_addr, nullptr);
  EXPECT_NE(r.res->ai_dst_addr, hints.ai_dst_addr);  // a copy
  EXPECT_EQ(IpOf(r.res->ai_dst_addr), "127.0.0.1");
  EXPECT_EQ(PortOf(r.res->ai_dst_addr), 7478);
}

TEST_F(CmAddrinfo, NothingToResolveIsAnError) {
  Rai r;
  Resolve(&r, nullptr, nullptr, nullptr);
  EXPECT_NE(r.ret, 0);
  EXPECT_EQ(r.res, nullptr);
}

// The whole path over IPv6 loopback: listen on ::1, resolve and connect to it.
TEST_F(CmAddrinfo, ConnectOverIpv6Loopback) {
  rdma_event_channel* sch = Channel();
  rdma_event_channel* cch = Channel();
  uint16_t port = 0;
  rdma_cm_id* listen = Listen(sch, &port, RDMA_PS_TCP, "::1");
  ASSERT_NE(listen, nullptr);
  EXPECT_EQ(rdma_get_local_addr(listen)->sa_family, AF_INET6);
  rdma_cm_id* client = Resolved(cch, port, RDMA_PS_TCP, "::1");
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(IpOf(rdma_get_local_addr(client)), "::1");
  ASSERT_TRUE(MakeQp(client));
  rdma_cm_id* server = Establish(client, sch);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(IpOf(rdma_get_peer_addr(server)), "::1");
  EXPECT_EQ(rdma_get_src_port(server), rdma_get_dst_port(client));
  EXPECT_EQ(rdma_get_dst_port(server), rdma_get_src_port(client));
}

// ---- port spaces ----

TEST_F(CmPortSpace, SamePortInTcpAndUdpBothListen) {
  rdma_event_channel* ch = Channel();
  uint16_t port = 0;
  rdma_cm_id* tcp = Listen(ch, &port, RDMA_PS_TCP);
  ASSERT_NE(tcp, nullptr);
  rdma_cm_id* udp = NewId(ch, RDMA_PS_UDP);
  ASSERT_NE(udp, nullptr);
  sockaddr_storage a = Ip("127.0.0.1", port);
  ASSERT_EQ(rdma_bind_addr(udp, Sa(&a)), 0) << strerror(errno);
  ASSERT_EQ(rdma_listen(udp, 4), 0) << strerror(errno);
  EXPECT_EQ(ntohs(rdma_get_src_port(tcp)), port);
  EXPECT_EQ(ntohs(rdma_get_src_port(udp)), port);
  EXPECT_EQ(rdma_get_dst_port(tcp), 0);
}

TEST_F(CmPortSpace, SamePortSamePortSpaceIsInUse) {
  rdma_event_channel* ch = Channel();
  uint16_t port = 0;
  rdma_cm_id* first = Listen(ch, &port, RDMA_PS_TCP);
  ASSERT_NE(first, nullptr);
  rdma_cm_id* second = NewId(ch, RDMA_PS_TCP);
  ASSERT_NE(second, nullptr);
  sockaddr_storage a = Ip("127.0.0.1", port);
  errno = 0;
  EXPECT_EQ(rdma_bind_addr(second, Sa(&a)), -1);
  EXPECT_EQ(errno, EADDRINUSE);
  // A wildcard on the same port overlaps too.
  rdma_cm_id* wild = NewId(ch, RDMA_PS_TCP);
  ASSERT_NE(wild, nullptr);
  sockaddr_storage any = Ip("0.0.0.0", port);
  errno = 0;
  EXPECT_EQ(rdma_bind_addr(wild, Sa(&any)), -1);
  EXPECT_EQ(errno, EADDRINUSE);
  // Once the first id is gone the port is free.
  Destroy(first);
  rdma_cm_id* third = NewId(ch, RDMA_PS_TCP);
  ASSERT_NE(third, nullptr);
  EXPECT_EQ(rdma_bind_addr(third, Sa(&a)), 0) << strerror(errno);
  EXPECT_EQ(rdma_listen(third, 4), 0) << strerror(errno);
}

TEST_F(CmPortSpace, BindingAnAddressThatIsNotLocalFails) {
  rdma_event_channel* ch = Channel();
  rdma_cm_id* id = NewId(ch);
  ASSERT_NE(id, nullptr);
  sockaddr_storage a = Ip("198.51.100.7", NextPort());
  errno = 0;
  EXPECT_EQ(rdma_bind_addr(id, Sa(&a)), -1);
  EXPECT_EQ(errno, EADDRNOTAVAIL);
}

TEST_F(CmPortSpace, SrcAndDstPortsOfBothEnds) {
  rdma_event_channel* sch = Channel();
  rdma_event_channel* cch = Channel();
  uint16_t port = 0;
  rdma_cm_id* listen = Listen(sch, &port);
  ASSERT_NE(listen, nullptr);
  EXPECT_EQ(ntohs(rdma_get_src_port(listen)), port);
  rdma_cm_id* client = NewId(cch);
  ASSERT_NE(client, nullptr);
  // A fresh id has no addresses.
  EXPECT_EQ(rdma_get_src_port(client), 0);
  EXPECT_EQ(rdma_get_dst_port(client), 0);
  // A source port chosen by the application is kept.
  uint16_t src_port = 0;
  for (int tries = 0; tries < 50; ++tries) {
    src_port = NextPort();
    sockaddr_storage src = Ip("127.0.0.1", src_port);
    if (rdma_bind_addr(client, Sa(&src)) == 0) break;
    ASSERT_EQ(errno, EADDRINUSE);
    src_port = 0;
  }
  ASSERT_NE(src_port, 0);
  sockaddr_storage dst = Ip("127.0.0.1", port);
  ASSERT_EQ(rdma_resolve_addr(client, nullptr, Sa(&dst), 2000), 0);
  ASSERT_TRUE(Next(cch, RDMA_CM_EVENT_ADDR_RESOLVED));
  EXPECT_EQ(ntohs(rdma_get_src_port(client)), src_port);
  EXPECT_EQ(ntohs(rdma_get_dst_port(client)), port);
  ASSERT_EQ(rdma_resolve_route(client, 2000), 0);
  ASSERT_TRUE(Next(cch, RDMA_CM_EVENT_ROUTE_RESOLVED));
  ASSERT_TRUE(MakeQp(client));
  rdma_cm_id* server = Establish(client, sch);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(ntohs(rdma_get_src_port(server)), port);
  EXPECT_EQ(ntohs(rdma_get_dst_port(server)), src_port);
}

// ---- devices ----

TEST_F(CmDevices, GetDevicesListsTheDeviceIdsUse) {
  int n = -1;
  ibv_context** list = rdma_get_devices(&n);
  ASSERT_NE(list, nullptr);
  ASSERT_EQ(n, 1);
  ASSERT_NE(list[0], nullptr);
  EXPECT_EQ(list[1], nullptr);  // NULL-terminated
  EXPECT_STREQ(ibv_get_device_name(list[0]->device), "softrdma0");
  ibv_device_attr attr{};
  EXPECT_EQ(ibv_query_device(list[0], &attr), 0);
  // Ids are bound to that same context.
  rdma_event_channel* ch = Channel();
  rdma_cm_id* id = NewId(ch);
  ASSERT_NE(id, nullptr);
  sockaddr_storage dst = Ip("127.0.0.1", NextPort());
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, Sa(&dst), 2000), 0);
  ASSERT_TRUE(Next(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
  EXPECT_EQ(id->verbs, list[0]);
  rdma_free_devices(list);
  // NULL count is allowed.
  list = rdma_get_devices(nullptr);
  ASSERT_NE(list, nullptr);
  rdma_free_devices(list);
}

}  // namespace
}  // namespace cmtest
