// A TCP client that connects to a process's CM service and never says Hello is disconnected after
// kHelloTimeoutMs (5 s), so silent strangers cannot pin the service's file descriptors.
#include <rdma/rdma_cma.h>

#include <arpa/inet.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "support/cm_harness.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

TEST(CmSilentChannel, IsClosedWhenItSendsNoHello) {
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
  uint16_t port = 0;
  ASSERT_TRUE(cmtest::BindFreePort(id, "127.0.0.1", &port)) << strerror(errno);
  ASSERT_EQ(rdma_listen(id, 1), 0);
  uint16_t service = cmtest::ServicePortOf(port);
  ASSERT_GT(service, 0);

  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_storage s = cmtest::Ip("127.0.0.1", service);
  ASSERT_EQ(connect(fd, cmtest::Sa(&s), sizeof(sockaddr_in)), 0);
  // The service greets us; then, as we say nothing, it hangs up.
  auto start = std::chrono::steady_clock::now();
  bool closed = false;
  char buf[256];
  while (!closed && std::chrono::steady_clock::now() - start < std::chrono::seconds(10)) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 500) == 1) closed = recv(fd, buf, sizeof buf, 0) <= 0;
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(closed) << "a silent channel stayed open for 10 s";
  EXPECT_GE(secs, 4.0) << "closed before the Hello timeout";
  close(fd);
  rdma_destroy_id(id);
  rdma_destroy_event_channel(ch);
}

}  // namespace
