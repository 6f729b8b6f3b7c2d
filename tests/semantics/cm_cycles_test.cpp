// librdmacm: 1,000 connect/disconnect cycles between two ids of this process (each cycle: a new
// active id resolves, makes its QP, connects; the passive side accepts with a QP; both disconnect;
// both ids and QPs are destroyed) leave the process's open fds and RSS flat.
//
// Tolerances: open fds after the last cycle equal those after the warm-up (exactly); RSS grows by
// at most kRssSlack between the warm-up and the end (allocator noise; a leak of one QP's buffers
// or one event channel per cycle would exceed it many times over).
#include <dirent.h>

#include <fstream>

#include "support/cm_harness.h"
#include "support/sanitized.h"

namespace cmtest {
namespace {

constexpr int kCycles = 1000;
constexpr int kWarmup = 100;
constexpr long kRssSlack = 4L << 20;

int OpenFds() {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int n = 0;
  while (dirent* de = readdir(d)) {
    if (de->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n - 1;  // the DIR's own fd
}

long RssBytes() {
  std::ifstream in("/proc/self/statm");
  long size = 0, resident = 0;
  in >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

class CmCycles : public CmTest {
 protected:
  // One whole cycle; false (with the failure recorded) if any step fails.
  bool Cycle(rdma_event_channel* sch, rdma_event_channel* cch, uint16_t port) {
    rdma_cm_id* client = Resolved(cch, port);
    if (!client || !MakeQp(client)) return false;
    rdma_cm_id* server = Establish(client, sch);
    if (!server) return false;
    if (rdma_disconnect(client) != 0) {
      ADD_FAILURE() << "rdma_disconnect: " << strerror(errno);
      return false;
    }
    auto a = Next(cch, RDMA_CM_EVENT_DISCONNECTED);
    auto b = Next(sch, RDMA_CM_EVENT_DISCONNECTED);
    if (!a || !b) {
      ADD_FAILURE() << (a ? "" : "client: ") << (a ? b.message() : a.message());
      return false;
    }
    rdma_disconnect(server);
    Destroy(server);
    Destroy(client);
    return true;
  }
};

TEST_F(CmCycles, ThousandConnectDisconnectCyclesLeaveFdsAndRssFlat) {
  rdma_event_channel* sch = Channel();
  rdma_event_channel* cch = Channel();
  uint16_t port = 0;
  ASSERT_NE(Listen(sch, &port), nullptr);
  auto t0 = Clock::now();
  for (int i = 0; i < kWarmup; ++i) ASSERT_TRUE(Cycle(sch, cch, port)) << "cycle " << i;
  int fds0 = OpenFds();
  long rss0 = RssBytes();
  for (int i = kWarmup; i < kCycles; ++i) ASSERT_TRUE(Cycle(sch, cch, port)) << "cycle " << i;
  int fds1 = OpenFds();
  long rss1 = RssBytes();
  RecordProperty("cycles_ms", std::to_string(MsSince(t0)));
  RecordProperty("fds", std::to_string(fds0) + " -> " + std::to_string(fds1));
  RecordProperty("rss_kib", std::to_string(rss0 / 1024) + " -> " + std::to_string(rss1 / 1024));
  EXPECT_EQ(fds1, fds0);
  // Sanitizers keep freed memory in quarantine (ASan) or shadow it (TSan), so RSS says nothing
  // there; LeakSanitizer checks for leaks instead, at exit.
  if (!kSanitized) {
    EXPECT_LE(rss1 - rss0, kRssSlack) << "RSS " << rss0 / 1024 << " KiB -> " << rss1 / 1024
                                      << " KiB over " << kCycles - kWarmup << " cycles";
  }
  EXPECT_TRUE(Quiet(sch));
  EXPECT_TRUE(Quiet(cch));
}

}  // namespace
}  // namespace cmtest
