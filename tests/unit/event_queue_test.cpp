// core::EventQueue: a blocking Pop must neither fail nor touch an empty queue while another
// thread purges (rdma_destroy_id / ibv_destroy_cq purge the events of the object they destroy).
//
// Found with cmtime's server (bench/cm_bench.sh, about 1 run in 3): its disconnect thread's
// rdma_destroy_id purged the channel while the event thread sat in rdma_get_cm_event, which
// returned EAGAIN on a blocking channel ("failure in rdma_get_cm_event in
// process_server_events: Resource temporarily unavailable"); cmtime then crashed on its way out.
#include "core/event_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace softrdma::core {
namespace {

TEST(EventQueue, BlockingPopSurvivesConcurrentPurge) {
  EventQueue<int> q;
  ASSERT_TRUE(q.ok());
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0}, popped{0}, bad_value{0};
  std::atomic<bool> done{false};
  std::thread reader([&] {
    for (;;) {
      int v = -1;
      int err = q.Pop(&v);
      if (err) {
        failures.fetch_add(1);
        continue;
      }
      if (v == 2) break;  // the sentinel: done
      if (v != 1) bad_value.fetch_add(1);
      popped.fetch_add(1);
    }
    done.store(true);
  });
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  int pushed = 0, purged = 0;
  while (std::chrono::steady_clock::now() < end && failures.load() == 0) {
    q.Push(1);
    ++pushed;
    purged += q.Purge([](int v) { return v == 1; });
  }
  q.Push(2);
  // One sentinel must be enough; more are pushed (bounded) only so that a reader whose wake-up
  // was stolen ends and the test reports instead of hanging.
  int extra = 0;
  for (int i = 0; i < 200 && !done.load(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (i % 10 == 9 && !done.load()) {
      q.Push(2);
      ++extra;
    }
  }
  ASSERT_TRUE(done.load()) << "the reader never got the sentinel";
  reader.join();
  EXPECT_EQ(extra, 0) << "a pushed event did not wake the blocked reader";
  EXPECT_EQ(failures.load(), 0) << "a blocking Pop returned an error";
  EXPECT_EQ(bad_value.load(), 0) << "Pop returned something nobody pushed";
  if (extra == 0) {
    EXPECT_EQ(popped.load() + purged, pushed) << "every event is either delivered or purged";
    EXPECT_EQ(q.size(), 0u);
  }
}

TEST(EventQueue, NonBlockingPopAfterPurgeSaysEagain) {
  EventQueue<int> q;
  ASSERT_TRUE(q.ok());
  int fl = fcntl(q.fd(), F_GETFL);
  ASSERT_EQ(fcntl(q.fd(), F_SETFL, fl | O_NONBLOCK), 0);
  q.Push(1);
  q.Push(3);
  EXPECT_EQ(q.Purge([](int v) { return v == 1; }), 1);
  int v = 0;
  EXPECT_EQ(q.Pop(&v), 0);
  EXPECT_EQ(v, 3);
  EXPECT_EQ(q.Pop(&v), EAGAIN);
  EXPECT_EQ(fcntl(q.fd(), F_GETFL) & O_NONBLOCK, O_NONBLOCK) << "the application's flag stays";
}

}  // namespace
}  // namespace softrdma::core
