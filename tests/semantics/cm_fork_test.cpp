// librdmacm after fork(): the child of a process whose connection manager is running (a
// listener, a service thread) gets a fresh one and can connect, here to its parent's listener.
// Without the fork handler the child inherits a CM whose service thread does not exist, and its
// connect never completes.
#include <rdma/rdma_cma.h>

#include <arpa/inet.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "support/cm_harness.h"
#include "support/fresh_process.h"

#include <cstring>

namespace {

bool NextEvent(rdma_event_channel* ch, rdma_cm_event** e, int timeout_ms) {
  pollfd p{ch->fd, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) != 1) return false;
  return rdma_get_cm_event(ch, e) == 0;
}

// The child's whole job: resolve, connect without a QP, and report the first answer it gets.
int ChildConnects(uint16_t port) {
  rdma_event_channel* ch = rdma_create_event_channel();
  rdma_cm_id* id = nullptr;
  if (!ch || rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP)) return 10;
  sockaddr_storage dst = cmtest::Ip("127.0.0.1", port);
  if (rdma_resolve_addr(id, nullptr, cmtest::Sa(&dst), 2000)) return 11;
  rdma_cm_event* e;
  if (!NextEvent(ch, &e, 5000) || e->event != RDMA_CM_EVENT_ADDR_RESOLVED) return 12;
  rdma_ack_cm_event(e);
  if (rdma_resolve_route(id, 2000)) return 13;
  if (!NextEvent(ch, &e, 5000) || e->event != RDMA_CM_EVENT_ROUTE_RESOLVED) return 14;
  rdma_ack_cm_event(e);
  rdma_conn_param p{};
  p.qp_num = 0x123;
  if (rdma_connect(id, &p)) return 15;
  if (!NextEvent(ch, &e, 8000)) return 16;
  int got = e->event;
  rdma_ack_cm_event(e);
  return got == RDMA_CM_EVENT_REJECTED ? 0 : 20 + got;
}

TEST(CmFork, ChildOfARunningCmConnectsToItsParentsListener) {
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  rdma_cm_id* listen_id = nullptr;
  ASSERT_EQ(rdma_create_id(ch, &listen_id, nullptr, RDMA_PS_TCP), 0);
  uint16_t port = 0;
  ASSERT_TRUE(cmtest::BindFreePort(listen_id, "127.0.0.1", &port)) << strerror(errno);
  ASSERT_EQ(rdma_listen(listen_id, 4), 0);

  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    alarm(30);
    _exit(ChildConnects(port));
  }

  // The parent answers the child's request with a reject (it has no QP to accept with).
  rdma_cm_event* e = nullptr;
  bool requested = NextEvent(ch, &e, 10000);
  if (!requested) {
    kill(child, SIGKILL);  // a child that hangs must not outlive the test
    waitpid(child, nullptr, 0);
  }
  ASSERT_TRUE(requested) << "the child's connect request never arrived";
  ASSERT_EQ(e->event, RDMA_CM_EVENT_CONNECT_REQUEST);
  rdma_cm_id* req = e->id;
  rdma_ack_cm_event(e);
  ASSERT_EQ(rdma_reject(req, nullptr, 0), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "child failed at step " << WEXITSTATUS(status);
  rdma_destroy_id(req);
  rdma_destroy_id(listen_id);
  rdma_destroy_event_channel(ch);
}

// The same as the first thing of fresh processes: the fork comes while the service thread the
// listener started (or the device's progress thread) may still be starting, inside the
// sanitizer's runtime, which allocates then.
TEST(CmFork, AForkRightAfterTheServiceStartsLeavesTheChildAWorkingOne) {
  if (semantics::kFreshRunsSkipped) GTEST_SKIP() << "see kFreshRunsSkipped";
  constexpr int kRounds = 20;
  EXPECT_EQ(semantics::FailedFreshRuns("CmFork.ChildOfARunningCmConnectsToItsParentsListener",
                                       kRounds, std::chrono::seconds(30)),
            0)
      << "of " << kRounds;
}

}  // namespace
