// A TCP client that connects to a process's CM service and never says Hello is disconnected after
// kHelloTimeoutMs (5 s), so silent strangers cannot pin the service's file descriptors.
#include <rdma/rdma_cma.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "support/cm_harness.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

namespace {

// The CM service port the listener on `port` published in <run dir>/cm.
int ServicePortOf(uint16_t port) {
  const char* run = getenv("SOFTRDMA_RUNDIR");
  std::string dir = std::string(run ? run : "/dev/shm/softrdma") + "/cm";
  DIR* d = opendir(dir.c_str());
  if (!d) return -1;
  int found = -1;
  while (dirent* de = readdir(d)) {
    std::ifstream in(dir + "/" + de->d_name);
    std::string word;
    long p = -1, listen = 0, pid = 0;
    while (in >> word) {
      if (word == "port") in >> p;
      if (word == "listen") in >> listen;
      if (word == "pid") in >> pid;
    }
    if (p == port && listen > 0 && pid == getpid()) found = static_cast<int>(listen);
  }
  closedir(d);
  return found;
}

TEST(CmSilentChannel, IsClosedWhenItSendsNoHello) {
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
  // Ports are shared with every test process running at the same time: take a free one.
  uint16_t port = 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int bound = -1;
  for (int tries = 0; tries < 50 && bound != 0; ++tries) {
    port = cmtest::NextPort();
    a.sin_port = htons(port);
    bound = rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&a));
    ASSERT_TRUE(bound == 0 || errno == EADDRINUSE) << strerror(errno);
  }
  ASSERT_EQ(bound, 0) << "no free port";
  ASSERT_EQ(rdma_listen(id, 1), 0);
  int service = ServicePortOf(port);
  ASSERT_GT(service, 0);

  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in s = a;
  s.sin_port = htons(static_cast<uint16_t>(service));
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&s), sizeof s), 0);
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
